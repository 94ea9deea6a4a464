# The dispatch engine (server/, crate dispatch-server) against real clusters, and its benchmark.
# Included by the root Makefile, which defines CARGO; K8S_BIN_ENV and k8s-bin come from
# tests/k8s/k8s.mk. Both targets build in the test profile (the artifacts of `cargo test`).

# The engine tests share 3 clusters; most of their time is waiting for Jobs, so run them wide.
ENGINE_TEST_THREADS ?= 6

.PHONY: test-engine
test-engine: k8s-bin ## dispatch engine against 3 real clusters: Job lifecycle, verdicts, Argo CD, Kargo stage, policy
	K8S_BIN_ENV=$(K8S_BIN_ENV) $(CARGO) test --locked -p dispatch-tests --test engine -- \
	  --ignored --test-threads $(ENGINE_TEST_THREADS)

.PHONY: bench-engine
bench-engine: k8s-bin ## 10 000 in-flight Jobs on 5 real clusters: watch-cache vs GET-per-lookup status (last line: the ratios)
	@set -euo pipefail; \
	summary=$$(mktemp); trap 'rm -f "$$summary"' EXIT; \
	K8S_BIN_ENV=$(K8S_BIN_ENV) BENCH_SUMMARY_FILE=$$summary \
	  $(CARGO) test --locked -p dispatch-tests --test engine_bench -- --ignored --nocapture; \
	tail -n 1 "$$summary"


.PHONY: e2e
e2e: k8s-bin plugin-release ## the real Rollouts controller + plugin + server + 3 clusters: Kargo-shaped verifications
	K8S_BIN_ENV=$(K8S_BIN_ENV) PLUGIN_BINARY=$(abspath $(PLUGIN_BIN)) $(CARGO) test --locked -p dispatch-tests --test e2e -- \
	  --ignored --nocapture

.PHONY: bench-verdict
bench-verdict: k8s-bin plugin-release ## Job completion → AnalysisRun phase change: our plugin vs Argo's built-in job provider (last line: both p50s)
	@set -euo pipefail; \
	summary=$$(mktemp); trap 'rm -f "$$summary"' EXIT; \
	K8S_BIN_ENV=$(K8S_BIN_ENV) PLUGIN_BINARY=$(abspath $(PLUGIN_BIN)) BENCH_SUMMARY_FILE=$$summary \
	  $(CARGO) test --locked -p dispatch-tests --test bench_verdict -- --ignored --nocapture 2>&1 | grep -vE '^time=|^[0-9-]+T[0-9:.]+Z \['; \
	tail -n 1 "$$summary"

.PHONY: test-cli
test-cli: k8s-bin ## `rollouts-dispatch run` and `doctor`, the real binary against a real cluster
	$(CARGO) build --locked -p dispatch-server --bin rollouts-dispatch
	K8S_BIN_ENV=$(K8S_BIN_ENV) $(CARGO) test --locked -p dispatch-tests --test cli -- \
	  --ignored --test-threads 4

.PHONY: e2e-agent
e2e-agent: k8s-bin plugin-release ## agent mode end to end: 2 server replicas on the Kubernetes store, an agent as the only way into cluster B, kills (-9), 403/401
	$(CARGO) build --locked -p dispatch-server --bin rollouts-dispatch
	K8S_BIN_ENV=$(K8S_BIN_ENV) PLUGIN_BINARY=$(abspath $(PLUGIN_BIN)) $(CARGO) test --locked -p dispatch-tests --test e2e_agent -- \
	  --ignored --nocapture

.PHONY: bench-agents
bench-agents: ## one server replica (release) with 500 simulated agents long-polling, 2 000 Jobs dispatched (last line: agents=500 dispatch_p99_ms=X server_rss_mib=Y)
	$(CARGO) build --release --locked -p dispatch-server --bin rollouts-dispatch
	@set -euo pipefail; \
	summary=$$(mktemp); trap 'rm -f "$$summary"' EXIT; \
	ROLLOUTS_DISPATCH_BINARY=$(abspath target/release/rollouts-dispatch) BENCH_SUMMARY_FILE=$$summary \
	  $(CARGO) test --locked -p dispatch-tests --test bench_agents -- --ignored --nocapture; \
	tail -n 1 "$$summary"

.PHONY: chaos
chaos: k8s-bin plugin-release ## 50 verifications on a direct and an agent destination while servers, agent, plugin and controller are killed (-9); last line: verifications=50 correct=N duplicate_jobs=D orphans=O
	$(CARGO) build --locked -p dispatch-server --bin rollouts-dispatch
	@set -euo pipefail; \
	summary=$$(mktemp); trap 'rm -f "$$summary"' EXIT; \
	K8S_BIN_ENV=$(K8S_BIN_ENV) PLUGIN_BINARY=$(abspath $(PLUGIN_BIN)) BENCH_SUMMARY_FILE=$$summary \
	  $(CARGO) test --locked -p dispatch-tests --test chaos -- --ignored --nocapture 2>&1 | grep -E '^(chaos|verifications=|test |Error)' ; \
	tail -n 1 "$$summary"
