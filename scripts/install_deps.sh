#!/usr/bin/env bash
# Installs the Debian packages Strata needs to build and test, only if some are missing.
# Idempotent: when everything is present it changes nothing and needs no network.
#
#   scripts/install_deps.sh            # packages for build + tests
#   scripts/install_deps.sh --check    # exit 1 and list what is missing, install nothing
#   STRATA_EXTRA_DEPS="libucx-dev openmpi-bin" scripts/install_deps.sh   # add packages ad hoc
#
# Works as root without sudo (fresh Debian 12 container) and as a user with sudo.
set -euo pipefail

# One package per line; add new groups here as layers need them.
PACKAGES=(
  # toolchain
  build-essential
  g++
  cmake
  ninja-build
  pkg-config
  # make format / format-check (.ci/run fails on an unformatted file), make lint
  clang-format
  clang-tidy
  # tests and benchmarks
  libgtest-dev
  googletest
  libbenchmark-dev
  # multi-host tests (network namespaces, veth)
  iproute2
  # helper scripts
  python3
  # python/ bindings: the _strata extension, its tests, the torch.distributed backend
  # (torch and its C++ headers for the c10d ProcessGroup)
  python3-dev
  pybind11-dev
  python3-numpy
  python3-pytest
  python3-torch
  libtorch-dev
  # `pip install .` without network: the build backend's setuptools/wheel come from Debian
  python3-setuptools
  python3-wheel
  python3-venv
  # tests/launchers: real launchers start Strata programs (each test skips, saying why, without
  # its launcher): a one-node Slurm cluster (auth/none, no munged needed), MPICH's mpiexec
  # (mpiexec.mpich; Open MPI keeps the mpirun/mpiexec names by priority), Open MPI's mpirun
  slurmctld
  slurmd
  slurm-client
  mpich
  openmpi-bin
  # make demo: the plot of Strata next to Open MPI and gloo
  python3-matplotlib
  # transport/ucx: ranks on other hosts (UCX 1.13 in Debian 12); the build skips it when absent
  libucx-dev
  # tests/fuzz: libFuzzer targets (built with clang; skipped, saying why, without them)
  clang-14
  libfuzzer-14-dev
  # examples/moe_layer: sgemm for the experts (the example falls back to its own kernel without it)
  libopenblas-dev
  # (Open MPI, matplotlib for `make bench`: scripts/install_bench_deps.sh)
)
# shellcheck disable=SC2206
PACKAGES+=(${STRATA_EXTRA_DEPS:-})

check_only=0
case "${1:-}" in
  --check) check_only=1 ;;
  "") ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "install_deps: dpkg-query not found; this script supports Debian/Ubuntu only." >&2
  echo "install_deps: install by hand: ${PACKAGES[*]}" >&2
  exit 1
fi

missing=()
for pkg in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
  if [[ "$status" != "installed" ]]; then
    missing+=("$pkg")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install_deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "install_deps: missing: ${missing[*]}"
if [[ $check_only -eq 1 ]]; then
  exit 1
fi

if [[ $(id -u) -eq 0 ]]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1; then
  as_root=(sudo)
else
  echo "install_deps: not root and no sudo; install as root: apt-get install ${missing[*]}" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get update
"${as_root[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
echo "install_deps: installed ${missing[*]}"
