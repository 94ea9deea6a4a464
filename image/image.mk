# The OCI image of rollouts-dispatch (server and agent), built without a Docker engine: a static
# binary on an empty base, assembled and checked with crane (github.com/google/go-containerregistry,
# built from the Go module pinned in image/crane/go.mod). Included by the root Makefile.

CRANE_VERSION := v0.22.1
CRANE_DIR := $(CACHE_DIR)/bin/crane-$(CRANE_VERSION)
CRANE := $(CRANE_DIR)/crane
# Static like the plugin (same target and flags): the image has no libc.
SERVER_BIN := target/$(TARGET)/release/rollouts-dispatch
IMAGE_DIR := target/image
# The repository the Helm chart pulls by default (charts/rollouts-dispatch/values.yaml image.repository;
# image/check.sh keeps them equal).
IMAGE_REPOSITORY := ghcr.io/rollouts-dispatch/rollouts-dispatch
IMAGE_ARCHIVE := $(IMAGE_DIR)/rollouts-dispatch-$(VERSION)-image-oci.tar

$(CRANE):
	@set -euo pipefail; \
	have=$$(cd image/crane && GOTOOLCHAIN=local GOFLAGS=-mod=readonly $(GO) list -m -f '{{.Version}}' github.com/google/go-containerregistry); \
	if [ "$$have" != "$(CRANE_VERSION)" ]; then echo "image.mk: image/crane/go.mod pins $$have, image.mk says $(CRANE_VERSION)" >&2; exit 1; fi; \
	out="$(CRANE_DIR).tmp.$$$$"; rm -rf "$$out"; mkdir -p "$$out"; \
	(cd image/crane && GOTOOLCHAIN=local GOFLAGS=-mod=readonly nice -n 19 $(GO) build -trimpath -ldflags='-s -w' -o "$$out/crane" github.com/google/go-containerregistry/cmd/crane); \
	rm -rf "$(CRANE_DIR)"; mv "$$out" "$(CRANE_DIR)"

.PHONY: server-release
server-release: ## build the static release server/agent binary ($(SERVER_BIN))
	RUSTFLAGS="$(STATIC_RUSTFLAGS)" $(CARGO) build --release --locked --target $(TARGET) -p dispatch-server --bin rollouts-dispatch
	@if readelf -l $(SERVER_BIN) | grep -q INTERP || readelf -d $(SERVER_BIN) | grep -q NEEDED; then echo "error: $(SERVER_BIN) is not statically linked"; exit 1; fi

.PHONY: image
image: server-release plugin-release $(CRANE) ## OCI image of rollouts-dispatch in target/image (static server and plugin, empty base, uid 65532), run from its root filesystem in a read-only chroot; last line `image: digest=… size_mib=… chroot_run=ok uid=65532`
	image/build.sh $(CRANE) $(SERVER_BIN) $(PLUGIN_BIN) $(IMAGE_DIR) $(VERSION) $$(git rev-parse HEAD 2>/dev/null || echo unknown) $(IMAGE_REPOSITORY)
	image/check.sh $(IMAGE_DIR) $(SERVER_BIN) $(PLUGIN_BIN) charts/rollouts-dispatch
