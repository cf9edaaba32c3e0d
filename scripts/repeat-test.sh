#!/usr/bin/env bash
# Runs one test file N times in a row (node with tap's TypeScript loader, as tap runs it), printing a pass
# count; the output of each failed run is kept in $LOGDIR (default /tmp/repeat-test.<pid>).
#   scripts/repeat-test.sh 200 test/flow/flow-between-scrapes.test.ts
set -u
n=${1:?usage: repeat-test.sh N test-file}
file=${2:?usage: repeat-test.sh N test-file}
cd "$(dirname "$0")/.."
logdir=${LOGDIR:-/tmp/repeat-test.$$}
mkdir -p "$logdir"
loader="file://$PWD/node_modules/@tapjs/typescript/dist/esm/import.mjs"
pass=0
fail=0
start=$(date +%s)
for i in $(seq 1 "$n"); do
  if out=$(TS_NODE_TRANSPILE_ONLY=1 timeout 300 node --import="$loader" --enable-source-maps "$file" 2>&1) && ! grep -q '^\s*not ok' <<<"$out"; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    printf '%s\n' "$out" > "$logdir/fail-$i.log"
    echo "run $i failed: $logdir/fail-$i.log" >&2
  fi
done
echo "$file: $pass/$n passed, $fail failed ($(( $(date +%s) - start )) s)"
[ "$fail" -eq 0 ]
