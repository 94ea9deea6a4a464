// Protocol tests: transport behaviour that any correct go-plugin netrpc metric provider
// must show (unknown methods, realistic and >1 MiB payloads, 64 concurrent calls on one
// stream, an 80 s idle session, Kill, the cookie check, stderr log parsing, a static binary
// in an empty chroot). Each runs against the Rust binary and the Go reference plugin.
package conformance

import (
	"bufio"
	"context"
	"encoding/gob"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/rpc"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	metricrpc "github.com/argoproj/argo-rollouts/metricproviders/plugin/rpc"
	"github.com/argoproj/argo-rollouts/pkg/apis/rollouts/v1alpha1"
	goplugin "github.com/hashicorp/go-plugin"
	"github.com/hashicorp/go-plugin/runner"

	"github.com/rollouts-dispatch/rollouts-dispatch/tests/conformance/internal/fixture"
	"github.com/rollouts-dispatch/rollouts-dispatch/tests/conformance/internal/harness"
)

// TestUnknownMethod sends calls net/rpc cannot route on the dispensed plugin stream. The
// first one carries a RunArgs body on a fresh stream, so its gob type definitions arrive in
// a body the server must discard but still learn from: the final Run relies on them.
func TestUnknownMethod(t *testing.T) {
	t.Parallel()
	bothPlugins(t, func(t *testing.T, p plugin) {
		s := start(t, p)
		raw, err := harness.RawRPC(s.Plugin)
		if err != nil {
			t.Fatal(err)
		}
		var args any = metricrpc.RunArgs{AnalysisRun: fixture.KargoRun(), Metric: fixture.Metric(fixture.ValidBlock)}
		// Bodies are never a nil interface (new(any)): Go's own server cannot skip one (gob's
		// ignoreInterface reads the next message as the value), and Argo never sends one to
		// an unknown method.
		calls := []struct {
			method string
			args   any
		}{
			{"Plugin.Nope", &args},
			{"Nope.Run", &args},
			{"Plugin.Nope", "a plain string body"},
		}
		for _, c := range calls {
			var reply v1alpha1.Measurement
			var err error
			within(t, callTimeout, c.method, func() { err = raw.Call(c.method, c.args, &reply) })
			var se rpc.ServerError
			if !errors.As(err, &se) {
				t.Fatalf("%s: got %v (%T), want an rpc.ServerError", c.method, err, err)
			}
			if !strings.Contains(err.Error(), "can't find") && !strings.Contains(err.Error(), "unknown") {
				t.Errorf("%s: error %q, want \"can't find ...\" or \"unknown ...\"", c.method, err)
			}
			t.Logf("%s -> %q", c.method, err)
		}
		expectNoServer(t, run(t, s, fixture.KargoRun(), fixture.Metric(fixture.ValidBlock)), "run")
	})
}

// TestRealisticKargoRun sends the Kargo-shaped AnalysisRun through Run, Resume and
// GarbageCollect: the point is the decode of every field type Argo sends.
func TestRealisticKargoRun(t *testing.T) {
	t.Parallel()
	bothPlugins(t, func(t *testing.T, p plugin) {
		s := shared(t, p)
		ar := fixture.KargoRun()
		metric := ar.Spec.Metrics[0]
		expectNoServer(t, run(t, s, ar, metric), "run")
		var m v1alpha1.Measurement
		within(t, callTimeout, "Resume", func() { m = s.Plugin.Resume(ar, metric, ar.Status.MetricResults[0].Measurements[9]) })
		expectNoServer(t, m, "resume")
		within(t, callTimeout, "GarbageCollect", func() {
			if e := s.Plugin.GarbageCollect(ar, metric, 5); e.HasError() {
				t.Errorf("GarbageCollect: %q", e.ErrorString)
			}
		})
	})
}

