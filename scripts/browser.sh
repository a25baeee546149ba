#!/usr/bin/env bash
# The dashboard's browser tests drive Debian's Chromium (playwright never
# downloads a browser here). Installs it with apt when missing and we are root;
# otherwise says how (the tests then skip, unless MARLAAS_REQUIRE_BROWSER=1).
set -euo pipefail
browser=${MARLAAS_CHROMIUM:-/usr/bin/chromium}
if [[ -x $browser ]]; then
  echo "[setup] browser for the dashboard tests: $browser"
  exit 0
fi
if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
  echo "[setup] installing Debian's chromium for the dashboard tests (apt)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    chromium fonts-dejavu-core >/dev/null
  exit 0
fi
echo "[setup] no Chromium at $browser: 'sudo apt-get install chromium' (or set" \
  "MARLAAS_CHROMIUM) for the dashboard's browser tests" >&2
