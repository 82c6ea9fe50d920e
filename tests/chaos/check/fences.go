package main

import (
	"bufio"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
)

// The fence watch (tests/chaos/run's fence_watch, fencewatch.jsonl): about once a second the
// claims of the round's images (and the faults' own), the cluster's blocklist, then the claims
// again. A fence is live at a look when both claim reads record it without a gone mark (so a
// fence made or ended between the reads is not judged at that look); it is in force when its
// exact address, or an entry covering it as a whole (ip:0/0, a range), is listed.

// WatchEntry is one listed blocklist entry and its expiry as Ceph printed it.
type WatchEntry struct {
	Addr  string `json:"a"`
	Until string `json:"u"`
}

// WatchFence is one live fence at a look.
type WatchFence struct {
	Image string `json:"image"`
	Node  string `json:"node"`
	Addr  string `json:"addr"`
	Held  bool   `json:"held"` // the claim had a holder (its holder keeps it each renewal; else the pool sweeps)
}

// Watch is one look.
type Watch struct {
	T         float64      `json:"t"`
	Blocklist []WatchEntry `json:"bl"`
	Live      []WatchFence `json:"live"`
}

// BlOp is a fault's own change of the blocklist (blops.txt: "T rm ADDR", "T clear -",
// "T add ADDR SECONDS"), T taken before the command ran.
type BlOp struct {
	T    float64
	Kind string
	Addr string
}

// ReadWatches parses fencewatch.jsonl (lines that do not parse are skipped: the watcher may
// have been stopped in the middle of one).
func ReadWatches(r io.Reader) ([]Watch, error) {
	out, err := readJSONLines[Watch](r)
	sort.SliceStable(out, func(i, j int) bool { return out[i].T < out[j].T })
	return out, err
}

// ReadBlOps parses blops.txt.
func ReadBlOps(r io.Reader) ([]BlOp, error) {
	var out []BlOp
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 3 {
			continue
		}
		t, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return nil, fmt.Errorf("blocklist op line %q: %w", sc.Text(), err)
		}
		out = append(out, BlOp{T: t, Kind: f[1], Addr: f[2]})
	}
	return out, sc.Err()
}

// normEntry strips a listed entry's v1:/v2:/any: prefix.
func normEntry(e string) string {
	for _, p := range []string{"v1:", "v2:", "any:"} {
		e = strings.TrimPrefix(e, p)
	}
	return e
}

// inForce says whether addr (ip:port/nonce, or ip:0/0) is blocklisted at a look: listed
// exactly, or covered by a whole-address entry (ip:0/0, a range).
func inForce(addr string, bl []WatchEntry) bool {
	host := addr
	if i := strings.LastIndex(addr, ":"); i >= 0 {
		host = strings.Trim(addr[:i], "[]")
	}
	for _, e := range bl {
		if normEntry(e.Addr) == addr {
			return true
		}
		if c, whole := entryCovers(e.Addr, host); c && whole {
			return true
		}
	}
	return false
}

// FenceGap is one time a live fence was seen not in force: from the first look that missed it
// to the first that found it again (End -1: not found again while it was watched live).
type FenceGap struct {
	Image, Node, Addr string
	Held              bool
	Start, End        float64
	Looks             int
	Op                *BlOp   // the fault's removal it follows, if any
	Back              float64 // seconds from Op to the first look that found it again (-1: never)
	// Down: the fenced node was frozen, cut off or rebooting during the gap (a fault's window);
	// a gap of a node that was up and that no fault's removal explains is counted, not judged
	Down bool
}

// WatchSummary is what the fence watch saw in a round.
type WatchSummary struct {
	Looks   int // looks at the blocklist
	Checks  int // live fences judged (one per fence per look)
	Fences  int // distinct live fences seen
	Gaps    []FenceGap
	Span    float64 // seconds from the first look to the last
	MaxStep float64 // the longest time between two looks
}

// down says whether a fault froze, cut off or rebooted node at some point in [from, to].
func down(faults []Fault, node string, from, to float64) bool {
	for _, f := range faults {
		switch f.Kind {
		case "freeze", "cut", "long-cut", "reboot", "pre-short", "old-fences":
		default:
			continue
		}
		end := f.End
		if end < 0 {
			end = to
		}
		if f.Node == node && f.Start <= to && end >= from {
			return true
		}
	}
	return false
}

