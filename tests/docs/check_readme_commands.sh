#!/usr/bin/env bash
# Runs every `build/bin/normgrad ...` command line (also under `mpirun`, and
# the `PYTHONPATH=build/python /usr/bin/python3 ...` ones) of README.md and
# docs/getting-started.md from the repository root, so the documented
# commands cannot rot silently: each must exit 0. Comments and a trailing
# `| dot ...` pipe are dropped; the binary is the one under test.
# Usage: check_readme_commands.sh NORMGRAD_CLI SOURCE_DIR
set -uo pipefail
cli="$1"; root="$2"
cd "$root"
if [ "$(id -u)" -eq 0 ]; then  # the documented mpirun lines, as root in CI
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
n=0; bad=0
while IFS= read -r line; do
  cmd="${line%%#*}"                # drop a trailing comment
  cmd="${cmd%%| dot*}"             # the Graphviz step is not ours
  cmd="$(echo "$cmd" | sed -E "s@(\"\\\$OLDPWD\"/|(\.\./)*)build/bin/normgrad@$cli@g; s@/tmp/out@$work/out@g")"
  n=$((n + 1))
  if ! out=$(timeout 600 bash -c "$cmd" 2>&1 > "$work/stdout"); then
    echo "FAIL: $line"; echo "$out" | tail -3; bad=$((bad + 1))
  else
    echo "ok: $line"
  fi
done < <(grep -hE '^(NORMGRAD_[A-Z_]+=[^ ]+ )?(cd [^ ]+ && )?(mpirun -np [0-9]+ --oversubscribe )?("\$OLDPWD"/|(\.\./)*)build/bin/normgrad |^PYTHONPATH=build/python /usr/bin/python3 ' README.md docs/getting-started.md)
echo "$n documented commands, $bad failed"
[ "$n" -gt 0 ] && [ "$bad" -eq 0 ]
