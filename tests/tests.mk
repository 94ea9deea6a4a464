# Every test and benchmark target, in one place. Included by the root Makefile, which defines
# CARGO, CACHE_DIR, PLUGIN_BIN and `plugin-release`; tests/k8s/k8s.mk defines K8S_BIN_ENV and
# `k8s-bin`; tests/conformance/conformance.mk the Go conformance suite and golden vectors;
# charts/chart.mk `chart`.
#
# The real-cluster tests live in the dispatch-tests crate (tests/, see tests/README.md) and are
# `#[ignore]`d, so `make test-fast` (plain `cargo test`) needs no Go binaries; the targets below run
# them with `--ignored`, where a missing binary fails them. Their artifacts are the test profile's.

.PHONY: test-fast
test-fast: ## unit, golden-vector and property tests (no Go, no clusters)
	$(CARGO) test --workspace --locked

# Every process `make test` starts carries this run's mark in its environment, so that the last
# step (tests/leftovers.sh check) finds any that outlived its test.
test: export ROLLOUTS_DISPATCH_TEST_RUN := make-test-$(shell date +%s)-$(shell echo $$$$)

.PHONY: test
test: ## the whole suite: Rust tests, golden vectors, Go conformance, real clusters, every bench small, no process left behind (README, .ci/run)
	@tests/leftovers.sh selftest
	$(MAKE) test-fast
	$(MAKE) docs-check
	$(MAKE) attacks
	$(MAKE) golden-check
	$(MAKE) conformance
	$(MAKE) clusters-smoke
	$(MAKE) test-engine
	$(MAKE) test-cli
	$(MAKE) e2e
	$(MAKE) e2e-agent
	$(MAKE) e2e-observe
	$(MAKE) chart
	$(MAKE) monitoring-check
	$(MAKE) bench-small
	@tests/leftovers.sh check

# Every Markdown file and every YAML file of config/ against the code (tests/tests/docs_check,
# tests/README.md "Docs that cannot drift"): no cluster, seconds once built. The unit tests of
# the extractor run too; the report's failures come first, its tally is the last line.
.PHONY: docs-check
docs-check: ## the docs name only what exists (make targets, flags, config keys, chart values, metrics, paths) and their YAML blocks validate (last line `docs: files=F … broken=0`)
	@set -uo pipefail; \
	report=$$(mktemp); log=$$(mktemp); trap 'rm -f "$$report" "$$log"' EXIT; \
	DOCS_REPORT=$$report $(CARGO) test --locked -q -p dispatch-tests --test docs_check -- --include-ignored >"$$log" 2>&1; \
	status=$$?; \
	if [ ! -s "$$report" ]; then cat "$$log"; echo "docs-check: FAILED (no report; cargo test exit $$status)"; exit 1; fi; \
	if [ "$$status" -ne 0 ] && tail -n 1 "$$report" | grep -q ' broken=0$$'; then cat "$$log"; fi; \
	cat "$$report"; exit $$status

.PHONY: attacks
attacks: ## every attack on authorization, tenancy, pod security, TLS and budgets, each asserted refused (last line: the tally)
	@set -euo pipefail; \
	tally=$$(mktemp); trap 'rm -f "$$tally"' EXIT; \
	ATTACKS_FILE=$$tally $(CARGO) test --locked -p dispatch-server --test attacks; \
	if [ ! -s "$$tally" ]; then echo "attacks: FAILED (no attack recorded an outcome)"; exit 1; fi; \
	awk -F'\t' '{ n++; r += $$2; cr += $$3; cd += $$4; sl += $$5; sy += $$6; fm += $$7; ub += $$8; st += $$9 } \
	  END { printf "attacks=%d refused=%d cross_tenant_reads=%d cross_tenant_deletes=%d secret_leaks=%d cross_tenant_syncs=%d foreign_mounts=%d unbound_callers=%d starved_calls=%d\n", n, r, cr, cd, sl, sy, fm, ub, st }' "$$tally"

.PHONY: bench
bench: bench-plugin bench-engine bench-verdict bench-agents bench-scale ## every benchmark, side by side with its baseline (ratios printed)

