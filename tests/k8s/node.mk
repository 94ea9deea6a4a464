# A real node for the real-node tests (`make e2e-real`, tests/README.md): kubelet and kube-proxy of
# the same Kubernetes version as the control plane, CoreDNS, containerd + runc + the CNI plugins
# from Debian's packages, and the small images the node pulls from a loopback registry. Included by
# the root Makefile after tests/k8s/k8s.mk (KUBE_*, K8S_* variables) and image/image.mk (CRANE).
#
# Nothing here is installed by hand: `make real-node-bin` installs the Debian packages that are
# missing (apt-get, as root), builds the Go binaries into $(CACHE_DIR)/bin/ and assembles the
# images into $(CACHE_DIR)/images/, then writes $(CACHE_DIR)/bin/real-node.env (KEY=/absolute/path
# lines read by tests/src/cluster/node/binaries.rs).

# containerd 1.6 and runc 1.1 are Debian 12's; the kubelet v1.37.2 still runs on cgroup v1 hosts
# with `failCgroupV1: false` (pkg/kubelet/apis/config/validation/validation_linux.go:35), which
# this machine is (tests/src/cluster/node/kubelet.rs).
NODE_PACKAGES := containerd runc containernetworking-plugins busybox-static iptables conntrack jq
COREDNS_VERSION := v1.15.0
NODE_BIN_DIR := $(K8S_BIN_ROOT)/kubernetes-node-$(KUBERNETES_VERSION)
COREDNS_DIR := $(K8S_BIN_ROOT)/coredns-$(COREDNS_VERSION)
# The images are keyed by what goes into them: the script, the versions and the Debian packages.
NODE_IMAGES_KEY := $(shell cat $(K8S_DIR)/node-images.sh 2>/dev/null | sha256sum | cut -c1-12)
NODE_IMAGES_DIR := $(CACHE_DIR)/images/node-$(NODE_IMAGES_KEY)
REAL_NODE_ENV := $(K8S_BIN_ROOT)/real-node.env

.PHONY: node-packages
node-packages: ## install the Debian packages a real node needs (containerd, runc, CNI plugins, busybox-static, iptables, conntrack) when missing
	@set -euo pipefail; missing=""; \
	for p in $(NODE_PACKAGES); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "node-packages: installing$$missing"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing >/dev/null || \
	  { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing >/dev/null; }; fi

# Static (CGO off), as the release kubelet and kube-proxy are not required to be, so that the
# node's binaries do not depend on the build machine's libc.
$(NODE_BIN_DIR)/kubelet:
	$(call k8s_build,kube,k8s.io/kubernetes,$(KUBERNETES_VERSION),$(NODE_BIN_DIR),\
	  CGO_ENABLED=0 $(K8S_GO) build -trimpath -ldflags='-s -w $(strip $(KUBE_VERSION_LDFLAGS))' \
	  -o "$$out/" k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy)

$(COREDNS_DIR)/coredns:
	$(call k8s_build,coredns,github.com/coredns/coredns,$(COREDNS_VERSION),$(COREDNS_DIR),\
	  CGO_ENABLED=0 $(K8S_GO_BUILD) -o "$$out/coredns" github.com/coredns/coredns)

# The controller image holds the controller `make k8s-bin` built (and the libraries it links);
# its manifest is the module's own `manifests/install.yaml`, copied beside the images.
$(NODE_IMAGES_DIR)/index.txt: $(K8S_DIR)/node-images.sh $(CRANE) $(ARGO_BIN_DIR)/rollouts-controller | node-packages
	@set -euo pipefail; out="$(NODE_IMAGES_DIR).tmp.$$$$"; rm -rf "$$out"; \
	$(K8S_DIR)/node-images.sh $(CRANE) "$$out" $(ARGO_BIN_DIR)/rollouts-controller $(ARGO_ROLLOUTS_VERSION); \
	src=$$(cd $(K8S_DIR)/rollouts && $(K8S_GO) list -m -f '{{.Dir}}' github.com/argoproj/argo-rollouts); \
	install -m 0644 "$$src/manifests/install.yaml" "$$out/argo-rollouts-install.yaml"; \
	rm -rf "$(NODE_IMAGES_DIR)"; mv "$$out" "$(NODE_IMAGES_DIR)"; echo "real-node: images in $(NODE_IMAGES_DIR)"; \
	find "$(CACHE_DIR)/images" -mindepth 1 -maxdepth 1 -name 'node-*' ! -name "$(notdir $(NODE_IMAGES_DIR))" -exec rm -rf {} +

$(REAL_NODE_ENV): $(NODE_BIN_DIR)/kubelet $(COREDNS_DIR)/coredns $(NODE_IMAGES_DIR)/index.txt $(K8S_DIR)/node.mk | node-packages
	@{ echo "# written by make real-node-bin (tests/k8s/node.mk); read by tests/src/cluster/node"; \
	  echo "KUBELET=$(NODE_BIN_DIR)/kubelet"; \
	  echo "KUBE_PROXY=$(NODE_BIN_DIR)/kube-proxy"; \
	  echo "COREDNS=$(COREDNS_DIR)/coredns"; \
	  echo "CONTAINERD=$$(command -v containerd)"; \
	  echo "CONTAINERD_SHIM=$$(command -v containerd-shim-runc-v2)"; \
	  echo "RUNC=$$(command -v runc)"; \
	  echo "CNI_BIN_DIR=/usr/lib/cni"; \
	  echo "CRANE=$(abspath $(CRANE))"; \
	  echo "NODE_IMAGES=$(NODE_IMAGES_DIR)"; \
	  echo "ROLLOUTS_INSTALL_YAML=$(NODE_IMAGES_DIR)/argo-rollouts-install.yaml"; } > $@.tmp && mv $@.tmp $@
	@echo "real-node: wrote $@"

.PHONY: real-node-bin
real-node-bin: node-packages $(REAL_NODE_ENV) ## install and build what a real node needs (Debian packages, kubelet, kube-proxy, CoreDNS, the test images) into CACHE_DIR
