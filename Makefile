# One Makefile drives dev and CI. `make test` is the test command (README, .ci/run).
# Fragments live next to what they build and are included below: every test and benchmark
# target is in tests/tests.mk.
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

.PHONY: lint
lint: conformance-lint deny ## rustfmt check, clippy with warnings denied, no module cycle in every crate, docs/architecture.md module tables true, cargo-deny, gofmt + go vet
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings
	$(CARGO) test --locked -q -p dispatch-server --test module_graph

# Licenses, banned crates and sources of every dependency against deny.toml. The advisory
# database cannot be fetched here, so `advisories` is not checked; everything else needs only
# Cargo.lock and the crates, fetched first: deny reads every crate of Cargo.lock, those of other
# platforms too, which no build here downloads (on a new machine `--offline` failed on `rand`).
.PHONY: deny
deny: ## cargo-deny: dependency licenses, bans and sources (deny.toml); installs cargo-deny from crates.io if missing
	@command -v cargo-deny >/dev/null || $(CARGO) install cargo-deny --locked
	$(CARGO) fetch --locked --quiet
	$(CARGO) deny --offline --locked check --hide-inclusion-graph licenses bans sources

# Coverage-guided fuzzing with cargo-fuzz on the stable toolchain (libFuzzer, no sanitizer: the
# code under test forbids `unsafe`, so the fuzzer is after panics, hangs and runaway allocation).
FUZZ_SECONDS ?= 20
FUZZ_TARGETS := gob_decode rpc_stream plugin_block yamux_frames
FUZZ_CORPUS := $(CACHE_DIR)/fuzz-corpus

.PHONY: fuzz-smoke
fuzz-smoke: ## run every fuzz target for FUZZ_SECONDS (default 20), seeded with the golden vectors
	@command -v cargo-fuzz >/dev/null || $(CARGO) install cargo-fuzz --locked
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(FUZZ_CORPUS)/$$t; \
	  case $$t in plugin_block) printf '%s' '{"destination":"a","spec":{"template":{}}}' > $(FUZZ_CORPUS)/$$t/seed.json ;; \
	    yamux_frames) cp fuzz/seeds/yamux_frames/* $(FUZZ_CORPUS)/$$t/ ;; \
	    *) cp metric-provider/tests/fixtures/gob/*.gob $(FUZZ_CORPUS)/$$t/ ; rm -f $(FUZZ_CORPUS)/$$t/bench_stream.gob ;; esac; \
	  echo "fuzz: $$t for $(FUZZ_SECONDS)s"; \
	  ($(CARGO) fuzz run --fuzz-dir fuzz -s none -O $$t $(FUZZ_CORPUS)/$$t -- \
	    -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=1024 -max_len=65536 -timeout=10 2>&1) > $(CACHE_DIR)/fuzz-$$t.log || \
	    { tail -40 $(CACHE_DIR)/fuzz-$$t.log; echo "fuzz: $$t FAILED (artifacts in fuzz/artifacts/$$t)"; exit 1; }; \
	  grep -E '^Done [0-9]+ runs' $(CACHE_DIR)/fuzz-$$t.log | sed "s/^/fuzz: $$t: /"; \
	done

.PHONY: fmt
fmt: ## format Rust and Go code
	$(CARGO) fmt --all

.PHONY: docs
docs: ## regenerate docs/configuration.md and the chart's config schema (values.schema.json `config`) from the config types (server/src/config/reference.rs), and docs/metrics.md from the metrics catalog (server/src/runtime/metrics/catalog.rs)
	UPDATE_DOCS=1 $(CARGO) test --locked -q -p dispatch-server --lib -- config::reference::tests config::schema::tests runtime::metrics::catalog::tests

include tests/conformance/conformance.mk
include tests/k8s/k8s.mk
include tests/tests.mk
include charts/chart.mk
include charts/monitoring.mk
include coverage.mk
include image/image.mk
include tests/k8s/node.mk
include tests/k8s/argocd.mk

# Release artifacts: the static plugin (what argo-rollouts-config downloads; its sha256 is what
# Argo >= 1.8 checks), and a tarball with both binaries; SHA256SUMS covers everything.
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
DIST := dist

.PHONY: dist
dist: plugin-release image ## release artifacts in dist/: static plugin binary + sha256, tarball of both static binaries, the OCI image archive + digest, SHA256SUMS
	@set -euo pipefail; rm -rf $(DIST); mkdir -p $(DIST)/stage; \
	cp $(PLUGIN_BIN) $(DIST)/rollouts-dispatch-plugin-linux-amd64; \
	cp $(PLUGIN_BIN) $(SERVER_BIN) README.md $(DIST)/stage/; \
	tar -C $(DIST)/stage -czf $(DIST)/rollouts-dispatch-$(VERSION)-linux-amd64.tar.gz .; rm -rf $(DIST)/stage; \
	cp $(IMAGE_ARCHIVE) $(DIST)/; cp $(IMAGE_DIR)/digest $(DIST)/rollouts-dispatch-$(VERSION)-image.digest; \
	(cd $(DIST) && sha256sum rollouts-dispatch-plugin-linux-amd64 | cut -d' ' -f1 > rollouts-dispatch-plugin-linux-amd64.sha256 \
	  && sha256sum rollouts-dispatch-plugin-linux-amd64 rollouts-dispatch-$(VERSION)-linux-amd64.tar.gz $(notdir $(IMAGE_ARCHIVE)) > SHA256SUMS \
	  && sha256sum -c --quiet SHA256SUMS); \
	ls -l $(DIST); echo "dist: plugin sha256 for argo-rollouts-config: $$(cat $(DIST)/rollouts-dispatch-plugin-linux-amd64.sha256)"