# Every bench at a small size, asserting only that it completes correctly (no timing asserts):
# `make test` runs it, so a bench that no longer runs fails CI. The full sizes are the bench-*
# targets themselves; each takes its sizes from the variables set here.
.PHONY: bench-small
bench-small: ## every bench at a small size, as `make test` runs them (about 4 min)
	$(MAKE) --no-print-directory bench-plugin BENCH_PLUGIN_CALLS=500 BENCH_PLUGIN_WARMUP=50
	BENCH_JOBS=200 BENCH_CLUSTERS=2 BENCH_ROUNDS=1 BENCH_NAIVE_LOOKUPS=100 $(MAKE) --no-print-directory bench-engine
	BENCH_VERDICT_RUNS=1 BENCH_VERDICT_DURATIONS=5 $(MAKE) --no-print-directory bench-verdict
	BENCH_AGENTS=20 BENCH_JOBS=50 $(MAKE) --no-print-directory bench-agents BENCH_AGENTS_PROFILE=debug
	BENCH_SCALE_MEASUREMENTS=40 BENCH_SCALE_AGENTS=8 BENCH_SCALE_JOB_SECONDS=5 $(MAKE) --no-print-directory bench-scale BENCH_SCALE_PROFILE=debug

# The binaries the process-level tests run.
DISPATCH_BIN := target/debug/rollouts-dispatch
DISPATCH_RELEASE_BIN := target/release/rollouts-dispatch
# What every test that loads the plugin into the real Argo Rollouts controller needs.
CLUSTER_ENV := K8S_BIN_ENV=$(K8S_BIN_ENV) PLUGIN_BINARY=$(abspath $(PLUGIN_BIN))

# $(call summary_test,TEST,ENV,OUTPUT_FILTER,PREFIX): run the #[ignore]d tests of dispatch-tests'
# test TEST with the environment ENV and SUMMARY_FILE naming a temporary file, show the output
# (through the shell filter OUTPUT_FILTER, if given, which keeps the interesting lines), and end
# with the one line the test wrote to $SUMMARY_FILE (dispatch_tests::summary): what scripts and
# the README read. A failed test, or one that wrote no summary, fails the target and says so last.
# PREFIX, if given, is a shell command run first (`demo` with DEMO_KEEP: `trap '' INT`).
define summary_test
	@set -euo pipefail; \
	summary=$$(mktemp); trap 'rm -f "$$summary"' EXIT; status=0; $(if $(4),$(4);) \
	$(2) SUMMARY_FILE=$$summary $(CARGO) test --locked -p dispatch-tests --test $(1) -- --ignored --nocapture \
	  $(if $(3),2>&1 | { $(3) || true; }) || status=$$?; \
	if [ "$$status" -ne 0 ]; then why="cargo test exit $$status"; \
	elif [ ! -s "$$summary" ]; then why="the test wrote no summary line"; fi; \
	if [ -n "$${why:-}" ]; then echo "$@: FAILED ($$why); every log line:" \
	  "$(strip $(2)) $(CARGO) test -p dispatch-tests --test $(1) -- --ignored --nocapture"; exit 1; fi; \
	tail -n 1 "$$summary"
endef

# The smoke test loads the plugin that `make plugin-release` builds, unless PLUGIN_BINARY names
# another file. Last line: `clusters_ready=N start_s_p50=X smoke=pass`.
.PHONY: clusters-smoke
clusters-smoke: k8s-bin ## start real clusters + the Argo Rollouts controller and run the smoke tests
	@if [ -z "$${PLUGIN_BINARY:-}" ]; then $(MAKE) --no-print-directory plugin-release; fi
	$(call summary_test,clusters_smoke,K8S_BIN_ENV=$(K8S_BIN_ENV))

# The engine tests share 3 clusters; most of their time is waiting for Jobs, so run them wide.
ENGINE_TEST_THREADS ?= 6

.PHONY: test-engine
test-engine: k8s-bin ## dispatch engine against 3 real clusters: Job lifecycle, verdicts, Argo CD, Kargo stage, policy
	K8S_BIN_ENV=$(K8S_BIN_ENV) $(CARGO) test --locked -p dispatch-tests --test engine -- \
	  --ignored --test-threads $(ENGINE_TEST_THREADS)

.PHONY: bench-engine
bench-engine: k8s-bin ## 10 000 in-flight Jobs on 5 real clusters: watch-cache vs GET-per-lookup status (last line: the ratios)
	$(call summary_test,engine_bench,K8S_BIN_ENV=$(K8S_BIN_ENV))

# The scenarios share one scene (3 clusters, the controller, the server); scenarios that kill a
# component take it alone, the others run side by side.
E2E_TEST_THREADS ?= 4

