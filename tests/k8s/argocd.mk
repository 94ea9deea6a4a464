# A real Argo CD for the real Argo CD tests (`make e2e-argocd`, tests/README.md, issue #29): the
# application controller and the repo-server, built from github.com/argoproj/argo-cd/v3 (one
# binary that picks its component from argv[0] or ARGOCD_BINARY_NAME, cmd/main.go:36-52), its
# CRDs from the same module, and Redis from Debian. Included by the root Makefile after
# tests/k8s/k8s.mk (K8S_*, k8s_build).
#
# `make argocd-bin` installs redis-server when it is missing (apt-get, as root), builds the binary
# into $(CACHE_DIR)/bin/argo-cd-$(ARGOCD_REAL_VERSION)/ with one symlink per component, and
# writes $(CACHE_DIR)/bin/argocd.env (KEY=/absolute/path lines read by
# tests/src/cluster/argocd_real/binaries.rs).

# v3.2 is the last minor whose gitops-engine is its own module on the module proxy; the version
# must match tests/k8s/argocd/go.mod (k8s_build checks). Its go.mod says `go 1.25.5`: the local
# toolchain builds it.
ARGOCD_REAL_VERSION := v3.2.6
ARGOCD_REAL_DIR := $(K8S_BIN_ROOT)/argo-cd-$(ARGOCD_REAL_VERSION)
ARGOCD_MANIFESTS_DIR := $(K8S_BIN_ROOT)/argo-cd-manifests-$(ARGOCD_REAL_VERSION)
ARGOCD_ENV := $(K8S_BIN_ROOT)/argocd.env
ARGOCD_PACKAGES := redis-server

.PHONY: argocd-packages
argocd-packages: ## install the Debian packages the real Argo CD needs (redis-server) when missing
	@set -euo pipefail; missing=""; \
	for p in $(ARGOCD_PACKAGES); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "argocd-packages: installing$$missing"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing >/dev/null || \
	  { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing >/dev/null; }; fi

# Static (CGO off), as Argo CD's own release build is (its Makefile's `argocd-all`: CGO_ENABLED=0).
# `version` is what the release build stamps (its Makefile: `-X ${PACKAGE}.version=${VERSION}`);
# with no commit known from the module zip the binary reports `v3.2.6+unknown`.
$(ARGOCD_REAL_DIR)/argocd:
	$(call k8s_build,argocd,github.com/argoproj/argo-cd/v3,$(ARGOCD_REAL_VERSION),$(ARGOCD_REAL_DIR),\
	  CGO_ENABLED=0 $(K8S_GO) build -trimpath -ldflags='-s -w -X github.com/argoproj/argo-cd/v3/common.version=$(ARGOCD_REAL_VERSION:v%=%)' \
	  -o "$$out/argocd" github.com/argoproj/argo-cd/v3/cmd && \
	  ln -s argocd "$$out/argocd-application-controller" && ln -s argocd "$$out/argocd-repo-server")

# What an install applies before any component starts, from the same module (never committed):
# the CRDs (manifests/crds/) and the ConfigMaps and Secret the components read
# (manifests/base/config/: argocd-cm with the default resource exclusions, argocd-rbac-cm,
# argocd-secret).
$(ARGOCD_MANIFESTS_DIR)/crds/application-crd.yaml:
	@set -euo pipefail; out="$(ARGOCD_MANIFESTS_DIR).tmp.$$$$"; rm -rf "$$out"; mkdir -p "$$out/crds" "$$out/config"; \
	src=$$(cd $(K8S_DIR)/argocd && $(K8S_GO) list -m -f '{{.Dir}}' github.com/argoproj/argo-cd/v3); \
	cp "$$src"/manifests/crds/*-crd.yaml "$$out/crds/"; \
	cp "$$src"/manifests/base/config/argocd-cm.yaml "$$src"/manifests/base/config/argocd-rbac-cm.yaml \
	  "$$src"/manifests/base/config/argocd-secret.yaml "$$out/config/"; chmod -R u+w "$$out"; \
	rm -rf "$(ARGOCD_MANIFESTS_DIR)"; mv "$$out" "$(ARGOCD_MANIFESTS_DIR)"; echo "argocd-bin: copied argo-cd $(ARGOCD_REAL_VERSION) CRDs and config"

$(ARGOCD_ENV): $(ARGOCD_REAL_DIR)/argocd $(ARGOCD_MANIFESTS_DIR)/crds/application-crd.yaml $(K8S_DIR)/argocd.mk | argocd-packages
	@mkdir -p $(dir $@)
	@{ echo "# written by make argocd-bin (tests/k8s/argocd.mk); read by tests/src/cluster/argocd_real"; \
	  echo "ARGOCD_VERSION=$(ARGOCD_REAL_VERSION)"; \
	  echo "ARGOCD_APPLICATION_CONTROLLER=$(ARGOCD_REAL_DIR)/argocd-application-controller"; \
	  echo "ARGOCD_REPO_SERVER=$(ARGOCD_REAL_DIR)/argocd-repo-server"; \
	  echo "ARGOCD_MANIFESTS=$(ARGOCD_MANIFESTS_DIR)"; \
	  echo "REDIS_SERVER=$$(command -v redis-server)"; \
	  echo "GIT=$$(command -v git)"; } > $@.tmp && mv $@.tmp $@
	@echo "argocd-bin: wrote $@"

.PHONY: argocd-bin
argocd-bin: argocd-packages $(ARGOCD_ENV) ## build the real Argo CD $(ARGOCD_REAL_VERSION) (application controller, repo-server, CRDs) and install redis-server into CACHE_DIR
