"""Failure recovery from Python: strata.State, Communicator.recover/epoch, recovery_run.

In this process (a job of one rank): State registration and its errors, recover() outside
--ft, and the step loop's protocol against a scripted communicator. Through `strata run --ft`:
a rank SIGKILLed mid-training is replaced, and the job ends with the bytes of a run without
failure while the survivors keep their processes.
"""

import gc
import re
import weakref

import numpy as np
import pytest

import strata
import strata._recovery
from conftest import launch


@pytest.fixture(scope="module")
def comm():
    return strata.init()


# ---- State ----------------------------------------------------------------------------------------

def test_state_registers_arrays_and_keeps_them_alive(comm):
    state = strata.State(comm)
    assert state.names == ["step"] and state.nbytes == 8 and state.step == 0
    heap = comm.zeros(10, np.float32)
    plain = np.arange(6, dtype=np.int64)
    state.add("heap", heap)
    state.add("plain", plain)
    assert state.names == ["step", "heap", "plain"]
    assert state.nbytes == 8 + 40 + 48
    state.step = 5
    assert state.step == 5

    probe = weakref.ref(plain)
    del plain
    gc.collect()
    assert probe() is not None, "State.add must keep the array alive"

    # One rank is its own healthy replica: restore() moves nothing and changes nothing.
    heap[:] = 3
    state.restore()
    assert state.step == 5 and np.all(heap == 3) and np.all(probe() == np.arange(6))
    assert strata.last_recovery(comm).restored_bytes == 0

    del state
    gc.collect()
    assert probe() is None, "the State must release its arrays when it goes away"


def test_state_add_errors(comm):
    state = strata.State(comm)
    state.add("w", np.zeros(4, np.float32))
    with pytest.raises(strata.InvalidArgument, match="'w' is already registered"):
        state.add("w", np.zeros(4, np.float32))
    with pytest.raises(strata.InvalidArgument, match="already registered"):
        state.add("step", np.zeros(1, np.uint64))  # the State's own counter
    with pytest.raises(strata.InvalidArgument, match="not C-contiguous"):
        state.add("strided", np.zeros(8, np.float32)[::2])
    readonly = np.zeros(4, np.float32)
    readonly.flags.writeable = False
    with pytest.raises(strata.InvalidArgument, match="read-only"):
        state.add("ro", readonly)
    with pytest.raises(strata.InvalidArgument, match="numpy.ndarray or a torch.Tensor"):
        state.add("list", [1.0, 2.0])
    assert state.names == ["step", "w"], "a rejected add must not register anything"
    with pytest.raises(strata.InvalidArgument, match=r"State.step must be a whole number from 0 .* got -1"):
        state.step = -1
    with pytest.raises(strata.InvalidArgument, match=r"got 18446744073709551616"):
        state.step = 2**64
    with pytest.raises(TypeError):
        state.step = 1.5  # not an int at all
    state.step = 2**64 - 1
    assert state.step == 2**64 - 1
    state.step = 0
    with pytest.raises(strata.InvalidArgument, match="got None for the group"):
        strata.State(None)


def test_state_accepts_torch_tensors(comm):
    torch = pytest.importorskip("torch")
    state = strata.State(comm, replica_group=0)
    state.add("t", torch.zeros(3, 4, dtype=torch.bfloat16))
    state.add("heap_t", comm.zeros_tensor(5, torch.float32))
    assert state.nbytes == 8 + 24 + 20
    with pytest.raises(strata.InvalidArgument, match="not contiguous"):
        state.add("tt", torch.zeros(4, 4).t())


def test_recover_outside_ft_is_unavailable(comm):
    assert comm.epoch == 0 and not strata.is_replacement()
    with pytest.raises(strata.Unavailable, match="--ft"):
        comm.recover()
    report = strata.last_recovery(comm)
    assert report.epoch == 0 and report.failed == [] and not report.replacement
    assert set(report.to_dict()) == {
        "epoch", "failed", "replacement", "injected_ns", "detected_ns", "spawned_ns", "seen_ns",
        "rebuild_start_ns", "joined_ns", "rebuilt_ns", "restored_ns", "restored_bytes", "premapped"}
    assert report.premapped == 0
    assert strata.now_ns() > 1_600_000_000 * 10**9
    # The communicator still works after the refused recover().
    a = np.ones(3, np.float32)
    comm.all_reduce(a)
    assert np.all(a == 1)


