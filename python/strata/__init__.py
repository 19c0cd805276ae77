"""Strata from Python: collectives over a shared-memory heap, and a torch.distributed backend.

    import strata
    comm = strata.init()                    # rank, size and store from the environment
    a = comm.empty((1 << 20,), "float32")   # a numpy array in the registered heap
    a[:] = comm.rank
    comm.all_reduce(a)                      # in place, zero-copy: peers read a directly

Every collective of the C++ API is a method of Communicator and takes numpy arrays or CPU
torch tensors: in place (``comm.all_reduce(a)``) or out of place (``out=b``), blocking or
``async_op=True`` (returns a Work). Arrays from ``comm.empty()`` / ``comm.empty_tensor()``
live in the registered heap and move with no copy; any other C-contiguous array works too
(staged through the heap). Blocking calls release the GIL.

Failure recovery under ``strata run --ft``: register the training state in a ``State`` and
run the loop with ``recovery_run`` (see docs/PYTHON.md, "Failure recovery").

torch: importing strata registers the backend "strata", so
``torch.distributed.init_process_group("strata")`` works under ``strata run`` and torchrun.
"""

import importlib.abc
import importlib.util
import os
import sys

try:
    from . import _strata
except ImportError as _e:
    raise ImportError(
        f"strata's compiled extension (_strata) is not next to {__file__}: this is the source tree. "
        "Build Strata (cmake --build build) and use the built package: PYTHONPATH=<build>/python") from _e
from ._strata import (
    Aborted,
    Algorithm,
    Code,
    Communicator,
    Error,
    Internal,
    InvalidArgument,
    PeerFailed,
    ReduceOp,
    RecoveryReport,
    Registration,
    StoreServer,
    Timeout,
    Unavailable,
    Work,
    dtype_name,
    dtype_size,
    is_replacement,
    last_recovery,
    mark_failure,
    now_ns,
)
from ._recovery import State, recovery_run

__version__ = "0.1.0"
__all__ = [
    "init", "world", "Communicator", "Work", "Registration", "StoreServer", "ReduceOp", "Algorithm", "Code",
    "Error", "InvalidArgument", "Timeout", "PeerFailed", "Aborted", "Unavailable", "Internal",
    "dtype_size", "dtype_name", "torch_communicator", "torch_backend_status", "torch_heap_allocator",
    "torch_heap_tensors", "torch_monitored_barrier", "State", "RecoveryReport", "recovery_run", "is_replacement", "mark_failure",
    "last_recovery", "now_ns",
]

# Errors raised from Python carry the same attributes as those the library raises.
Error.code, Error.rank, Error.peer = Code.Internal, -1, -1
for _cls in (InvalidArgument, Timeout, PeerFailed, Aborted, Unavailable, Internal):
    _cls.code = getattr(Code, _cls.__name__)
del _cls

# The world communicator of this process (a process joins one job: its heap and sockets are
# named after the job and the rank). strata.init() and the torch backend share it.
_world = None


def _torch_installed():
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


def _under_torchrun():
    env = os.environ
    return "TORCHELASTIC_RUN_ID" in env and "MASTER_ADDR" in env and "MASTER_PORT" in env


def init(rank=None, size=None, store=None, token=None, job_id=None, timeout=None, host_id=None):
    """Joins the job and returns the world Communicator.

    Unset arguments come from the environment: ``strata run`` (STRATA_*), torchrun, Open MPI
    or Slurm variables. ``store`` is "host:port" of a Strata store (``strata store`` or
    ``strata.StoreServer``), ``timeout`` the default deadline of every wait (seconds or
    timedelta). Under torchrun without STRATA_STORE, the ranks meet through torch's own store
    (rank 0 serves a Strata store and publishes its address there).

    A process joins one job: calling init() again returns the same communicator (while it
    has not been destroyed) and raises InvalidArgument if asked for another placement.
    """
    global _world
    if _world is not None and _world.valid:
        explicit = [x for x in (store, token, job_id, host_id) if x is not None]
        if rank in (None, _world.rank) and size in (None, _world.size) and not explicit:
            return _world
        raise InvalidArgument(
            f"strata.init: this process already joined a job as rank {_world.rank} of {_world.size}; "
            "destroy() that communicator first, or use comm.split() for sub-groups")
    if store is None and "STRATA_STORE" not in os.environ and _under_torchrun():
        from . import _torch
        store, token, job_id = _torch.rendezvous_from_torchrun_env(rank, size, timeout)
    comm = _strata.init(rank=rank, size=size, store=store or "", token=token or "", job_id=job_id or "",
                        timeout=timeout, host_id=host_id or "")
    if "STRATA_SPARE" in os.environ:
        # A hot spare (strata run --ft --spares K) learnt its rank in init(); code after it that
        # reads the placement variables, and processes it starts, see the rank it took.
        del os.environ["STRATA_SPARE"]
        for k in ("STRATA_RANK", "RANK", "STRATA_LOCAL_RANK", "LOCAL_RANK"):
            os.environ[k] = str(comm.rank)
        os.environ["STRATA_EPOCH"] = str(comm.epoch)
    _world = comm
    return comm


