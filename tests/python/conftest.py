"""Shared helpers for the Python tests.

Ranks run as real processes, started two ways:
* ``launch(script, n)``: through the real launcher, ``strata run -n N python script``;
* ``spawn(script, n)``: plain subprocesses given explicit init arguments (rank, size, store,
  token, job id) and a store served by this pytest process (``strata.StoreServer``), for tests
  that kill ranks or must not be stopped by the launcher.

Each worker script prints "OK ..." as its last line when every check passed.
"""

import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
WORKERS = HERE / "workers"
ROOT = HERE.parents[1]
PYTHON = sys.executable


def strata_bin():
    """The `strata` CLI: STRATA_BIN (set by ctest), else build/strata, else PATH."""
    for candidate in (os.environ.get("STRATA_BIN"), ROOT / "build" / "strata", shutil.which("strata")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    pytest.fail("the strata CLI was not found: set STRATA_BIN or build it (cmake --build build)")


def _clean_env(extra=None):
    """The environment of this process without any job placement (we may run inside a job)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("STRATA_RANK", "STRATA_WORLD_SIZE", "STRATA_LOCAL", "STRATA_STORE",
                                "STRATA_JOB", "STRATA_SPARE", "TORCHELASTIC"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.setdefault("STRATA_TIMEOUT", "60s")
    env.update(extra or {})
    return env


def _report(cmd, proc_out, rc):
    return f"command: {' '.join(map(str, cmd))}\nexit code: {rc}\n--- output ---\n{proc_out}"


def launch(script, n, *args, timeout=150, env=None, expect_ok=True, launcher_args=()):
    """Runs `strata run [launcher_args] -n N python WORKERS/script args...` (launcher_args such as
    ["--ft"]); returns the combined output.
    With expect_ok, fails unless the job succeeded and every rank printed an OK line."""
    cmd = [strata_bin(), "run", *map(str, launcher_args), "-n", str(n), "--", PYTHON, str(WORKERS / script),
           *map(str, args)]
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout, env=_clean_env(env), cwd=ROOT)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"job did not finish in {timeout} s\n" + _report(cmd, e.stdout or "", "timeout"))
    if expect_ok:
        assert p.returncode == 0, _report(cmd, p.stdout, p.returncode)
        for r in range(n):
            assert f"[{r}] OK" in p.stdout, f"rank {r} did not report OK\n" + _report(cmd, p.stdout, p.returncode)
    return p.stdout, p.returncode


class Job:
    """Ranks started as plain processes around a store served by this process."""

    def __init__(self, script, n, args=(), env=None):
        import strata
        self.token = secrets.token_hex(8)
        self.server = strata.StoreServer("127.0.0.1", 0, self.token)
        self.n = n
        base = _clean_env(env)
        base.update(STRATA_TEST_STORE=f"127.0.0.1:{self.server.port}", STRATA_TEST_TOKEN=self.token,
                    STRATA_TEST_JOB="pytest-" + secrets.token_hex(4), STRATA_TEST_SIZE=str(n))
        self.procs = []
        for r in range(n):
            e = dict(base, STRATA_TEST_RANK=str(r))
            self.procs.append(subprocess.Popen([PYTHON, str(WORKERS / script), *map(str, args)], env=e,
                                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                               cwd=ROOT))

    def wait(self, timeout=120):
        """Waits for every rank: [(returncode, output)] by rank."""
        results = []
        for r, p in enumerate(self.procs):
            try:
                out, _ = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                out, _ = p.communicate()
                out += f"\n[test: rank {r} killed after {timeout} s]"
            results.append((p.returncode, out))
        self.server.stop()
        return results

    def kill_all(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()


@pytest.fixture
def spawn():
    jobs = []

    def start(script, n, *args, env=None):
        job = Job(script, n, args, env)
        jobs.append(job)
        return job

    yield start
    for j in jobs:
        j.kill_all()


def torch_or_skip():
    """Skips unless torch imports and the backend was built (a failure if ctest says it was)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        pytest.skip("PyTorch is not installed (Debian: python3-torch)")
    import strata
    ok, why = strata.torch_backend_status()
    if not ok:
        if os.environ.get("STRATA_TORCH_BACKEND_BUILT") == "ON":
            pytest.fail("the build says the torch backend was built, but: " + why)
        pytest.skip(why)
