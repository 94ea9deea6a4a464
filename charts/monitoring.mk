# Monitoring a team imports (charts/rollouts-dispatch/monitoring/: the Grafana dashboard and the
# PrometheusRule groups, rendered by the chart when `monitoring.*.enabled`) and their check.
# Included by the root Makefile after charts/chart.mk, which defines HELM and CHART_DIR.
#
# promtool (Prometheus' own rule checker) is built from its Go module, pinned in its own tool module
# charts/tools/promtool/go.mod (apart from charts/tools/go.mod so that Prometheus' dependency tree
# does not move helm's), into $(CACHE_DIR)/bin/promtool-<version>/promtool, only when that file is
# missing. The Go module version v0.3XY.Z is Prometheus 3.XY.Z (its VERSION file). Built with the
# tag `remove_all_sd` (plugins/plugin_*.go in the module): rule checks and rule unit tests use no
# service discovery, and leaving it out (the cloud SDKs) builds 1 117 packages instead of 1 364.

PROMTOOL_MOD_VERSION := v0.316.0
PROMTOOL_VERSION := 3.16.0
PROMTOOL_TOOLS_DIR := charts/tools/promtool
PROMTOOL_BIN_DIR := $(CACHE_DIR)/bin/promtool-$(PROMTOOL_VERSION)
PROMTOOL := $(PROMTOOL_BIN_DIR)/promtool
MONITORING_DIR := charts/rollouts-dispatch/monitoring

PROMTOOL_GO := GOTOOLCHAIN=local GOFLAGS=-mod=readonly nice -n 10 $(or $(GO),go)

# The version stamps of Prometheus' own release build (.promu.yml: github.com/prometheus/common/version).
$(PROMTOOL):
	@set -euo pipefail; \
	have=$$(cd $(PROMTOOL_TOOLS_DIR) && $(PROMTOOL_GO) list -m -f '{{.Version}}' github.com/prometheus/prometheus); \
	if [ "$$have" != "$(PROMTOOL_MOD_VERSION)" ]; then \
	  echo "monitoring.mk: $(PROMTOOL_TOOLS_DIR)/go.mod pins github.com/prometheus/prometheus $$have, monitoring.mk says $(PROMTOOL_MOD_VERSION)" >&2; exit 1; fi; \
	out="$(PROMTOOL_BIN_DIR).tmp.$$$$"; rm -rf "$$out"; mkdir -p "$$out"; \
	echo "promtool: building $(PROMTOOL_VERSION) (a cold build takes minutes)"; start=$$(date +%s); \
	(cd $(PROMTOOL_TOOLS_DIR) && $(PROMTOOL_GO) build -trimpath -tags netgo,remove_all_sd -o "$$out/promtool" -ldflags="-s -w \
	  -X github.com/prometheus/common/version.Version=$(PROMTOOL_VERSION) \
	  -X github.com/prometheus/common/version.Branch=HEAD \
	  -X github.com/prometheus/common/version.Revision=$(PROMTOOL_MOD_VERSION)" \
	  github.com/prometheus/prometheus/cmd/promtool); \
	rm -rf "$(PROMTOOL_BIN_DIR)"; mv "$$out" "$(PROMTOOL_BIN_DIR)"; \
	echo "promtool: built $(PROMTOOL_VERSION) in $$(( $$(date +%s) - start ))s: $$("$(PROMTOOL)" --version 2>&1 | head -1)"

.PHONY: promtool
promtool: $(PROMTOOL) ## build promtool (Prometheus' rule checker) from its Go module into CACHE_DIR/bin/promtool-<version>/ (only when missing)

# The rules checked and unit-tested by promtool, the dashboards' queries parsed by it, every metric
# they name found in docs/metrics.md, the chart's renderings of both unchanged
# (charts/monitoring-check.sh). No cluster, no cargo build.
# Last line: `monitoring: rules=R dashboards=D metrics_named=N missing=0`.
.PHONY: monitoring-check
monitoring-check: $(PROMTOOL) $(HELM) ## promtool check + unit tests of the chart's alerts (as files and as rendered), dashboard queries parsed, every metric they name in docs/metrics.md
	@PROMTOOL="$(PROMTOOL)" HELM="$(HELM)" CHART_DIR="$(CHART_DIR)" MONITORING_DIR="$(MONITORING_DIR)" bash charts/monitoring-check.sh
