#!/usr/bin/env bash
# Makes sure Debian's Chromium and ChromeDriver are installed: the admin console's browser test
# drives a headless Chromium through ChromeDriver. Idempotent and quiet: does nothing when both
# are present.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
log="$(mktemp)"
if ! { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver; } >"$log" 2>&1; then
  cat "$log" >&2
  rm -f "$log"
  echo "ensure-chromium: apt-get could not install chromium and chromium-driver" >&2
  exit 1
fi
rm -f "$log"
command -v chromedriver >/dev/null 2>&1 || { echo "ensure-chromium: chromedriver still missing after apt-get install" >&2; exit 1; }
