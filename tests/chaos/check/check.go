package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/rbd-owner/rbd-owner/tests/chaos/block"
)

// Invariant names, as in the protocol model (docs/safety.md) where one corresponds.
const (
	InvOneWriter   = "one-unfenced-writer"  // at most one unfenced client writes an RWO image
	InvNoOverlap   = "no-older-epoch-after" // no older-epoch write lands after a newer acked one
	InvNothingLost = "acked-writes-kept"    // every acked write is there or overwritten later
	InvLiveKept    = "live-holder-kept"     // no node fenced while its agent was live
	InvIntact      = "blocks-intact"        // every block is zeros or a whole stamp
)

// Violation is one broken invariant.
type Violation struct {
	Invariant string
	Detail    string
}

// Logs holds what the writers logged.
type Logs struct {
	Issued map[string]map[uint64][]block.Stamp // image → block → issued writes
	Acked  map[string]map[uint64][]block.Stamp // image → block → acknowledged writes
	Maps   map[string]string                   // mapping client address → "node image epoch"
	NAcked int
}

// ReadLogs parses writer logs (lines "issue …", "ack …", "mapped … addr=…").
func ReadLogs(rs ...io.Reader) (*Logs, error) {
	l := &Logs{Issued: map[string]map[uint64][]block.Stamp{}, Acked: map[string]map[uint64][]block.Stamp{}, Maps: map[string]string{}}
	add := func(m map[string]map[uint64][]block.Stamp, s block.Stamp) {
		if m[s.Image] == nil {
			m[s.Image] = map[uint64][]block.Stamp{}
		}
		m[s.Image][s.Block] = append(m[s.Image][s.Block], s)
	}
	for _, r := range rs {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			kind, rest, _ := strings.Cut(sc.Text(), " ")
			switch kind {
			case "issue", "ack":
				s, err := block.Parse(rest)
				if err != nil {
					return nil, fmt.Errorf("log line %q: %w", sc.Text(), err)
				}
				if kind == "issue" {
					add(l.Issued, s)
				} else {
					add(l.Acked, s)
					l.NAcked++
				}
			case "mapped":
				f := fields(rest)
				if f["addr"] != "" {
					l.Maps[f["addr"]] = f["image"] + "@" + f["epoch"]
				}
			}
		}
		if err := sc.Err(); err != nil {
			return nil, err
		}
	}
	return l, nil
}

func fields(s string) map[string]string {
	m := map[string]string{}
	for _, f := range strings.Fields(s) {
		if k, v, ok := strings.Cut(f, "="); ok {
			m[k] = v
		}
	}
	return m
}

// CheckImage holds one image's final content against the writes logged for it: every block is
// zeros or a whole stamp that was issued; no block's last write is older than a write to it
// that was acknowledged (an older epoch landing after a newer one, or a lost write).
func CheckImage(name string, data []byte, l *Logs) (checked int, vs []Violation) {
	for b := uint64(0); b < block.Count; b++ {
		off := int(b) * block.Size
		if off+block.Size > len(data) {
			vs = append(vs, Violation{InvIntact, fmt.Sprintf("%s: image shorter than %d blocks", name, block.Count)})
			return
		}
		checked++
		got, err := block.Read(data[off : off+block.Size])
		if err != nil {
			vs = append(vs, Violation{InvIntact, fmt.Sprintf("%s block %d: %v", name, b, err)})
			continue
		}
		if got != nil {
			if got.Image != name || got.Block != b {
				vs = append(vs, Violation{InvIntact, fmt.Sprintf("%s block %d holds a stamp for %s block %d", name, b, got.Image, got.Block)})
				continue
			}
			if !slices.Contains(l.Issued[name][b], *got) {
				vs = append(vs, Violation{InvIntact, fmt.Sprintf("%s block %d holds a write nobody logged issuing: %s", name, b, got)})
			}
		}
		var last *block.Stamp
		for _, a := range l.Acked[name][b] {
			if last == nil || a.After(*last) {
				a := a
				last = &a
			}
		}
		switch {
		case last == nil:
		case got == nil:
			vs = append(vs, Violation{InvNothingLost, fmt.Sprintf("%s block %d: the acknowledged write %s is gone (the block is zeros)", name, b, last)})
		case got.Epoch < last.Epoch:
			vs = append(vs, Violation{InvNoOverlap, fmt.Sprintf("%s block %d: %s (epoch %d) landed after the acknowledged %s (epoch %d)", name, b, got, got.Epoch, last, last.Epoch)})
		case last.After(*got):
			vs = append(vs, Violation{InvNothingLost, fmt.Sprintf("%s block %d: the acknowledged %s was lost under the older %s", name, b, last, got)})
		}
	}
	return checked, vs
}

