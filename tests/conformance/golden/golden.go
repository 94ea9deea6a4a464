// Package golden produces the golden gob request vectors in
// metric-provider/tests/fixtures/gob: the exact bytes Argo's own client code writes on a
// fresh net/rpc stream for each case, plus a JSON description of every call, and decodes
// them back so regeneration only rewrites files whose content changed semantically.
package golden

import (
	"bytes"
	"encoding/gob"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/rpc"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"sort"
	"sync"

	metricrpc "github.com/argoproj/argo-rollouts/metricproviders/plugin/rpc"
	"github.com/argoproj/argo-rollouts/pkg/apis/rollouts/v1alpha1"
	"github.com/argoproj/argo-rollouts/utils/plugin/types"

	"github.com/rollouts-dispatch/rollouts-dispatch/tests/conformance/internal/fixture"
)

// BenchStreamCalls is the number of Run calls after the first one in bench_stream.
const BenchStreamCalls = 200

// Case is one golden vector: a fresh net/rpc client stream and the calls made on it.
type Case struct {
	Name string
	// JSON is false when the .json would be too large to be useful (bench_stream).
	JSON bool
	// Drive makes the calls. p is Argo's own client (MetricsPluginRPC) on rc; control-stream
	// calls use rc directly with go-plugin's exact arguments.
	Drive func(p metricrpc.MetricProviderPlugin, rc *rpc.Client) error
}

// Cases returns every golden case, in file-name order.
func Cases() []Case {
	run := fixture.KargoRun()
	metric := run.Spec.Metrics[0]
	measurement := fixture.RunningMeasurement()
	cases := []Case{
		{"control", true, func(_ metricrpc.MetricProviderPlugin, rc *rpc.Client) error {
			// go-plugin rpc_client.go: Dispense, Ping, and Close's Control.Quit.
			var id uint32
			var empty struct{}
			if err := rc.Call("Dispenser.Dispense", "RpcMetricProviderPlugin", &id); err != nil || id != 1 {
				return err
			}
			if err := rc.Call("Control.Ping", true, &empty); err != nil {
				return err
			}
			return rc.Call("Control.Quit", true, &empty)
		}},
		{"init_plugin", true, func(p metricrpc.MetricProviderPlugin, _ *rpc.Client) error {
			return rpcErr(p.InitPlugin())
		}},
		{"type", true, func(p metricrpc.MetricProviderPlugin, _ *rpc.Client) error {
			return stringErr(p.Type())
		}},
		{"run_realistic", true, func(p metricrpc.MetricProviderPlugin, _ *rpc.Client) error {
			return measurementErr(p.Run(run, metric))
		}},
		{"resume", true, func(p metricrpc.MetricProviderPlugin, _ *rpc.Client) error {
			return measurementErr(p.Resume(run, metric, measurement))
		}},
		{"terminate", true, func(p metricrpc.MetricProviderPlugin, _ *rpc.Client) error {
			return measurementErr(p.Terminate(run, metric, measurement))
		}},
		{"garbage_collect", true, func(p metricrpc.MetricProviderPlugin, _ *rpc.Client) error {
			return rpcErr(p.GarbageCollect(run, metric, 5))
		}},
		{"get_metadata", true, func(p metricrpc.MetricProviderPlugin, _ *rpc.Client) error {
			if md := p.GetMetadata(metric); md["error"] != "" {
				return errors.New(md["error"])
			}
			return nil
		}},
		{"run_resume_run", true, func(p metricrpc.MetricProviderPlugin, _ *rpc.Client) error {
			if err := measurementErr(p.Run(run, metric)); err != nil {
				return err
			}
			if err := measurementErr(p.Resume(run, metric, measurement)); err != nil {
				return err
			}
			return measurementErr(p.Run(run, metric))
		}},
		{"bench_stream", false, func(p metricrpc.MetricProviderPlugin, _ *rpc.Client) error {
			for i := 0; i <= BenchStreamCalls; i++ {
				if err := measurementErr(p.Run(run, metric)); err != nil {
					return err
				}
			}
			return nil
		}},
	}
	sort.Slice(cases, func(i, j int) bool { return cases[i].Name < cases[j].Name })
	return cases
}

