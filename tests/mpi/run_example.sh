#!/usr/bin/env bash
# Runs an MPI example under `mpirun -np 2` on loopback (as root in CI too).
# Usage: run_example.sh MPIEXEC PROGRAM [ARGS...]
set -uo pipefail
mpiexec="$1"; shift
export OMPI_MCA_btl="self,vader,tcp" OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
timeout 240 "$mpiexec" -np 2 --oversubscribe "$@" 2>&1
