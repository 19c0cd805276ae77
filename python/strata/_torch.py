"""torch.distributed backend "strata": rendezvous and registration.

The process group itself is C++ (_strata_torch, built only when torch and its C++ headers are
found). Rendezvous, decided here:

* Default group under ``strata run`` (STRATA_STORE set): the communicator is the one
  ``strata.init()`` gives, from the STRATA_* variables. A program may call both
  ``strata.init()`` and ``init_process_group("strata")``, in either order, and gets one
  communicator (one heap): heap tensors from it move with no copy through torch.distributed.
* Otherwise (torchrun, or MASTER_ADDR/MASTER_PORT set by hand), and for every sub-group: torch's
  store already occupies MASTER_PORT and speaks another protocol, so the group's rank 0 serves
  a Strata store on a free port of 127.0.0.1 (a thread of that process, one per process) and
  publishes "address, where the token is, job id" under the group's prefix in torch's store;
  the others read it there. Strata's store then carries Strata's own setup; torch's store is
  used once.

The token itself never goes into torch's store: torch's TCPStore has no authentication, so
anything written there is readable by whoever reaches its port. When STRATA_JOB_TOKEN is set
every rank uses it; otherwise rank 0 writes a random one to a file only its user can read
(mode 0600 in a 0700 directory) and publishes the file's path. The store listens on 127.0.0.1,
so the ranks that can use it are on this host and can read that file.
"""

import atexit
import contextlib
import datetime
import hashlib
import hmac
import os
import secrets
import shutil
import stat
import sys
import tempfile

import torch
import torch.distributed as dist

from . import _strata
from ._strata import InvalidArgument

try:
    from . import _strata_torch
    _import_error = None
except ImportError as e:  # built without torch headers, or against another torch
    _strata_torch = None
    _import_error = e

_RENDEZVOUS_KEY = "strata/rendezvous"
_server = None  # (StoreServer, token, token source): this process's store for torch-launched groups


def status():
    if _strata_torch is None:
        return False, _missing_message()
    return True, "available"


def _missing_message():
    here = os.path.dirname(os.path.abspath(__file__))
    if any(f.startswith("_strata_torch") for f in os.listdir(here)):  # built, but does not load
        return (f"the strata torch backend failed to load ({_import_error}); it must be built against "
                f"the torch that is imported (torch {torch.__version__} here)")
    return ("the strata torch backend is not built into this installation of Strata: it needs PyTorch "
            "and its C++ headers when Strata is built (Debian: apt-get install python3-torch "
            "libtorch-dev), then rebuild (cmake --build <build dir>)")


def _strata_timeout(timeout):
    """A timeout torch passes on: its 30-minute default means Strata's own (STRATA_TIMEOUT)."""
    if timeout is None:
        return None
    if not isinstance(timeout, datetime.timedelta):
        timeout = datetime.timedelta(seconds=float(timeout))
    default = getattr(dist, "default_pg_timeout", datetime.timedelta(minutes=30))
    if timeout == default or timeout.total_seconds() <= 0:
        return None
    return timeout.total_seconds()


def _private_token_file(token):
    """Writes `token` where only this user can read it; returns the path (removed at exit)."""
    directory = tempfile.mkdtemp(prefix="strata-token-")  # mode 0700
    path = os.path.join(directory, "token")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)
    atexit.register(shutil.rmtree, directory, True)
    return path


def _read_token(source):
    """The token a rendezvous value points at: "env" (STRATA_JOB_TOKEN) or "file:PATH"."""
    if source == "env":
        token = os.environ.get("STRATA_JOB_TOKEN", "")
        if not token:
            raise InvalidArgument("rank 0 uses STRATA_JOB_TOKEN as the job token, but it is not set here: "
                                  "set the same STRATA_JOB_TOKEN for every rank")
        return token
    if source.startswith("file:"):
        path = source[len("file:"):]
        try:
            # Non-blocking: a FIFO named there must not hang the rank before it is refused.
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as e:
            raise InvalidArgument(f"cannot read the job token rank 0 wrote to {path} ({e}); the ranks of a "
                                  "torch-launched group must run on rank 0's host as the same user, or share "
                                  "STRATA_JOB_TOKEN") from None
        with os.fdopen(fd) as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise InvalidArgument(f"the job token file {path} named in torch's store is not a regular file")
            _check_private(path, st, "file")
            _check_private(os.path.dirname(path), os.stat(os.path.dirname(path)), "directory")
            return f.read()
    raise InvalidArgument(f"unexpected token source {source!r} in torch's store")