// Sample is one sampler line: at host time T, an image's watchers (in that order: watchers
// first, then the blocklist, so a fence done before the watcher read is in the list) and its
// claim's holders and fences.
type Sample struct {
	T         float64  `json:"t"`
	Image     string   `json:"image"`
	Watchers  []string `json:"watchers"`
	Blocklist []string `json:"blocklist"`
	Fences    []struct {
		NodeID string `json:"node_id"`
		Addr   string `json:"addr"`
		Epoch  uint64 `json:"epoch"`
		By     string `json:"by"`
	} `json:"fences"`
}

// Fault is one injected fault's window on the host clock; Node "" means every node.
type Fault struct {
	Kind       string
	Node       string
	Start, End float64
}

// impairs says whether a fault may stop a node's agent from keeping its lease: a clock step or
// an unmap does not; a freeze, a cut, a killed agent, a reboot or a paused cluster does.
func (f Fault) impairs(node string) bool {
	switch f.Kind {
	case "freeze", "cut", "kill", "reboot":
		return f.Node == node
	case "pause-osd", "pause-mon":
		return true
	}
	return false
}

// ReadFaults parses "start T KIND NODE" / "end T KIND NODE" lines.
func ReadFaults(r io.Reader) ([]Fault, error) {
	var out []Fault
	open := map[string]int{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 4 {
			continue
		}
		t, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			return nil, fmt.Errorf("fault line %q: %w", sc.Text(), err)
		}
		node := f[3]
		if node == "-" {
			node = ""
		}
		key := f[2] + "/" + node
		switch f[0] {
		case "start":
			out = append(out, Fault{Kind: f[2], Node: node, Start: t, End: -1})
			open[key] = len(out) - 1
		case "end":
			if i, ok := open[key]; ok {
				out[i].End = t
				delete(open, key)
			}
		}
	}
	return out, sc.Err()
}

// Takeover is a fence first seen in a claim at host time T.
type Takeover struct {
	T      float64
	Image  string
	Fenced string
	By     string
}

// CheckSamples holds the sampled watchers and claims to invariants 3 and 5: at every sample at
// most one unfenced mapping client watches an image, and every node fenced by a takeover was
// impaired (frozen, cut off, its agent killed, rebooting, or the cluster paused) at some point
// in the lease (plus slack) before the fence was seen.
func CheckSamples(samples []Sample, l *Logs, faults []Fault, lease, slack float64) (takeovers []Takeover, vs []Violation) {
	seen := map[string]bool{}
	sort.SliceStable(samples, func(i, j int) bool { return samples[i].T < samples[j].T })
	for _, s := range samples {
		bl := map[string]bool{}
		for _, a := range s.Blocklist {
			bl[a] = true
		}
		var live []string
		for _, w := range s.Watchers {
			if _, mapping := l.Maps[w]; mapping && !bl[w] {
				live = append(live, w+" ("+l.Maps[w]+")")
			}
		}
		if len(live) > 1 {
			vs = append(vs, Violation{InvOneWriter, fmt.Sprintf("t=%.1f %s: %d unfenced mapping clients watch it: %s", s.T, s.Image, len(live), strings.Join(live, ", "))})
		}
		for _, f := range s.Fences {
			key := s.Image + "/" + f.NodeID + "/" + strconv.FormatUint(f.Epoch, 10) + "/" + f.Addr
			if seen[key] {
				continue
			}
			seen[key] = true
			to := Takeover{T: s.T, Image: s.Image, Fenced: f.NodeID, By: f.By}
			takeovers = append(takeovers, to)
			fair := false
			for _, fl := range faults {
				end := fl.End
				if end < 0 {
					end = s.T
				}
				if fl.impairs(f.NodeID) && fl.Start <= s.T && end >= s.T-lease-slack {
					fair = true
				}
			}
			if !fair {
				vs = append(vs, Violation{InvLiveKept, fmt.Sprintf("t=%.1f %s: node %s fenced by %s (epoch %d, %s) although no fault impaired it in the %.0f s before", s.T, s.Image, f.NodeID, f.By, f.Epoch, f.Addr, lease+slack)})
			}
		}
	}
	return takeovers, vs
}

// ReadSamples parses the sampler's JSON lines (blank and non-JSON lines are skipped: the
// sampler may have been stopped in the middle of one).
func ReadSamples(r io.Reader) ([]Sample, error) {
	var out []Sample
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var s Sample
		if err := json.Unmarshal([]byte(line), &s); err != nil {
			continue
		}
		out = append(out, s)
	}
	return out, sc.Err()
}
