#!/usr/bin/env bash
# Sends a burst through the compose example's Envoy and checks that sluice limits it: the first
# requests pass, then 429s carry Retry-After and the X-RateLimit-* headers.
#
#   docker compose -f envoy/docker-compose.yml up -d --build && bash envoy/smoke.sh
set -euo pipefail
url="${1:-http://localhost:10000/}"
burst=20   # envoy.yaml: per-ip gcra, rate 10/s, burst 20

for _ in $(seq 60); do
  code=$(curl -s -o /dev/null -w '%{http_code}' "$url" || true)
  [ "$code" = "200" ] && break
  sleep 1
done
[ "$code" = "200" ] || { echo "smoke: Envoy never answered 200 at $url (last: $code)" >&2; exit 1; }
sleep 3   # let the probe's budget refill

passed=0 limited=0 headers=""
for i in $(seq 40); do
  out=$(curl -s -D - -o /dev/null "$url")
  code=$(printf '%s' "$out" | head -1 | awk '{print $2}')
  if [ "$code" = "200" ]; then passed=$((passed + 1)); fi
  if [ "$code" = "429" ]; then
    limited=$((limited + 1))
    headers=$(printf '%s' "$out" | tr -d '\r')
  fi
done
echo "smoke: $passed passed, $limited limited"
[ "$passed" -ge "$burst" ] || { echo "smoke: fewer than $burst requests passed" >&2; exit 1; }
[ "$limited" -ge 10 ] || { echo "smoke: the burst was not limited" >&2; exit 1; }
for h in retry-after x-ratelimit-limit x-ratelimit-remaining x-ratelimit-reset; do
  printf '%s\n' "$headers" | grep -qi "^$h: " || { echo "smoke: a 429 lacks $h:" >&2; printf '%s\n' "$headers" >&2; exit 1; }
done
printf '%s\n' "$headers" | grep -qi '^x-ratelimit-remaining: 0$' || { echo "smoke: a 429 with remaining quota" >&2; exit 1; }
echo "smoke: ok"
