package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

const (
	topTypes = 10 // the types printed, by lines
	longFunc = 60 // a function longer than this many lines is counted
)

// report is the figures of one package directory.
type report struct {
	dir, name string
	files     []string // base names, sorted
	lines     int      // of all its files
	types     []typeShape
	links     int // file links A→B (A≠B), each pair once
	upward    int // links within a cycle: to a file on the same floor
	inCycles  int // files in a cycle of links
	floors    int // the highest floor
	floorOf   map[string]int
	cycles    []cycle
	longest   funcShape
	overLong  int // functions and methods over longFunc lines
}

// typeShape is one named type with methods.
type typeShape struct {
	name                   string
	methods, lines         int
	mutexes, maps          int
	declLines, methodLines int
}

// cycle is the files of one cycle of links (a strongly connected component of two or more).
type cycle struct {
	floor int
	files []string
}

// funcShape is one function or method: Name or Recv.Name.
type funcShape struct {
	name, file string
	lines      int
}

// analyse parses the non-test .go files of dir and computes its figures.
func analyse(dir string) (*report, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	r := &report{dir: dir}
	parsed := map[string]*ast.File{}
	for _, e := range ents {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, n), nil, 0)
		if err != nil {
			return nil, err
		}
		if r.name == "" {
			r.name = f.Name.Name
		}
		parsed[n] = f
		r.files = append(r.files, n)
		r.lines += fset.File(f.Pos()).LineCount()
	}
	if len(r.files) == 0 {
		return nil, fmt.Errorf("%s: no Go files (tests left out)", dir)
	}
	sort.Strings(r.files)
	r.measureTypes(fset, parsed)
	r.measureFuncs(fset, parsed)
	r.linkFiles(fileLinks(r.files, parsed))
	return r, nil
}

// lines is how many lines a node spans.
func lines(fset *token.FileSet, n ast.Node) int {
	return fset.Position(n.End()).Line - fset.Position(n.Pos()).Line + 1
}

// recvType is the name of a method's receiver type (T of T, *T, T[P], *T[P]); "" for a function.
func recvType(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return ""
	}
	t := fd.Recv.List[0].Type
	for {
		switch x := t.(type) {
		case *ast.StarExpr:
			t = x.X
		case *ast.IndexExpr:
			t = x.X
		case *ast.IndexListExpr:
			t = x.X
		case *ast.ParenExpr:
			t = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

// measureTypes fills r.types: the named types with methods, by lines (most first).
func (r *report) measureTypes(fset *token.FileSet, parsed map[string]*ast.File) {
	byName := map[string]*typeShape{}
	get := func(n string) *typeShape {
		if byName[n] == nil {
			byName[n] = &typeShape{name: n}
		}
		return byName[n]
	}
	for _, f := range parsed {
		syncName := importName(f, "sync")
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if rt := recvType(d); rt != "" {
					t := get(rt)
					t.methods++
					t.methodLines += lines(fset, d)
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					ts, ok := s.(*ast.TypeSpec)
					if !ok {
						continue
					}
					t := get(ts.Name.Name)
					t.declLines += declLines(fset, d, ts)
					if st, ok := ts.Type.(*ast.StructType); ok {
						t.mutexes, t.maps = structFields(st, syncName)
					}
				}
			}
		}
	}
	for _, t := range byName {
		if t.methods == 0 {
			continue
		}
		t.lines = t.declLines + t.methodLines
		r.types = append(r.types, *t)
	}
	sort.Slice(r.types, func(i, j int) bool {
		a, b := r.types[i], r.types[j]
		if a.lines != b.lines {
			return a.lines > b.lines
		}
		return a.name < b.name
	})
}

// declLines is the lines of a type's declaration: from its type keyword when it is declared
// alone, else from its name, to its end.
func declLines(fset *token.FileSet, d *ast.GenDecl, ts *ast.TypeSpec) int {
	if len(d.Specs) == 1 && !d.Lparen.IsValid() {
		return lines(fset, d)
	}
	return lines(fset, ts)
}

// importName is the name file f imports path under ("" when it does not import it).
func importName(f *ast.File, path string) string {
	for _, im := range f.Imports {
		p, err := strconv.Unquote(im.Path.Value)
		if err != nil || p != path {
			continue
		}
		if im.Name != nil {
			return im.Name.Name
		}
		return path[strings.LastIndex(path, "/")+1:]
	}
	return ""
}

// structFields counts a struct's sync.Mutex and sync.RWMutex fields (or pointers to them,
// embedded ones too) and its map fields (each name of a list counts).
func structFields(st *ast.StructType, syncName string) (mutexes, maps int) {
	for _, fl := range st.Fields.List {
		n := max(len(fl.Names), 1) // an embedded field has no name
		t := fl.Type
		if s, ok := t.(*ast.StarExpr); ok {
			t = s.X
		}
		switch x := t.(type) {
		case *ast.MapType:
			maps += n
		case *ast.SelectorExpr:
			if id, ok := x.X.(*ast.Ident); ok && syncName != "" && id.Name == syncName &&
				(x.Sel.Name == "Mutex" || x.Sel.Name == "RWMutex") {
				mutexes += n
			}
		}
	}
	return mutexes, maps
}

// measureFuncs finds the longest function or method and counts those over longFunc lines.
func (r *report) measureFuncs(fset *token.FileSet, parsed map[string]*ast.File) {
	for _, file := range r.files {
		for _, d := range parsed[file].Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok {
				continue
			}
			n := lines(fset, fd)
			if n > longFunc {
				r.overLong++
			}
			name := fd.Name.Name
			if rt := recvType(fd); rt != "" {
				name = rt + "." + name
			}
			if n > r.longest.lines {
				r.longest = funcShape{name: name, file: file, lines: n}
			}
		}
	}
}
