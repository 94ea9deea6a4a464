// Shared setup for the conformance suite: locating/building the plugins under test, one
// long-lived shared session per plugin (like the controller's singleton client), and
// assertion helpers with timeouts so a hung plugin fails a test instead of the whole run.
package conformance

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/argoproj/argo-rollouts/pkg/apis/rollouts/v1alpha1"
	goplugin "github.com/hashicorp/go-plugin"

	"github.com/rollouts-dispatch/rollouts-dispatch/tests/conformance/internal/fixture"
	"github.com/rollouts-dispatch/rollouts-dispatch/tests/conformance/internal/harness"
)

// callTimeout bounds a single RPC; net/rpc itself never times out.
const callTimeout = 30 * time.Second

var (
	rustBinary string // PLUGIN_BINARY: the Rust plugin under test
	goBinary   string // the Go reference plugin, built by TestMain
	goBuildErr error
)

func TestMain(m *testing.M) {
	rustBinary = os.Getenv("PLUGIN_BINARY")
	if rustBinary != "" && !filepath.IsAbs(rustBinary) {
		fmt.Fprintf(os.Stderr, "PLUGIN_BINARY must be an absolute path, got %q\n", rustBinary)
		os.Exit(2)
	}
	if goBinary = os.Getenv("GO_PLUGIN_BINARY"); goBinary == "" {
		goBinary, goBuildErr = harness.BuildGoPlugin()
	}
	code := m.Run()
	goplugin.CleanupClients()
	os.Exit(code)
}

// plugin names a binary under test.
type plugin struct{ name, path string }

// rustPlugin returns the Rust binary or skips the test.
func rustPlugin(t *testing.T) plugin {
	t.Helper()
	if rustBinary == "" {
		t.Skip("PLUGIN_BINARY is not set; run `make conformance` or set PLUGIN_BINARY=/abs/path/to/rollouts-dispatch-plugin")
	}
	if _, err := os.Stat(rustBinary); err != nil {
		t.Fatalf("PLUGIN_BINARY: %v", err)
	}
	return plugin{"rust", rustBinary}
}

// goPlugin returns the Go reference plugin or fails the test.
func goPlugin(t *testing.T) plugin {
	t.Helper()
	if goBuildErr != nil {
		t.Fatalf("building the Go reference plugin: %v", goBuildErr)
	}
	return plugin{"go", goBinary}
}

// bothPlugins runs f as parallel subtests "rust" and "go".
func bothPlugins(t *testing.T, f func(t *testing.T, p plugin)) {
	t.Helper()
	t.Run("rust", func(t *testing.T) {
		t.Parallel()
		f(t, rustPlugin(t))
	})
	t.Run("go", func(t *testing.T) {
		t.Parallel()
		f(t, goPlugin(t))
	})
}

// within runs fn and fails the test if it does not return within d.
func within(t *testing.T, d time.Duration, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s did not return within %s (plugin hung?)", what, d)
	}
}

// start launches a fresh session for p; it is killed when the test ends.
func start(t *testing.T, p plugin) *harness.Session {
	t.Helper()
	var s *harness.Session
	var err error
	within(t, 90*time.Second, "start+dispense+InitPlugin", func() { s, err = harness.Start(p.path, nil) })
	if err != nil {
		t.Fatalf("%s: %v", p.name, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("go-plugin log of %s session:\n%s", p.name, tail(s.Logs(), 40))
		}
		s.Client.Kill()
	})
	if s.Init.HasError() {
		t.Fatalf("InitPlugin returned %q", s.Init.ErrorString)
	}
	return s
}

var (
	sharedMu       sync.Mutex
	sharedSessions = map[string]*harness.Session{}
)

// shared returns the one long-lived session for p, shared by tests like the controller's
// singleton client. It is killed by TestMain.
func shared(t *testing.T, p plugin) *harness.Session {
	t.Helper()
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if s := sharedSessions[p.name]; s != nil {
		if s.Client.Exited() {
			t.Fatalf("shared %s plugin process has exited; log:\n%s", p.name, tail(s.Logs(), 40))
		}
		return s
	}
	var s *harness.Session
	var err error
	within(t, 90*time.Second, "start+dispense+InitPlugin", func() { s, err = harness.Start(p.path, nil) })
	if err != nil {
		t.Fatalf("%s: %v", p.name, err)
	}
	if s.Init.HasError() {
		t.Fatalf("InitPlugin returned %q", s.Init.ErrorString)
	}
	sharedSessions[p.name] = s
	return s
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// run calls Run with a timeout.
func run(t *testing.T, s *harness.Session, ar *v1alpha1.AnalysisRun, m v1alpha1.Metric) v1alpha1.Measurement {
	t.Helper()
	var out v1alpha1.Measurement
	within(t, callTimeout, "Run", func() { out = s.Plugin.Run(ar, m) })
	return out
}

// expectPluginError checks a Measurement that the plugin (not net/rpc) answered with
// Phase Error: Argo's client prefixes "failed to <op> via plugin: " only to replies, while a
// transport error becomes "<Op> rpc call error: ...".
func expectPluginError(t *testing.T, m v1alpha1.Measurement, op, want string) {
	t.Helper()
	if m.Phase != v1alpha1.AnalysisPhaseError {
		t.Errorf("Phase = %q, want Error (message %q)", m.Phase, m.Message)
	}
	prefix := "failed to " + op + " via plugin: "
	if !strings.HasPrefix(m.Message, prefix) {
		t.Errorf("Message = %q, want a plugin reply (prefix %q), not a transport error", m.Message, prefix)
	}
	if !strings.Contains(m.Message, want) {
		t.Errorf("Message = %q, want it to contain %q", m.Message, want)
	}
	if m.FinishedAt == nil {
		t.Errorf("FinishedAt is nil")
	}
}

// expectNoServer checks the reply to a valid Run in this plugin version.
func expectNoServer(t *testing.T, m v1alpha1.Measurement, op string) {
	t.Helper()
	expectPluginError(t, m, op, fixture.NoServerMessage)
	if op == "run" && m.StartedAt == nil {
		t.Errorf("StartedAt is nil")
	}
}
