// Command goplugin is the Go reference metric-provider plugin: it is served with Argo's own
// rpc package and does the same trivial work as this version of rollouts-dispatch-plugin,
// so the conformance suite and the benchmark can prove the harness against a known-good peer.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	metricrpc "github.com/argoproj/argo-rollouts/metricproviders/plugin/rpc"
	"github.com/argoproj/argo-rollouts/pkg/apis/rollouts/v1alpha1"
	"github.com/argoproj/argo-rollouts/utils/plugin/types"
	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	pluginKey       = "rollouts-dispatch/job"
	noServerMessage = "no server configured (set --server / ROLLOUTS_DISPATCH_SERVER)"
)

// config is the subset of the rollouts-dispatch/job block the reference plugin reads.
type config struct {
	Destination string          `json:"destination"`
	Spec        json.RawMessage `json:"spec"`
}

type impl struct{}

func parse(metric v1alpha1.Metric) (config, error) {
	var c config
	raw, ok := metric.Provider.Plugin[pluginKey]
	if !ok {
		return c, fmt.Errorf("metric %q has no %s provider block", metric.Name, pluginKey)
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return c, fmt.Errorf("invalid %s block: %w", pluginKey, err)
	}
	return c, nil
}

func errorMeasurement(msg string) v1alpha1.Measurement {
	now := metav1.Now()
	return v1alpha1.Measurement{Phase: v1alpha1.AnalysisPhaseError, Message: msg, StartedAt: &now, FinishedAt: &now}
}

func (impl) InitPlugin() types.RpcError { return types.RpcError{} }

func (impl) Run(_ *v1alpha1.AnalysisRun, metric v1alpha1.Metric) v1alpha1.Measurement {
	if _, err := parse(metric); err != nil {
		return errorMeasurement(err.Error())
	}
	return errorMeasurement(noServerMessage)
}

func (impl) Resume(_ *v1alpha1.AnalysisRun, metric v1alpha1.Metric, _ v1alpha1.Measurement) v1alpha1.Measurement {
	if _, err := parse(metric); err != nil {
		return errorMeasurement(err.Error())
	}
	return errorMeasurement(noServerMessage)
}

func (impl) Terminate(_ *v1alpha1.AnalysisRun, _ v1alpha1.Metric, m v1alpha1.Measurement) v1alpha1.Measurement {
	now := metav1.Now()
	m.Phase, m.Message, m.FinishedAt = v1alpha1.AnalysisPhaseFailed, "terminated", &now
	return m
}

func (impl) GarbageCollect(*v1alpha1.AnalysisRun, v1alpha1.Metric, int) types.RpcError {
	return types.RpcError{}
}

func (impl) Type() string { return "RPCPlugin" }

func (impl) GetMetadata(metric v1alpha1.Metric) map[string]string {
	c, err := parse(metric)
	if err != nil {
		return map[string]string{"error": err.Error()}
	}
	return map[string]string{"plugin-version": "go-reference", "destination": c.Destination}
}

func main() {
	logger := hclog.New(&hclog.LoggerOptions{
		Name:       "rollouts-dispatch-goplugin",
		Output:     os.Stderr,
		Level:      hclog.Info,
		JSONFormat: true,
	})
	// Serve checks the cookie first, so this line only appears under a real host.
	if os.Getenv("ARGO_ROLLOUTS_RPC_PLUGIN") == "metricprovider" {
		logger.Info("rollouts-dispatch-plugin started", "version", "go-reference")
	}
	goplugin.Serve(&goplugin.ServeConfig{
		HandshakeConfig: goplugin.HandshakeConfig{
			ProtocolVersion:  1,
			MagicCookieKey:   "ARGO_ROLLOUTS_RPC_PLUGIN",
			MagicCookieValue: "metricprovider",
		},
		Plugins: map[string]goplugin.Plugin{
			"RpcMetricProviderPlugin": &metricrpc.RpcMetricProviderPlugin{Impl: impl{}},
		},
	})
}
