package main

import (
	"go/ast"
	"sort"
)

// fileLinks returns, per file, the files it links to: those declaring a package-level func,
// type, var or const it names. The parser leaves the names a file does not declare itself
// unresolved (ast.File.Unresolved; locals, fields and selectors are not among them): those
// are looked up among the other files' declarations.
func fileLinks(files []string, parsed map[string]*ast.File) map[string][]string {
	declaredIn := map[string]string{}
	for _, file := range files {
		for _, name := range packageNames(parsed[file]) {
			declaredIn[name] = file
		}
	}
	out := map[string][]string{}
	for _, file := range files {
		to := map[string]bool{}
		for _, id := range parsed[file].Unresolved {
			if other, ok := declaredIn[id.Name]; ok && other != file {
				to[other] = true
			}
		}
		for other := range to {
			out[file] = append(out[file], other)
		}
		sort.Strings(out[file])
	}
	return out
}

// packageNames is what file f declares at package level: funcs (not methods, not init), types,
// vars and consts.
func packageNames(f *ast.File) []string {
	var names []string
	add := func(id *ast.Ident) {
		if id.Name != "_" {
			names = append(names, id.Name)
		}
	}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil && d.Name.Name != "init" {
				add(d.Name)
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					add(s.Name)
				case *ast.ValueSpec:
					for _, id := range s.Names {
						add(id)
					}
				}
			}
		}
	}
	return names
}

// linkFiles counts the links, condenses their cycles (Tarjan's strongly connected components)
// and puts each file on its floor: 1 for a file that links to none, else one above the highest
// floor of the files it links to outside its own cycle. A link within a cycle runs upward.
func (r *report) linkFiles(links map[string][]string) {
	comps := components(r.files, links)
	compOf := map[string]int{}
	for i, c := range comps {
		for _, f := range c {
			compOf[f] = i
		}
	}
	// Tarjan emits a component after every component it links to: floors in one pass
	floor := make([]int, len(comps))
	for i, c := range comps {
		floor[i] = 1
		for _, f := range c {
			for _, to := range links[f] {
				if j := compOf[to]; j != i {
					floor[i] = max(floor[i], floor[j]+1)
				}
			}
		}
	}
	r.floorOf = map[string]int{}
	for _, f := range r.files {
		r.floorOf[f] = floor[compOf[f]]
		r.floors = max(r.floors, r.floorOf[f])
		for _, to := range links[f] {
			r.links++
			if r.floorOf[to] >= r.floorOf[f] || compOf[to] == compOf[f] {
				r.upward++
			}
		}
	}
	for i, c := range comps {
		if len(c) > 1 {
			sort.Strings(c)
			r.inCycles += len(c)
			r.cycles = append(r.cycles, cycle{floor: floor[i], files: c})
		}
	}
	sort.Slice(r.cycles, func(i, j int) bool {
		if r.cycles[i].floor != r.cycles[j].floor {
			return r.cycles[i].floor < r.cycles[j].floor
		}
		return r.cycles[i].files[0] < r.cycles[j].files[0]
	})
}

// components is the strongly connected components of the link graph, each emitted after the
// components it links to (Tarjan's order).
func components(files []string, links map[string][]string) [][]string {
	index, low := map[string]int{}, map[string]int{}
	onStack := map[string]bool{}
	var stack []string
	var comps [][]string
	var visit func(string)
	visit = func(v string) {
		index[v], low[v] = len(index), len(index)
		stack = append(stack, v)
		onStack[v] = true
		for _, w := range links[v] {
			if _, seen := index[w]; !seen {
				visit(w)
				low[v] = min(low[v], low[w])
			} else if onStack[w] {
				low[v] = min(low[v], index[w])
			}
		}
		if low[v] != index[v] {
			return
		}
		var c []string
		for {
			w := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			onStack[w] = false
			c = append(c, w)
			if w == v {
				break
			}
		}
		comps = append(comps, c)
	}
	for _, f := range files {
		if _, seen := index[f]; !seen {
			visit(f)
		}
	}
	return comps
}