# ---- recovery_run's protocol, against a scripted communicator --------------------------------------

class FakeState:
    def __init__(self):
        self.step = 0
        self.restores = 0

    def restore(self):
        self.restores += 1


class FakeComm:
    """barrier() raises the errors queued in `barrier_errors` (one per call, None = success);
    recover() likewise from `recover_errors`. Every call is logged."""

    def __init__(self, log, barrier_errors=(), recover_errors=()):
        self.log = log
        self.epoch = 0  # built in the first epoch: nothing to restore at the start
        self.barrier_errors = list(barrier_errors)
        self.recover_errors = list(recover_errors)

    def barrier(self):
        self.log.append("barrier")
        if self.barrier_errors and (e := self.barrier_errors.pop(0)) is not None:
            raise e

    def recover(self):
        self.log.append("recover")
        if self.recover_errors and (e := self.recover_errors.pop(0)) is not None:
            raise e


@pytest.fixture
def scripted(monkeypatch):
    """recovery_run with replacement status and reports scripted instead of read from the job."""
    def run(comm, state, steps, replacement=False, **kw):
        monkeypatch.setattr(strata._recovery, "is_replacement", lambda: replacement)
        monkeypatch.setattr(strata._recovery, "last_recovery", lambda c: "report")
        log = comm.log
        strata.recovery_run(comm, state, steps, lambda s: log.append(f"compute {s}"),
                            lambda s: log.append(f"apply {s}"),
                            on_failure=lambda: log.append("on_failure"),
                            on_recovered=lambda r: log.append(f"on_recovered {r}"), **kw)
    return run


def test_recovery_run_discards_and_redoes_a_failed_step(scripted):
    log = []
    comm = FakeComm(log, barrier_errors=[None, strata.PeerFailed("rank 2 failed")],
                    recover_errors=[strata.Timeout("failed again during the rebuild"), None])
    state = FakeState()
    scripted(comm, state, 3)
    assert log == [
        "compute 0", "barrier", "apply 0",
        "compute 1", "barrier",                      # step 1 fails at the commit point: not applied
        "on_failure", "recover", "recover",          # the rebuild is retried
        "on_recovered report",
        "compute 1", "barrier", "apply 1",           # and redone
        "compute 2", "barrier", "apply 2",
    ]
    assert state.step == 3 and state.restores == 1


def test_recovery_run_replacement_restores_first(scripted):
    log = []
    state = FakeState()
    state.step = 7  # what a restore would have brought; the loop must resume there
    scripted(FakeComm(log), state, 8, replacement=True)
    assert log == ["on_recovered report", "compute 7", "barrier", "apply 7"] and state.restores == 1


def test_recovery_run_gives_up_after_max_recoveries(scripted):
    log = []
    comm = FakeComm(log, barrier_errors=[strata.PeerFailed("a"), strata.Aborted("b")])
    with pytest.raises(strata.Aborted):
        scripted(comm, FakeState(), 5, max_recoveries=1)
    assert log.count("recover") == 1 and "apply 0" not in log


def test_recovery_run_does_not_recover_from_other_errors(scripted):
    log = []
    comm = FakeComm(log, barrier_errors=[strata.InvalidArgument("a bug")])
    with pytest.raises(strata.InvalidArgument):
        scripted(comm, FakeState(), 5)
    assert "recover" not in log and "on_failure" not in log
    with pytest.raises(strata.InvalidArgument, match="callable"):
        strata.recovery_run(comm, FakeState(), 5, None, lambda s: None)


# ---- a real job under `strata run --ft` ------------------------------------------------------------

