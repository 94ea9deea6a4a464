# Real Kubernetes control planes and the real Argo Rollouts controller for tests, built from Go
# modules (tests/README.md). Included by the root Makefile, which defines CACHE_DIR and CARGO.
#
# The binaries are cached under $(CACHE_DIR)/bin/<component>-<version>/ and built only when that
# directory is missing. $(CACHE_DIR)/bin/k8s-bin.env maps KEY=/absolute/path for the Rust launcher
# (tests/src/cluster). The versions below must match the go.mod files in tests/k8s/*/ (checked
# before each build).

K8S_DIR := tests/k8s
KUBERNETES_VERSION := v1.37.2
ETCD_VERSION := v3.7.3
KWOK_VERSION := v0.8.0
# v1.10.2 needs Go >= 1.26.10 (`go 1.26.10` in its go.mod); the toolchain here is 1.26.8.
ARGO_ROLLOUTS_VERSION := v1.10.1
# Only the Application CRD manifest is used (the e2e-observe Application tests); no build. The
# module's go.mod says `go 1.27.3`, so `go mod download` needs that toolchain (fetched by Go).
ARGO_CD_VERSION := v3.6.1
ARGO_CD_TOOLCHAIN := go1.27.3

# The second controller `make e2e` runs against (#18: users often run v1.9). Its go.mod says
# `go 1.26.10`, so it is built with the toolchain go1.27.3, which the go command fetches from the
# Go module proxy (tests/k8s/rollouts-v1.9/go.mod).
ARGO_ROLLOUTS_PREV_VERSION := v1.9.3
ARGO_ROLLOUTS_PREV_TOOLCHAIN := go1.27.3

K8S_BIN_ROOT := $(CACHE_DIR)/bin
KUBE_BIN_DIR := $(K8S_BIN_ROOT)/kubernetes-$(KUBERNETES_VERSION)
ETCD_BIN_DIR := $(K8S_BIN_ROOT)/etcd-$(ETCD_VERSION)
KWOK_BIN_DIR := $(K8S_BIN_ROOT)/kwok-$(KWOK_VERSION)
KWOK_CRD_DIR := $(K8S_BIN_ROOT)/kwok-crds-$(KWOK_VERSION)
ARGO_BIN_DIR := $(K8S_BIN_ROOT)/argo-rollouts-$(ARGO_ROLLOUTS_VERSION)
ARGO_CD_DIR := $(K8S_BIN_ROOT)/argo-cd-$(ARGO_CD_VERSION)
ARGO_PREV_BIN_DIR := $(K8S_BIN_ROOT)/argo-rollouts-$(ARGO_ROLLOUTS_PREV_VERSION)
K8S_BIN_ENV := $(K8S_BIN_ROOT)/k8s-bin.env

GO ?= go
# Builds share the 2 cores with Rust builds: lowest priority. The toolchain is the local one.
K8S_GO := GOTOOLCHAIN=local GOFLAGS=-mod=readonly nice -n 19 $(GO)
K8S_GO_BUILD := $(K8S_GO) build -trimpath -ldflags='-s -w'
# What hack/lib/version.sh stamps into a release build; without it the components report
# v0.0.0-master, which clients that parse the server version (Argo Rollouts) reject.
KUBE_VERSION_LDFLAGS := $(foreach pkg,k8s.io/client-go/pkg/version k8s.io/component-base/version,\
	-X $(pkg).gitVersion=$(KUBERNETES_VERSION) -X $(pkg).gitTreeState=clean \
	-X $(pkg).gitMajor=$(word 1,$(subst ., ,$(KUBERNETES_VERSION:v%=%))) \
	-X $(pkg).gitMinor=$(word 2,$(subst ., ,$(KUBERNETES_VERSION:v%=%))))

# $(call k8s_build,MODULE_DIR,MODULE,VERSION,OUT_DIR,COMMAND...): check that tests/k8s/MODULE_DIR
# pins MODULE at VERSION, run COMMAND in it with $$out set to a fresh temporary directory, then
# move that directory to OUT_DIR, so that a build is either complete or absent.
define k8s_build
	@set -euo pipefail; \
	have=$$(cd $(K8S_DIR)/$(1) && $(K8S_GO) list -m -f '{{.Version}}' $(2)); \
	if [ "$$have" != "$(3)" ]; then \
	  echo "k8s.mk: $(K8S_DIR)/$(1)/go.mod pins $(2) $$have, k8s.mk says $(3)" >&2; exit 1; fi; \
	out="$(4).tmp.$$$$"; rm -rf "$$out"; mkdir -p "$$out"; \
	echo "k8s-bin: building $(notdir $(4)) (cold builds take minutes)"; start=$$(date +%s); \
	(cd $(K8S_DIR)/$(1) && $(5)); \
	rm -rf "$(4)"; mv "$$out" "$(4)"; \
	echo "k8s-bin: built $(notdir $(4)) in $$(( $$(date +%s) - start ))s, $$(du -sh "$(4)" | cut -f1)"
