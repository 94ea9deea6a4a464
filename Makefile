# One Makefile drives dev and CI. `make test` is the test command (README, .ci/run).
# Fragments owned by each test tier live next to their code and are included below.
SHELL := /bin/bash
.DEFAULT_GOAL := help

CARGO ?= cargo
export CARGO_TERM_COLOR ?= never
# Everything built from Go modules for tests (Kubernetes, Argo Rollouts, helm) is cached here.
CACHE_DIR ?= $(HOME)/.cache/rollouts-dispatch
export CACHE_DIR

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | sort | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

# The plugin binary Argo Rollouts loads: fully static (the controller image is distroless/static,
# no libc), built for the gnu target with crt-static because no musl toolchain is installed here.
TARGET ?= x86_64-unknown-linux-gnu
PLUGIN_BIN := target/$(TARGET)/release/rollouts-dispatch-plugin
STATIC_RUSTFLAGS := -C target-feature=+crt-static

.PHONY: build
build: ## build every crate (debug)
	$(CARGO) build --workspace

.PHONY: plugin-release
plugin-release: ## build the static release plugin binary ($(PLUGIN_BIN))
	RUSTFLAGS="$(STATIC_RUSTFLAGS)" $(CARGO) build --release --locked --target $(TARGET) -p dispatch-metric-provider --bin rollouts-dispatch-plugin
	@if readelf -l $(PLUGIN_BIN) | grep -q INTERP || readelf -d $(PLUGIN_BIN) | grep -q NEEDED; then echo "error: $(PLUGIN_BIN) is not statically linked"; exit 1; fi

.PHONY: test-fast
test-fast: ## unit, golden-vector and property tests (no Go, no clusters)
	$(CARGO) test --workspace --locked

.PHONY: test
test: ## the whole suite: Rust tests, golden vectors, Go conformance (README, .ci/run)
	$(MAKE) test-fast
	$(MAKE) golden-check
	$(MAKE) conformance

.PHONY: lint
lint: ## rustfmt check, clippy with warnings denied, go vet
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

.PHONY: fmt
fmt: ## format Rust and Go code
	$(CARGO) fmt --all

-include tests/conformance/conformance.mk
-include tests/k8s/k8s.mk