STEPS = 16


def lines(out, tag):
    """{rank: [dict of key=value fields]} of the lines `[rank] TAG k=v ...`."""
    found = {}
    for m in re.finditer(rf"^\[(\d+)\] {tag} (.*)$", out, re.M):
        found.setdefault(int(m.group(1)), []).append(dict(kv.split("=", 1) for kv in m.group(2).split()))
    return found


def final_hash(out):
    m = re.search(r"^\[0\] HASH ([0-9a-f]{64})$", out, re.M)
    assert m, out
    return m.group(1)


@pytest.fixture(scope="module")
def baseline():
    out, _ = launch("recovery.py", 3, STEPS, launcher_args=["--ft"], timeout=60)
    assert "RECOVERED" not in out, out
    return final_hash(out)


# Rank 0 also plans restore() and is the first choice of donor: its replacement must get the
# state from rank 1.
@pytest.mark.parametrize("fail_rank, fail_step", [(2, 6), (0, 11)])
def test_killed_rank_is_replaced_and_training_matches_a_run_without_failure(baseline, fail_rank, fail_step):
    out, _ = launch("recovery.py", 3, STEPS, fail_rank, fail_step, launcher_args=["--ft"], timeout=60)
    assert final_hash(out) == baseline, "the recovered run ended with other parameters\n" + out

    start, done, recovered = lines(out, "START"), lines(out, "DONE"), lines(out, "RECOVERED")
    ticks = lines(out, "TICKS")
    assert f"[{fail_rank}] INJECT rank={fail_rank} step={fail_step}" in out, out
    for r in range(3):
        assert len(done[r]) == 1 and done[r][0]["steps"] == str(STEPS), out
        assert done[r][0]["recoveries"] == "1" and done[r][0]["epoch"] == "1", out
        assert [x["step"] for x in recovered[r]] == [str(fail_step)], out  # the killed step is redone
        assert recovered[r][0]["failed"] == str(fail_rank), out
        if r == fail_rank:
            assert [x["replacement"] for x in start[r]] == ["0", "1"], out
            assert done[r][0]["pid"] == start[r][1]["pid"] != start[r][0]["pid"], out
        else:
            # A survivor is the same process from start to end.
            assert len(start[r]) == 1 and start[r][0]["replacement"] == "0", out
            assert done[r][0]["pid"] == start[r][0]["pid"], out
            assert len(ticks[r]) == 1, out  # recover() let another thread run (checked by the worker)


# strata run --ft --spares 1: the spare ran the worker's imports and waits in strata.init();
# the killed rank goes to it (it learns its rank there, and os.environ follows), and training
# ends with the bytes of a run without failure.
def test_killed_rank_goes_to_a_python_hot_spare(baseline, tmp_path):
    # The failing rank waits until the spare has imported (on a loaded machine the ranks can
    # reach the failing step before the spare is through its imports).
    out, _ = launch("recovery.py", 3, STEPS, 1, 6, launcher_args=["--ft", "--spares", "1"], timeout=60,
                    env={"RECOVERY_SPARE_READY": str(tmp_path / "spare_ready")})
    assert final_hash(out) == baseline, "the recovered run ended with other parameters\n" + out
    m = re.search(r"^strata run: rank 1 goes to spare 0 \(pid (\d+)\)$", out, re.M)
    assert m, "rank 1 was not handed to the spare\n" + out
    spare_pid = m.group(1)
    # Imported before the failure, under the spare's own prefix, then rank 1 to the end.
    assert re.search(rf"^\[spare0\] IMPORTED pid={spare_pid}$", out, re.M), out
    assert out.index(f"[spare0] IMPORTED pid={spare_pid}") < out.index("[1] INJECT"), out
    start, done = lines(out, "START"), lines(out, "DONE")
    assert start[1][1] == {"rank": "1", "pid": spare_pid, "replacement": "1", "env_rank": "1"}, out
    assert done[1][0]["pid"] == spare_pid and done[1][0]["steps"] == str(STEPS), out