def _check_private(path, st, what):
    """A token file (and its directory) must be this user's alone: torch's store is open to
    every local user, who could otherwise point a rank at a token, and a store, of its own."""
    if st.st_uid != os.geteuid() or st.st_mode & 0o022 or (what == "file" and st.st_mode & 0o077):
        raise InvalidArgument(f"the job token {what} {path} named in torch's store is not private to this user "
                              f"(owner uid {st.st_uid}, mode {oct(st.st_mode & 0o777)}): refusing it, as another "
                              "user of the host may have written that rendezvous record")


def _mac(token, record):
    """Binds a rendezvous record to the job token: torch's store has no authentication, so
    without it anyone on the host could point the ranks at a store, or a relay, of their own."""
    return hmac.new(token.encode(), record.encode(), hashlib.sha256).hexdigest()


def rendezvous(torch_store, rank):
    """Agrees on a Strata store through `torch_store`: (address, token, job_id). The token is
    not written to `torch_store`, only where to find it, and the record carries a MAC under
    the token that the other ranks check before they connect anywhere."""
    global _server
    if rank == 0:
        if _server is None:
            shared = os.environ.get("STRATA_JOB_TOKEN", "")
            token = shared or secrets.token_hex(16)
            source = "env" if shared else "file:" + _private_token_file(token)
            _server = (_strata.StoreServer("127.0.0.1", 0, token), token, source)
        server, token, source = _server
        job_id = "torch-" + secrets.token_hex(6)
        record = f"127.0.0.1:{server.port}\n{source}\n{job_id}"
        torch_store.set(_RENDEZVOUS_KEY, record + "\n" + _mac(token, record))
        return f"127.0.0.1:{server.port}", token, job_id
    value = torch_store.get(_RENDEZVOUS_KEY)  # waits up to the store's timeout
    value = value.decode(errors="replace") if isinstance(value, bytes) else value
    fields = value.split("\n")
    if len(fields) != 4:
        raise InvalidArgument(f"rank {rank}: the rendezvous record in torch's store under {_RENDEZVOUS_KEY!r} is "
                              "malformed (not written by this version of strata's rank 0?)")
    address, source, job_id, mac = fields
    token = _read_token(source)
    if not hmac.compare_digest(mac.encode(), _mac(token, "\n".join(fields[:3])).encode()):
        raise InvalidArgument(f"rank {rank}: the rendezvous record in torch's store under {_RENDEZVOUS_KEY!r} does "
                              "not carry this job token's MAC: it was not written by this job's rank 0 (another "
                              "process on the host overwrote it?), or rank 0 uses another STRATA_JOB_TOKEN")
    return address, token, job_id


_torchrun_store = None  # kept: torch's env:// rendezvous later shares its server (multi-tenant)


def rendezvous_from_torchrun_env(rank, size, timeout):
    """For strata.init() under torchrun: meet through torch's store at MASTER_ADDR:MASTER_PORT.

    With a static rendezvous the agent serves that store. Otherwise torch's env:// rendezvous
    has rank 0 serve it, multi-tenant, and so do we here: a later init_process_group() in this
    process reuses the same server instead of failing to bind the port twice."""
    global _torchrun_store
    env = os.environ
    rank = int(env["RANK"]) if rank is None else rank
    size = int(env["WORLD_SIZE"]) if size is None else size
    seconds = _strata_timeout(timeout) or 300.0
    agent_store = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    _torchrun_store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), size,
                                    rank == 0 and not agent_store, datetime.timedelta(seconds=seconds),
                                    wait_for_workers=False, multi_tenant=True)
    prefix = f"strata/{env.get('TORCHELASTIC_RUN_ID', '')}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    return rendezvous(dist.PrefixStore(prefix, _torchrun_store), rank)


