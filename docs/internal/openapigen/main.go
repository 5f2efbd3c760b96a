// Command openapigen writes the HTTP API's OpenAPI 3.1 document,
// docs/openapi.json, from the operations it describes and the Go types
// that encode their answers. It is run by go generate in docs (go generate
// ./docs); never edit the file by hand. Its test fails when the committed
// file is not what it writes.
package main

import (
	"fmt"
	"os"
)

func main() {
	out := "openapi.json"
	if len(os.Args) > 1 {
		out = os.Args[1]
	}
	if err := os.WriteFile(out, encodeDocument(buildDocument()), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "openapigen:", err)
		os.Exit(1)
	}
}
