package main

import (
	"strconv"
	"strings"
	"testing"

	"github.com/rbd-owner/rbd-owner/tests/chaos/block"
)

// image builds an image's content from the writes that landed last on each block.
func image(landed ...block.Stamp) []byte {
	data := make([]byte, block.Count*block.Size)
	for _, s := range landed {
		s.Fill(data[s.Block*block.Size : (s.Block+1)*block.Size])
	}
	return data
}

func logOf(lines ...string) *Logs {
	l, err := ReadLogs(strings.NewReader(strings.Join(lines, "\n")))
	if err != nil {
		panic(err)
	}
	return l
}

func st(node string, epoch, seq, b uint64) block.Stamp {
	return block.Stamp{Node: node, Image: "chaos1", Epoch: epoch, Seq: seq, Block: b}
}

func line(kind string, s block.Stamp) string { return kind + " " + s.String() }

// TestCheckImage: each invariant the data can break is caught, and a clean history passes.
func TestCheckImage(t *testing.T) {
	a1, a2 := st("node-a", 3, 10, 5), st("node-a", 3, 11, 5)
	b1 := st("node-b", 4, 7, 5)
	for _, tc := range []struct {
		name   string
		landed []block.Stamp
		log    []string
		want   string // invariant, "" for none
	}{
		{"clean: the newer owner's acked write is last", []block.Stamp{b1}, []string{line("issue", a1), line("ack", a1), line("issue", b1), line("ack", b1)}, ""},
		{"in-flight write newer than the last ack: fine", []block.Stamp{a2}, []string{line("issue", a1), line("ack", a1), line("issue", a2)}, ""},
		{"older epoch landed after a newer acked write", []block.Stamp{a2}, []string{line("issue", a2), line("issue", b1), line("ack", b1)}, InvNoOverlap},
		{"acked write lost (same epoch, older seq last)", []block.Stamp{a1}, []string{line("issue", a1), line("ack", a1), line("issue", a2), line("ack", a2)}, InvNothingLost},
		{"acked write lost (zeros)", nil, []string{line("issue", a1), line("ack", a1)}, InvNothingLost},
		{"a write nobody issued", []block.Stamp{a1}, nil, InvIntact},
		{"never written: zeros", nil, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, vs := CheckImage("chaos1", image(tc.landed...), logOf(tc.log...))
			if n != block.Count {
				t.Fatalf("%d blocks checked", n)
			}
			switch {
			case tc.want == "" && len(vs) != 0:
				t.Fatalf("violations: %+v", vs)
			case tc.want != "" && (len(vs) != 1 || vs[0].Invariant != tc.want):
				t.Fatalf("want one %s, got %+v", tc.want, vs)
			}
		})
	}
	// a torn block (half of one write, half of another) is corrupt
	data := image(a1)
	other := image(b1)
	copy(data[5*block.Size+2048:6*block.Size], other[5*block.Size+2048:6*block.Size])
	if _, vs := CheckImage("chaos1", data, logOf(line("issue", a1), line("issue", b1))); len(vs) != 1 || vs[0].Invariant != InvIntact {
		t.Fatalf("torn block: %+v", vs)
	}
}

