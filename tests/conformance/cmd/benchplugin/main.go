// Command benchplugin compares the Rust plugin with the Go reference plugin side by side,
// in one run, through Argo's own client: Run round-trip latency (p50/p99) with the
// realistic Kargo AnalysisRun, plugin RSS after those calls, and gob decode time of the
// realistic RunArgs (Go encoding/gob here vs the Rust decoder via -rust-decode). The last
// line is machine-readable: ratio_roundtrip_p50=X ratio_rss=Y ratio_decode=Z.
package main

import (
	"bytes"
	"encoding/gob"
	"errors"
	"flag"
	"fmt"
	"math"
	"net/rpc"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/argoproj/argo-rollouts/pkg/apis/rollouts/v1alpha1"

	"github.com/rollouts-dispatch/rollouts-dispatch/tests/conformance/golden"
	"github.com/rollouts-dispatch/rollouts-dispatch/tests/conformance/internal/fixture"
	"github.com/rollouts-dispatch/rollouts-dispatch/tests/conformance/internal/harness"
)

func main() {
	ours := flag.String("ours", "", "path of the Rust plugin binary (required)")
	goBin := flag.String("go", "", "path of the Go reference plugin (default: build cmd/goplugin into bin/)")
	n := flag.Int("n", 10000, "measured Run calls per plugin")
	warmup := flag.Int("warmup", 500, "unmeasured Run calls per plugin before measuring")
	rustDecode := flag.String("rust-decode", "", "Rust decode benchmark command; the bench_stream path is appended and the last line must be ns_per_op=<float>")
	stream := flag.String("stream", filepath.Join(golden.Dir(), "bench_stream.gob"), "bench_stream.gob golden vector")
	flag.Parse()
	if err := benchmark(*ours, *goBin, *n, *warmup, *rustDecode, *stream); err != nil {
		fmt.Fprintln(os.Stderr, "benchplugin:", err)
		os.Exit(1)
	}
}

type result struct {
	p50, p99 time.Duration
	rssKiB   int64
	decodeNs float64 // NaN if not available
}

func benchmark(ours, goBin string, n, warmup int, rustDecode, stream string) error {
	if ours == "" {
		return errors.New("-ours is required")
	}
	if goBin == "" {
		var err error
		if goBin, err = harness.BuildGoPlugin(); err != nil {
			return err
		}
	}
	rust, err := harness.Start(ours, nil)
	if err != nil {
		return fmt.Errorf("starting %s: %w", ours, err)
	}
	defer rust.Client.Kill()
	gop, err := harness.Start(goBin, nil)
	if err != nil {
		return fmt.Errorf("starting %s: %w", goBin, err)
	}
	defer gop.Client.Kill()

	ar := fixture.KargoRun()
	metric := ar.Spec.Metrics[0]
	for _, s := range []*harness.Session{rust, gop} {
		for i := 0; i < warmup; i++ {
			if err := checkRun(s.Plugin.Run(ar, metric)); err != nil {
				return fmt.Errorf("warm-up: %w", err)
			}
		}
	}
	// Interleave blocks so both plugins see the same machine load.
	const block = 500
	lat := map[*harness.Session][]time.Duration{}
	for done := 0; done < n; done += block {
		k := min(block, n-done)
		for _, s := range []*harness.Session{rust, gop} {
			for i := 0; i < k; i++ {
				t0 := time.Now()
				m := s.Plugin.Run(ar, metric)
				lat[s] = append(lat[s], time.Since(t0))
				if err := checkRun(m); err != nil {
					return err
				}
			}
		}
	}
	res := map[*harness.Session]*result{}
	for _, s := range []*harness.Session{rust, gop} {
		d := lat[s]
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		r := &result{p50: d[len(d)/2], p99: d[len(d)*99/100]}
		if r.rssKiB, err = harness.RSSKiB(s.Pid()); err != nil {
			return err
		}
		res[s] = r
	}
	if res[gop].decodeNs, err = goDecode(stream); err != nil {
		return err
	}
	res[rust].decodeNs = rustDecodeNs(rustDecode, stream)

	r, g := res[rust], res[gop]
	fmt.Printf("Run round trip with the realistic Kargo AnalysisRun, %d calls each after %d warm-up, via Argo's client\n\n", n, warmup)
	fmt.Printf("%-34s %14s %14s %8s\n", "", "ours (rust)", "go reference", "ours/go")
	row := func(name string, a, b float64, format string) {
		fmt.Printf("%-34s %14s %14s %8s\n", name, fmtNum(a, format), fmtNum(b, format), ratio(a, b))
	}
	row("Run round trip p50 (µs)", us(r.p50), us(g.p50), "%.1f")
	row("Run round trip p99 (µs)", us(r.p99), us(g.p99), "%.1f")
	row(fmt.Sprintf("plugin VmRSS after %d runs (KiB)", n+warmup), float64(r.rssKiB), float64(g.rssKiB), "%.0f")
	row("gob decode RunArgs (ns/op)", r.decodeNs, g.decodeNs, "%.0f")
	fmt.Println()
	fmt.Printf("ratio_roundtrip_p50=%s ratio_rss=%s ratio_decode=%s\n",
		ratio(us(r.p50), us(g.p50)), ratio(float64(r.rssKiB), float64(g.rssKiB)), ratio(g.decodeNs, r.decodeNs))
	return nil
}

