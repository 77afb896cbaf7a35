package agent

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strconv"
	"strings"
	"testing"
)

// TestEveryOpKindCalled: each kind of op the wire names (a Kind constant
// of fleet/wire) has its driver call here, so that no controller's op
// meets "unknown op kind" on an agent of the same version.
func TestEveryOpKindCalled(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "../fleet/wire/wire.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if !strings.HasPrefix(name.Name, "Kind") || i >= len(vs.Values) {
					continue
				}
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					continue
				}
				kind, _ := strconv.Unquote(lit.Value)
				n++
				if opCalls[kind] == nil {
					t.Errorf("wire.%s (%q) has no driver call", name.Name, kind)
				}
			}
		}
	}
	if n != len(opCalls) {
		t.Errorf("%d op kinds on the wire, %d driver calls", n, len(opCalls))
	}
}
