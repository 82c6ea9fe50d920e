// Command shape prints structure figures of Go packages, from their source alone (issue 52):
//
//	go run ./agent/internal/shape ./agent/claim ./agent/daemon
//
// For each package directory given (its non-test .go files):
//   - the named types with methods, the ten with the most lines: their methods, the lines of
//     their methods plus their declaration (from the func or type keyword to the closing brace,
//     doc comments left out), and their sync.Mutex/RWMutex fields and map fields;
//   - the links between its files: A→B when file A names a package-level identifier (func,
//     type, var, const) declared in file B, resolved by name (a method names its receiver's
//     type, so it links to the file declaring it); the files ordered into floors (a file that
//     links to none is on floor 1, any other one floor above the highest file it links to, the
//     files of a cycle sharing one floor): the links that run upward (to the same floor or a
//     higher one: the links within a cycle) and the files in cycles;
//   - the longest function or method, and how many are over 60 lines.
//
// Only the standard library's parser: nothing is type-checked, so a selector (x.F) links nowhere
// and every file is read whatever its build constraints.
package main

import (
	"fmt"
	"io"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: shape DIR... (package directories, e.g. ./agent/claim ./agent/daemon)")
		os.Exit(2)
	}
	for i, dir := range os.Args[1:] {
		r, err := analyse(dir)
		if err != nil {
			fmt.Fprintln(os.Stderr, "shape:", err)
			os.Exit(1)
		}
		if i > 0 {
			fmt.Println()
		}
		r.print(os.Stdout)
	}
}

// print writes r as the command shows it.
func (r *report) print(w io.Writer) {
	fmt.Fprintf(w, "package %s (%s): %d files, %d lines\n", r.name, r.dir, len(r.files), r.lines)
	fmt.Fprintf(w, "types with methods, by lines (top %d of %d):\n", min(topTypes, len(r.types)), len(r.types))
	fmt.Fprintf(w, "  %-28s %7s %6s %7s %4s\n", "type", "methods", "lines", "mutexes", "maps")
	for _, t := range r.types[:min(topTypes, len(r.types))] {
		fmt.Fprintf(w, "  %-28s %7d %6d %7d %4d\n", t.name, t.methods, t.lines, t.mutexes, t.maps)
	}
	fmt.Fprintf(w, "file links: %d, %d of them run upward; %d files in cycles; %d floors\n",
		r.links, r.upward, r.inCycles, r.floors)
	for _, c := range r.cycles {
		fmt.Fprintf(w, "  cycle on floor %d: %v\n", c.floor, c.files)
	}
	if r.longest.name != "" {
		fmt.Fprintf(w, "longest function: %s (%s), %d lines; %d functions over %d lines\n",
			r.longest.name, r.longest.file, r.longest.lines, r.overLong, longFunc)
	}
}
