// Command golden regenerates the golden gob request vectors that the Rust gob/net/rpc
// tests decode: go run ./cmd/golden -out <repo>/metric-provider/tests/fixtures/gob
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/rollouts-dispatch/rollouts-dispatch/tests/conformance/golden"
)

func main() {
	out := flag.String("out", golden.Dir(), "fixture directory to (re)write")
	flag.Parse()
	results, err := golden.Write(*out)
	if err != nil {
		fmt.Fprintln(os.Stderr, "golden:", err)
		os.Exit(1)
	}
	written := 0
	for _, r := range results {
		if r.Written {
			written++
			fmt.Println("wrote", r.File)
		}
	}
	fmt.Printf("golden: %d files checked, %d rewritten, in %s\n", len(results), written, *out)
}
