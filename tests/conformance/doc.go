// Package conformance is the Go side of the rollouts-dispatch plugin tests. Its tests
// (conformance_test.go, protocol_test.go) start the plugin binary named by PLUGIN_BINARY
// exactly like the Argo Rollouts controller does and check the behaviour contract and the
// go-plugin/yamux/net/rpc/gob transport; protocol tests also run against the Go reference
// plugin in cmd/goplugin to prove the harness. See conformance.mk for the make targets.
package conformance
