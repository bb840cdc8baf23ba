#!/usr/bin/env bash
# Shared set-up for scripts/run and scripts/test: install missing Debian
# packages (as root; otherwise print the apt-get line and stop), configure
# build/ once, and build incrementally. Idempotent and quick when nothing changed.
set -euo pipefail

NG_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NG_BUILD="${NG_BUILD:-$NG_ROOT/build}"
# What the library and the CLI need (scripts/run installs these alone)...
NG_PACKAGES=(cmake make g++ libdnnl-dev libtbb-dev libgtest-dev googletest nlohmann-json3-dev
             libxbyak-dev libbenchmark-dev ocl-icd-opencl-dev pkg-config libcli11-dev)
# ...and the optional parts and test tools scripts/test adds (ng_add_test_packages):
# MPI, Python and torch (libtorch-dev: c10's headers, for the pool allocator), lit and
# FileCheck, graphviz, clang-format.
NG_TEST_PACKAGES=(clang-format libopenmpi-dev openmpi-bin pybind11-dev python3-dev python3-numpy
                  python3-torch libtorch-dev python3-pytest python3-torchvision llvm-16-tools
                  graphviz
                  python3-venv python3-pip python3-setuptools python3-wheel)
NG_INSTALLED=0  # set when ng_install_deps installed something: the build then configures again

ng_add_test_packages() { NG_PACKAGES+=("${NG_TEST_PACKAGES[@]}"); }

ng_install_deps() {
  local missing=()
  for p in "${NG_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "normgrad needs these Debian packages; install them with:" >&2
    echo "  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  echo "== installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
  NG_INSTALLED=1
}

# ng_build [TARGET...]: configure once, then build the targets (all by default).
ng_build() {
  # Configured once; again after an install, so that optional parts found
  # missing before (MPI, Python, lit) are searched for anew.
  if [ ! -f "$NG_BUILD/CMakeCache.txt" ] || [ "$NG_INSTALLED" = 1 ]; then
    echo "== configuring $NG_BUILD"
    cmake -S "$NG_ROOT" -B "$NG_BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
  fi
  echo "== building${*:+ $*}"
  if [ $# -gt 0 ]; then
    cmake --build "$NG_BUILD" -j "$(nproc)" --target "$@"
  else
    cmake --build "$NG_BUILD" -j "$(nproc)"
  fi
}
