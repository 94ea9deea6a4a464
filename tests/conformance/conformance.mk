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

bench-plugin: plugin-release ## compare the Rust plugin with the Go reference: Run latency, RSS, gob decode time
	$(if $(PLUGIN_BIN),,$(error PLUGIN_BIN is not defined))
	$(CARGO) build --release --locked -p dispatch-metric-provider --example gob_decode_bench
	cd $(CONFORMANCE_DIR) && $(CONFORMANCE_GO) run ./cmd/benchplugin \
		-ours $(abspath $(PLUGIN_BIN)) -rust-decode $(abspath $(GOB_DECODE_BENCH))

.PHONY: conformance-lint
conformance-lint: ## gofmt check and go vet for the Go test module (tests/conformance)
	@out=$$(cd $(CONFORMANCE_DIR) && gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	cd $(CONFORMANCE_DIR) && $(CONFORMANCE_GO) vet ./...
