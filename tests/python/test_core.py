"""The strata module in one process (a job of one rank): dtypes, heap arrays and their
lifetime, argument errors and their exception classes, Work, init()."""

import subprocess
import sys

import numpy as np
import pytest

import strata
from conftest import PYTHON, _clean_env, strata_bin


def launch_code(code, n):
    p = subprocess.run([strata_bin(), "run", "-n", str(n), PYTHON, "-c", code], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=60, env=_clean_env())
    assert p.returncode == 0, p.stdout
    return p.stdout, p.returncode


@pytest.fixture(scope="module")
def comm():
    return strata.init()


# ---- errors ---------------------------------------------------------------------------------------

def test_exception_hierarchy_and_codes():
    for name in ("InvalidArgument", "Timeout", "PeerFailed", "Aborted", "Unavailable", "Internal"):
        cls = getattr(strata, name)
        assert issubclass(cls, strata.Error) and issubclass(cls, RuntimeError)
        assert cls.code == getattr(strata.Code, name)
    assert issubclass(strata.InvalidArgument, ValueError)
    assert issubclass(strata.Timeout, TimeoutError)
    assert issubclass(strata.Unavailable, ConnectionError)
    e = strata.PeerFailed("x")
    assert e.code == strata.Code.PeerFailed and e.rank == -1 and e.peer == -1


def test_library_errors_carry_code_and_rank(comm):
    with pytest.raises(strata.InvalidArgument) as info:
        comm.reduce(np.ones(4, np.float32), root=5)  # root out of range: raised by the library
    assert info.value.code == strata.Code.InvalidArgument
    assert info.value.rank == 0
    assert "root" in str(info.value)


@pytest.mark.parametrize("call, message", [
    (lambda c: c.all_reduce(np.arange(10, dtype=np.float32)[::2]), "not C-contiguous"),
    (lambda c: c.all_reduce(np.ones((4, 4), np.float32).T), "not C-contiguous"),
    (lambda c: c.all_reduce([1.0, 2.0]), "must be a numpy.ndarray or a torch.Tensor"),
    (lambda c: c.all_reduce(np.ones(3, np.int16)), "int16, which Strata does not support"),
    (lambda c: c.all_reduce(np.ones(3, np.bool_)), "does not support"),
    (lambda c: c.all_reduce(np.ones(3, ">f4")), "non-native byte order"),
    (lambda c: c.all_reduce(np.ones(3, np.float32), "median"), "unknown reduction op"),
    (lambda c: c.all_reduce(np.ones(3, np.float32), out=np.ones(4, np.float32)), "needs 3"),
    (lambda c: c.all_reduce(np.ones(3, np.float32), out=np.ones(3, np.float64)), "dtype"),
    (lambda c: c.all_reduce(np.ones(3, np.float32), timeout=-1), "timeout"),
    (lambda c: c.all_reduce(np.ones(3, np.float32), algorithm="fast"), "algorithm"),
    (lambda c: c.reduce_scatter(np.ones(3, np.float32), out=np.ones(2, np.float32)), "needs 3"),
    (lambda c: c.all_gather_v(np.ones(3, np.float32), [1, 2]), "one per rank"),
    (lambda c: c.empty((2, -1)), "negative"),
    (lambda c: c.empty(4, "bfloat16"), "numpy has no bfloat16"),
    (lambda c: c.empty(4, "complex64"), "does not support"),
    (lambda c: c.empty(4, "nonsense"), "unknown dtype"),
    (lambda c: c.empty([3.0, 2]), "a dimension must be an integer"),
    (lambda c: c.empty(2**62, "float64"), "larger than an array can be"),
    (lambda c: c.zeros((2**40, 2**40)), "larger than an array can be"),
    (lambda c: c.send(np.ones(2), peer="1"), "send: peer must be an integer"),
    (lambda c: c.recv(np.ones(2), 0, tag=2**40), "recv: tag = .* is out of range"),
    (lambda c: c.split("0"), "split.*color must be an integer"),
    (lambda c: c.split(0, key=2**31), "split.*key = .* is out of range"),
])
def test_argument_errors_raise_invalid_argument(comm, call, message):
    with pytest.raises(strata.InvalidArgument, match=message):
        call(comm)


def test_read_only_output_is_rejected(comm):
    a = np.ones(4, np.float32)
    a.flags.writeable = False
    with pytest.raises(strata.InvalidArgument, match="read-only"):
        comm.all_reduce(a)
    out = comm.all_reduce(a, out=np.empty(4, np.float32))  # a read-only input is fine
    assert (out == 1).all()


# ---- dtypes -------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec, name", [
    ("float32", "float32"), (np.float16, "float16"), (np.dtype("int64"), "int64"), ("u1", "uint8"),
    ("bfloat16", "bfloat16"), ("BFLOAT16", "bfloat16"), ("double", "float64"), (np.uint32, "uint32"),
])
def test_dtype_names(spec, name):
    assert strata.dtype_name(spec) == name
    assert strata.dtype_size(spec) == {"float32": 4, "float16": 2, "int64": 8, "uint8": 1, "bfloat16": 2,
                                       "float64": 8, "uint32": 4}[name]