func rpcErr(e types.RpcError) error {
	if e.HasError() {
		return e
	}
	return nil
}

func stringErr(s string) error {
	if s != "RPCPlugin" {
		return errors.New(s)
	}
	return nil
}

// measurementErr detects transport errors (Argo turns them into an Error measurement).
func measurementErr(m v1alpha1.Measurement) error {
	if m.Phase != v1alpha1.AnalysisPhaseSuccessful {
		return fmt.Errorf("%s: %s", m.Phase, m.Message)
	}
	return nil
}

// Record runs c against an in-process net/rpc server and returns every byte the client
// wrote (one gob stream of (rpc.Request, body) pairs, exactly as net/rpc's gobClientCodec
// produces them for Argo's client) and every byte the Go server wrote back.
func Record(c Case) (requests, replies []byte, err error) {
	cli, srv := net.Pipe()
	server := rpc.NewServer()
	for name, rcvr := range map[string]any{
		"Plugin":    &metricrpc.MetricsRPCServer{Impl: stub{}},
		"Control":   &control{},
		"Dispenser": &dispenser{},
	} {
		if err := server.RegisterName(name, rcvr); err != nil {
			return nil, nil, err
		}
	}
	srvRec := &recorder{Conn: srv}
	go server.ServeConn(srvRec)
	rec := &recorder{Conn: cli}
	rc := rpc.NewClient(rec)
	defer rc.Close()
	p, err := (&metricrpc.RpcMetricProviderPlugin{}).Client(nil, rc)
	if err != nil {
		return nil, nil, err
	}
	if err := c.Drive(p.(metricrpc.MetricProviderPlugin), rc); err != nil {
		return nil, nil, fmt.Errorf("case %s: %w", c.Name, err)
	}
	return rec.Bytes(), srvRec.Bytes(), nil
}

// recorder is a net.Conn that keeps a copy of everything written.
type recorder struct {
	net.Conn
	mu  sync.Mutex
	buf bytes.Buffer
}

func (r *recorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	r.buf.Write(p)
	r.mu.Unlock()
	return r.Conn.Write(p)
}

func (r *recorder) Bytes() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return bytes.Clone(r.buf.Bytes())
}

// StubMeasurementJSON is what the in-process stub answers to Run/Resume/Terminate, with
// sub-second times so reply checks exercise full time precision.
const StubMeasurementJSON = `{"phase":"Successful","message":"ok","value":"true",` +
	`"startedAt":"2026-03-14T09:26:53.123456789Z","finishedAt":"2026-03-14T09:27:01.5+02:00",` +
	`"metadata":{"job-name":"stub","destination":"cluster-a"}}`

func stubMeasurement() v1alpha1.Measurement {
	var m v1alpha1.Measurement
	if err := json.Unmarshal([]byte(StubMeasurementJSON), &m); err != nil {
		panic(err)
	}
	return m
}

// stub is the server-side plugin behind Record; it only has to answer.
type stub struct{}

func (stub) InitPlugin() types.RpcError { return types.RpcError{} }
func (stub) Run(*v1alpha1.AnalysisRun, v1alpha1.Metric) v1alpha1.Measurement {
	return stubMeasurement()
}
func (stub) Resume(*v1alpha1.AnalysisRun, v1alpha1.Metric, v1alpha1.Measurement) v1alpha1.Measurement {
	return stubMeasurement()
}
func (stub) Terminate(*v1alpha1.AnalysisRun, v1alpha1.Metric, v1alpha1.Measurement) v1alpha1.Measurement {
	return stubMeasurement()
}
func (stub) GarbageCollect(*v1alpha1.AnalysisRun, v1alpha1.Metric, int) types.RpcError {
	return types.RpcError{}
}
func (stub) Type() string { return "RPCPlugin" }
func (stub) GetMetadata(v1alpha1.Metric) map[string]string {
	return map[string]string{"plugin-version": "stub"}
}

// control and dispenser mirror go-plugin's controlServer and dispenseServer signatures.
type control struct{}

func (*control) Ping(_ bool, resp *struct{}) error { *resp = struct{}{}; return nil }
func (*control) Quit(_ bool, resp *struct{}) error { *resp = struct{}{}; return nil }

