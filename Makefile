# sluice: global rate limiting for Envoy.
#
#   make demo    replay a trace through the filter and print the report
#                (RLS=1: through Envoy's native rate limit filter and envoy/ratelimit/)
#   make test    every test
#   make bench   measure sluice against its baselines (writes BENCHMARKS.md)
#
# Both install what a fresh machine lacks first (scripts/setup.sh).

CARGO  ?= cargo
WASM   := target/wasm32-wasip1/wasm/sluice_filter.wasm
# The demo's simulator: the profile and the packages the tests build (Cargo.toml), so that
# `make test` after `make demo` builds only the tests.
SIM    := target/debug/sluice-sim
DEMO   := target/demo
# make demo TRACE=/path/to/access.log   (any access log)
TRACE  ?=
# Without TRACE the demo replays this real access log, read in place, where the checkout has
# it (the project's own working copies keep real traces beside the repository); a user's
# clone has none and replays a synthetic trace generated from a fixed seed instead.
REAL_TRACE := ../shared/traces/zanbil_access_10k.log
POLICY ?= examples/policy.json
# Extra replay flags, e.g. ARGS="--sort --instances 3"
ARGS   ?=
# make demo RLS=1   the same trace through Envoy's native rate limit filter instead of the
# .wasm: the routes of envoy/envoy-ratelimit.yaml and the limits of envoy/ratelimit/.
RLS    ?=
ifeq ($(RLS),)
THROUGH = --wasm $(WASM) --policy $(POLICY)
else
THROUGH = --envoy-config envoy/envoy-ratelimit.yaml --rls-config envoy/ratelimit
endif

# The demo's build and the unit and doc tests name the same packages: with a different set,
# Cargo unifies the dependencies' features differently (hashbrown's, through the filter's
# proxy-wasm) and builds wasmtime and two dozen other crates a second time. (So Cargo warns,
# rightly, that the filter, a cdylib, has no doc tests.)
TESTED := --workspace --exclude sluice-probe --exclude sluice-noop-filter

.PHONY: all setup filter wasm module build demo test bench schema lint fmt clean

all: build

setup:
	@bash scripts/setup.sh

# The filter alone: all the demo runs.
filter: setup
	$(CARGO) build -p sluice-filter --target wasm32-wasip1 --profile wasm
	@bash scripts/optimize-wasm.sh $(WASM)

# The filter, the probe filter the simulator's fidelity tests load, and the no-op filter
# make bench measures the filter against. (Cargo resolves the filter's dependencies alike
# with and without the other two, so after `make filter` it builds only theirs.)
wasm: setup
	$(CARGO) build -p sluice-filter -p sluice-probe -p sluice-noop-filter --target wasm32-wasip1 --profile wasm
	@bash scripts/optimize-wasm.sh $(WASM) target/wasm32-wasip1/wasm/sluice_noop_filter.wasm

# The filter as a native Envoy dynamic module: target/module/libsluice_module.so (Cargo's
# `module` profile), which Envoy loads from ENVOY_DYNAMIC_MODULES_SEARCH_PATH (docs/module.md).
module: setup
	$(CARGO) build --profile module -p sluice-module

# The binaries as they ship: the tuned release profile.
build: wasm module
	$(CARGO) build --release -p sluice-sim -p sluice-server

# Builds only what it runs: the filter and the simulator (which runs the server in process),
# in the tests' profile and with their features, so that `make test` then builds only the
# tests. Cargo unifies the dev-dependencies' features (hashbrown's, num-traits', sluice-core's
# `schema`) only when it builds a target that has them: the bench's small example `floor` is
# that target here (without it, `make test` built wasmtime and 90 other crates again).
demo: filter
	$(CARGO) build $(TESTED) --bin sluice-sim --example floor
	@mkdir -p $(DEMO)
	@trace='$(TRACE)'; \
	if [ -z "$$trace" ] && [ -r $(REAL_TRACE) ]; then \
		trace=$(REAL_TRACE); \
		echo "demo: replaying the real access log $$trace"; \
	elif [ -z "$$trace" ]; then \
		echo "demo: no real access log at $(REAL_TRACE); replaying a synthetic trace (make demo TRACE=your.log replays yours)"; \
		trace=$(DEMO)/trace.jsonl; \
		$(SIM) gen --kind demo --duration 10m --seed 1 --out $$trace || exit 1; \
	fi; \
	$(SIM) replay $(THROUGH) --trace "$$trace" --json $(DEMO)/report.json --html $(DEMO)/report.html $(ARGS)


test: wasm module
	@bash scripts/setup.sh --test
	@if $(CARGO) nextest --version >/dev/null 2>&1; then \
		$(CARGO) nextest run $(TESTED) --no-fail-fast --test-threads $$(( $$(nproc) + 1 )); \
	else \
		$(CARGO) test $(TESTED) --no-fail-fast; \
	fi
	$(CARGO) test $(TESTED) --doc

# Measures sluice beside its baselines and writes BENCHMARKS.md.
bench: wasm module
	@bash scripts/setup.sh --bench
	$(CARGO) build --release -p sluice-sim -p sluice-server -p sluice-bench
	$(CARGO) build --profile module -p sluice-noop-module
	$(CARGO) build --release -p sluice-bench --example floor
	target/release/sluice-bench all --out BENCHMARKS.md

# Regenerates docs/config.schema.json from the configuration's types.
schema:
	SLUICE_BLESS=1 $(CARGO) test -p sluice-core --test schema

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --exclude sluice-probe --exclude sluice-noop-filter --all-targets -- -D warnings
	$(CARGO) clippy -p sluice-filter -p sluice-probe -p sluice-noop-filter --target wasm32-wasip1 -- -D warnings
	@rustup target list --installed | grep -qx aarch64-unknown-linux-gnu || rustup target add aarch64-unknown-linux-gnu
	$(CARGO) clippy -p sluice-module --target aarch64-unknown-linux-gnu -- -D warnings

fmt:
	$(CARGO) fmt --all

clean:
	$(CARGO) clean