// TestConcurrentCalls issues 64 Run and 64 GetMetadata calls at once on the one shared
// client (one yamux stream), as the controller's analysis workers do. GetMetadata echoes a
// per-call destination, so a reply routed to the wrong Seq is caught.
func TestConcurrentCalls(t *testing.T) {
	t.Parallel()
	bothPlugins(t, func(t *testing.T, p plugin) {
		s := shared(t, p)
		const n = 64
		var wg sync.WaitGroup
		errs := make(chan error, 2*n)
		ar := fixture.KargoRun()
		for i := 0; i < n; i++ {
			dest := fmt.Sprintf("cluster-%02d", i)
			metric := fixture.MetricWith(map[string]json.RawMessage{fixture.PluginKey: fixture.Block(dest)})
			wg.Add(2)
			go func() {
				defer wg.Done()
				m := s.Plugin.Run(ar, metric)
				if m.Phase != v1alpha1.AnalysisPhaseError || !strings.Contains(m.Message, "failed to run via plugin: ") ||
					!strings.Contains(m.Message, fixture.NoServerMessage) || m.StartedAt == nil || m.FinishedAt == nil {
					errs <- fmt.Errorf("Run %s: %+v", dest, m)
				}
			}()
			go func() {
				defer wg.Done()
				md := s.Plugin.GetMetadata(metric)
				if md["destination"] != dest {
					errs <- fmt.Errorf("GetMetadata %s: got %v", dest, md)
				}
			}()
		}
		within(t, 2*callTimeout, "128 concurrent calls", wg.Wait)
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})
}

// TestLargeRun sends an AnalysisRun whose gob body is well over 1 MiB (several 256 KiB
// yamux windows), then a normal one on the same stream.
func TestLargeRun(t *testing.T) {
	t.Parallel()
	bothPlugins(t, func(t *testing.T, p plugin) {
		s := shared(t, p)
		big := fixture.BigRun(3 << 19) // 1.5 MiB of annotations + 500 extra measurements
		metric := fixture.Metric(fixture.ValidBlock)
		var args any = metricrpc.RunArgs{AnalysisRun: big, Metric: metric}
		var size countingWriter
		if err := gob.NewEncoder(&size).Encode(&args); err != nil || size < 1<<20 {
			t.Fatalf("large RunArgs body is %d bytes (err %v), want > 1 MiB", size, err)
		}
		expectNoServer(t, run(t, s, big, metric), "run")
		var m v1alpha1.Measurement
		within(t, callTimeout, "Resume (large)", func() { m = s.Plugin.Resume(big, metric, fixture.RunningMeasurement()) })
		expectNoServer(t, m, "resume")
		expectNoServer(t, run(t, s, fixture.KargoRun(), metric), "run")
	})
}

// idleFor is the idle period: longer than yamux's 75 s StreamOpenTimeout and than two
// 30 s keepalive intervals. CONFORMANCE_IDLE overrides it for quick local runs.
func idleFor(t *testing.T) time.Duration {
	if v := os.Getenv("CONFORMANCE_IDLE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("CONFORMANCE_IDLE: %v", err)
		}
		return d
	}
	return 80 * time.Second
}

// TestIdleSession leaves a fresh session idle past yamux's StreamOpenTimeout (75 s), which
// closes the session if the stdout/stderr streams were never ACKed, and past two keepalive
// pings, then checks Ping and Run still work.
func TestIdleSession(t *testing.T) {
	t.Parallel()
	bothPlugins(t, func(t *testing.T, p plugin) {
		s := start(t, p)
		time.Sleep(idleFor(t))
		within(t, callTimeout, "Ping", func() {
			if err := s.Protocol.Ping(); err != nil {
				t.Fatalf("Ping after idle: %v", err)
			}
		})
		expectNoServer(t, run(t, s, fixture.KargoRun(), fixture.Metric(fixture.ValidBlock)), "run")
		if s.Client.Exited() {
			t.Errorf("plugin exited")
		}
		if l := s.Logs(); strings.Contains(l, "yamux") || strings.Contains(l, "keepalive") {
			t.Errorf("yamux complained:\n%s", tail(l, 20))
		}
	})
}

