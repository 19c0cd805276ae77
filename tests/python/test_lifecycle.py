"""A communicator stays in step after a refused call, and survives threads, forks and Ctrl-C."""

import pytest


@pytest.mark.parametrize("mode", ["in_step", "destroy", "fork", "send_timeout", "sigint"])
def test_lifecycle(spawn, mode):
    job = spawn("lifecycle.py", 2, mode, env={"STRATA_TIMEOUT": "30s"})
    for r, (rc, out) in enumerate(job.wait(timeout=90)):
        assert rc == 0 and "OK" in out, f"rank {r} (exit {rc}):\n{out}"