def _world_communicator(torch_store, rank, size, timeout):
    import strata
    w = strata.world()
    if w is not None and w.rank == rank and w.size == size:
        return w
    if "STRATA_STORE" in os.environ:
        return strata.init(rank=rank, size=size, timeout=timeout)
    address, token, job_id = rendezvous(torch_store, rank)
    return strata.init(rank=rank, size=size, store=address, token=token, job_id=job_id, timeout=timeout)


def _create_process_group(opts, pg_options=None):
    """Backend creator (torch's extended API): one ProcessGroupStrata per torch group."""
    if _strata_torch is None:
        raise RuntimeError(_missing_message())
    rank, size = opts.group_rank, opts.group_size
    timeout = _strata_timeout(opts.timeout)
    if not opts.global_ranks_in_group:  # the default group
        comm = _world_communicator(opts.store, rank, size, timeout)
    else:
        address, token, job_id = rendezvous(opts.store, rank)
        comm = _strata.init(rank=rank, size=size, store=address, token=token, job_id=job_id, timeout=timeout)
    pg = _strata_torch.ProcessGroupStrata(comm._capsule(), rank, size, grace_us=100)
    pg._strata_comm = comm
    pg._strata_timeout = opts.timeout
    if not opts.global_ranks_in_group and _strata.is_replacement():
        # The survivors are inside recover(), not in this setup: its collectives (DDP's
        # parameter check and broadcast) are answered locally until recovery_run restores
        # the state, which brings what they would have carried.
        pg._strata_local = True
    return pg


def _skip_store_barrier_in_replacement(c10d):
    """torch 1.13's init_process_group ends with a barrier on torch's store that counts every
    rank of the group; in a replacement the survivors never come to it (and the count already
    holds theirs from the first start), so a replacement skips it."""
    barrier = getattr(c10d, "_store_based_barrier", None)
    if barrier is None or getattr(barrier, "_strata_wrapped", False):
        return

    def wrapped(rank, store, timeout):
        pg = c10d._get_default_group() if c10d.is_initialized() else None
        if _strata.is_replacement() and getattr(pg, "_strata_comm", None) is not None:
            return None
        return barrier(rank, store, timeout)

    wrapped._strata_wrapped = True
    c10d._store_based_barrier = wrapped


def _wait_as_spare_in_init_process_group(c10d):
    """A hot spare (strata run --ft --spares K) has no rank until the launcher gives it one,
    and torch's env:// rendezvous reads RANK before any backend runs. So in a spare,
    init_process_group("strata") first waits in strata.init() (which takes the assigned rank
    and sets RANK), then goes on as in any replacement: the program's imports and everything
    before this call were paid before the failure."""
    original = c10d.init_process_group
    if getattr(original, "_strata_wrapped", False):
        return

    def wrapped(backend, *args, **kwargs):
        if "STRATA_SPARE" in os.environ and str(backend).lower() == "strata":
            import strata
            comm = strata.init(timeout=_strata_timeout(kwargs.get("timeout")))
            if kwargs.get("rank", -1) not in (-1, None):
                kwargs["rank"] = comm.rank  # the rank the spare took, not one it guessed
        return original(backend, *args, **kwargs)

    wrapped._strata_wrapped = True
    wrapped.__doc__ = original.__doc__
    wrapped.__wrapped__ = original
    c10d.init_process_group = wrapped
    if getattr(dist, "init_process_group", None) is original:
        dist.init_process_group = wrapped


def _destroy_at_exit():
    # A strata group left to the interpreter's shutdown had its executor threads end inside
    # it: a thread that dropped a tensor's last reference then took the GIL after
    # finalization began and was unwound, which aborted the process ("terminate called
    # without an active exception"). Destroyed here, before that, its queued works run and
    # its threads are joined, as destroy_process_group() does (atexit runs handlers
    # registered after `import strata` first). Only the default group, and only when it is
    # strata's; with a peer already gone its queued works wait for their timeout.
    try:
        if dist.is_initialized() and dist.get_backend() == "strata":
            dist.destroy_process_group()
    except Exception:  # at exit nothing is left to report it to
        pass