.PHONY: e2e
e2e: k8s-bin plugin-release rollouts-prev-bin ## the real Rollouts controller + plugin + server + 3 clusters: Kargo-shaped verifications, against Argo Rollouts $(ARGO_ROLLOUTS_VERSION) and then $(ARGO_ROLLOUTS_PREV_VERSION)
	@echo "e2e: argo-rollouts $(ARGO_ROLLOUTS_VERSION)"
	$(CLUSTER_ENV) E2E_ARGO_ROLLOUTS_VERSION=$(ARGO_ROLLOUTS_VERSION) $(CARGO) test --locked -p dispatch-tests --test e2e -- \
	  --ignored --nocapture --test-threads $(E2E_TEST_THREADS)
	@echo "e2e: argo-rollouts $(ARGO_ROLLOUTS_PREV_VERSION)"
	$(CLUSTER_ENV) E2E_ARGO_ROLLOUTS_VERSION=$(ARGO_ROLLOUTS_PREV_VERSION) ROLLOUTS_CONTROLLER=$(ARGO_PREV_BIN_DIR)/rollouts-controller ARGO_ROLLOUTS_CRDS=$(ARGO_PREV_BIN_DIR)/crds \
	  $(CARGO) test --locked -p dispatch-tests --test e2e -- --ignored --nocapture --test-threads $(E2E_TEST_THREADS)

# Issue #17: the full log of a real verification through the log API, `rollouts-dispatch logs -f`
# and Chromium (driven over W3C WebDriver). Not in `make test`: it installs Debian's chromium and
# chromium-driver when they are missing (we run as root; `apt-get update` only if the install
# fails). Last line: `ui: login=ok runs_listed=N failing_log=ok other_project=hidden cli_follow=ok`.
# The product on a real node (issue #28, tests/tests/e2e_real/): a cluster whose pods run in real
# containers (containerd, runc, kubelet, kube-proxy, CoreDNS; `make real-node-bin`) under the
# `restricted` Pod Security level, our image (`make image`) installed with `helm install`, the real
# Argo Rollouts controller as a pod with the plugin from its init container, and the example
# templates through all of it. Needs root (it makes a bridge, cgroups and iptables rules, and
# takes them all back). Not in `make test` yet: its cold build (kubelet, CoreDNS, the release
# image) would take a cold `make test` past the hour.
.PHONY: e2e-real
e2e-real: k8s-bin real-node-bin image helm ## the product on a real node: containerd + kubelet under `restricted`, the chart's pods, the controller pod with the plugin from its init container, the examples; last line `real: node=ready examples=K/K restricted=ok chart_pods=ready plugin=init-container waiting_reasons=W/W kubelet_logs=ok`
	$(call summary_test,e2e_real,K8S_BIN_ENV=$(K8S_BIN_ENV) HELM=$(abspath $(HELM)))

# Issue #29 (tests/tests/e2e_argocd/): the `application:` check and the sync trigger through the
# agent against a real Argo CD v3.2.6 (application controller, repo-server, Redis; `make
# argocd-bin`) on cluster-b, syncing plain manifests from local Git repositories. Not in `make
# test` yet: its cold build (Argo CD's whole dependency tree) is long on the 2-core machine.
.PHONY: e2e-argocd
e2e-argocd: k8s-bin argocd-bin plugin-release ## the agent's application: checks and sync trigger against a real Argo CD $(ARGOCD_REAL_VERSION) on cluster-b; last line `argocd: version=… app_healthy=… app_degraded=… sync_trigger=… synced_revision=… missing_revision=… stage=… airgapped_flow=…`
	$(CARGO) build --locked -p dispatch-server --bin rollouts-dispatch
	$(call summary_test,e2e_argocd,$(CLUSTER_ENV) ARGOCD_ENV=$(ARGOCD_ENV) RUST_TEST_THREADS=5,grep -vE '^time=|^[0-9-]+T[0-9:.]+Z ')

.PHONY: e2e-ui
e2e-ui: k8s-bin plugin-release ## issue #17 end to end: full logs through the API, the CLI (-f) and a real browser (installs chromium)
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
	  apt-get install -y --no-install-recommends chromium chromium-driver || \
	  { apt-get update && apt-get install -y --no-install-recommends chromium chromium-driver; }; fi
	$(CARGO) build --locked -p dispatch-server --bin rollouts-dispatch
	$(call summary_test,e2e_ui,$(CLUSTER_ENV),grep -vE '^time=|^[0-9-]+T[0-9:.]+Z \[')