func checkRun(m v1alpha1.Measurement) error {
	if m.Phase != v1alpha1.AnalysisPhaseError || !strings.Contains(m.Message, fixture.NoServerMessage) {
		return fmt.Errorf("unexpected Run reply: %s %q", m.Phase, m.Message)
	}
	return nil
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func fmtNum(v float64, format string) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	return fmt.Sprintf(format, v)
}

func ratio(a, b float64) string {
	if math.IsNaN(a) || math.IsNaN(b) || b == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", a/b)
}

// goDecode times encoding/gob decoding the 200 calls after the first in bench_stream: the
// type definitions arrive with call 0, so each timed op is a header plus a RunArgs body
// decoded into an interface, as net/rpc's server does. It returns the best of 30 passes.
func goDecode(path string) (float64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("%w (run `make golden`)", err)
	}
	best := math.Inf(1)
	for pass := 0; pass < 30; pass++ {
		dec := gob.NewDecoder(bytes.NewReader(b))
		var req rpc.Request
		var body any
		if err := dec.Decode(&req); err != nil {
			return 0, err
		}
		if err := dec.Decode(&body); err != nil {
			return 0, err
		}
		ops := 0
		t0 := time.Now()
		for {
			req = rpc.Request{}
			if err := dec.Decode(&req); err != nil {
				break
			}
			body = nil
			if err := dec.Decode(&body); err != nil {
				return 0, err
			}
			ops++
		}
		el := time.Since(t0)
		if ops != golden.BenchStreamCalls {
			return 0, fmt.Errorf("%s has %d calls after the first, want %d", path, ops, golden.BenchStreamCalls)
		}
		best = math.Min(best, float64(el.Nanoseconds())/float64(ops))
	}
	return best, nil
}

var nsPerOp = regexp.MustCompile(`^ns_per_op=([0-9.eE+-]+)\s*$`)

// rustDecodeNs runs the Rust decode benchmark; NaN if it is not configured or missing.
func rustDecodeNs(command, stream string) float64 {
	args := strings.Fields(command)
	if len(args) == 0 {
		return math.NaN()
	}
	if _, err := exec.LookPath(args[0]); err != nil {
		fmt.Fprintf(os.Stderr, "benchplugin: rust decode benchmark %s not found; decode is n/a\n", args[0])
		return math.NaN()
	}
	out, err := exec.Command(args[0], append(args[1:], stream)...).Output()
	if err != nil {
		fmt.Fprintf(os.Stderr, "benchplugin: %s: %v\n", command, err)
		return math.NaN()
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if m := nsPerOp.FindStringSubmatch(lines[len(lines)-1]); m != nil {
		if v, err := strconv.ParseFloat(m[1], 64); err == nil {
			return v
		}
	}
	fmt.Fprintf(os.Stderr, "benchplugin: %s: last line %q is not ns_per_op=<float>\n", command, lines[len(lines)-1])
	return math.NaN()
}
