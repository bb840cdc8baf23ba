#!/usr/bin/env bash
# oneDNN's own batch files, run unchanged from the root of its inputs the way
# benchdnn runs them: op/harness_*_ci, pattern/harness_*_ci, and the
# batch-norm lines of every *_all file. Checks that every batch reaches its
# summary line, every case printed a status, every batch-norm case PASSED and
# nothing is INVALID_ARGUMENTS (graphs we cannot run are UNIMPLEMENTED).
# Usage: run_batches.sh NORMGRAD_CLI INPUTS_DIR; NORMGRAD_ONEDNN_INPUTS in the
# environment overrides INPUTS_DIR; without either it exits 77 (skipped).
set -uo pipefail
cli="$1"
root="${NORMGRAD_ONEDNN_INPUTS:-${2:-}}"
if [ -z "$root" ] || [ ! -d "$root" ]; then
  echo "SKIP: NORMGRAD_ONEDNN_INPUTS is not set or not a folder ('$root'); point it at a oneDNN checkout's tests/benchdnn/inputs/graph to run oneDNN's own inputs"
  exit 77
fi
cd "$root"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
bad=0; batches=0
check() {  # name log
  local name="$1" log="$2"
  local summary statuses tests
  summary=$(grep -E '^tests:[0-9]+ passed:[0-9]+ skipped:[0-9]+ mistrusted:0 unimplemented:[0-9]+ invalid_arguments:[0-9]+ failed:[0-9]+ listed:[0-9]+$' "$log")
  if [ -z "$summary" ] || ! grep -qE '^total: [0-9.]+s;' "$log"; then
    echo "FAIL $name: no summary"; tail -3 "$log"; bad=$((bad + 1)); return
  fi
  tests=$(echo "$summary" | sed 's/^tests:\([0-9]*\).*/\1/')
  statuses=$(grep -cE '^[0-9]+:(PASSED|SKIPPED|UNIMPLEMENTED|INVALID_ARGUMENTS|FAILED|EXECUTED).* ms\) __REPRO: ' "$log")
  [ "$tests" = "$statuses" ] || { echo "FAIL $name: $statuses status lines for $tests tests"; bad=$((bad + 1)); }
  if grep -qE '^[0-9]+:INVALID_ARGUMENTS' "$log"; then
    echo "FAIL $name: INVALID_ARGUMENTS"; grep -E '^[0-9]+:INVALID_ARGUMENTS' "$log" | head -3; bad=$((bad + 1))
  fi
  if grep -E '^[0-9]+:' "$log" | grep -E 'bnorm|bn_' | grep -vq ':PASSED'; then
    echo "FAIL $name: a batch-norm case did not pass"
    grep -E '^[0-9]+:' "$log" | grep -E 'bnorm|bn_' | grep -v ':PASSED' | head -3; bad=$((bad + 1))
  fi
  batches=$((batches + 1))
  echo "$name: $summary"
}
for b in op/harness_*_ci pattern/harness_*_ci; do
  [ -f "$b" ] || continue
  "$cli" run --batch="$b" > "$work/log" 2>&1
  check "$b" "$work/log"
done
grep -hE 'bnorm|bn_' op/harness_*_all pattern/harness_*_all > "$work/bn_all" 2>/dev/null
if [ -s "$work/bn_all" ]; then
  "$cli" run --batch="$work/bn_all" > "$work/log" 2>&1
  check "batch-norm lines of *_all" "$work/log"
fi
echo "$batches batches, $bad failures"
[ "$batches" -gt 0 ] && [ "$bad" -eq 0 ]