.PHONY: bench-verdict
bench-verdict: k8s-bin plugin-release ## Job completion → AnalysisRun phase change, Jobs of 5 s, 60 s and 300 s: our plugin vs Argo's built-in job provider side by side (about 7 min; last line `verdict_ratio_5s=X verdict_ratio_60s=Y verdict_ratio_300s=Z writes_ratio=W`, ours over built-in: p50 latencies, and AnalysisRun status writes per running measurement per minute)
	$(call summary_test,bench_verdict,$(CLUSTER_ENV),grep -vE '^time=|^[0-9-]+T[0-9:.]+Z \[')

.PHONY: test-cli
test-cli: k8s-bin ## `rollouts-dispatch run` and `doctor`, the real binary against a real cluster
	$(CARGO) build --locked -p dispatch-server --bin rollouts-dispatch
	K8S_BIN_ENV=$(K8S_BIN_ENV) $(CARGO) test --locked -p dispatch-tests --test cli -- \
	  --ignored --test-threads 4

.PHONY: e2e-agent
e2e-agent: k8s-bin plugin-release ## agent mode end to end: 2 server replicas on the Kubernetes store, an agent as the only way into cluster B, kills (-9), 403/401
	$(CARGO) build --locked -p dispatch-server --bin rollouts-dispatch
	$(CLUSTER_ENV) $(CARGO) test --locked -p dispatch-tests --test e2e_agent -- \
	  --ignored --nocapture

# Issue #16: verifying what is already deployed. The scenarios share one scene (the agent scene,
# a Rollouts controller on cluster-a, Argo CD's Application CRD on cluster-b) and spend their time
# waiting for Rollouts, so they run side by side.
E2E_OBSERVE_TEST_THREADS ?= 8

.PHONY: e2e-observe
e2e-observe: k8s-bin plugin-release ## rollout: and application: checks and the sync trigger against a real Rollouts controller on cluster-a and Argo CD's Application CRD behind cluster-b's agent; last line `observe: rollout_pass=… rollout_fail=… app_healthy=… app_degraded=… sync_trigger=…`
	$(CARGO) build --locked -p dispatch-server --bin rollouts-dispatch
	$(call summary_test,e2e_observe,$(CLUSTER_ENV) RUST_TEST_THREADS=$(E2E_OBSERVE_TEST_THREADS),grep -vE '^time=|^[0-9-]+T[0-9:.]+Z ')

# BENCH_AGENTS agents (1000) and BENCH_JOBS Jobs (2000), from the environment; the server is the
# release build unless BENCH_AGENTS_PROFILE=debug (bench-small: no release build in `make test`).
BENCH_AGENTS_PROFILE ?= release

.PHONY: bench-agents
bench-agents: ## one server replica (default serve flags) with 1 000 simulated agents long-polling, 2 000 Jobs dispatched, no plugin call refused (last line: agents=1000 dispatch_p99_ms=X server_rss_mib=Y)
	$(CARGO) build $(if $(filter release,$(BENCH_AGENTS_PROFILE)),--release) --locked -p dispatch-server --bin rollouts-dispatch
	$(call summary_test,bench_agents,ROLLOUTS_DISPATCH_BINARY=$(abspath target/$(BENCH_AGENTS_PROFILE)/rollouts-dispatch))

# Issue #30: 10 000 Kargo-shaped verifications on one control plane, Jobs on cluster-a (kwok),
# then the same across 1 000 simulated agents; the release server, plugin and the real
# controller. Sizes: BENCH_SCALE_MEASUREMENTS, BENCH_SCALE_AGENTS, BENCH_SCALE_JOB_SECONDS,
# BENCH_SCALE_CREATE_PER_S, BENCH_SCALE_CONTROLLER_ARGS (tests/tests/bench_scale.rs). The server
# is the release build unless BENCH_SCALE_PROFILE=debug (bench-small).
BENCH_SCALE_PROFILE ?= release

.PHONY: bench-scale
bench-scale: k8s-bin plugin-release ## 10 000 concurrent verifications through one controller, plugin and server, direct then on 1 000 agents: verdicts, p99 latency, API writes by client, RSS; last line `scale: measurements=10000 correct=10000 verdict_p99_ms=P api_writes_per_s=A server_rss_mib=S plugin_rss_mib=R agents=1000`
	$(CARGO) build $(if $(filter release,$(BENCH_SCALE_PROFILE)),--release) --locked -p dispatch-server --bin rollouts-dispatch
	$(call summary_test,bench_scale,$(CLUSTER_ENV) ROLLOUTS_DISPATCH_BINARY=$(abspath target/$(BENCH_SCALE_PROFILE)/rollouts-dispatch),grep -vE '^time=|^[0-9-]+T[0-9:.]+Z ')

