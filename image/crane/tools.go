//go:build tools

// Package tools pins crane (github.com/google/go-containerregistry), which `make image` builds
// to assemble and check the OCI image without a Docker engine.
package tools

import _ "github.com/google/go-containerregistry/cmd/crane"