# ---- heap arrays --------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32",
                                   "float64"])
def test_heap_arrays(comm, dtype):
    a = comm.empty((3, 5), dtype)
    assert a.shape == (3, 5) and a.dtype == np.dtype(dtype) and a.flags.c_contiguous and a.flags.writeable
    assert comm.is_heap(a) and not comm.is_heap(np.empty(4, dtype))
    z = comm.zeros((7,), dtype)
    assert (z == 0).all()
    assert comm.empty(0, dtype).size == 0


def test_heap_array_outlives_its_communicator():
    # A communicator of its own (a second world would clash with the module's); its array stays
    # valid after the communicator is destroyed and dropped: the array's base owns the block.
    code = ("import numpy as np, strata, gc\n"
            "c = strata.init()\n"
            "a = c.zeros((1 << 16,), 'float64')\n"
            "v = a[10:20]\n"
            "c.all_reduce(a)\n"
            "c.destroy(); del c; gc.collect()\n"
            "a[:] = 3; assert (v == 3).all() and a.sum() == 3 * (1 << 16)\n"
            "del a; gc.collect(); assert (v == 3).all()\n"
            "print('ok')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "ok" in p.stdout, p.stdout + p.stderr


def test_collectives_on_one_rank(comm):
    a = comm.empty((4, 4), "float32")
    a[:] = 2
    assert comm.all_reduce(a, "prod") is a and (a == 2).all()
    assert comm.all_gather(a).shape == (1, 4, 4)
    assert comm.reduce_scatter(a).shape == (4, 4)
    assert comm.gather(a, 0).shape == (1, 4, 4)
    assert comm.all_to_all_v(np.arange(5.0), [5]).tolist() == [0, 1, 2, 3, 4]
    assert comm.all_reduce(np.arange(3, dtype=np.int64), "max").tolist() == [0, 1, 2]


def test_work_api(comm):
    a = comm.zeros(1000, "float64")
    w = comm.all_reduce(a, async_op=True)
    assert w.wait() is a and w.result is a
    assert w.completed() and w.test() and w.wait_for(1.0) and w.status == strata.Code.Ok
    assert w.wait_for(0) and w.wait_for(0.0)  # 0 polls
    assert comm.barrier(async_op=True).wait() is None


def test_registration_context_manager(comm):
    ext = np.ones(1 << 12, np.float32)
    with comm.register(ext) as reg:
        assert reg.active
        comm.all_reduce(ext)
    assert not reg.active


def test_abort_fails_later_calls():
    code = ("import numpy as np, strata\n"
            "c = strata.init()\n"
            "c.abort()\n"
            "try:\n"
            "    c.all_reduce(np.ones(4, np.float32))\n"
            "except strata.Aborted as e:\n"
            "    assert e.code == strata.Code.Aborted; print('ok', e)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "ok" in p.stdout, p.stdout + p.stderr


def test_init_returns_the_same_world(comm):
    assert strata.init() is comm and strata.world() is comm
    with pytest.raises(strata.InvalidArgument, match="already joined"):
        strata.init(rank=1, size=2, store="127.0.0.1:1")
    assert comm.rank == 0 and comm.size == 1 and comm.local_rank == 0 and comm.local_size == 1
    assert comm.global_rank(0) == 0 and comm.valid and comm.timeout > 0


def test_unreachable_store_raises_unavailable():
    code = ("import strata, os\n"
            "os.environ['STRATA_STORE_TIMEOUT'] = '1s'\n"
            "try:\n"
            "    strata.init(rank=0, size=2, store='127.0.0.1:1', token='t', job_id='unreachable')\n"
            "except strata.Unavailable as e:\n"
            "    print('ok', e)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90,
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path), "STRATA_STORE_TIMEOUT": "1s"})
    assert p.returncode == 0 and "ok" in p.stdout, p.stdout + p.stderr


def test_import_without_torch():
    # torch made unimportable: strata still imports and says what the backend needs.
    code = ("import sys, importlib.abc\n"
            "class Block(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path, target=None):\n"
            "        if name == 'torch' or name.startswith('torch.'):\n"
            "            raise ModuleNotFoundError(f'No module named {name!r} (blocked)')\n"
            "sys.meta_path.insert(0, Block())\n"
            "import numpy as np, strata\n"
            "c = strata.init(); print(c.all_reduce(np.ones(2))[0])\n"
            "ok, why = strata.torch_backend_status(); print(ok, why)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "1.0" in p.stdout and "False PyTorch is not installed" in p.stdout, p.stdout


def test_strata_run_exports_torchrun_variables():
    # torch.distributed's env:// rendezvous (any backend) works under `strata run`.
    code = ("import os; e = os.environ; "
            "print('VARS', e['RANK'], e['LOCAL_RANK'], e['WORLD_SIZE'], e['LOCAL_WORLD_SIZE'], "
            "e['MASTER_ADDR'], int(e['MASTER_PORT']) > 0, e['RANK'] == e['STRATA_RANK'])")
    out, _ = launch_code(code, 2)
    for r in range(2):
        assert f"[{r}] VARS {r} {r} 2 2 127.0.0.1 True True" in out, out