endef

$(KUBE_BIN_DIR)/kube-apiserver:
	$(call k8s_build,kube,k8s.io/kubernetes,$(KUBERNETES_VERSION),$(KUBE_BIN_DIR),\
	  $(K8S_GO) build -trimpath -ldflags='-s -w $(strip $(KUBE_VERSION_LDFLAGS))' \
	  -o "$$out/" k8s.io/kubernetes/cmd/kube-apiserver \
	  k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler \
	  k8s.io/kubernetes/cmd/kubectl)

$(ETCD_BIN_DIR)/etcd:
	$(call k8s_build,kube,go.etcd.io/etcd/server/v3,$(ETCD_VERSION),$(ETCD_BIN_DIR),\
	  $(K8S_GO_BUILD) -o "$$out/etcd" go.etcd.io/etcd/server/v3)

$(KWOK_BIN_DIR)/kwok:
	$(call k8s_build,kwok,sigs.k8s.io/kwok,$(KWOK_VERSION),$(KWOK_BIN_DIR),\
	  $(K8S_GO_BUILD) -o "$$out/kwok" sigs.k8s.io/kwok/cmd/kwok)

# kwok's Logs and ClusterLogs CRDs (kustomize/crd/bases/ of the module in the Go module cache),
# never committed: with them a test maps a pod's containers to log files that kwok's kubelet API
# serves to the kube-apiserver's pods/log (tests/src/cluster/kwok.rs).
$(KWOK_CRD_DIR)/kwok.x-k8s.io_logs.yaml:
	@set -euo pipefail; out="$(KWOK_CRD_DIR).tmp.$$$$"; rm -rf "$$out"; mkdir -p "$$out"; \
	src=$$(cd $(K8S_DIR)/kwok && $(K8S_GO) list -m -f '{{.Dir}}' sigs.k8s.io/kwok); \
	cp "$$src"/kustomize/crd/bases/kwok.x-k8s.io_logs.yaml \
	  "$$src"/kustomize/crd/bases/kwok.x-k8s.io_clusterlogs.yaml "$$out/"; chmod -R u+w "$$out"; \
	rm -rf "$(KWOK_CRD_DIR)"; mv "$$out" "$(KWOK_CRD_DIR)"; echo "k8s-bin: copied kwok $(KWOK_VERSION) Logs CRDs"