// TestCheckSamples: two unfenced mapping clients at once, and a fence of a node no fault
// impaired, are violations; the agent's own RADOS client and a fenced client do not count.
func TestCheckSamples(t *testing.T) {
	l := logOf("mapped image=chaos1 device=/dev/rbd0 epoch=3 addr=10.0.0.1:0/1", "mapped image=chaos1 device=/dev/rbd0 epoch=4 addr=10.0.0.2:0/2")
	fence := func(node string) Sample {
		s := Sample{T: 100, Image: "chaos1"}
		s.Fences = append(s.Fences, struct {
			NodeID string `json:"node_id"`
			Addr   string `json:"addr"`
			Epoch  uint64 `json:"epoch"`
			By     string `json:"by"`
		}{node, "10.0.0.1:0/1", 3, "node-b"})
		return s
	}
	for _, tc := range []struct {
		name    string
		samples []Sample
		faults  []Fault
		want    string
	}{
		{"one mapping and the agent's own client", []Sample{{T: 1, Image: "chaos1", Watchers: []string{"10.0.0.1:0/1", "10.0.0.9:0/77"}}}, nil, ""},
		{"two mappings, one fenced", []Sample{{T: 1, Image: "chaos1", Watchers: []string{"10.0.0.1:0/1", "10.0.0.2:0/2"}, Blocklist: []string{"10.0.0.1:0/1"}}}, nil, ""},
		{"two unfenced mappings", []Sample{{T: 1, Image: "chaos1", Watchers: []string{"10.0.0.1:0/1", "10.0.0.2:0/2"}}}, nil, InvOneWriter},
		{"fence of a frozen node", []Sample{fence("node-a")}, []Fault{{Kind: "freeze", Node: "node-a", Start: 80, End: 99}}, ""},
		{"fence of a node cut off past a fence's life", []Sample{fence("node-a")}, []Fault{{Kind: "long-cut", Node: "node-a", Start: 50, End: 400}}, ""},
		{"fence during a paused cluster", []Sample{fence("node-a")}, []Fault{{Kind: "pause-osd", Start: 70, End: 90}}, ""},
		{"fence of a node whose clock was stepped only", []Sample{fence("node-a")}, []Fault{{Kind: "clock", Node: "node-a", Start: 90, End: 91}}, InvLiveKept},
		{"fence of a node frozen long before", []Sample{fence("node-a")}, []Fault{{Kind: "freeze", Node: "node-a", Start: 10, End: 20}}, InvLiveKept},
		{"fence of the other node's fault", []Sample{fence("node-a")}, []Fault{{Kind: "freeze", Node: "node-b", Start: 90, End: 99}}, InvLiveKept},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, vs := CheckSamples(tc.samples, l, tc.faults, 15, 5)
			switch {
			case tc.want == "" && len(vs) != 0:
				t.Fatalf("violations: %+v", vs)
			case tc.want != "" && (len(vs) != 1 || vs[0].Invariant != tc.want):
				t.Fatalf("want one %s, got %+v", tc.want, vs)
			}
		})
	}
}

func TestReadFaults(t *testing.T) {
	fs, err := ReadFaults(strings.NewReader("start 10.5 freeze node-a\nstart 11 pause-osd -\nend 20 freeze node-a\n"))
	if err != nil || len(fs) != 2 || fs[0].End != 20 || fs[1].Node != "" || fs[1].End != -1 {
		t.Fatalf("%+v %v", fs, err)
	}
}

