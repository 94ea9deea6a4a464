# Go side of the plugin tests (tests/conformance): the conformance suite run through Argo
# Rollouts' own client, the golden gob vectors, and the Rust-vs-Go benchmark.
# Included by the root Makefile, which defines PLUGIN_BIN, plugin-release and CACHE_DIR.

CONFORMANCE_DIR := tests/conformance
GOLDEN_DIR := metric-provider/tests/fixtures/gob
GOB_DECODE_BENCH := target/release/examples/gob_decode_bench
# Extra `go test` flags for `make conformance`, e.g. CONFORMANCE_FLAGS='-run TestKill'.
CONFORMANCE_FLAGS ?=
CONFORMANCE_GO := GOTOOLCHAIN=local go

.PHONY: conformance golden golden-check bench-plugin

conformance: plugin-release ## run the Go conformance suite against the Rust plugin and the Go reference plugin
	$(if $(PLUGIN_BIN),,$(error PLUGIN_BIN is not defined))
	@mkdir -p $(CACHE_DIR)
	@log=$(CACHE_DIR)/conformance.log; \
	if ls $(GOLDEN_DIR)/replies/*.gob >/dev/null 2>&1; then req="GOLDEN_REQUIRE_REPLIES=1"; else req=; fi; \
	echo "go test -count=1 -v ./... (PLUGIN_BINARY=$(abspath $(PLUGIN_BIN))) > $$log"; \
	(cd $(CONFORMANCE_DIR) && env -u GOLDEN_REQUIRE_REPLIES $$req PLUGIN_BINARY=$(abspath $(PLUGIN_BIN)) \
		$(CONFORMANCE_GO) test -count=1 -v $(CONFORMANCE_FLAGS) ./...) > $$log 2>&1; status=$$?; \
	grep -E '^ *--- (PASS|FAIL|SKIP)|^(ok|FAIL|panic)|^ +[a-z_]+_test\.go:[0-9]+: |^ {8,}[^ -]' $$log; \
	echo "full log: $$log"; exit $$status

golden: ## regenerate the golden gob request vectors in metric-provider/tests/fixtures/gob
	cd $(CONFORMANCE_DIR) && $(CONFORMANCE_GO) run ./cmd/golden -out $(abspath $(GOLDEN_DIR))

golden-check: golden ## regenerate the golden vectors, fail if they changed, check the Rust reply vectors
	git diff --exit-code -- $(GOLDEN_DIR)
	@untracked=$$(git ls-files --others --exclude-standard -- $(GOLDEN_DIR)); \
	if [ -n "$$untracked" ]; then echo "golden-check: uncommitted fixture files:"; echo "$$untracked"; exit 1; fi
	cd $(CONFORMANCE_DIR) && GOLDEN_REQUIRE_REPLIES=1 $(CONFORMANCE_GO) test -count=1 ./golden

# Sizes: BENCH_PLUGIN_CALLS measured Run calls per plugin (10 000), BENCH_PLUGIN_WARMUP before.
BENCH_PLUGIN_CALLS ?= 10000
BENCH_PLUGIN_WARMUP ?= 500

bench-plugin: plugin-release ## compare the Rust plugin with the Go reference: Run latency, RSS, gob decode time (BENCH_PLUGIN_CALLS, BENCH_PLUGIN_WARMUP)
	$(if $(PLUGIN_BIN),,$(error PLUGIN_BIN is not defined))
	$(CARGO) build --release --locked -p dispatch-metric-provider --example gob_decode_bench
	cd $(CONFORMANCE_DIR) && $(CONFORMANCE_GO) run ./cmd/benchplugin \
		-n $(BENCH_PLUGIN_CALLS) -warmup $(BENCH_PLUGIN_WARMUP) \
		-ours $(abspath $(PLUGIN_BIN)) -rust-decode $(abspath $(GOB_DECODE_BENCH))

.PHONY: conformance-lint
conformance-lint: ## gofmt check and go vet for the Go test module (tests/conformance)
	@out=$$(cd $(CONFORMANCE_DIR) && gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	cd $(CONFORMANCE_DIR) && $(CONFORMANCE_GO) vet ./...

# The conformance suite against the plugin client of the newest patch of every Argo Rollouts
# minor from v1.7 (the first with metric-provider plugins' current rpc) to the newest. Each is its
# own module file (tests/conformance/matrix/<version>.mod and .sum, `go test -modfile`), written by
# `go mod tidy` from a require of that version alone, so the client, go-plugin and Kubernetes
# types are the ones that release builds with. v1.9.3 and v1.10.2 declare `go 1.26.10`: they need
# the toolchain go1.27.3, which the go command fetches from the Go module proxy.
CONFORMANCE_MATRIX := v1.7.2:local v1.8.5:local v1.9.3:go1.27.3 v1.10.2:go1.27.3

.PHONY: conformance-matrix
conformance-matrix: plugin-release ## the conformance suite through the plugin client of Argo Rollouts v1.7.2, v1.8.5, v1.9.3 and v1.10.2; last line `conformance: v1.7=pass v1.8=pass v1.9=pass v1.10=pass`
	@set -uo pipefail; summary=; status=0; mkdir -p $(CACHE_DIR); \
	for entry in $(CONFORMANCE_MATRIX); do \
	  version=$${entry%%:*}; toolchain=$${entry#*:}; minor=$$(echo $$version | cut -d. -f1,2); \
	  log=$(CACHE_DIR)/conformance-$$version.log; \
	  if (cd $(CONFORMANCE_DIR) && PLUGIN_BINARY=$(abspath $(PLUGIN_BIN)) GOTOOLCHAIN=$$toolchain GOFLAGS=-mod=readonly \
	      nice -n 10 go test -modfile=matrix/$$version.mod -count=1 -v $(CONFORMANCE_FLAGS) .) > $$log 2>&1; then result=pass; \
	  else result=fail; status=1; grep -E '^ *--- FAIL|^FAIL|panic|_test\.go:[0-9]+: ' $$log | head -20; fi; \
	  echo "conformance-matrix: argo-rollouts $$version (toolchain $$toolchain): $$result, $$(grep -c '^ *--- PASS' $$log) passed, $$(grep -c '^ *--- FAIL' $$log) failed (log: $$log)"; \
	  summary="$$summary $$minor=$$result"; \
	done; echo "conformance:$$summary"; exit $$status
