#!/usr/bin/env bash
# docs/cli.md documents every option that `normgrad <command> --help` lists
# (CLI11's options, and run's benchdnn knobs from its footer), and every
# command of the top-level usage. Prints what is missing; exit 1 if anything is.
# Usage: check_cli_docs.sh NORMGRAD_CLI SOURCE_DIR
set -uo pipefail
cli="$1"; doc="$2/docs/cli.md"
missing=0; checked=0
commands=$("$cli" 2>&1 | sed -nE 's/^  ([a-z]+) .*/\1/p')
[ -n "$commands" ] || { echo "no commands in the usage"; exit 1; }
for c in $commands; do
  if ! grep -q "normgrad $c" "$doc"; then echo "missing: the command '$c'"; missing=$((missing + 1)); fi
  opts=$("$cli" "$c" --help 2>&1 | grep -oE '(^|[ ,/])--?[a-z][a-z0-9-]*' | sed -E 's/^[ ,/]//' | sort -u)
  for o in $opts; do
    case "$o" in -h|--help|-v) continue ;; esac
    checked=$((checked + 1))
    if ! grep -qF -- "$o" "$doc"; then echo "missing: $c $o"; missing=$((missing + 1)); fi
  done
done
echo "$checked options of $(echo $commands | wc -w) commands checked, $missing missing"
[ "$missing" -eq 0 ]