// CheckWatches holds the fence watch to the campaign's fence invariant: while its node is frozen,
// cut off or rebooting, a live fence's entry is never missing, except right after a fault
// removed it (its address, or the whole list); a fault's removal must be undone within
// backHeld seconds when the claim had a holder (who checks at every renewal), backFree when it
// was free (the pools' sweeps), whatever the node's state. A gap of a node that was up, with no
// removal to explain it, is counted and printed, not judged: the keepers do not lengthen the
// entry of a node seen alive (the limit alive-short in docs/safety.md: it lapses and comes back
// at the next check), which in the lab, with its one-minute fence_expiry, is every fence whose
// node came back with its fenced device still mapped.
func CheckWatches(ws []Watch, ops []BlOp, faults []Fault, backHeld, backFree float64) (sum WatchSummary, vs []Violation) {
	type state struct {
		gap *FenceGap
	}
	last := map[*FenceGap]float64{} // the last look of a gap's fence while live
	st := map[string]*state{}
	var gaps []*FenceGap
	if len(ws) > 0 {
		sum.Span = ws[len(ws)-1].T - ws[0].T
	}
	for i, w := range ws {
		sum.Looks++
		if i > 0 {
			sum.MaxStep = max(sum.MaxStep, w.T-ws[i-1].T)
		}
		for _, f := range w.Live {
			key := f.Image + "|" + f.Addr
			s := st[key]
			if s == nil {
				s = &state{}
				st[key] = s
				sum.Fences++
			}
			sum.Checks++
			if s.gap != nil {
				last[s.gap] = w.T
			}
			if inForce(f.Addr, w.Blocklist) {
				if s.gap != nil {
					s.gap.End = w.T
					s.gap = nil
				}
				continue
			}
			if s.gap == nil {
				s.gap = &FenceGap{Image: f.Image, Node: f.Node, Addr: f.Addr, Held: f.Held, Start: w.T, End: -1, Back: -1}
				gaps = append(gaps, s.gap)
				last[s.gap] = w.T
			}
			s.gap.Looks++
		}
	}
	for _, g := range gaps {
		bound := backFree
		if g.Held {
			bound = backHeld
		}
		g.Op = removalOf(g, ops, bound)
		if g.Op != nil && g.End >= 0 {
			g.Back = g.End - g.Op.T
		}
		to := g.End
		if to < 0 {
			to = last[g]
		}
		g.Down = down(faults, g.Node, g.Start, to)
		sum.Gaps = append(sum.Gaps, *g)
		end := "not listed again while it was watched live"
		if g.End >= 0 {
			end = fmt.Sprintf("listed again at t=%.1f (%.1f s later)", g.End, g.End-g.Start)
		}
		who := "its holder"
		if !g.Held {
			who = "the pools' sweeps (a free claim)"
		}
		switch {
		case g.Op == nil && !g.Down:
			// counted (the summary), not judged: see above
		case g.Op == nil:
			vs = append(vs, Violation{InvFenceListed, fmt.Sprintf("t=%.1f %s: node %s's live fence %s was not on the blocklist (%d looks) while its node was frozen, cut off or rebooting, and no fault had just removed it; %s", g.Start, g.Image, g.Node, g.Addr, g.Looks, end)})
		case g.End < 0 || g.Back > bound:
			vs = append(vs, Violation{InvFenceListed, fmt.Sprintf("t=%.1f %s: node %s's live fence %s, removed by the fault at t=%.1f (%s), was not back within %.0f s (kept by %s): %s", g.Start, g.Image, g.Node, g.Addr, g.Op.T, g.Op.Kind, bound, who, end)})
		}
	}
	return sum, vs
}

// removalOf is the fault's removal of g's entry (or clear) that explains g: the latest before
// the first look that missed it, no more than bound before it (nil when none).
func removalOf(g *FenceGap, ops []BlOp, bound float64) *BlOp {
	var op *BlOp
	for i := range ops {
		o := ops[i]
		if ((o.Kind == "rm" && o.Addr == g.Addr) || o.Kind == "clear") && o.T <= g.Start && (op == nil || o.T > op.T) {
			op = &o
		}
	}
	if op != nil && g.Start-op.T > bound {
		return nil // an older removal: this gap is not its
	}
	return op
}