def world():
    """The world communicator made by init() (or by the torch backend), or None."""
    return _world if _world is not None and _world.valid else None


def torch_communicator(group=None):
    """The strata Communicator behind a torch.distributed process group of backend "strata"
    (default: the default group). Its empty_tensor() gives tensors that torch.distributed
    collectives move with no copy."""
    from . import _torch
    return _torch.communicator(group)


def torch_heap_allocator(enable=True, comm=None):
    """Makes torch allocate every CPU tensor in Strata's registered heap (of `comm`, default the
    world communicator), so that torch.distributed collectives on any tensor, DDP's gradient
    buckets included, move with no copy. enable=False switches back to torch's allocator;
    tensors keep whichever memory they were given."""
    from . import _torch
    _torch.use_heap_allocator(enable, comm)


def torch_heap_tensors(comm=None):
    """Context manager: torch_heap_allocator() inside the block, torch's allocator after it."""
    from . import _torch
    return _torch.heap_tensors(comm)


def torch_monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    """torch.distributed.monitored_barrier for groups of any backend, "strata" included: torch
    1.13's own function refuses every backend but gloo by name, although the process group
    call behind it is the backend's. Rank 0 raises naming the ranks that did not arrive
    within `timeout` (a timedelta or seconds; default: the group's timeout)."""
    from . import _torch
    return _torch.monitored_barrier(group, timeout, wait_all_ranks)


def torch_backend_status():
    """(available, message): whether torch.distributed can use the backend "strata", and why not."""
    if not _torch_installed():
        return False, "PyTorch is not installed (Debian: apt-get install python3-torch)"
    if os.environ.get("STRATA_TORCH_BACKEND", "1") == "0":
        return False, "STRATA_TORCH_BACKEND=0: the backend is not registered with torch.distributed"
    from . import _torch
    return _torch.status()


# ---- torch.distributed backend registration ---------------------------------------------------
# Registering needs torch.distributed's Backend class. When torch is already imported we
# register now; otherwise a finder waits for torch.distributed.distributed_c10d to be
# imported and registers right after it, so `import strata` never pays for importing torch.

def _register(c10d_module):
    # strata._torch imports torch.distributed itself, which lands here while _torch is half
    # initialised (torch_backend_status() before any torch import); it registers when done.
    half = sys.modules.get(__name__ + "._torch")
    if half is not None and not hasattr(half, "register"):
        return
    try:
        from . import _torch
        _torch.register(c10d_module.Backend)
    except Exception as e:  # never break `import torch` because of us
        print(f"strata: could not register the torch.distributed backend: {e}", file=sys.stderr)


class _AfterImport(importlib.abc.Loader):
    """Runs the real loader, then `then(module)`; anything else is the real loader's."""

    def __init__(self, real, then):
        self._real = real
        self._then = then

    def create_module(self, spec):
        return self._real.create_module(spec)

    def exec_module(self, module):
        self._real.exec_module(module)
        self._then(module)

    def __getattr__(self, name):  # get_source, is_package, ...: tracebacks keep working
        return getattr(self._real, name)


class _TorchDistributedFinder(importlib.abc.MetaPathFinder):
    _target = "torch.distributed.distributed_c10d"

    def find_spec(self, fullname, path, target=None):
        if fullname != self._target:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # one shot; also keeps find_spec below from finding us
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _AfterImport(spec.loader, _register)
        return spec


if os.environ.get("STRATA_TORCH_BACKEND", "1") != "0":
    _c10d = sys.modules.get(_TorchDistributedFinder._target)
    if _c10d is not None and hasattr(_c10d, "Backend"):
        _register(_c10d)
    elif _torch_installed():
        sys.meta_path.insert(0, _TorchDistributedFinder())
    del _c10d
