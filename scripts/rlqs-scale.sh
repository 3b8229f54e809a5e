#!/usr/bin/env bash
# The quota service's upkeep at scale: starts a Redis and the release sluice-server (with
# envoy/rlqs/) on free loopback ports, runs scripts/rlqs-scale.py against them, and stops both.
#
#   scripts/rlqs-scale.sh 50000 0.1      # 50,000 buckets, a tenth of them busy
#   scripts/rlqs-scale.sh 50000 0.1 4    # four such streams
#
# SERVER_BIN runs another build of sluice-server (to compare two); SETTLE_S and MEASURE_S set
# how long scripts/rlqs-scale.py settles and measures.
set -euo pipefail
cd "$(dirname "$0")/.."
buckets=${1:-50000}
busy=${2:-0.1}
streams=${3:-1}
free_port() { .venv/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
redis_port=$(free_port)
server_port=$(free_port)
dir=$(mktemp -d)
trap 'kill "$server" 2>/dev/null; redis-cli -p "$redis_port" shutdown nosave >/dev/null 2>&1; rm -rf "$dir"' EXIT
redis-server --port "$redis_port" --bind 127.0.0.1 --dir "$dir" --save '' --daemonize yes >/dev/null
"${SERVER_BIN:-target/release/sluice-server}" --listen "127.0.0.1:$server_port" --redis "redis://127.0.0.1:$redis_port" \
  --rlqs-config envoy/rlqs >"$dir/server.log" 2>&1 &
server=$!
sleep 1
.venv/bin/python scripts/rlqs-scale.py "127.0.0.1:$server_port" "$server" "$redis_port" "$buckets" "$busy" "$streams"
