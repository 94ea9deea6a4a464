// Tests of the golden vectors: the reply streams written by the Rust encoder
// (fixtures/gob/replies/*.gob) must decode with Go's encoding/gob into rpc.Response plus the
// Go reply type and match their .json; the committed request vectors must match what
// Argo's client code produces today.
package golden

import (
	"encoding/gob"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/rpc"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	metricrpc "github.com/argoproj/argo-rollouts/metricproviders/plugin/rpc"
	"github.com/argoproj/argo-rollouts/pkg/apis/rollouts/v1alpha1"
	"github.com/argoproj/argo-rollouts/utils/plugin/types"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rollouts-dispatch/rollouts-dispatch/tests/conformance/internal/fixture"
)

// reply is one entry of replies/<case>.json.
type reply struct {
	ServiceMethod string          `json:"serviceMethod"`
	Seq           uint64          `json:"seq"`
	Error         string          `json:"error"`
	ReplyType     string          `json:"replyType"`
	Reply         json.RawMessage `json:"reply"`
}

// newReply returns a pointer to a zero value of the Go type behind a replyType.
func newReply(replyType string) (any, error) {
	switch replyType {
	case "Measurement":
		return new(v1alpha1.Measurement), nil
	case "RpcError":
		return new(types.RpcError), nil
	case "string":
		return new(string), nil
	case "map":
		return new(map[string]string), nil
	case "uint32":
		return new(uint32), nil
	case "struct":
		return new(struct{}), nil
	}
	return nil, fmt.Errorf("unknown replyType %q", replyType)
}

func TestRustReplies(t *testing.T) {
	dir := filepath.Join(Dir(), "replies")
	files, _ := filepath.Glob(filepath.Join(dir, "*.gob"))
	if len(files) == 0 {
		if os.Getenv("GOLDEN_REQUIRE_REPLIES") != "" {
			t.Fatalf("no reply vectors in %s (GOLDEN_REQUIRE_REPLIES is set): the Rust side must write replies/<case>.gob and .json", dir)
		}
		t.Skipf("no reply vectors in %s yet", dir)
	}
	jsons, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	for _, j := range jsons {
		if _, err := os.Stat(strings.TrimSuffix(j, ".json") + ".gob"); err != nil {
			t.Errorf("%s has no .gob", filepath.Base(j))
		}
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".gob")
		t.Run(name, func(t *testing.T) { checkReplies(t, f) })
	}
}

func checkReplies(t *testing.T, gobPath string) {
	jb, err := os.ReadFile(strings.TrimSuffix(gobPath, ".gob") + ".json")
	if err != nil {
		t.Fatalf("reading the .json: %v", err)
	}
	var want []reply
	if err := json.Unmarshal(jb, &want); err != nil {
		t.Fatalf("parsing the .json: %v", err)
	}
	f, err := os.Open(gobPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// One decoder for the whole file, like net/rpc's client codec for one stream.
	dec := gob.NewDecoder(f)
	for i, w := range want {
		var resp rpc.Response
		if err := dec.Decode(&resp); err != nil {
			t.Fatalf("reply %d: decoding rpc.Response: %v", i, err)
		}
		if resp.ServiceMethod != w.ServiceMethod || resp.Seq != w.Seq || resp.Error != w.Error {
			t.Errorf("reply %d: header {%q %d %q}, json says {%q %d %q}",
				i, resp.ServiceMethod, resp.Seq, resp.Error, w.ServiceMethod, w.Seq, w.Error)
		}
		got, err := newReply(w.ReplyType)
		if err != nil {
			t.Fatalf("reply %d: %v", i, err)
		}
		if err := dec.Decode(got); err != nil {
			t.Fatalf("reply %d: decoding the %s body: %v", i, w.ReplyType, err)
		}
		exp, _ := newReply(w.ReplyType)
		if len(w.Reply) > 0 {
			if err := json.Unmarshal(w.Reply, exp); err != nil {
				t.Fatalf("reply %d: json reply into %s: %v", i, w.ReplyType, err)
			}
		}
		if diff := compare(got, exp); diff != "" {
			t.Errorf("reply %d (%s): gob and json differ: %s", i, w.ServiceMethod, diff)
		}
	}
	var extra rpc.Response
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		t.Errorf("trailing data after %d replies (decode: %v, %+v)", len(want), err, extra)
	}
}

