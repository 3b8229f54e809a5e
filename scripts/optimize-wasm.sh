#!/usr/bin/env bash
# Shrinks each .wasm given with binaryen's wasm-opt, in place: V8 compiles every function of
# a module with TurboFan before Envoy can start (proxy-wasm turns Liftoff off), on the main
# thread's watch, so every byte is paid at each start. -Os, not -Oz: -Oz's module was 6 KB
# smaller and took V8 in Envoy 270 to 296 ms to compile against 206 to 241 for -Os's
# (`Base Wasm created` to `_initialize` in Envoy's debug log, 4 runs each, 2026-11-26).
set -euo pipefail

if ! command -v wasm-opt >/dev/null 2>&1; then
  echo "optimize-wasm: wasm-opt not found: install binaryen (scripts/setup.sh does)" >&2
  exit 1
fi

for wasm in "$@"; do
  # Cargo links its build output here again on every build, changed or not: the optimized
  # module is kept beside it with the hash of the output it was made from.
  optimized="$wasm.optimized"
  from="$wasm.optimized.from"
  hash=$(sha256sum < "$wasm")
  if [ -f "$optimized" ] && [ -f "$from" ] && [ "$(cat "$from")" = "$hash" ]; then
    cp "$optimized" "$wasm.tmp"
    mv "$wasm.tmp" "$wasm"
    continue
  fi
  [ -f "$optimized" ] && [ "$hash" = "$(sha256sum < "$optimized")" ] && continue
  before=$(stat -c %s "$wasm")
  # The features Rust's wasm32-wasip1 target enables by default (1.87 and later).
  wasm-opt -Os --strip-debug --strip-producers --enable-bulk-memory --enable-sign-ext \
    --enable-mutable-globals --enable-nontrapping-float-to-int --enable-multivalue \
    --enable-reference-types "$wasm" -o "$optimized"
  echo "$hash" > "$from"
  cp "$optimized" "$wasm.tmp"
  mv "$wasm.tmp" "$wasm"
  echo "optimize-wasm: $(basename "$wasm"): $before -> $(stat -c %s "$wasm") bytes"
done
