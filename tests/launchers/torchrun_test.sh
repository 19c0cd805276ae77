#!/usr/bin/env bash
# torchrun: a Python program meets through torch's own store (rank 0 serves a Strata store and
# publishes it there), a C++ program through a `strata store` named by STRATA_STORE.
# usage: torchrun_test.sh PYTHON PYTHONPATH_OF_THE_BUILD WORKER_PY
set -euo pipefail
source "$(dirname "$0")/common.sh"
python=$1 pypath=$2 worker=$3

TORCHRUN=$(command -v torchrun || true)
[[ -n $TORCHRUN ]] || skip "torchrun is not installed (Debian: apt-get install python3-torch)"
"$python" -c "import torch.distributed" 2>/dev/null || skip "$python cannot import torch.distributed"
[[ -n $(find "$pypath/strata" -name '_strata_torch*.so' 2>/dev/null) ]] ||
  skip "the torch backend was not built (see the configure output)"

# --redirects/--tee 1: Debian's torch 1.13 torchrun cannot parse its own default ("0") under
# Python 3.11. torchrun starts the script with its own interpreter (sys.executable).
tr=("$python" "$TORCHRUN" --standalone --nproc_per_node 2 --redirects 1 --tee 1)
echo "--- torchrun (python, torch's store): ${tr[*]} $worker"
rc=0
PYTHONPATH=$pypath timeout -k 5 60 "${tr[@]}" "$worker" strata-first >"$WORK/py.log" 2>&1 || rc=$?
sed 's/^/    /' "$WORK/py.log"
[[ $rc -eq 0 ]] || fail "torchrun (python) exited with $rc"
# Each rank's own line; torchrun's --tee may join the two ranks' lines into one.
for r in 0 1; do
  grep -q "\[$r\] OK" "$WORK/py.log" || fail "torchrun (python): rank $r did not say OK"
done

start_store
run_case torchrun-cpp 2 "${tr[@]}" --no_python "$PROBE" 2