// TestKill checks that go-plugin's Kill (Control.Quit, then close) makes the plugin exit
// on its own well within the 2 s grace period that precedes the fallback SIGKILL.
func TestKill(t *testing.T) {
	t.Parallel()
	bothPlugins(t, func(t *testing.T, p plugin) {
		s := start(t, p)
		pid := s.Pid()
		if pid <= 0 {
			t.Fatalf("no pid from ReattachConfig")
		}
		begin := time.Now()
		within(t, 10*time.Second, "Kill", s.Client.Kill)
		elapsed := time.Since(begin)
		if elapsed >= 2*time.Second {
			t.Errorf("Kill took %s; the plugin did not exit after Control.Quit (go-plugin fell back to SIGKILL)", elapsed)
		}
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("pid %d still exists after Kill (kill(pid,0) = %v)", pid, err)
		}
		if !s.Client.Exited() {
			t.Errorf("client does not report the plugin as exited")
		}
		// Not an error: go-plugin's own server exits from inside Control.Quit and often loses
		// the race with writing the reply, so Go plugins get this too. A plugin that ignores
		// Quit is caught above (go-plugin then waits the full 2 s before SIGKILL).
		if strings.Contains(s.Logs(), "plugin failed to exit gracefully") {
			t.Logf("note: the plugin exited before its Control.Quit reply arrived (go-plugin logs \"plugin failed to exit gracefully\")")
		}
		t.Logf("Kill returned after %s", elapsed)
	})
}

// TestNoCookie starts the binary directly, without the magic cookie.
func TestNoCookie(t *testing.T) {
	t.Parallel()
	bothPlugins(t, func(t *testing.T, p plugin) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, p.path)
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "ARGO_ROLLOUTS_RPC_PLUGIN=") && !strings.HasPrefix(kv, "PLUGIN_") {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Errorf("exit: %v, want exit status 1", err)
		}
		if !strings.Contains(stderr.String(), "This binary is a plugin") {
			t.Errorf("stderr = %q, want it to contain %q", stderr.String(), "This binary is a plugin")
		}
		if stdout.Len() != 0 {
			t.Errorf("stdout = %q, want nothing (no handshake without the cookie)", stdout.String())
		}
	})
}

// TestPluginLog checks that the plugin's hclog-style JSON stderr line is parsed by
// go-plugin and re-logged at INFO under the controller's logger (a line go-plugin cannot
// parse, e.g. a bad @timestamp, would be logged verbatim at DEBUG instead).
func TestPluginLog(t *testing.T) {
	t.Parallel()
	bothPlugins(t, func(t *testing.T, p plugin) {
		buf := &harness.SyncBuffer{}
		var s *harness.Session
		var err error
		within(t, 90*time.Second, "start", func() { s, err = harness.Start(p.path, harness.NewLogger(buf)) })
		if err != nil {
			t.Fatal(err)
		}
		defer s.Client.Kill()
		// go-plugin logs under "plugin.<basename of the binary>".
		want := regexp.MustCompile(`\[INFO\]\s+plugin\.` + regexp.QuoteMeta(filepath.Base(p.path)) +
			`: rollouts-dispatch-plugin started`)
		deadline := time.Now().Add(5 * time.Second)
		for !want.MatchString(buf.String()) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		logs := buf.String()
		if !want.MatchString(logs) {
			t.Errorf("no INFO line %q from the plugin; go-plugin logged:\n%s", want, tail(logs, 30))
		}
		for _, line := range strings.Split(logs, "\n") {
			if strings.Contains(line, "@message") {
				t.Errorf("a plugin JSON line was not parsed by go-plugin: %s", line)
			}
		}
	})
}

