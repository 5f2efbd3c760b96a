package sdkts

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSDKOpsAreTheProtocols: the TypeScript SDK refuses an op outside its
// OPS list before sending, so that list must be exactly the ops the Go
// protocol package declares (every constant Op*): a new op in Go without
// the SDK knowing it fails here, not in a user's program.
func TestSDKOpsAreTheProtocols(t *testing.T) {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, filepath.Join("..", "..", "protocol"), func(fi os.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, 0)
	require.NoError(t, err)
	var goOps []string
	for _, p := range pkgs {
		for _, f := range p.Files {
			for _, d := range f.Decls {
				g, ok := d.(*ast.GenDecl)
				if !ok || g.Tok != token.CONST {
					continue
				}
				for _, sp := range g.Specs {
					vs := sp.(*ast.ValueSpec)
					for i, n := range vs.Names {
						if !regexp.MustCompile(`^Op[A-Z]`).MatchString(n.Name) || i >= len(vs.Values) {
							continue
						}
						lit, ok := vs.Values[i].(*ast.BasicLit)
						require.True(t, ok && lit.Kind == token.STRING, "%s is a string literal", n.Name)
						v, err := strconv.Unquote(lit.Value)
						require.NoError(t, err)
						goOps = append(goOps, v)
					}
				}
			}
		}
	}
	require.NotEmpty(t, goOps)
	src, err := os.ReadFile(filepath.Join(sdkDir(t), "src", "protocol.ts"))
	require.NoError(t, err)
	m := regexp.MustCompile(`(?s)export const OPS: readonly string\[\] = Object\.freeze\(\[(.*?)\]\);`).FindSubmatch(src)
	require.NotNil(t, m, "protocol.ts declares OPS")
	var tsOps []string
	for _, q := range regexp.MustCompile(`"([^"]+)"`).FindAllSubmatch(m[1], -1) {
		tsOps = append(tsOps, string(q[1]))
	}
	slices.Sort(goOps)
	slices.Sort(tsOps)
	require.Equal(t, slices.Compact(goOps), tsOps)
}