# The CRDs come from the module zip in the Go module cache (manifests/crds/), never committed.
$(ARGO_BIN_DIR)/rollouts-controller:
	$(call k8s_build,rollouts,github.com/argoproj/argo-rollouts,$(ARGO_ROLLOUTS_VERSION),$(ARGO_BIN_DIR),\
	  $(K8S_GO_BUILD) -o "$$out/rollouts-controller" \
	  github.com/argoproj/argo-rollouts/cmd/rollouts-controller && \
	  src=$$($(K8S_GO) list -m -f '{{.Dir}}' github.com/argoproj/argo-rollouts) && \
	  mkdir -p "$$out/crds" && cp "$$src"/manifests/crds/*.yaml "$$out/crds/" && \
	  chmod -R u+w "$$out/crds")

# Like the rule above, with the toolchain v1.9.3 asks for (k8s_build pins GOTOOLCHAIN=local).
$(ARGO_PREV_BIN_DIR)/rollouts-controller:
	@set -euo pipefail; go="GOTOOLCHAIN=$(ARGO_ROLLOUTS_PREV_TOOLCHAIN) GOFLAGS=-mod=readonly nice -n 19 $(GO)"; \
	have=$$(cd $(K8S_DIR)/rollouts-v1.9 && eval "$$go list -m -f '{{.Version}}' github.com/argoproj/argo-rollouts"); \
	if [ "$$have" != "$(ARGO_ROLLOUTS_PREV_VERSION)" ]; then \
	  echo "k8s.mk: $(K8S_DIR)/rollouts-v1.9/go.mod pins argo-rollouts $$have, k8s.mk says $(ARGO_ROLLOUTS_PREV_VERSION)" >&2; exit 1; fi; \
	out="$(ARGO_PREV_BIN_DIR).tmp.$$$$"; rm -rf "$$out"; mkdir -p "$$out/crds"; \
	echo "k8s-bin: building argo-rollouts $(ARGO_ROLLOUTS_PREV_VERSION) with $(ARGO_ROLLOUTS_PREV_TOOLCHAIN)"; start=$$(date +%s); \
	(cd $(K8S_DIR)/rollouts-v1.9 && eval "$$go build -trimpath -ldflags='-s -w' -o $$out/rollouts-controller github.com/argoproj/argo-rollouts/cmd/rollouts-controller" && \
	  src=$$(eval "$$go list -m -f '{{.Dir}}' github.com/argoproj/argo-rollouts") && cp "$$src"/manifests/crds/*.yaml "$$out/crds/"); \
	chmod -R u+w "$$out/crds"; rm -rf "$(ARGO_PREV_BIN_DIR)"; mv "$$out" "$(ARGO_PREV_BIN_DIR)"; \
	echo "k8s-bin: built argo-rollouts $(ARGO_ROLLOUTS_PREV_VERSION) in $$(( $$(date +%s) - start ))s"

.PHONY: rollouts-prev-bin
rollouts-prev-bin: $(ARGO_PREV_BIN_DIR)/rollouts-controller ## build the Argo Rollouts v1.9 controller (and copy its CRDs) for the second e2e run

# Argo CD's CRDs from the module source in the Go module cache (downloaded if absent: the
# module only, nothing is built), never committed.
$(ARGO_CD_DIR)/crds/application-crd.yaml:
	@set -euo pipefail; out="$(ARGO_CD_DIR).tmp.$$$$"; rm -rf "$$out"; mkdir -p "$$out/crds"; \
	src=$$(cd /tmp && GOTOOLCHAIN=$(ARGO_CD_TOOLCHAIN) GOFLAGS=-mod=mod $(GO) mod download -json \
	  github.com/argoproj/argo-cd/v3@$(ARGO_CD_VERSION) | sed -n 's/^\t"Dir": "\(.*\)",$$/\1/p'); \
	if [ ! -f "$$src/manifests/crds/application-crd.yaml" ]; then \
	  echo "k8s.mk: no manifests/crds/application-crd.yaml in argo-cd $(ARGO_CD_VERSION) ($$src)" >&2; exit 1; fi; \
	cp "$$src"/manifests/crds/*-crd.yaml "$$out/crds/"; chmod -R u+w "$$out"; \
	rm -rf "$(ARGO_CD_DIR)"; mv "$$out" "$(ARGO_CD_DIR)"; echo "k8s-bin: copied argo-cd $(ARGO_CD_VERSION) CRDs"

K8S_BINARIES := $(KUBE_BIN_DIR)/kube-apiserver $(ETCD_BIN_DIR)/etcd $(KWOK_BIN_DIR)/kwok \
	$(KWOK_CRD_DIR)/kwok.x-k8s.io_logs.yaml \
	$(ARGO_BIN_DIR)/rollouts-controller $(ARGO_CD_DIR)/crds/application-crd.yaml

$(K8S_BIN_ENV): $(K8S_BINARIES) $(K8S_DIR)/k8s.mk
	@mkdir -p $(dir $@)
	@{ echo "# written by make k8s-bin (tests/k8s/k8s.mk); read by tests/src/cluster"; \
	  echo "KUBE_APISERVER=$(KUBE_BIN_DIR)/kube-apiserver"; \
	  echo "KUBE_CONTROLLER_MANAGER=$(KUBE_BIN_DIR)/kube-controller-manager"; \
	  echo "KUBE_SCHEDULER=$(KUBE_BIN_DIR)/kube-scheduler"; \
	  echo "KUBECTL=$(KUBE_BIN_DIR)/kubectl"; \
	  echo "ETCD=$(ETCD_BIN_DIR)/etcd"; \
	  echo "KWOK=$(KWOK_BIN_DIR)/kwok"; \
	  echo "ROLLOUTS_CONTROLLER=$(ARGO_BIN_DIR)/rollouts-controller"; \
	  echo "ARGO_ROLLOUTS_CRDS=$(ARGO_BIN_DIR)/crds"; \
	  echo "ARGO_CD_CRDS=$(ARGO_CD_DIR)/crds"; \
	  echo "KWOK_CRDS=$(KWOK_CRD_DIR)"; } > $@.tmp && mv $@.tmp $@
	@echo "k8s-bin: wrote $@"

.PHONY: k8s-bin
k8s-bin: $(K8S_BIN_ENV) ## build the missing test-cluster binaries (kube-*, kubectl, etcd, kwok, rollouts-controller, Argo CD CRDs) into CACHE_DIR/bin