// TestStaticChroot runs the binary in an empty chroot (nothing but itself and /tmp), the
// way a distroless/static controller image would, then attaches with go-plugin.
func TestStaticChroot(t *testing.T) {
	t.Parallel()
	bothPlugins(t, func(t *testing.T, p plugin) {
		if os.Geteuid() != 0 {
			t.Skip("needs root for chroot(2)")
		}
		root := t.TempDir()
		if err := os.Mkdir(filepath.Join(root, "tmp"), 0o1777); err != nil {
			t.Fatal(err)
		}
		const inside = "/rollouts-dispatch-plugin"
		if err := copyFile(p.path, filepath.Join(root, inside)); err != nil {
			t.Fatal(err)
		}
		stdoutR, stdoutW, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer stdoutR.Close()
		var stderr harness.SyncBuffer
		var cmd *exec.Cmd
		// ETXTBSY: a process forked concurrently by another parallel test may briefly hold
		// the write fd of the copy we just made (golang/go#22315); retry.
		for attempt := 0; ; attempt++ {
			cmd = &exec.Cmd{
				Path:        inside,
				Args:        []string{inside},
				Env:         []string{"ARGO_ROLLOUTS_RPC_PLUGIN=metricprovider", "PLUGIN_PROTOCOL_VERSIONS=1", "PLUGIN_UNIX_SOCKET_DIR=/tmp"},
				Dir:         "/",
				Stdout:      stdoutW,
				Stderr:      &stderr,
				SysProcAttr: &syscall.SysProcAttr{Chroot: root},
			}
			err = cmd.Start()
			if err == nil || !errors.Is(err, syscall.ETXTBSY) || attempt == 50 {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			stdoutW.Close()
			t.Fatalf("start in chroot: %v", err)
		}
		stdoutW.Close()
		exited := make(chan struct{})
		var waitErr error
		go func() { waitErr = cmd.Wait(); close(exited) }()
		died := func(what string) {
			select {
			case <-exited:
				t.Fatalf("plugin %s in the empty chroot (exit: %v); stderr:\n%s", what, waitErr, tail(stderr.String(), 20))
			case <-time.After(5 * time.Second):
				t.Fatalf("plugin %s in the empty chroot; stderr:\n%s", what, tail(stderr.String(), 20))
			}
		}
		defer func() {
			_ = cmd.Process.Kill()
			<-exited
		}()

		lineCh := make(chan string, 1)
		go func() {
			line, _ := bufio.NewReader(stdoutR).ReadString('\n')
			lineCh <- line
			_, _ = io.Copy(io.Discard, stdoutR)
		}()
		var line string
		select {
		case line = <-lineCh:
			if line == "" {
				died("closed stdout before the handshake")
			}
		case <-exited:
			died("exited before the handshake")
		case <-time.After(30 * time.Second):
			t.Fatalf("no handshake line within 30 s")
		}
		parts := strings.Split(strings.TrimSuffix(line, "\n"), "|")
		if len(parts) != 6 || parts[0] != "1" || parts[1] != "1" || parts[2] != "unix" ||
			!strings.HasPrefix(parts[3], "/tmp/plugin") || parts[4] != "netrpc" || parts[5] != "" {
			t.Fatalf("handshake line %q, want 1|1|unix|/tmp/plugin...|netrpc|", line)
		}
		hostAddr := &net.UnixAddr{Name: filepath.Join(root, parts[3]), Net: "unix"}
		pid := cmd.Process.Pid
		var s *harness.Session
		within(t, 60*time.Second, "attach+dispense+InitPlugin", func() {
			s, err = harness.Attach(&goplugin.ReattachConfig{
				Protocol: goplugin.ProtocolNetRPC,
				Addr:     hostAddr,
				Pid:      pid,
				// Our own attached runner instead of go-plugin's default, which dials a
				// throw-away probe connection first and polls the pid (our child would be
				// a zombie until we reap it, so that poll would never end).
				ReattachFunc: func() (runner.AttachedRunner, error) {
					return &childRunner{cmd: cmd, exited: exited}, nil
				},
			})
		})
		if err != nil {
			t.Fatal(err)
		}
		if s.Init.HasError() {
			t.Errorf("InitPlugin: %q", s.Init.ErrorString)
		}
		expectNoServer(t, run(t, s, fixture.KargoRun(), fixture.Metric(fixture.ValidBlock)), "run")
		within(t, 10*time.Second, "Kill", s.Client.Kill)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			t.Errorf("plugin still running 5 s after Kill")
		}
	})
}

// childRunner is a go-plugin runner.AttachedRunner for a child process we started and reap.
type childRunner struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

func (r *childRunner) Wait(context.Context) error { <-r.exited; return nil }
func (r *childRunner) Kill(context.Context) error { return r.cmd.Process.Kill() }
func (r *childRunner) ID() string                 { return strconv.Itoa(r.cmd.Process.Pid) }
func (r *childRunner) PluginToHost(n, a string) (string, string, error) {
	return n, a, nil
}
func (r *childRunner) HostToPlugin(n, a string) (string, string, error) {
	return n, a, nil
}

// countingWriter counts bytes written to it.
type countingWriter int

func (c *countingWriter) Write(p []byte) (int, error) {
	*c += countingWriter(len(p))
	return len(p), nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
