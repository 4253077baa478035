# Shared by the bench scripts: `source "$(dirname "$0")/common.sh"`.

# Installs the given Debian packages (needs root or sudo).
install_packages() {
  [ $# -gt 0 ] || return 0
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}

# Waits (up to TRIES tenths of a second, default 100) for `listening on URL` in the stdout file
# of a `sluice serve` and prints the URL; fails with the server's stderr if it never comes.
listening_url() { # stdout_file stderr_file [tries]
  local url=""
  for _ in $(seq "${3:-100}"); do
    url=$(sed -n 's/^listening on //p' "$1" 2>/dev/null)
    [ -n "$url" ] && break
    sleep 0.1
  done
  [ -n "$url" ] || { echo "sluice did not start:" >&2; cat "$2" >&2; return 1; }
  echo "$url"
}

# Writes the benchmarks' sluice config to FILE: the demo's bypass (admin@example.com), alice at
# 1/s as in the demo's wrk run, and an account whose quota no run reaches (bench@example.com).
write_bench_config() { # file
  cat > "$1" <<'YAML'
fetch_latency: 0s
bypass: [admin@example.com]
accounts:
  alice@example.com: 1/s
  bench@example.com: 1000000000/s
YAML
}
