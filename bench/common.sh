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

# Builds bench target NAME of PACKAGE (the sluice crate by default) and prints its
# executable's path.
bench_binary() { # name [package]
  local log
  log=$(mktemp)
  if ! cargo bench -p "${2:-sluice}" --bench "$1" --no-run --message-format=json >"$log" 2>"$log.err"; then
    echo "building the $1 bench failed:" >&2
    cat "$log.err" >&2
    rm -f "$log" "$log.err"
    return 1
  fi
  python3 -c '
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == sys.argv[2] and m.get("executable"):
        print(m["executable"])
' "$log" "$1" | tail -1
  rm -f "$log" "$log.err"
}

# Runs a command under valgrind TOOL (callgrind, or cachegrind with a simulated cache whose
# last level is LL_CACHE, default 2 MiB 16-way) and prints its event totals, one line
# "Ir=… D1mr=… …" (the events the tool counted, by name).
valgrind_totals() { # tool command...
  local tool=$1 out
  shift
  out=$(mktemp)
  local args=(--tool="$tool")
  case $tool in
    callgrind) args+=(--callgrind-out-file="$out") ;;
    cachegrind) args+=(--cachegrind-out-file="$out" --cache-sim=yes --LL="${LL_CACHE:-2097152,16,64}") ;;
  esac
  if ! valgrind "${args[@]}" "$@" >/dev/null 2>"$out.err"; then
    echo "valgrind $tool $* failed:" >&2
    cat "$out.err" >&2
    rm -f "$out" "$out.err"
    return 1
  fi
  awk '/^events:/ {n = split($0, names, " ")} /^(summary|totals):/ {
    line = ""; for (i = 2; i <= NF; i++) line = line (i > 2 ? " " : "") names[i] "=" $i; print line; exit}' "$out"
  rm -f "$out" "$out.err"
}

# One event's total from a valgrind_totals line.
event() { # totals_line event
  tr ' ' '\n' <<<"$1" | awk -F= -v e="$2" '$1 == e {print $2}'
}

# CPU time the processes (a space-separated list) have used, in clock ticks (user + system):
# a server's cost per request, which other load on the machine disturbs far less than its
# throughput.
ticks() { # pids
  local pid total=0
  for pid in $1; do total=$((total + $(awk '{print $14 + $15}' "/proc/$pid/stat"))); done
  echo "$total"
}

# The median of the numbers on stdin, one per line.
# Builds revision REV's sluice (its sources under target/baseline/src-REV, its build in a
# target directory of its own: two revisions' crates share names and versions, and cargo does
# not tell their builds apart in one directory) and prints the binary's path.
baseline_binary() { # rev
  local rev src
  rev=$(git rev-parse --short "$1")
  src="target/baseline/src-$rev"
  [ -d "$src" ] || { mkdir -p "$src"; git archive "$rev" | tar -x -C "$src"; }
  CARGO_TARGET_DIR="$PWD/target/baseline/target-$rev" cargo build --release -q -p sluice-cli \
    --manifest-path "$src/Cargo.toml" >&2
  echo "target/baseline/target-$rev/release/sluice"
}

median() {
  sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'
}

# A scratch directory in $tmp and a list $pids of the processes a script starts, both cleaned
# up when the script exits (the processes killed, the directory removed).
scratch() {
  tmp=$(mktemp -d)
  pids=()
  trap clean_scratch EXIT
}
clean_scratch() {
  local pid
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}

# Starts DIR/nginx.conf (and makes DIR/logs): WORKERS workers, no access log, keep-alive
# connections never closed for their request count, the http block left open.
nginx_config_start() { # dir workers
  mkdir -p "$1/logs"
  cat > "$1/nginx.conf" <<EOF
worker_processes $2;
pid $1/nginx.pid;
error_log $1/logs/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 100000000;
EOF
}

# The proxy benchmarks' upstream, an nginx answering / as nginx's control in http.sh does, in
# DIR/nginx.conf (DIR/logs made); its stub_status (a location of its own, outside the measured
# path) counts the requests and connections it gets.
write_nginx_upstream_config() { # dir port workers
  nginx_config_start "$1" "$3"
  cat >> "$1/nginx.conf" <<EOF
  keepalive_timeout 3600s;
  server {
    listen 127.0.0.1:$2;
    location / { return 200 "Hello World!"; }
    location = /upstream-status { stub_status; }
  }
}
EOF
}

# nginx as a rate-limiting proxy in front of the upstream on UPSTREAM_PORT, in DIR/nginx.conf:
# one limit_req zone per account's quota (see bench/proxy.sh), limit refusals answered 429
# and not logged, admitted requests forwarded over kept-alive connections (at most POOL idle)
# with the forwarding headers sluice writes.
write_nginx_proxy_config() { # dir port upstream_port pool workers
  nginx_config_start "$1" "$5"
  cat >> "$1/nginx.conf" <<EOF
  # Each zone's key: the account's X-Account-ID for its own account, "" (not limited by that
  # zone) for any other. Every request is checked against exactly one zone.
  map \$http_x_account_id \$alice_key { alice@example.com \$http_x_account_id; default ""; }
  map \$http_x_account_id \$bench_key { bench@example.com \$http_x_account_id; default ""; }
  limit_req_zone \$alice_key zone=alice:10m rate=1r/s;
  limit_req_zone \$bench_key zone=bench:10m rate=1000000000r/s;
  upstream upstream_pool {
    server 127.0.0.1:$3;
    keepalive $4;
    keepalive_requests 100000000;
  }
  server {
    listen 127.0.0.1:$2;
    limit_req_status 429;
    # Refusals logged at info, below the error log's warn: nginx writes no line per refusal,
    # as sluice writes at most denied_log (5) a second.
    limit_req_log_level info;
    location / {
      limit_req zone=alice;
      limit_req zone=bench burst=1000000000 nodelay;
      proxy_pass http://upstream_pool;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host \$http_host;
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
      proxy_set_header Forwarded "for=\$remote_addr;proto=\$scheme";
      proxy_set_header X-Forwarded-Proto \$scheme;
    }
  }
}
EOF
}