// compare returns "" if gob-decoded got equals json-decoded exp. Times are compared with
// Equal; nil and empty maps are the same (gob never sends an empty map).
func compare(got, exp any) string {
	if g, ok := got.(*v1alpha1.Measurement); ok {
		e := exp.(*v1alpha1.Measurement)
		var d []string
		if g.Phase != e.Phase {
			d = append(d, fmt.Sprintf("Phase %q vs %q", g.Phase, e.Phase))
		}
		if g.Message != e.Message {
			d = append(d, fmt.Sprintf("Message %q vs %q", g.Message, e.Message))
		}
		if g.Value != e.Value {
			d = append(d, fmt.Sprintf("Value %q vs %q", g.Value, e.Value))
		}
		if !sameMap(g.Metadata, e.Metadata) {
			d = append(d, fmt.Sprintf("Metadata %v vs %v", g.Metadata, e.Metadata))
		}
		for _, tt := range []struct {
			name string
			a, b *metav1.Time
		}{{"StartedAt", g.StartedAt, e.StartedAt}, {"FinishedAt", g.FinishedAt, e.FinishedAt}, {"ResumeAt", g.ResumeAt, e.ResumeAt}} {
			if (tt.a == nil) != (tt.b == nil) || (tt.a != nil && !tt.a.Time.Equal(tt.b.Time)) {
				d = append(d, fmt.Sprintf("%s %v vs %v", tt.name, fmtTime(tt.a), fmtTime(tt.b)))
			}
		}
		return strings.Join(d, "; ")
	}
	if g, ok := got.(*map[string]string); ok {
		if !sameMap(*g, *exp.(*map[string]string)) {
			return fmt.Sprintf("%v vs %v", *g, *exp.(*map[string]string))
		}
		return ""
	}
	if !reflect.DeepEqual(got, exp) {
		return fmt.Sprintf("%#v vs %#v", got, exp)
	}
	return ""
}

func sameMap(a, b map[string]string) bool {
	if len(a) == 0 && len(b) == 0 {
		return true
	}
	return reflect.DeepEqual(a, b)
}

func fmtTime(t *metav1.Time) string {
	if t == nil {
		return "nil"
	}
	return t.Time.Format(time.RFC3339Nano)
}

// TestRequestVectorsCurrent checks the committed request vectors decode to exactly what
// Argo's client writes now (the in-process version of `make golden-check`).
func TestRequestVectorsCurrent(t *testing.T) {
	dir := Dir()
	if _, err := os.Stat(dir); err != nil {
		if os.Getenv("GOLDEN_REQUIRE_REPLIES") != "" {
			t.Fatalf("no fixture directory %s", dir)
		}
		t.Skipf("no fixture directory %s; run `make golden`", dir)
	}
	for _, c := range Cases() {
		t.Run(c.Name, func(t *testing.T) {
			b, _, err := Record(c)
			if err != nil {
				t.Fatal(err)
			}
			calls, err := Decode(b)
			if err != nil {
				t.Fatal(err)
			}
			same, err := sameCalls(filepath.Join(dir, c.Name+".gob"), calls)
			if err != nil {
				t.Fatal(err)
			}
			if !same {
				t.Errorf("%s.gob is stale or missing; run `make golden`", c.Name)
			}
			if c.Name == "bench_stream" && len(calls) != BenchStreamCalls+1 {
				t.Errorf("bench_stream has %d calls", len(calls))
			}
		})
	}
}

