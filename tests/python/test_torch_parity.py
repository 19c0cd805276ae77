"""torch.distributed parity of the "strata" backend with gloo on CPU (issue 20 item 4): one test
per call, each comparing strata's result with gloo's computed in the same processes. The 3-rank
job runs once (workers/torch_parity.py prints PASS/FAIL per call on every rank); each test
below checks its call's lines."""

import re

import pytest

from conftest import launch, torch_or_skip

N = 3
CALLS = ["all_reduce", "bitwise_ops", "avg_and_premul_sum", "all_reduce_coalesced", "sparse_all_reduce", "reduce",
         "broadcast", "all_gather", "all_gather_coalesced", "gather_scatter", "reduce_scatter", "all_to_all",
         "send_recv", "recv_any_source", "batch_isend_irecv", "object_collectives", "barrier", "monitored_barrier",
         "subgroups", "timeouts"]


@pytest.fixture(scope="module")
def job():
    torch_or_skip()
    out, rc = launch("torch_parity.py", N, timeout=150, expect_ok=False, env={"STRATA_TIMEOUT": "40s"})
    return out, rc


@pytest.mark.parametrize("call", CALLS)
def test_call_matches_gloo(job, call):
    out, rc = job
    for r in range(N):
        if f"[{r}] PASS {call}\n" not in out and not re.search(rf"\[{r}\] PASS {call}$", out, re.M):
            fails = [line for line in out.splitlines() if f"FAIL {call}:" in line]
            pytest.fail(f"rank {r}: {call} did not pass: {fails or 'no result line'}\n--- output ---\n{out[-6000:]}")


def test_every_call_is_listed_and_the_job_ends(job):
    out, rc = job
    ran = set(re.findall(r"\] (?:PASS|FAIL) (\w+)", out))
    assert ran <= set(CALLS), f"cases without a test here: {sorted(ran - set(CALLS))}"
    assert rc == 0 and all(f"[{r}] DONE" in out for r in range(N)), f"exit {rc}\n{out[-6000:]}"
