"""Failures surface as the right exception class in the surviving ranks, never as a hang."""

import signal


def test_killed_rank_raises_peer_failed_in_the_others(spawn):
    job = spawn("faults.py", 3, "kill")
    results = job.wait(timeout=90)
    killed_rc, _ = results[-1]
    assert killed_rc == -signal.SIGKILL, results[-1]
    for r, (rc, out) in enumerate(results[:-1]):
        assert rc == 0 and "OK PeerFailed" in out, f"rank {r} (exit {rc}):\n{out}"


def test_stopped_rank_raises_timeout_in_the_others(spawn):
    job = spawn("faults.py", 2, "stop")
    out0, rc0 = "", None
    try:
        p0 = job.procs[0]
        out0, _ = p0.communicate(timeout=60)
        rc0 = p0.returncode
    finally:
        job.procs[1].kill()  # SIGKILL works on a stopped process
        job.wait(timeout=30)
    assert rc0 == 0 and "OK Timeout" in out0, f"rank 0 (exit {rc0}):\n{out0}"


def test_blocking_calls_release_the_gil(spawn):
    job = spawn("faults.py", 2, "gil")
    for r, (rc, out) in enumerate(job.wait(timeout=60)):
        assert rc == 0 and "OK" in out, f"rank {r} (exit {rc}):\n{out}"
