package main

import (
	"bytes"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestFixtureFigures: the figures of testdata/cyc, whose shape its files' comments state.
func TestFixtureFigures(t *testing.T) {
	r, err := analyse(filepath.Join("testdata", "cyc"))
	if err != nil {
		t.Fatal(err)
	}
	if r.name != "cyc" || !reflect.DeepEqual(r.files, []string{"a.go", "b.go", "c.go", "d.go"}) || r.lines != 104 {
		t.Errorf("package %s, files %v, %d lines; want cyc, a.go to d.go, 104 lines", r.name, r.files, r.lines)
	}
	want := []typeShape{
		// Store: its declaration (6 lines), Get (5) and Put in another file (3)
		{name: "Store", methods: 2, lines: 14, mutexes: 2, maps: 2, declLines: 6, methodLines: 8},
		{name: "counter", methods: 1, lines: 2, declLines: 1, methodLines: 1},
	}
	if !reflect.DeepEqual(r.types, want) {
		t.Errorf("types %+v;\nwant %+v", r.types, want)
	}
	// a→b, b→a (the cycle), c→a (a method of a's Store), c→d (a const); not c→b: c's
	// registry is a local
	if r.links != 4 || r.upward != 2 || r.inCycles != 2 || r.floors != 2 {
		t.Errorf("links %d, upward %d, in cycles %d, floors %d; want 4, 2, 2, 2", r.links, r.upward, r.inCycles, r.floors)
	}
	if want := map[string]int{"a.go": 1, "b.go": 1, "c.go": 2, "d.go": 1}; !reflect.DeepEqual(r.floorOf, want) {
		t.Errorf("floors %v; want %v", r.floorOf, want)
	}
	if want := []cycle{{floor: 1, files: []string{"a.go", "b.go"}}}; !reflect.DeepEqual(r.cycles, want) {
		t.Errorf("cycles %+v; want %+v", r.cycles, want)
	}
	if want := (funcShape{name: "long", file: "c.go", lines: 62}); r.longest != want || r.overLong != 1 {
		t.Errorf("longest %+v, %d over %d lines; want %+v, 1", r.longest, r.overLong, longFunc, want)
	}
	var out bytes.Buffer
	r.print(&out)
	for _, line := range []string{
		"  Store                              2     14       2    2\n",
		"file links: 4, 2 of them run upward; 2 files in cycles; 2 floors\n",
		"longest function: long (c.go), 62 lines; 1 functions over 60 lines\n",
	} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("the output lacks %q:\n%s", line, out.String())
		}
	}
}

// TestLongerChain: floors climb along a chain with a cycle in the middle, and only the links
// within the cycle run upward.
func TestLongerChain(t *testing.T) {
	r := &report{files: []string{"a", "b", "c", "d", "e"}}
	// e → d → c ⇄ b → a
	r.linkFiles(map[string][]string{"e": {"d"}, "d": {"c"}, "c": {"b"}, "b": {"a", "c"}})
	if want := map[string]int{"a": 1, "b": 2, "c": 2, "d": 3, "e": 4}; !reflect.DeepEqual(r.floorOf, want) {
		t.Errorf("floors %v; want %v", r.floorOf, want)
	}
	if r.links != 5 || r.upward != 2 || r.inCycles != 2 || r.floors != 4 {
		t.Errorf("links %d, upward %d, in cycles %d, floors %d; want 5, 2, 2, 4", r.links, r.upward, r.inCycles, r.floors)
	}
}

// TestClaimAndDaemonFilesInFloors: in agent/claim and agent/daemon no file links upward (no
// cycle of files): a sub-protocol's or a worker's file never names the Store or the Daemon
// that holds it, and their methods live above the type (docs/architecture.md).
func TestClaimAndDaemonFilesInFloors(t *testing.T) {
	for _, dir := range []string{"../../claim", "../../daemon"} {
		r, err := analyse(dir)
		if err != nil {
			t.Fatal(err)
		}
		if r.upward != 0 || len(r.cycles) != 0 {
			t.Errorf("%s: %d of %d file links run upward, cycles %+v; want none (go run ./agent/internal/shape %s)",
				dir, r.upward, r.links, r.cycles, strings.TrimPrefix(dir, "../../"))
		}
	}
}
