package main

import (
	"strings"
	"testing"
)

// TestCheckWatches: a live fence's entry missing is a violation unless a fault's removal of it
// (or a clear) came just before and it is back within the bound; a cover counts as in force.
func TestCheckWatches(t *testing.T) {
	const addr = "203.0.113.11:0/1234"
	f := func(held bool) []WatchFence {
		return []WatchFence{{Image: "chaos1-1", Node: "node-a", Addr: addr, Held: held}}
	}
	listed := []WatchEntry{{Addr: addr, Until: "x"}}
	frozen := []Fault{{Kind: "freeze", Node: "node-a", Start: 0, End: 100}}
	w := func(tm float64, bl []WatchEntry, held bool) Watch { return Watch{T: tm, Blocklist: bl, Live: f(held)} }
	for _, tc := range []struct {
		name   string
		ws     []Watch
		ops    []BlOp
		faults []Fault
		want   int // violations
		back   float64
	}{
		{"always listed", []Watch{w(1, listed, true), w(2, listed, true)}, nil, frozen, 0, -1},
		{"covered by ip:0/0", []Watch{w(1, []WatchEntry{{Addr: "203.0.113.11:0/0"}}, true)}, nil, frozen, 0, -1},
		{"covered by a range", []Watch{w(1, []WatchEntry{{Addr: "cidr:203.0.113.11:0/32"}}, true)}, nil, frozen, 0, -1},
		{"another node's cover does not count", []Watch{w(1, []WatchEntry{{Addr: "203.0.113.12:0/0"}}, true)}, nil, frozen, 1, -1},
		{"missing, nobody removed it", []Watch{w(1, listed, true), w(2, nil, true), w(3, listed, true)}, nil, frozen, 1, -1},
		{"removed by bl-rm, back in 5 s", []Watch{w(1, listed, true), w(2, nil, true), w(6, listed, true)}, []BlOp{{T: 1.5, Kind: "rm", Addr: addr}}, frozen, 0, 4.5},
		{"removed by bl-clear, back in 5 s", []Watch{w(1, listed, true), w(2, nil, true), w(6, listed, true)}, []BlOp{{T: 1.5, Kind: "clear", Addr: "-"}}, frozen, 0, 4.5},
		{"removed, back too late (held)", []Watch{w(1, listed, true), w(2, nil, true), w(13, listed, true)}, []BlOp{{T: 1.5, Kind: "rm", Addr: addr}}, frozen, 1, 11.5},
		{"removed, back in 12 s (free: the sweep's bound)", []Watch{w(1, listed, false), w(2, nil, false), w(13, listed, false)}, []BlOp{{T: 1.5, Kind: "rm", Addr: addr}}, frozen, 0, 11.5},
		{"removed, never back", []Watch{w(1, listed, true), w(2, nil, true), w(3, nil, true)}, []BlOp{{T: 1.5, Kind: "rm", Addr: addr}}, frozen, 1, -1},
		{"an old removal does not excuse", []Watch{w(1, listed, true), w(40, nil, true), w(41, listed, true)}, []BlOp{{T: 1.5, Kind: "rm", Addr: addr}}, frozen, 1, -1},
		{"missing while its node was up: counted, not judged", []Watch{w(1, listed, true), w(2, nil, true), w(3, listed, true)}, nil, []Fault{{Kind: "freeze", Node: "node-a", Start: 0, End: 1.5}}, 0, -1},
		{"missing while the other node was down: not judged", []Watch{w(1, listed, true), w(2, nil, true), w(3, listed, true)}, nil, []Fault{{Kind: "cut", Node: "node-b", Start: 0, End: 5}}, 0, -1},
		{"a removal not undone in time is judged with the node up", []Watch{w(1, listed, true), w(2, nil, true), w(13, listed, true)}, []BlOp{{T: 1.5, Kind: "rm", Addr: addr}}, nil, 1, 11.5},
		{"another address's removal does not excuse", []Watch{w(1, listed, true), w(2, nil, true), w(3, listed, true)}, []BlOp{{T: 1.5, Kind: "rm", Addr: "203.0.113.11:0/9"}}, frozen, 1, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sum, vs := CheckWatches(tc.ws, tc.ops, tc.faults, 10, 14)
			if len(vs) != tc.want {
				t.Fatalf("%d violations, want %d: %+v", len(vs), tc.want, vs)
			}
			for _, v := range vs {
				if v.Invariant != InvFenceListed {
					t.Fatalf("invariant %s", v.Invariant)
				}
			}
			if tc.back >= 0 && (len(sum.Gaps) != 1 || sum.Gaps[0].Back != tc.back) {
				t.Fatalf("gaps %+v, want one back after %.1f", sum.Gaps, tc.back)
			}
			if sum.Checks != len(tc.ws) {
				t.Fatalf("%d checks", sum.Checks)
			}
		})
	}
}

func TestReadWatches(t *testing.T) {
	ws, err := ReadWatches(strings.NewReader(`{"t":2,"bl":[{"a":"1.2.3.4:0/5","u":"2026-12-06T16:20:00.123456+0000"}],"live":[{"image":"i","node":"node-a","addr":"1.2.3.4:0/5","held":true}]}
{"t":1,"bl":[],"live":[]}
{"t":3,"bl":[`))
	if err != nil || len(ws) != 2 || ws[0].T != 1 || ws[1].Live[0].Addr != "1.2.3.4:0/5" || !ws[1].Live[0].Held {
		t.Fatalf("%+v %v", ws, err)
	}
	ops, err := ReadBlOps(strings.NewReader("5.5 rm 1.2.3.4:0/5\n6 clear -\n7 add 1.2.3.4:0/5 20\n"))
	if err != nil || len(ops) != 3 || ops[1].Kind != "clear" || ops[0].T != 5.5 {
		t.Fatalf("%+v %v", ops, err)
	}
}
