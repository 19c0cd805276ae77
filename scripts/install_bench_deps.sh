#!/usr/bin/env bash
# Installs what the peer benchmarks need (Open MPI, torch with gloo, numpy, matplotlib), only
# if something is missing. Idempotent: when everything is there it changes nothing and needs
# no network. The build itself needs scripts/install_deps.sh.
#
#   scripts/install_bench_deps.sh            # install what is missing
#   scripts/install_bench_deps.sh --check    # list what is missing and exit 1; install nothing
#
# Works as root without sudo and as a user with sudo.
set -euo pipefail

PACKAGES=(
  openmpi-bin          # mpirun
  libopenmpi-dev       # mpi.h, libmpi (bench/peers/mpi_bench)
  python3-torch        # torch.distributed gloo (bench/peers/torch_bench.py)
  python3-numpy
  python3-matplotlib   # plots of scripts/perf_report.py and strata bench --plot
  iperf3               # link probe of scripts/bench_multihost.sh
  linux-perf           # scripts/profile_hotspots.sh
)

check_only=0
case "${1:-}" in
  --check) check_only=1 ;;
  "") ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

missing=()
for p in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install_bench_deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi
echo "install_bench_deps: missing: ${missing[*]}"
[[ $check_only -eq 1 ]] && exit 1

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install_bench_deps: not root and no sudo" >&2; exit 1; }
  SUDO=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update
"${SUDO[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
echo "install_bench_deps: installed ${missing[*]}"
