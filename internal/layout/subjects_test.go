package layout

import (
	"go/scanner"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSubjectsAreBuiltInProtocol: no non-test Go file outside protocol
// spells a subject of the grammar ("cg.v1." or "cgledger.v1.") in a string
// literal; every subject is built by a protocol function, so the grammar
// has one home (docs/architecture.md, "Where each concern lives").
// Comments may name subjects. The programs under test/ are left out: they
// speak the wire protocol as a client in another language would, with
// nothing of ours.
func TestSubjectsAreBuiltInProtocol(t *testing.T) {
	root := filepath.Join("..", "..")
	var bad []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			switch rel {
			case "protocol", "test", ".git":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		fset := token.NewFileSet()
		f := fset.AddFile(path, -1, len(src))
		var s scanner.Scanner
		s.Init(f, src, nil, 0)
		for {
			pos, tok, lit := s.Scan()
			if tok == token.EOF {
				break
			}
			if tok == token.STRING && (strings.Contains(lit, "cg.v1.") || strings.Contains(lit, "cgledger.v1.")) {
				bad = append(bad, fset.Position(pos).String()+": "+lit)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bad {
		t.Errorf("a subject spelled outside protocol (build it with a protocol function): %s", b)
	}
}