def register(backend_cls):
    """Registers "strata" with torch.distributed.Backend (once)."""
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    spare = "STRATA_SPARE" in os.environ  # a replacement to be, once the launcher picks it
    if c10d is not None and (_strata.is_replacement() or spare):
        _skip_store_barrier_in_replacement(c10d)
    if c10d is not None and spare:
        _wait_as_spare_in_init_process_group(c10d)
    if "STRATA" in getattr(backend_cls, "_plugins", {}) or hasattr(backend_cls, "STRATA"):
        return
    atexit.register(_destroy_at_exit)
    try:
        backend_cls.register_backend("strata", _create_process_group, extended_api=True)
    except TypeError:  # torch before extended_api: no sub-group ranks, so world groups only
        def creator(store, rank, size, timeout):
            class _Opts:
                pass
            o = _Opts()
            o.store, o.group_rank, o.group_size, o.timeout = store, rank, size, timeout
            o.global_ranks_in_group = []
            return _create_process_group(o)
        backend_cls.register_backend("strata", creator)


def process_group(group=None):
    """The ProcessGroup object of `group` (None: the default group)."""
    if group is None:
        if not dist.is_initialized():
            raise InvalidArgument("no torch.distributed group: call dist.init_process_group('strata') first, "
                                  "or pass a strata Communicator")
        return dist.distributed_c10d._get_default_group()
    return group


def communicator(group=None):
    pg = process_group(group)
    comm = getattr(pg, "_strata_comm", None)
    if comm is None:
        raise InvalidArgument(f"process group {pg!r} does not use the strata backend")
    return comm


def monitored_barrier(group, timeout, wait_all_ranks):
    """See strata.torch_monitored_barrier."""
    c10d = dist.distributed_c10d
    if c10d._rank_not_in_group(group):
        return None
    pg = group if group is not None else c10d._get_default_group()
    if timeout is None:
        timeout = getattr(pg, "_strata_timeout", None) or dist.default_pg_timeout
    elif not isinstance(timeout, datetime.timedelta):
        timeout = datetime.timedelta(seconds=float(timeout))
    if timeout.total_seconds() <= 0:
        from . import InvalidArgument
        raise InvalidArgument("torch_monitored_barrier: timeout must be positive, got %s s"
                              % timeout.total_seconds())
    return pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)


_fork_guard = False


def _after_fork_in_child():
    # Heap segments are shared mappings, not copy-on-write: a forked child (a DataLoader
    # worker) allocating from the parent's heap would hand out the parent's blocks.
    if _strata_torch is not None and _strata_torch.heap_allocator_active():
        _strata_torch.use_heap_allocator(None)


def use_heap_allocator(enable=True, comm=None):
    """Makes torch allocate every CPU tensor in Strata's heap (enable=False: torch's allocator)."""
    global _fork_guard
    if _strata_torch is None:
        raise RuntimeError(_missing_message())
    if not enable:
        _strata_torch.use_heap_allocator(None)
        return
    if not _fork_guard:
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _fork_guard = True
    if comm is None:
        import strata
        comm = strata.world()
        if comm is None:
            raise InvalidArgument("no Strata communicator yet: call strata.init() or "
                                  "init_process_group('strata') first, or pass comm=")
    _strata_torch.use_heap_allocator(comm._capsule())


@contextlib.contextmanager
def heap_tensors(comm=None):
    was = _strata_torch is not None and _strata_torch.heap_allocator_active()
    use_heap_allocator(True, comm)
    try:
        yield
    finally:
        if not was:
            use_heap_allocator(False)


# Imported before torch.distributed was (strata.torch_backend_status() first): the hook in
# __init__ left the registration to this module, now complete. (When the hook itself imports
# this module, torch.distributed is still half-initialised, hence its c10d module here.)
_c10d = sys.modules.get("torch.distributed.distributed_c10d")
if os.environ.get("STRATA_TORCH_BACKEND", "1") != "0" and hasattr(_c10d, "Backend"):
    register(_c10d.Backend)
