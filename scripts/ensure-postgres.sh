#!/usr/bin/env bash
# Makes sure PostgreSQL's server programs (initdb, postgres) are installed: the PostgreSQL
# store's tests start their own server in a temporary directory. Idempotent and quiet: does
# nothing when they are present.
set -euo pipefail
if compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
log="$(mktemp)"
if ! { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends postgresql; } >"$log" 2>&1; then
  cat "$log" >&2
  rm -f "$log"
  echo "ensure-postgres: apt-get could not install postgresql" >&2
  exit 1
fi
rm -f "$log"
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || { echo "ensure-postgres: initdb still missing after apt-get install" >&2; exit 1; }