.PHONY: chaos
chaos: k8s-bin plugin-release ## 50 verifications on a direct and an agent destination while servers, agent, plugin and controller are killed (-9), then 4 faults (apiserver down during abort, agent silent past the deadline, transient 5xx on the agent's create, memory-store server restart); last line: verifications=50 correct=N duplicate_jobs=D orphans=O stuck=S leftover_jobs=L
	$(CARGO) build --locked -p dispatch-server --bin rollouts-dispatch
	$(call summary_test,chaos,$(CLUSTER_ENV),grep -E '^(chaos|verifications=|test |Error)')

# The previous release of the server, agent and CLI, for make faults' version skew and rolling
# upgrade: 0.1.0 (CHANGELOG.md), the last commit of 2026-12-04. Built once from this repository's
# own history (`git archive`, no network) into the cache; its own target directory, so the
# workspace's build is untouched.
PREVIOUS_RELEASE ?= 5c8d435
PREVIOUS_DIR := $(CACHE_DIR)/previous/$(PREVIOUS_RELEASE)
PREVIOUS_BINARY := $(PREVIOUS_DIR)/rollouts-dispatch

.PHONY: previous-release
previous-release: ## the previous release's rollouts-dispatch binary ($(PREVIOUS_RELEASE), 0.1.0) built into the cache from this repository's history
	@if [ ! -x $(PREVIOUS_BINARY) ]; then \
	  rm -rf $(PREVIOUS_DIR)/src && mkdir -p $(PREVIOUS_DIR)/src && \
	  git archive $(PREVIOUS_RELEASE) | tar -x -C $(PREVIOUS_DIR)/src && \
	  (cd $(PREVIOUS_DIR)/src && CARGO_TARGET_DIR=$(PREVIOUS_DIR)/target $(CARGO) build --locked -p dispatch-server --bin rollouts-dispatch) && \
	  cp $(PREVIOUS_DIR)/target/debug/rollouts-dispatch $(PREVIOUS_BINARY); \
	fi
	@echo "previous-release: $(PREVIOUS_RELEASE) $$($(PREVIOUS_BINARY) --version)"

# The previous release's image (`make image` run in its own tree, so the image is the one that
# release built: its static server and plugin) for `make upgrade-real`. Its own target directory
# under the cache; the workspace's build is untouched.
PREVIOUS_IMAGE_LAYOUT := $(PREVIOUS_DIR)/src/target/image/layout

.PHONY: previous-image
previous-image: previous-release ## the previous release's OCI image ($(PREVIOUS_RELEASE), 0.1.0) built into the cache with that release's own `make image`
	@if [ ! -f $(PREVIOUS_IMAGE_LAYOUT)/index.json ]; then \
	  $(MAKE) -C $(PREVIOUS_DIR)/src image CACHE_DIR=$(CACHE_DIR); fi
	@echo "previous-image: $(PREVIOUS_RELEASE) $(PREVIOUS_IMAGE_LAYOUT)"

# `helm upgrade` and `helm rollback` with verifications in flight, as pods on the real node (issue
# #32, tests/tests/upgrade_real/): the previous release's chart and image installed as a user
# installed them, the one-time CRD step of docs/upgrading.md run as written, then this chart and
# image, then back. Root and the real-node pieces, like `make e2e-real`; not in `make test`.
.PHONY: upgrade-real
upgrade-real: k8s-bin real-node-bin image helm previous-image ## helm upgrade from the previous release's chart and image to this one and helm rollback, each with runs in flight on a direct and an agent destination, as pods on the real node; last line `upgrade: from=… upgraded_in_flight=N/N rolled_back_in_flight=N/N duplicate_jobs=0 leftover_jobs=0 crds_kept=yes`
	$(call summary_test,upgrade_real,K8S_BIN_ENV=$(K8S_BIN_ENV) HELM=$(abspath $(HELM)) ROLLOUTS_DISPATCH_PREVIOUS=$(PREVIOUS_RELEASE) ROLLOUTS_DISPATCH_PREVIOUS_IMAGE=$(PREVIOUS_IMAGE_LAYOUT) ROLLOUTS_DISPATCH_PREVIOUS_CHART=$(PREVIOUS_DIR)/src/charts/rollouts-dispatch)

