// Package harness starts a metric-provider plugin binary exactly the way the Argo Rollouts
// controller does (argo-rollouts metricproviders/plugin/client/client.go): hashicorp/go-plugin
// NewClient with Argo's handshake and plugin map, Dispense("RpcMetricProviderPlugin"), then
// InitPlugin. It also builds the Go reference plugin and digs out the raw net/rpc client.
package harness

import (
	"bytes"
	"errors"
	"fmt"
	"net/rpc"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	metricrpc "github.com/argoproj/argo-rollouts/metricproviders/plugin/rpc"
	"github.com/argoproj/argo-rollouts/utils/plugin/types"
	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"
)

// Handshake is argo-rollouts' handshakeConfig for metric providers.
var Handshake = goplugin.HandshakeConfig{
	ProtocolVersion:  1,
	MagicCookieKey:   "ARGO_ROLLOUTS_RPC_PLUGIN",
	MagicCookieValue: "metricprovider",
}

// PluginMap is argo-rollouts' pluginMap for metric providers.
var PluginMap = map[string]goplugin.Plugin{
	"RpcMetricProviderPlugin": &metricrpc.RpcMetricProviderPlugin{},
}

// Session is one started (or attached) plugin process with its dispensed plugin.
type Session struct {
	Client   *goplugin.Client
	Protocol goplugin.ClientProtocol
	Plugin   metricrpc.MetricProviderPlugin
	// Init is the reply of the InitPlugin call made right after Dispense.
	Init types.RpcError
	// Log holds everything go-plugin logged for this session, including plugin stderr.
	Log *SyncBuffer
}

// Start launches binary as the controller would and returns the session after InitPlugin.
// If logger is nil, logs go to a fresh SyncBuffer at Trace level.
func Start(binary string, logger hclog.Logger) (*Session, error) {
	return StartWithArgs(binary, nil, logger)
}

// StartWithArgs is Start with the plugin `args` of argo-rollouts-config (Argo >= 1.7 passes them
// as argv).
func StartWithArgs(binary string, args []string, logger hclog.Logger) (*Session, error) {
	s := &Session{}
	if logger == nil {
		s.Log = &SyncBuffer{}
		logger = NewLogger(s.Log)
	}
	s.Client = goplugin.NewClient(&goplugin.ClientConfig{
		HandshakeConfig: Handshake,
		Plugins:         PluginMap,
		Cmd:             exec.Command(binary, args...),
		Managed:         true,
		Logger:          logger,
	})
	return s, s.dispense()
}

// Attach connects to an already running plugin (go-plugin Reattach) and dispenses it.
func Attach(rc *goplugin.ReattachConfig) (*Session, error) {
	s := &Session{Log: &SyncBuffer{}}
	s.Client = goplugin.NewClient(&goplugin.ClientConfig{
		HandshakeConfig: Handshake,
		Plugins:         PluginMap,
		Reattach:        rc,
		Logger:          NewLogger(s.Log),
	})
	return s, s.dispense()
}

func (s *Session) dispense() error {
	proto, err := s.Client.Client()
	if err != nil {
		s.Client.Kill()
		return fmt.Errorf("unable to get plugin client: %w", err)
	}
	s.Protocol = proto
	raw, err := proto.Dispense("RpcMetricProviderPlugin")
	if err != nil {
		s.Client.Kill()
		return fmt.Errorf("unable to dispense plugin: %w", err)
	}
	p, ok := raw.(metricrpc.MetricProviderPlugin)
	if !ok {
		s.Client.Kill()
		return fmt.Errorf("unexpected type from plugin: %T", raw)
	}
	s.Plugin = p
	s.Init = p.InitPlugin()
	return nil
}

// Pid is the plugin's process id (0 if unknown).
func (s *Session) Pid() int {
	if rc := s.Client.ReattachConfig(); rc != nil {
		return rc.Pid
	}
	return 0
}

// Logs returns what was logged so far (empty if a caller-supplied logger was used).
func (s *Session) Logs() string {
	if s.Log == nil {
		return ""
	}
	return s.Log.String()
}

// RawRPC returns the *net/rpc.Client inside Argo's dispensed MetricsPluginRPC. Argo keeps
// it in the unexported field "client"; reflection plus unsafe is the only way to reach it
// without changing the client code under test.
func RawRPC(p metricrpc.MetricProviderPlugin) (*rpc.Client, error) {
	v := reflect.ValueOf(p)
	if v.Kind() != reflect.Pointer || v.IsNil() {
		return nil, fmt.Errorf("dispensed plugin is %T, not a pointer", p)
	}
	f := v.Elem().FieldByName("client")
	if !f.IsValid() || f.Type() != reflect.TypeOf((*rpc.Client)(nil)) {
		return nil, fmt.Errorf("%T has no field client *rpc.Client", p)
	}
	c := reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem().Interface().(*rpc.Client)
	if c == nil {
		return nil, errors.New("dispensed plugin has a nil rpc client")
	}
	return c, nil
}

// NewLogger is an hclog logger in the controller's format (non-JSON, Trace) writing to w.
func NewLogger(w *SyncBuffer) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name:       "plugin",
		Output:     w,
		Level:      hclog.Trace,
		JSONFormat: false,
	})
}

// SyncBuffer is a goroutine-safe bytes.Buffer for log output.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns the buffered text.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// ModuleDir is the directory of this Go module (tests/conformance).
func ModuleDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// BuildGoPlugin builds the Go reference plugin (cmd/goplugin) statically into
// tests/conformance/bin/goplugin and returns its absolute path.
func BuildGoPlugin() (string, error) {
	dir := ModuleDir()
	out := filepath.Join(dir, "bin", "goplugin")
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		goBin = "go"
	}
	cmd := exec.Command(goBin, "build", "-trimpath", "-o", out, "./cmd/goplugin")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOTOOLCHAIN=local")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/goplugin: %v\n%s", err, b)
	}
	return out, nil
}

// RSSKiB reads VmRSS of pid from /proc.
func RSSKiB(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}
