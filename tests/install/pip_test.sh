#!/usr/bin/env bash
# pip_test.sh MODE SRC_DIR BUILD_DIR WORK_DIR  (issue 20 item 3)
#   MODE clean:  `pip install .` of a copy of the repository in a fresh venv: CMake builds
#                everything from scratch inside pip (minutes; label slow)
#   MODE reuse:  the same, but setup.py reuses this CMake tree (STRATA_CMAKE_BUILD_DIR=BUILD_DIR),
#                so only the packaging is exercised
# Then, from another directory and without PYTHONPATH/LD_LIBRARY_PATH: `import strata`, the
# torch backend (when torch is there), and `strata run -n 2` of a Python all_reduce through
# the venv's `strata` command.
set -euo pipefail
mode=$1 src=$2 build=$3 work=$4
python=/usr/bin/python3
[[ -x $python ]] || python=$(command -v python3)

skip() {
  echo "SKIP: $*"
  exit 77
}
fail() {
  echo "pip_test($mode): FAIL: $*" >&2
  exit 1
}
"$python" -c "import venv, ensurepip" 2>/dev/null || skip "$python has no venv/ensurepip (Debian: apt-get install python3-venv)"
"$python" -c "import setuptools, wheel" 2>/dev/null ||
  skip "$python has no setuptools/wheel (Debian: apt-get install python3-setuptools python3-wheel)"
"$python" -c "import numpy" 2>/dev/null || skip "$python has no numpy (Debian: apt-get install python3-numpy)"

rm -rf "$work"
mkdir -p "$work/src" "$work/elsewhere"
unset PYTHONPATH LD_LIBRARY_PATH STRATA_CMAKE_BUILD_DIR STRATA_CMAKE_ARGS

# A copy without build trees, as a fresh clone has it (pip builds in the source tree).
tar -C "$src" --exclude='./build*' --exclude=./.git --exclude='*.egg-info' --exclude=__pycache__ -cf - . |
  tar -C "$work/src" -xf -

echo "--- $python -m venv --system-site-packages $work/venv"
"$python" -m venv --system-site-packages "$work/venv"
venv=$work/venv
env_args=()
if [[ $mode == reuse ]]; then
  env_args=(STRATA_CMAKE_BUILD_DIR="$build")
else
  env_args=(STRATA_BUILD_JOBS="${STRATA_BUILD_JOBS:-2}")
fi
# --no-index: nothing from the network (numpy and torch come from the system's packages);
# --no-build-isolation: the build backend (setuptools, wheel) too.
echo "--- ${env_args[*]} pip install --no-index --no-build-isolation $work/src"
start=$SECONDS
env "${env_args[@]}" "$venv/bin/pip" install -v --no-index --no-build-isolation "$work/src" >"$work/pip.log" 2>&1 ||
  { tail -n 60 "$work/pip.log"; fail "pip install failed (log: $work/pip.log)"; }
grep 'strata setup.py: packaged' "$work/pip.log" || true
echo "--- pip install took $((SECONDS - start)) s"

cd "$work/elsewhere"
site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['platlib'])")
pkg=$site/strata
[[ -f $pkg/__init__.py && -x $pkg/bin/strata && -e $pkg/lib/libstrata.so.0 ]] ||
  fail "the installed package lacks __init__.py, bin/strata or lib/libstrata.so.0: $(ls -R "$pkg")"
for so in "$pkg"/_strata*.so "$pkg/bin/strata"; do
  ! ldd "$so" | grep 'not found' || fail "$so misses libraries"
  loaded=$(ldd "$so" | awk '$1 == "libstrata.so.0" { print $3 }')
  [[ -n $loaded && $(realpath "$loaded") == $(realpath "$pkg/lib/libstrata.so.0") ]] ||
    fail "$so does not load the package's own libstrata (it loads '$loaded')"
done

torch_expected=0
"$python" -c "import torch.distributed" 2>/dev/null && [[ -n $(ls "$pkg"/_strata_torch*.so 2>/dev/null) ]] && torch_expected=1
if [[ $mode == clean ]] && "$python" -c "import torch.distributed" 2>/dev/null && ((!torch_expected)); then
  grep -i "torch backend" "$work/pip.log" || true
  echo "(torch is installed but the wheel has no torch backend: the configure output above says why)"
fi

echo "--- import strata from $PWD"
"$venv/bin/python" - "$pkg" "$torch_expected" <<'PY'
import os, sys
import strata
pkg, torch_expected = sys.argv[1], sys.argv[2] == "1"
assert os.path.dirname(os.path.realpath(strata.__file__)) == os.path.realpath(pkg), strata.__file__
ok, why = strata.torch_backend_status()
print(f"strata {strata.__version__} from {os.path.dirname(strata.__file__)}; torch backend: {ok} ({why})")
assert ok or not torch_expected, why
PY

cat >"$work/elsewhere/job.py" <<'PY'
import sys
import strata
comm = strata.init()
a = comm.empty((1024,), "float32")
a[:] = comm.rank + 1
comm.all_reduce(a)
assert (a == comm.size * (comm.size + 1) / 2).all(), a[:4]
if sys.argv[1] == "1":
    import torch
    import torch.distributed as dist
    dist.init_process_group("strata")
    t = torch.full((1000,), float(comm.rank + 1))
    dist.all_reduce(t)
    assert (t == 3).all(), t[:4]
print(f"rank {comm.rank}: OK", flush=True)
PY
echo "--- $venv/bin/strata run -n 2 $venv/bin/python job.py"
PATH=$venv/bin:$PATH timeout -k 5 120 strata run -n 2 python job.py "$torch_expected" >"$work/run.log" 2>&1 ||
  { cat "$work/run.log"; fail "strata run failed"; }
cat "$work/run.log"
[[ $(grep -c ': OK' "$work/run.log") -eq 2 ]] || fail "not both ranks said OK"
! grep -q "could not register" "$work/run.log" || fail "the torch backend's registration failed"
echo "pip_test($mode): OK"