# FAULTS_ONLY=name,name runs only those scenarios (for development; the last line then counts
# only them).
.PHONY: faults
faults: k8s-bin plugin-release previous-release ## production faults on the real clusters, one scenario each: partitions (netns, veth, tc), throttling (APF), 410 after compaction, a stalled watch, 10 000 Jobs, rotations, a narrowed policy, version skew, a rolling upgrade and rollback; last line `faults: scenarios=N correct=N stuck=0 duplicate_jobs=0 leftover_jobs=0 lost_verdicts=0`
	$(CARGO) build --locked -p dispatch-server --bin rollouts-dispatch
	$(call summary_test,faults,$(CLUSTER_ENV) ROLLOUTS_DISPATCH_PREVIOUS_BINARY=$(PREVIOUS_BINARY),grep -E '^(faults|test |Error)')

# SOAK_RUNS=40 make soak runs a shorter soak (the default is 500 verifications, about 12 minutes);
# SOAK_HOURS=2 make soak a longer one (one verification per 1.2 s for that long, plus ~5 min).
.PHONY: soak
soak: k8s-bin plugin-release ## 500 Kargo-shaped verifications (pass, fail, abort, reverify) over ~10 min (SOAK_HOURS=H: H hours) on a direct and an agent destination, 1m retention, a fault every 5 min (SOAK_FAULT_EVERY); last line: soak: verifications=N peak_jobs_per_destination=P final_jobs=F store_records=R server_rss_growth_mib=G fds_growth=D tasks_growth=T
	$(CARGO) build --locked -p dispatch-server --bin rollouts-dispatch
	$(call summary_test,soak,$(CLUSTER_ENV),grep -E '^(soak|test |Error)')

# With DEMO_KEEP=1 (any value but 0; `make demo-up` sets it) the demo keeps everything up after
# the verdicts and prints the page's URL, a token, the `logs` and `kubectl` commands and how to
# stop it (tests/src/kept.rs), then waits in the foreground for Ctrl-C or `make demo-down`. Its
# recipe ignores SIGINT (inherited by cargo and the filter), so that Ctrl-C reaches only the
# test, which catches it, tears everything down and still prints the last line. The filter is
# line-buffered so that the block shows while the demo waits.
DEMO_KEEP_ON = $(filter-out 0,$(DEMO_KEEP))
# What a kept demo writes for people and for demo-down (pid, process groups, token, CA,
# kubeconfig): `target/demo` of the workspace, as `dispatch_tests::kept::StateDir` names it.
DEMO_STATE_DIR := target/demo

.PHONY: demo
demo: k8s-bin plugin-release ## the main job locally: 3 clusters, Argo Rollouts, the server, a passing and a failing verification; last line `demo: cluster-a=… cluster-b=…` (DEMO_KEEP=1: kept up, see demo-up)
	$(if $(DEMO_KEEP_ON),$(CARGO) build --locked -p dispatch-server --bin rollouts-dispatch)
	$(call summary_test,demo,$(CLUSTER_ENV),grep --line-buffered -E '^(demo:|ANALYSISRUN|[a-z0-9-]+\.[0-9a-z]+\.[0-9a-f]{7} |$$)' | grep --line-buffered -v '^demo: cluster-a=',$(if $(DEMO_KEEP_ON),trap '' INT))

.PHONY: demo-up
demo-up: export DEMO_KEEP := 1
demo-up: demo ## make demo kept up after the verdicts: prints the page's URL, a token, the `logs` and `kubectl` commands; Ctrl-C or `make demo-down` ends it (same last line)

.PHONY: demo-down
demo-down: ## stop the demo that `make demo-up` keeps up (its process, then its clusters' process groups) and remove target/demo
	@tests/demo-down.sh $(DEMO_STATE_DIR)

.PHONY: demo-debug
demo-debug: k8s-bin plugin-release ## make demo with every log line
	$(CLUSTER_ENV) $(CARGO) test --locked -p dispatch-tests --test demo -- --ignored --nocapture

.PHONY: api-fuzz
api-fuzz: ## fuzz the /v1 API from its OpenAPI document with schemathesis (installs it from PyPI if missing)
	$(CARGO) build --locked -p dispatch-server --bin rollouts-dispatch
	tests/api-fuzz/run.sh $(abspath $(DISPATCH_BIN)) $${API_FUZZ_EXAMPLES:-100}
