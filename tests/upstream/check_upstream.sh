#!/usr/bin/env bash
# Every oneDNN upstream graph JSON loads and partitions (exit 0), and every
# batch-norm graph among them passes `normgrad run --mode=C` on auto; the
# forward ones (BatchNormInference, BatchNormForwardTraining) also on dnnl.
# Usage: check_upstream.sh NORMGRAD_CLI INPUTS_DIR [with_dnnl:0|1]; NORMGRAD_ONEDNN_INPUTS
# in the environment overrides INPUTS_DIR; without either it exits 77 (skipped).
set -uo pipefail
cli="$1"; with_dnnl="${3:-1}"
root="${NORMGRAD_ONEDNN_INPUTS:-${2:-}}"
if [ -z "$root" ] || [ ! -d "$root" ]; then
  echo "SKIP: NORMGRAD_ONEDNN_INPUTS is not set or not a folder ('$root'); point it at a oneDNN checkout's tests/benchdnn/inputs/graph to run oneDNN's own inputs"
  exit 77
fi
cd "$root"
files=0; bn=0; bad=0
while IFS= read -r f; do
  files=$((files + 1))
  if ! out=$("$cli" partitions "$f" 2>&1); then
    echo "FAIL partitions $f: $out" | head -3; bad=$((bad + 1)); continue
  fi
  grep -q '"kind": *"BatchNorm' "$f" || continue
  bn=$((bn + 1))
  backends="auto"
  if [ "$with_dnnl" = 1 ] && grep -q '"kind": *"BatchNorm\(Inference\|ForwardTraining\)' "$f"; then
    backends="auto dnnl"
  fi
  for b in $backends; do
    line=$("$cli" run --mode=C --backend="$b" --case="$f" 2>&1 | grep -E '^0:')
    case "$line" in
      0:PASSED*) ;;
      *) echo "FAIL run $b $f: $line"; bad=$((bad + 1)) ;;
    esac
  done
done < <(find . -name '*.json' | sort)
echo "$files graphs partitioned, $bn batch-norm graphs run, $bad failures"
[ "$files" -gt 0 ] && [ "$bad" -eq 0 ]