// TestRecordIsWhatArgoSends double-checks Record against a hand-written encoder doing what
// net/rpc + rpc.go do (one gob.Encoder; Request then &args with args of type any).
func TestRecordIsWhatArgoSends(t *testing.T) {
	for _, c := range Cases() {
		if c.Name != "run_realistic" {
			continue
		}
		b, _, err := Record(c)
		if err != nil {
			t.Fatal(err)
		}
		run := fixtureRun()
		var buf strings.Builder
		enc := gob.NewEncoder(&buf)
		if err := enc.Encode(&rpc.Request{ServiceMethod: "Plugin.Run", Seq: 0}); err != nil {
			t.Fatal(err)
		}
		var args any = run
		if err := enc.Encode(&args); err != nil {
			t.Fatal(err)
		}
		got, err := Decode(b)
		if err != nil {
			t.Fatal(err)
		}
		want, err := Decode([]byte(buf.String()))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("Record differs from a hand-written Request+&args encoding")
		}
		if len(b) != buf.Len() {
			t.Errorf("Record wrote %d bytes, hand-written encoding %d", len(b), buf.Len())
		}
	}
}

func fixtureRun() metricrpc.RunArgs {
	r := fixture.KargoRun()
	return metricrpc.RunArgs{AnalysisRun: r, Metric: r.Spec.Metrics[0]}
}

// TestReplyCheckerOnGoServer proves TestRustReplies' checker on reply streams written by
// Go's own net/rpc server (including an error reply for an unknown method).
func TestReplyCheckerOnGoServer(t *testing.T) {
	dir := t.TempDir()
	m := json.RawMessage(StubMeasurementJSON)
	cases := map[string]struct {
		drive   func(metricrpc.MetricProviderPlugin, *rpc.Client) error
		replies []reply
	}{
		"control": {nil, []reply{
			{"Dispenser.Dispense", 0, "", "uint32", json.RawMessage(`1`)},
			{"Control.Ping", 1, "", "struct", json.RawMessage(`{}`)},
			{"Control.Quit", 2, "", "struct", json.RawMessage(`{}`)},
		}},
		"run_resume_run": {nil, []reply{
			{"Plugin.Run", 0, "", "Measurement", m},
			{"Plugin.Resume", 1, "", "Measurement", m},
			{"Plugin.Run", 2, "", "Measurement", m},
		}},
		"mixed": {func(p metricrpc.MetricProviderPlugin, rc *rpc.Client) error {
			p.InitPlugin()
			p.Type()
			p.GetMetadata(fixtureRun().Metric)
			var out v1alpha1.Measurement
			if err := rc.Call("Plugin.Nope", "x", &out); err == nil {
				return errors.New("Plugin.Nope succeeded")
			}
			p.GarbageCollect(nil, fixtureRun().Metric, 5)
			return nil
		}, []reply{
			{"Plugin.InitPlugin", 0, "", "RpcError", json.RawMessage(`{"ErrorString":""}`)},
			{"Plugin.Type", 1, "", "string", json.RawMessage(`"RPCPlugin"`)},
			{"Plugin.GetMetadata", 2, "", "map", json.RawMessage(`{"plugin-version":"stub"}`)},
			{"Plugin.Nope", 3, "rpc: can't find method Plugin.Nope", "struct", json.RawMessage(`{}`)},
			{"Plugin.GarbageCollect", 4, "", "RpcError", json.RawMessage(`{"ErrorString":""}`)},
		}},
	}
	byName := map[string]Case{}
	for _, c := range Cases() {
		byName[c.Name] = c
	}
	for name, tc := range cases {
		c := byName[name]
		if tc.drive != nil {
			c = Case{Name: name, Drive: tc.drive}
		}
		_, replies, err := Record(c)
		if err != nil {
			t.Fatal(err)
		}
		j, _ := json.Marshal(tc.replies)
		if err := os.WriteFile(filepath.Join(dir, name+".gob"), replies, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name+".json"), j, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Run(name, func(t *testing.T) { checkReplies(t, filepath.Join(dir, name+".gob")) })
	}
}
