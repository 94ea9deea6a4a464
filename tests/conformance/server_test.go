// Plugin behaviour when a server is configured but cannot be reached, and with bad plugin args:
// the measurement must stay Running with a retry ResumeAt (not burn consecutiveErrorLimit) until
// the outage deadline, and bad args must stop the plugin with a message naming the flag.
package conformance

import (
	"strings"
	"testing"
	"time"

	"github.com/argoproj/argo-rollouts/pkg/apis/rollouts/v1alpha1"

	"github.com/rollouts-dispatch/rollouts-dispatch/tests/conformance/internal/fixture"
	"github.com/rollouts-dispatch/rollouts-dispatch/tests/conformance/internal/harness"
)

// unreachable is a loopback port nothing listens on.
const unreachable = "http://127.0.0.1:9"

func startWithArgs(t *testing.T, args ...string) *harness.Session {
	t.Helper()
	var s *harness.Session
	var err error
	within(t, 90*time.Second, "start+dispense+InitPlugin", func() { s, err = harness.StartWithArgs(rustPlugin(t).path, args, nil) })
	if err != nil {
		t.Fatalf("start with args %v: %v", args, err)
	}
	t.Cleanup(s.Client.Kill)
	return s
}

func TestServerUnreachableKeepsRunning(t *testing.T) {
	t.Parallel()
	s := startWithArgs(t, "--server", unreachable, "--outage-deadline", "1h", "--request-timeout", "2s")
	before := time.Now()
	m := run(t, s, fixture.KargoRun(), fixture.Metric(fixture.ValidBlock))
	if m.Phase != v1alpha1.AnalysisPhaseRunning {
		t.Fatalf("phase %q (message %q), want Running while the server is unreachable", m.Phase, m.Message)
	}
	if !strings.Contains(m.Message, "waiting for the rollouts-dispatch server") || !strings.Contains(m.Message, "127.0.0.1:9") {
		t.Errorf("message %q does not say it waits for the server at 127.0.0.1:9", m.Message)
	}
	if m.ResumeAt == nil || !m.ResumeAt.Time.After(before) {
		t.Fatalf("ResumeAt %v must be set in the future, or nothing calls Resume", m.ResumeAt)
	}
	if m.StartedAt == nil || m.FinishedAt != nil {
		t.Errorf("StartedAt %v FinishedAt %v: want started, not finished", m.StartedAt, m.FinishedAt)
	}
	since := m.Metadata["rollouts-dispatch/outage-since"]
	if since == "" {
		t.Fatalf("metadata %v lacks the outage start", m.Metadata)
	}
	var r v1alpha1.Measurement
	within(t, callTimeout, "Resume", func() { r = s.Plugin.Resume(fixture.KargoRun(), fixture.Metric(fixture.ValidBlock), m) })
	if r.Phase != v1alpha1.AnalysisPhaseRunning || r.Metadata["rollouts-dispatch/outage-since"] != since {
		t.Errorf("resume during the outage: phase %q metadata %v, want Running with outage-since %s kept", r.Phase, r.Metadata, since)
	}
}

func TestServerOutageDeadlineGivesError(t *testing.T) {
	t.Parallel()
	s := startWithArgs(t, "--server", unreachable, "--outage-deadline", "0s", "--request-timeout", "2s")
	m := run(t, s, fixture.KargoRun(), fixture.Metric(fixture.ValidBlock))
	expectPluginError(t, m, "run", "rollouts-dispatch server unavailable since")
}

func TestBadServerArgStopsThePlugin(t *testing.T) {
	t.Parallel()
	log := &harness.SyncBuffer{}
	_, err := harness.StartWithArgs(rustPlugin(t).path, []string{"--server", "ftp://example"}, harness.NewLogger(log))
	if err == nil {
		t.Fatal("the plugin started with --server ftp://example")
	}
	if !strings.Contains(log.String(), "--server") || !strings.Contains(log.String(), "ftp://example") {
		t.Errorf("the controller log does not name the bad flag:\n%s", log.String())
	}
}
