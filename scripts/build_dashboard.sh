#!/usr/bin/env bash
# Bundle the dashboard (dashboard/: uPlot + our modules, esbuild) into the
# package data the service serves (areal_marlaas/service/dashboard/assets).
# Idempotent: skipped when the bundle is newer than its sources and lock file.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
src=$here/dashboard
out=$here/areal_marlaas/service/dashboard/assets
stamp=$out/.stamp
want=$(cat "$src/package-lock.json" "$src/package.json" "$src"/src/* | sha256sum | cut -c1-16)
if [[ -f $stamp && $(cat "$stamp") == "$want" && -f $out/app.js && -f $out/app.css ]]; then
  echo "[setup] dashboard bundle is up to date"
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "[setup] npm not found: install Node.js >= 18 and npm to build the dashboard" >&2
  exit 1
fi
echo "[setup] building the dashboard bundle (npm ci + esbuild)"
cd "$src"
# The registry only: no install scripts are needed (esbuild's binary comes in
# its platform package).
npm ci --no-audit --no-fund --ignore-scripts --silent
npm run --silent build
echo "$want" >"$stamp"
