#!/usr/bin/env bash
# The synchronized batch norm (backward and forward) across processes, on
# loopback with `mpirun --oversubscribe`:
#  - every sync graph (examples/graphs/sync, tests/data/sync) with the batch
#    split over 2 and 3 processes (uneven slices) and over 4 (the batch-3
#    graph then gives rank 0 an empty slice), checked against ref on the
#    full batch, on auto and on ref;
#  - a shape mismatch, a process failing before the collective, and one that
#    never joins (timeout): clean errors, no hang;
#  - bitwise identical outputs run to run;
#  - `bench --shard-batch` runs.
# Usage: run_mpi.sh NORMGRAD_CLI MPI_SYNC_CHECK SOURCE_DIR MPIEXEC
set -uo pipefail
cli="$1"; check="$2"; src="$3"; mpiexec="$4"
export OMPI_MCA_btl="self,vader,tcp" OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
fail=0
run() {  # run NP ARGS...: mpirun under a wall-clock bound (BOUND, 300 s), output captured
  local np="$1"; shift
  timeout "${BOUND:-300}" "$mpiexec" -np "$np" --oversubscribe "$@" 2>&1
}

for g in "$src"/examples/graphs/sync/*.json "$src"/tests/data/sync/*.json; do
  for np in 2 3; do
    for backend in auto ref; do
      out="$(run "$np" "$cli" run "$g" --shard-batch --check --backend "$backend")"
      if ! grep -q '^PASSED$' <<<"$out"; then
        echo "FAIL np=$np $backend $g"; echo "$out"; fail=1
      else
        echo "ok   np=$np $backend $(basename "$g")"
      fi
    done
  done
done
g="$src/examples/graphs/sync/bn_sync_backward_bf16_ncx_relu.json"   # batch 3
out="$(run 4 "$cli" run "$g" --shard-batch --check)"
if grep -q 'rows 0\.\.0' <<<"$out" && grep -q '^PASSED$' <<<"$out"; then
  echo "ok   np=4 with an empty slice"
else
  echo "FAIL np=4 with an empty slice"; echo "$out"; fail=1
fi

# The synchronized forward at 1e4 from zero (statistics merged without
# cancellation), and with a batch of 5 over 6 processes (rank 0 holds none).
for g in "$src"/examples/graphs/sync/bn_sync_forward_*.json; do
  out="$(run 2 "$cli" run "$g" --shard-batch --check --data-offset 1e4)"
  if grep -q '^PASSED$' <<<"$out"; then
    echo "ok   np=2 offset 1e4 $(basename "$g")"
  else
    echo "FAIL np=2 offset 1e4 $g"; echo "$out"; fail=1
  fi
done
g="$src/examples/graphs/sync/bn_sync_forward_f32_ncx.json"   # batch 5
out="$(run 6 "$cli" run "$g" --shard-batch --check)"
if grep -q 'rows 0\.\.0' <<<"$out" && grep -q '^PASSED$' <<<"$out"; then
  echo "ok   np=6 forward with an empty slice"
else
  echo "FAIL np=6 forward with an empty slice"; echo "$out"; fail=1
fi

for np in 2 3; do
  for mode in mismatch fail-early eps-mismatch dtype-mismatch; do
    out="$(run "$np" "$check" "$mode")"
    if [ "$(grep -c ': expected: ' <<<"$out")" -eq "$np" ] && ! grep -q UNEXPECTED <<<"$out"; then
      echo "ok   np=$np $mode: a clean error on every rank"
    else
      echo "FAIL np=$np $mode"; echo "$out"; fail=1
    fi
  done
  # A rank that exits without MPI_Finalize: mpirun ends the job; no rank may
  # hang or report success.
  for mode in exit-before exit-between; do
    start=$(date +%s)
    out="$(BOUND=120 run "$np" "$check" "$mode")"
    rc=$?
    took=$(( $(date +%s) - start ))
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$took" -lt 100 ] && ! grep -q UNEXPECTED <<<"$out"; then
      echo "ok   np=$np $mode: the job ended in ${took}s (exit $rc)"
    else
      echo "FAIL np=$np $mode (exit $rc, ${took}s)"; echo "$out"; fail=1
    fi
  done
done
start=$(date +%s)
out="$(BOUND=90 NORMGRAD_COLLECTIVE_TIMEOUT=3 run 2 -x NORMGRAD_COLLECTIVE_TIMEOUT "$check" timeout)"
took=$(( $(date +%s) - start ))
if grep -q 'rank 0: expected: .*deadline_exceeded' <<<"$out" && [ "$took" -lt 60 ]; then
  echo "ok   timeout: rank 0 gave up after ${took}s"
else
  echo "FAIL timeout (${took}s)"; echo "$out"; fail=1
fi
a="$(run 2 "$check" bits | sort)"; b="$(run 2 "$check" bits | sort)"
if [ "$a" = "$b" ] && grep -q 'rank 1: hash .* same' <<<"$a" && ! grep -q DIFFERENT <<<"$a"; then
  echo "ok   bits: identical run to run"
else
  echo "FAIL bits"; echo "$a"; echo "$b"; fail=1
fi
out="$(run 2 "$cli" bench --shard-batch --threads 1 --iters 3 --dt f32,bf16 --layouts NCX,NXC)"
if grep -q 'collective' <<<"$out" && grep -q '2x192x71x71 bf16 NXC' <<<"$out"; then
  echo "ok   bench --shard-batch"
else
  echo "FAIL bench --shard-batch"; echo "$out"; fail=1
fi
g="$src/tests/data/cli/fuse_elementwise.json"
one="$(run 1 "$cli" opt "$g" --text)"; two="$(run 2 "$cli" opt "$g" --text)"
if [ -n "$one" ] && [ "$one" = "$two" ]; then
  echo "ok   opt under mpirun prints once"
else
  echo "FAIL opt under mpirun"; echo "$two"; fail=1
fi
[ "$fail" -eq 0 ] && echo "mpi: all passed"
exit "$fail"
