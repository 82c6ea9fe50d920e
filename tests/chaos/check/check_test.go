package main

import (
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
