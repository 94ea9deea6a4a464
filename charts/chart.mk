# The Helm chart (charts/rollouts-dispatch/) and its checks. Included by the root Makefile, which
# defines CACHE_DIR and CARGO; tests/k8s/k8s.mk defines K8S_BIN_ENV and `k8s-bin`.
#
# helm is built from its Go module, pinned in the tool module charts/tools/go.mod (go.sum
# alongside), into $(CACHE_DIR)/bin/helm-<version>/helm, only when that file is missing.
# HELM_VERSION must match charts/tools/go.mod (checked before the build).

CHART_DIR := charts/rollouts-dispatch
CHART_TOOLS_DIR := charts/tools
HELM_VERSION := v3.22.0
HELM_BIN_DIR := $(CACHE_DIR)/bin/helm-$(HELM_VERSION)
HELM := $(HELM_BIN_DIR)/helm
# Rendered manifests and logs of the last `make chart`.
CHART_OUT := $(CACHE_DIR)/chart

CHART_GO := GOTOOLCHAIN=local GOFLAGS=-mod=readonly nice -n 10 $(or $(GO),go)

# The version stamps of helm's own Makefile: `helm version`, and the Kubernetes version that
# `helm lint` / `helm template` assume, from the client-go the module resolves (v0.X → 1.X).
$(HELM):
	@set -euo pipefail; \
	have=$$(cd $(CHART_TOOLS_DIR) && $(CHART_GO) list -m -f '{{.Version}}' helm.sh/helm/v3); \
	if [ "$$have" != "$(HELM_VERSION)" ]; then \
	  echo "chart.mk: $(CHART_TOOLS_DIR)/go.mod pins helm.sh/helm/v3 $$have, chart.mk says $(HELM_VERSION)" >&2; exit 1; fi; \
	kminor=$$(cd $(CHART_TOOLS_DIR) && $(CHART_GO) list -m -f '{{.Version}}' k8s.io/client-go | cut -d. -f2); \
	out="$(HELM_BIN_DIR).tmp.$$$$"; rm -rf "$$out"; mkdir -p "$$out"; \
	echo "helm: building $(HELM_VERSION) (a cold build takes minutes)"; start=$$(date +%s); \
	(cd $(CHART_TOOLS_DIR) && $(CHART_GO) build -trimpath -o "$$out/helm" -ldflags="-s -w \
	  -X helm.sh/helm/v3/internal/version.version=$(HELM_VERSION) \
	  -X helm.sh/helm/v3/internal/version.gitTreeState=clean \
	  -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$$kminor \
	  -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$$kminor" \
	  helm.sh/helm/v3/cmd/helm); \
	rm -rf "$(HELM_BIN_DIR)"; mv "$$out" "$(HELM_BIN_DIR)"; \
	echo "helm: built $(HELM_VERSION) in $$(( $$(date +%s) - start ))s: $$("$(HELM)" version --short)"

.PHONY: helm
helm: $(HELM) ## build helm from its Go module into CACHE_DIR/bin/helm-<version>/ (only when missing)

# lint and template with the default values and every ci/*-values.yaml, invalid values refused, then
# against a real kube-apiserver started by the Rust launcher: the DispatchJob CRD applied, a
# server-side dry-run apply of every rendering, the RBAC renderings applied for real and checked
# with SubjectAccessReviews (charts/chart-check.sh). Last line:
# `chart: lint=ok template=ok dry_run=ok apply=ok rbac=ok (N SubjectAccessReviews) variants=K`.
.PHONY: chart
chart: $(HELM) k8s-bin ## lint + render the Helm chart (every ci/*-values.yaml), dry-run and apply it on a real test cluster, check its RBAC
	@HELM="$(HELM)" CARGO="$(CARGO)" K8S_BIN_ENV="$(K8S_BIN_ENV)" CHART_DIR="$(CHART_DIR)" \
	  CHART_OUT="$(CHART_OUT)" bash charts/chart-check.sh