// TestCheckBlocklist: an entry new in the round that covers a node no fault impaired is a fence
// of a live node (above all its whole address, ip:0/0 or a range); entries from before the round,
// entries of an impaired node and entries of no node are not.
func TestCheckBlocklist(t *testing.T) {
	nodes := map[string]string{"203.0.113.11": "node-a", "203.0.113.12": "node-b"}
	first := Sample{T: 1, Image: "chaos1", Blocklist: []string{"203.0.113.11:0/111"}}
	at := func(t float64, bl ...string) Sample {
		return Sample{T: t, Image: "chaos1", Blocklist: append([]string{"203.0.113.11:0/111"}, bl...)}
	}
	for _, tc := range []struct {
		name      string
		samples   []Sample
		faults    []Fault
		want      string
		wantWhole bool
	}{
		{"nothing new", []Sample{first, at(50)}, nil, "", false},
		{"an entry from before the round", []Sample{first, at(50)}, []Fault{{Kind: "idle-claim", Node: "node-a", Start: 10, End: 60}}, "", false},
		{"a live node's whole address (the idle-claim hole)", []Sample{first, at(40, "203.0.113.11:0/0")}, []Fault{{Kind: "idle-claim", Node: "node-a", Start: 10, End: 60}}, InvLiveKept, true},
		{"a live node's mapping client during slow-pool", []Sample{first, at(40, "203.0.113.11:0/3989453")}, []Fault{{Kind: "slow-pool", Node: "node-a", Start: 10, End: 60}}, InvLiveKept, false},
		{"a CIDR range covering a live node", []Sample{first, at(40, "cidr:203.0.113.0:0/24")}, nil, InvLiveKept, true},
		{"a v1-prefixed entry", []Sample{first, at(40, "v1:203.0.113.12:0/0")}, nil, InvLiveKept, true},
		{"a frozen node's client", []Sample{first, at(40, "203.0.113.11:0/3989453")}, []Fault{{Kind: "freeze", Node: "node-a", Start: 20, End: 35}}, "", false},
		{"the other node frozen", []Sample{first, at(40, "203.0.113.11:0/0")}, []Fault{{Kind: "freeze", Node: "node-b", Start: 20, End: 35}}, InvLiveKept, true},
		{"an address of no node", []Sample{first, at(40, "10.9.9.9:0/0")}, nil, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			es, vs := CheckBlocklist(tc.samples, nodes, tc.faults, 15, 10)
			switch {
			case tc.want == "" && len(vs) != 0:
				t.Fatalf("violations: %+v", vs)
			case tc.want != "" && (len(vs) != 1 || vs[0].Invariant != tc.want):
				t.Fatalf("want one %s, got %+v (entries %+v)", tc.want, vs, es)
			case tc.want != "" && es[0].Whole != tc.wantWhole:
				t.Fatalf("whole=%v, want %v: %+v", es[0].Whole, tc.wantWhole, es)
			}
		})
	}
}

// TestEntryCovers: the address forms `ceph osd blocklist ls` prints.
func TestEntryCovers(t *testing.T) {
	for _, tc := range []struct {
		entry, ip     string
		covers, whole bool
	}{
		{"203.0.113.11:0/0", "203.0.113.11", true, true},
		{"203.0.113.11:0/3278327", "203.0.113.11", true, false},
		{"203.0.113.111:0/0", "203.0.113.11", false, false},
		{"any:203.0.113.11:0/0", "203.0.113.11", true, true},
		{"cidr:203.0.113.0:0/24", "203.0.113.12", true, true},
		{"cidr:203.0.113.0:0/30", "203.0.113.12", false, true},
		{"[2001:db8::1]:0/0", "2001:db8::1", true, true},
		{"garbage", "203.0.113.11", false, false},
	} {
		if c, w := entryCovers(tc.entry, tc.ip); c != tc.covers || (c && w != tc.whole) {
			t.Errorf("entryCovers(%q, %q) = %v, %v; want %v, %v", tc.entry, tc.ip, c, w, tc.covers, tc.whole)
		}
	}
}

// TestCheckHolds: a failed write or open of a live hold's holder is a violation; a failed write
// of the ordinary writers (fenced under a fault) is not.
func TestCheckHolds(t *testing.T) {
	h := block.Stamp{Node: "node-a", Image: "idle1-1-y", Epoch: 2, Seq: 5, Block: 7}
	ok := logOf("hold node=node-a image=idle1-1-y epoch=2", line("issue", h), line("ack", h), "hold-end node=node-a image=idle1-1-y writes=1 failed=0")
	if vs := CheckHolds(ok); len(vs) != 0 {
		t.Fatalf("clean hold: %+v", vs)
	}
	bad := logOf("hold node=node-a image=idle1-1-y epoch=2", line("issue", h), line("fail", h)+" err=input/output error")
	if vs := CheckHolds(bad); len(vs) != 1 || vs[0].Invariant != InvLiveKept {
		t.Fatalf("failed write of a hold: %+v", vs)
	}
	// the fail line in one log, the hold line in another read after it
	l, err := ReadLogs(strings.NewReader(line("fail", h)+" err=input/output error\n"), strings.NewReader("hold node=node-a image=idle1-1-y epoch=2\n"))
	if err != nil || len(CheckHolds(l)) != 1 {
		t.Fatalf("hold read after its failure: %v %+v", err, CheckHolds(l))
	}
	if vs := CheckHolds(logOf("hold node=node-a image=idle1-1-y epoch=2", "open-failed image=idle1-1-y err=no such device")); len(vs) != 1 {
		t.Fatalf("failed open of a hold: %+v", vs)
	}
	w := st("node-b", 3, 9, 1)
	if vs := CheckHolds(logOf(line("issue", w), line("fail", w)+" err=input/output error")); len(vs) != 0 {
		t.Fatalf("an ordinary writer's failed write: %+v", vs)
	}
	if l := logOf("hold-unmapped node=node-a image=idle1-1-y refused=3"); len(l.HoldMissed) != 1 {
		t.Fatalf("hold-unmapped not recorded: %+v", l.HoldMissed)
	}
}

