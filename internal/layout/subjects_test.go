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
// Comments may name subjects. Nor does one build or parse a subject from
// protocol.Root: concatenated (+) or compared (==, !=), the root is a
// subject spelled by hand, and a filter or a parser of the grammar belongs
// in protocol (protocol/filter.go). The programs under test/ are left out:
// they speak the wire protocol as a client in another language would, with
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
		var toks []scanned
		for {
			pos, tok, lit := s.Scan()
			if tok == token.EOF {
				break
			}
			if tok == token.STRING && (strings.Contains(lit, "cg.v1.") || strings.Contains(lit, "cgledger.v1.")) {
				bad = append(bad, fset.Position(pos).String()+": "+lit)
			}
			toks = append(toks, scanned{pos, tok, lit})
		}
		for _, pos := range rootByHand(toks) {
			bad = append(bad, fset.Position(pos).String()+": protocol.Root concatenated or compared")
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

// scanned is one token of a file.
type scanned struct {
	pos token.Pos
	tok token.Token
	lit string
}

// rootByHand finds protocol.Root beside a +, == or != in toks: a subject
// built or parsed by hand.
func rootByHand(toks []scanned) []token.Pos {
	byHand := func(t token.Token) bool { return t == token.ADD || t == token.EQL || t == token.NEQ }
	var at []token.Pos
	for i := 0; i+2 < len(toks); i++ {
		if toks[i].tok != token.IDENT || toks[i].lit != "protocol" || toks[i+1].tok != token.PERIOD || toks[i+2].lit != "Root" {
			continue
		}
		if (i > 0 && byHand(toks[i-1].tok)) || (i+3 < len(toks) && byHand(toks[i+3].tok)) {
			at = append(at, toks[i].pos)
		}
	}
	return at
}

// TestRootByHand: the rule of TestSubjectsAreBuiltInProtocol finds a root
// concatenated or compared, and leaves a root passed along alone.
func TestRootByHand(t *testing.T) {
	for src, want := range map[string]int{
		`x := protocol.Root + "." + v`:       1,
		`x := v + protocol.Root`:             1,
		`if toks[0] != protocol.Root {}`:     1,
		`if protocol.Root == toks[0] {}`:     1,
		`f(protocol.Root)`:                   0,
		`x := other.Root + "."`:              0,
		`x := protocol.RootX + "."`:          0,
		`x := protocol.ToolEntriesFilter(v)`: 0,
	} {
		fset := token.NewFileSet()
		f := fset.AddFile("x.go", -1, len(src))
		var s scanner.Scanner
		s.Init(f, []byte(src), nil, 0)
		var toks []scanned
		for {
			pos, tok, lit := s.Scan()
			if tok == token.EOF {
				break
			}
			toks = append(toks, scanned{pos, tok, lit})
		}
		if got := len(rootByHand(toks)); got != want {
			t.Errorf("%s: %d found, want %d", src, got, want)
		}
	}
}