type dispenser struct{}

func (*dispenser) Dispense(_ string, resp *uint32) error { *resp = 1; return nil }

// Call is one decoded request.
type Call struct {
	ServiceMethod string `json:"serviceMethod"`
	Seq           uint64 `json:"seq"`
	ArgsType      string `json:"argsType"`
	Args          any    `json:"args"`
}

// Decode reads a request stream back with encoding/gob: for each call an rpc.Request,
// then the body as net/rpc's server would see it (interface for Plugin.*, string for
// Dispenser.Dispense, bool for Control.*).
func Decode(b []byte) ([]Call, error) {
	dec := gob.NewDecoder(bytes.NewReader(b))
	var calls []Call
	for {
		var req rpc.Request
		if err := dec.Decode(&req); err != nil {
			if errors.Is(err, io.EOF) {
				return calls, nil
			}
			return nil, fmt.Errorf("call %d header: %w", len(calls), err)
		}
		c := Call{ServiceMethod: req.ServiceMethod, Seq: req.Seq}
		var err error
		switch req.ServiceMethod {
		case "Dispenser.Dispense":
			var s string
			err, c.Args, c.ArgsType = dec.Decode(&s), s, "string"
		case "Control.Ping", "Control.Quit":
			var v bool
			err, c.Args, c.ArgsType = dec.Decode(&v), v, "bool"
		default:
			var v any
			err = dec.Decode(&v)
			c.Args, c.ArgsType = v, argsType(v)
		}
		if err != nil {
			return nil, fmt.Errorf("call %d (%s) body: %w", len(calls), req.ServiceMethod, err)
		}
		calls = append(calls, c)
	}
}

func argsType(v any) string {
	if v == nil {
		return "nil"
	}
	t := reflect.TypeOf(v)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.Name()
}

// Dir is the default fixture directory, metric-provider/tests/fixtures/gob, or $GOLDEN_DIR.
func Dir() string {
	if d := os.Getenv("GOLDEN_DIR"); d != "" {
		return d
	}
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "metric-provider", "tests", "fixtures", "gob")
}

// Result says what Write did with one file.
type Result struct {
	File    string
	Written bool
}

// Write regenerates every case into dir. A .gob is rewritten only if its decoded calls
// differ from the existing file's (gob writes map entries in random order, so the bytes of
// two equal runs differ); a .json only if its bytes differ.
func Write(dir string) ([]Result, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var results []Result
	for _, c := range Cases() {
		b, _, err := Record(c)
		if err != nil {
			return nil, err
		}
		calls, err := Decode(b)
		if err != nil {
			return nil, fmt.Errorf("%s: decoding what we just recorded: %w", c.Name, err)
		}
		gobPath := filepath.Join(dir, c.Name+".gob")
		same, err := sameCalls(gobPath, calls)
		if err != nil {
			return nil, err
		}
		if !same {
			if err := os.WriteFile(gobPath, b, 0o644); err != nil {
				return nil, err
			}
		}
		results = append(results, Result{gobPath, !same})
		if !c.JSON {
			continue
		}
		// The JSON describes the decoded values, i.e. what actually travels: e.g. a
		// resource.Quantity has no exported fields but Format, so gob carries only that.
		j, err := MarshalCalls(calls)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.Name, err)
		}
		jsonPath := filepath.Join(dir, c.Name+".json")
		old, err := os.ReadFile(jsonPath)
		write := err != nil || !bytes.Equal(old, j)
		if write {
			if err := os.WriteFile(jsonPath, j, 0o644); err != nil {
				return nil, err
			}
		}
		results = append(results, Result{jsonPath, write})
	}
	return results, nil
}

// MarshalCalls is the .json form of a case: an indented array with a trailing newline.
func MarshalCalls(calls []Call) ([]byte, error) {
	j, err := json.MarshalIndent(calls, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(j, '\n'), nil
}

// sameCalls reports whether path holds a gob stream decoding to calls.
func sameCalls(path string, calls []Call) (bool, error) {
	old, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	oldCalls, err := Decode(old)
	if err != nil {
		return false, nil // unreadable: regenerate
	}
	return reflect.DeepEqual(oldCalls, calls), nil
}
