"""Failure recovery for torch.distributed + DistributedDataParallel (backend "strata").

Each test runs examples/python/ddp_recovery.py under `strata run --ft`: a rank SIGKILLs itself
at a chosen point of a step, `strata run --ft` replaces it, the survivors keep their processes,
their DDP model (its buckets and reducer) and optimizer, and the job ends with the same
parameters and momentum (the hash) as the run without a failure.
"""

import re
from functools import lru_cache

import pytest

from conftest import ROOT, launch, torch_or_skip

EXAMPLE = ROOT / "examples" / "python" / "ddp_recovery.py"
N = 3
STEPS = 8


@pytest.fixture(autouse=True)
def need_torch():
    torch_or_skip()


def final_hash(out):
    found = re.findall(r"final params hash ([0-9a-f]+)", out)
    assert len(found) == 1, "rank 0 must print the hash once\n" + out
    return found[0]


@lru_cache(maxsize=None)
def baseline(*args):
    out, _ = launch(EXAMPLE, N, "--steps", STEPS, *args, launcher_args=["--ft"])
    return final_hash(out)


@pytest.mark.parametrize("fail,extra", [
    ("1:3:forward", ()),
    ("2:4:backward", ()),           # inside DDP's gradient all_reduce (a later bucket is in flight)
    ("1:5:step", ()),               # during the optimizer update, after the commit
    ("2:2:recovery", ()),           # and a survivor dies during the recovery
    ("1:3:backward", ("--accumulate", "3")),  # gradient accumulation with no_sync()
])
def test_ddp_job_survives_a_killed_rank_with_the_same_result(fail, extra):
    out, _ = launch(EXAMPLE, N, "--steps", STEPS, "--fail", fail, *extra, launcher_args=["--ft"])
    victim = fail.split(":")[0]
    assert f"rank {victim} (pid" in out and "replacing it" in out, "the failure was not injected\n" + out
    assert re.search(r"OK steps=\d+ hash=\S+ elapsed=\S+ replacement=True", out), "no replacement finished\n" + out
    survivors = re.findall(r"OK steps=\d+ hash=\S+ elapsed=\S+ replacement=False", out)
    expect_survivors = N - (2 if fail.endswith("recovery") else 1)
    assert len(survivors) == expect_survivors, "survivors must keep their processes\n" + out
    assert final_hash(out) == baseline(*extra), "recovered run differs from the run without failure\n" + out


def test_ddp_hot_spare_takes_the_failed_rank_with_torch_already_imported():
    # The spare runs the script up to init_process_group("strata"), which waits for a rank
    # (torch's env:// rendezvous would need RANK, which a spare has not got yet). The failure
    # comes late (step 25 of 30) so that the spare, importing torch while the ranks do, is
    # surely waiting by then.
    steps, fail = 30, "1:25:step"
    out, _ = launch(EXAMPLE, N, "--steps", steps, "--fail", fail, launcher_args=["--ft", "--spares", "1"])
    assert "rank 1 (pid" in out and "rank 1 goes to spare 0" in out, "the spare did not take rank 1\n" + out
    assert re.search(r"^\[1\] OK steps=\d+ hash=\S+ elapsed=\S+ replacement=True", out, re.M), \
        "the spare did not finish as the replacement\n" + out
    survivors = re.findall(r"^\[[02]\] OK steps=\d+ hash=\S+ elapsed=\S+ replacement=False", out, re.M)
    assert len(survivors) == N - 1, "survivors must keep their processes\n" + out
    ready = re.search(r"^\[spare0\] spare ready, torch imported ns=(\d+)", out, re.M)
    killed = re.search(r"killing myself at step 25 .* ns=(\d+)", out)
    assert ready and killed, out
    assert int(ready.group(1)) < int(killed.group(1)), "the spare imported torch after the failure\n" + out
    assert final_hash(out) == baseline("--steps", steps), "recovered run differs from the run without failure\n" + out


def test_recovery_run_outside_ft_is_a_clear_error():
    out, rc = launch("torch_recovery_errors.py", 2, "plain", expect_ok=False)
    assert rc != 0
    assert "RAISED Unavailable recovery_run needs a job started with `strata run --ft`" in out, out


def test_ranks_registering_different_state_is_a_clear_error():
    out, rc = launch("torch_recovery_errors.py", 2, "mismatch", expect_ok=False,
                     launcher_args=["--ft", "--max-failures", "0"])
    assert rc != 0
    assert re.search(r"RAISED InvalidArgument .*rank 1 registered different buffers than rank 0", out), out


def test_state_from_torch_objects_restores_into_the_same_tensors():
    """In this process (one rank): what add_module/add_optimizer/add_rng register, and that
    restore() brings back the committed numbers and RNG into the same objects."""
    import torch

    import strata
    comm = strata.init()
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = strata.State(comm)
    state.add_module("m", model)
    state.add_optimizer("opt", opt)
    state.add_rng("rng")
    names = state.names
    for n in ("m.0.weight", "m.0.bias", "m.1.weight", "m.1.running_mean", "m.1.num_batches_tracked",
              "opt.state.0.momentum_buffer", "opt.numbers", "rng"):
        assert n in names, names
    assert all(torch.count_nonzero(opt.state[p]["momentum_buffer"]) == 0 for p in model.parameters())
    w = model[0].weight
    before = w.detach().clone()
    opt.param_groups[0]["lr"] = 7.0
    state.commit()  # lr 7 and this RNG state are now the committed values
    r0 = torch.rand(3)
    opt.param_groups[0]["lr"] = 0.5
    state.restore()  # one rank: nothing moves, the committed numbers and RNG come back
    assert opt.param_groups[0]["lr"] == 7.0
    assert torch.equal(torch.rand(3), r0), "the RNG must be back at the committed state"
    assert torch.equal(w, before) and model[0].weight is w
    state2 = strata.State(comm)
    with pytest.raises(strata.InvalidArgument, match="not contiguous"):
        state2.add("t", torch.zeros(4, 4).t())


def test_same_process_group_raises_then_works_after_recover():
    """Without DDP or recovery_run: a direct dist.all_reduce after a rank died raises a
    strata error (a RuntimeError); after comm.recover() the same ProcessGroup object reduces
    over the rebuilt communicator, with the replacement in it."""
    out, _ = launch("torch_recovery_errors.py", 3, "peerfailed", launcher_args=["--ft"])
    raised = re.findall(r"RAISED (\w+) runtime_error=(\w+) peer_failed=\w+", out)
    assert len(raised) == 2, out
    for cls, runtime in raised:
        # PeerFailed where this rank saw the death itself, Aborted where it saw the revoke first.
        assert cls in ("PeerFailed", "Aborted") and runtime == "True", out
