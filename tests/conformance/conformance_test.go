// Behaviour tests: what this version of rollouts-dispatch-plugin answers to each Argo call
// (InitPlugin, Type, Run with valid/invalid blocks, Resume, Terminate, GarbageCollect,
// GetMetadata). These run only against the Rust binary named by PLUGIN_BINARY.
package conformance

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/argoproj/argo-rollouts/pkg/apis/rollouts/v1alpha1"

	"github.com/rollouts-dispatch/rollouts-dispatch/tests/conformance/internal/fixture"
)

func TestInitAndType(t *testing.T) {
	t.Parallel()
	s := shared(t, rustPlugin(t))
	if s.Init.ErrorString != "" {
		t.Errorf("InitPlugin ErrorString = %q, want empty", s.Init.ErrorString)
	}
	var typ string
	within(t, callTimeout, "Type", func() { typ = s.Plugin.Type() })
	if typ != "RPCPlugin" {
		t.Errorf("Type() = %q, want RPCPlugin", typ)
	}
}

func TestRunValid(t *testing.T) {
	t.Parallel()
	s := shared(t, rustPlugin(t))
	m := run(t, s, fixture.KargoRun(), fixture.Metric(fixture.ValidBlock))
	expectNoServer(t, m, "run")
}

func TestRunInvalid(t *testing.T) {
	t.Parallel()
	p := rustPlugin(t)
	const spec = `"spec":{"template":{"spec":{"restartPolicy":"Never","containers":[{"name":"c","image":"busybox"}]}}}`
	cases := []struct {
		name    string
		plugins map[string]json.RawMessage
		want    string // substring of the message; "" means any non-empty message
	}{
		{"unknown_field", block(`{"destinaton":"cluster-a",` + spec + `}`), "destinaton"},
		{"missing_spec", block(`{"destination":"cluster-a"}`), "spec"},
		{"bad_require", block(`{"destination":"cluster-a","require":"some",` + spec + `}`), "require"},
		{"empty_destination", block(`{"destination":"",` + spec + `}`), "destination"},
		{"unresolved_arg", block(`{"destination":"{{args.destination}}",` + spec + `}`), "destination"},
		{"destination_and_selector", block(`{"destination":"cluster-a","destinationSelector":"env=prod",` + spec + `}`), "destinationSelector"},
		{"bad_selector", block(`{"destinationSelector":"env==",` + spec + `}`), "destinationSelector"},
		{"bad_active_deadline", block(`{"destination":"cluster-a","activeDeadline":"soon",` + spec + `}`), "activeDeadline"},
		{"not_an_object", block(`"x"`), ""},
		{"no_plugin_key", map[string]json.RawMessage{"other-vendor/metric": json.RawMessage(fixture.ValidBlock)}, fixture.PluginKey},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := shared(t, p)
			m := run(t, s, fixture.KargoRun(), fixture.MetricWith(c.plugins))
			expectPluginError(t, m, "run", c.want)
			if strings.TrimPrefix(m.Message, "failed to run via plugin: ") == "" {
				t.Errorf("empty error message")
			}
			if strings.Contains(m.Message, fixture.NoServerMessage) {
				t.Errorf("invalid block got past validation: %q", m.Message)
			}
		})
	}
}

func block(raw string) map[string]json.RawMessage {
	return map[string]json.RawMessage{fixture.PluginKey: json.RawMessage(raw)}
}

func TestResume(t *testing.T) {
	t.Parallel()
	s := shared(t, rustPlugin(t))
	var m v1alpha1.Measurement
	within(t, callTimeout, "Resume", func() {
		m = s.Plugin.Resume(fixture.KargoRun(), fixture.Metric(fixture.ValidBlock), fixture.RunningMeasurement())
	})
	expectNoServer(t, m, "resume")
}

func TestTerminate(t *testing.T) {
	t.Parallel()
	s := shared(t, rustPlugin(t))
	var m v1alpha1.Measurement
	within(t, callTimeout, "Terminate", func() {
		m = s.Plugin.Terminate(fixture.KargoRun(), fixture.Metric(fixture.ValidBlock), fixture.RunningMeasurement())
	})
	if !m.Phase.Completed() {
		t.Errorf("Phase = %q (message %q), want a completed phase", m.Phase, m.Message)
	}
	if strings.Contains(m.Message, "rpc call error") {
		t.Errorf("transport error: %q", m.Message)
	}
	if m.FinishedAt == nil {
		t.Errorf("FinishedAt is nil")
	}
}

func TestGarbageCollect(t *testing.T) {
	t.Parallel()
	s := shared(t, rustPlugin(t))
	within(t, callTimeout, "GarbageCollect", func() {
		if e := s.Plugin.GarbageCollect(fixture.KargoRun(), fixture.Metric(fixture.ValidBlock), 5); e.ErrorString != "" {
			t.Errorf("GarbageCollect ErrorString = %q, want empty", e.ErrorString)
		}
	})
}

func TestGetMetadata(t *testing.T) {
	t.Parallel()
	p := rustPlugin(t)
	t.Run("valid", func(t *testing.T) {
		t.Parallel()
		s := shared(t, p)
		var md map[string]string
		within(t, callTimeout, "GetMetadata", func() { md = s.Plugin.GetMetadata(fixture.Metric(fixture.ValidBlock)) })
		if md["plugin-version"] == "" {
			t.Errorf("plugin-version missing in %v", md)
		}
		if md["destination"] != fixture.Destination {
			t.Errorf("destination = %q, want %q (metadata %v)", md["destination"], fixture.Destination, md)
		}
		if e, ok := md["error"]; ok {
			t.Errorf("unexpected error %q", e)
		}
	})
	t.Run("invalid", func(t *testing.T) {
		t.Parallel()
		s := shared(t, p)
		var md map[string]string
		within(t, callTimeout, "GetMetadata", func() {
			md = s.Plugin.GetMetadata(fixture.Metric(`{"destinaton":"cluster-a","spec":{}}`))
		})
		e, ok := md["error"]
		if !ok || !strings.Contains(e, "destinaton") {
			t.Errorf("metadata = %v, want key error naming destinaton", md)
		}
		if strings.Contains(e, "rpc call error") {
			t.Errorf("transport error: %q", e)
		}
	})
}