// TestCheckHeartbeats: during a slow-pool stall the node's heartbeat in the healthy pool must
// change within every lease, counted from the last change before the stall up to its end.
func TestCheckHeartbeats(t *testing.T) {
	f := Fault{Kind: "slow-pool", Node: "node-a", Start: 100, End: 130}
	beats := func(every float64, from, to float64) (out []HBSample) {
		seq := 0
		for t := from; t <= to; t += 0.5 {
			if int(t*2)%int(every*2) == 0 {
				seq++
			}
			out = append(out, HBSample{T: t, Node: "node-a", Pool: "rbd", Mark: "inc/" + strconv.Itoa(seq)})
		}
		return out
	}
	gaps, vs := CheckHeartbeats(beats(5, 95, 132), []Fault{f}, 15)
	if len(vs) != 0 || len(gaps) != 1 || gaps[0].Gap > 5.5 || gaps[0].Changes < 5 {
		t.Fatalf("renewing every 5 s: %+v %+v", gaps, vs)
	}
	// renewed every 20 s (one pool's stall holding up the others' heartbeats)
	gaps, vs = CheckHeartbeats(beats(20, 95, 132), []Fault{f}, 15)
	if len(vs) != 1 || vs[0].Invariant != InvRenewed || gaps[0].Gap < 15 {
		t.Fatalf("renewing every 20 s: %+v %+v", gaps, vs)
	}
	// not renewed at all after the stall began: the gap runs to the end of the window
	stuck := append(beats(5, 95, 99.5), HBSample{T: 100, Node: "node-a", Pool: "rbd", Mark: "inc/99"})
	for t := 100.5; t <= 130; t += 0.5 {
		stuck = append(stuck, HBSample{T: t, Node: "node-a", Pool: "rbd", Mark: "inc/99"})
	}
	if _, vs = CheckHeartbeats(stuck, []Fault{f}, 15); len(vs) != 1 {
		t.Fatalf("stuck heartbeat: %+v", vs)
	}
	// never readable during the stall
	var none []HBSample
	for t := 100.0; t <= 130; t += 0.5 {
		none = append(none, HBSample{T: t, Node: "node-a", Pool: "rbd", Mark: "none"})
	}
	if _, vs = CheckHeartbeats(none, []Fault{f}, 15); len(vs) != 1 {
		t.Fatalf("unreadable heartbeat: %+v", vs)
	}
	// a second stall of the same node later in the round: the first one's samples do not count
	// toward it (nor does the time between the two, when the node held nothing there)
	g := Fault{Kind: "slow-pool", Node: "node-a", Start: 300, End: 330}
	second := beats(5, 297, 332)
	for i := range second {
		second[i].Mark = "inc2/" + second[i].Mark
	}
	two := append(beats(5, 95, 132), second...)
	if gaps, vs = CheckHeartbeats(two, []Fault{f, g}, 15); len(vs) != 0 || len(gaps) != 2 {
		t.Fatalf("two stalls: %+v %+v", gaps, vs)
	}
	// the other node's heartbeat is not held to it
	other := beats(20, 95, 132)
	for i := range other {
		other[i].Node = "node-b"
	}
	if gaps, vs = CheckHeartbeats(other, []Fault{f}, 15); len(vs) != 0 || len(gaps) != 0 {
		t.Fatalf("the other node: %+v %+v", gaps, vs)
	}
}
