package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
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
	InvRenewed     = "live-lease-renewed"   // a live holder's heartbeat changes within every lease
	InvFenceListed = "live-fence-listed"    // a live fence's entry is listed (or put back within the bound after a fault removed it)
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
	// Holds are the images a writer held live with -hold (image → node): every write of the
	// holder there must be acknowledged. HoldFailed lists what failed there (a failed write or
	// open of the holder), HoldMissed the holds that never got their image (the fault did not
	// happen as meant).
	Holds      map[string]string
	HoldFailed map[string][]string
	HoldMissed []string
}

// ReadLogs parses writer logs (lines "issue …", "ack …", "mapped … addr=…").
func ReadLogs(rs ...io.Reader) (*Logs, error) {
	l := &Logs{Issued: map[string]map[uint64][]block.Stamp{}, Acked: map[string]map[uint64][]block.Stamp{}, Maps: map[string]string{},
		Holds: map[string]string{}, HoldFailed: map[string][]string{}}
	var failed []block.Stamp
	var openFailed []string // "image err"
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
			case "hold":
				f := fields(rest)
				l.Holds[f["image"]] = f["node"]
			case "fail":
				s, err := block.Parse(rest)
				if err != nil {
					return nil, fmt.Errorf("log line %q: %w", sc.Text(), err)
				}
				failed = append(failed, s)
			case "open-failed":
				f := fields(rest)
				openFailed = append(openFailed, f["image"]+" "+rest)
			case "hold-unmapped":
				f := fields(rest)
				l.HoldMissed = append(l.HoldMissed, f["node"]+" "+f["image"])
			}
		}
		if err := sc.Err(); err != nil {
			return nil, err
		}
	}
	// a hold's line comes before its writes in its own log, but the logs are read one after the
	// other: the failures are matched to the holds once all are read
	for _, s := range failed {
		if l.Holds[s.Image] == s.Node {
			l.HoldFailed[s.Image] = append(l.HoldFailed[s.Image], "write "+s.String()+" failed")
		}
	}
	for _, o := range openFailed {
		img, rest, _ := strings.Cut(o, " ")
		if _, held := l.Holds[img]; held {
			l.HoldFailed[img] = append(l.HoldFailed[img], "open failed: "+rest)
		}
	}
	return l, nil
}

// CheckHolds: a live hold (writer -hold, during idle-claim and slow-pool, while no other fault
// runs) never sees a write of its holder fail: a failed write there means the holder's mapping
// was fenced although its node was live throughout.
func CheckHolds(l *Logs) (vs []Violation) {
	imgs := make([]string, 0, len(l.HoldFailed))
	for img := range l.HoldFailed {
		imgs = append(imgs, img)
	}
	sort.Strings(imgs)
	for _, img := range imgs {
		vs = append(vs, Violation{InvLiveKept, fmt.Sprintf("%s, held live by %s: %s (its mapping was fenced or broken while its node was live)", img, l.Holds[img], strings.Join(l.HoldFailed[img], "; "))})
	}
	return vs
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
// an unmap does not; a freeze, a cut (long-cut too: a cut past a fence's life, then maybe a
// reboot), a killed agent, a reboot, a paused cluster or a killed monitor does (counted as
// impairing in the prod topology too, where two monitors of three keep the quorum). Neither
// idle-claim (a node idle in a namespace, then claiming) nor slow-pool (the OSD of another pool
// stalled) impairs anyone: the node they are about must keep its leases through them.
func (f Fault) impairs(node string) bool {
	switch f.Kind {
	case "freeze", "cut", "long-cut", "kill", "reboot", "pre-short", "old-fences":
		return f.Node == node
	case "pause-osd", "pause-mon", "kill-mon":
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
			if !fair(faults, f.NodeID, s.T, lease, slack) {
				vs = append(vs, Violation{InvLiveKept, fmt.Sprintf("t=%.1f %s: node %s fenced by %s (epoch %d, %s) although no fault impaired it in the %.0f s before", s.T, s.Image, f.NodeID, f.By, f.Epoch, f.Addr, lease+slack)})
			}
		}
	}
	return takeovers, vs
}

// fair says whether some fault impaired node in the lease (plus slack) before t.
func fair(faults []Fault, node string, t, lease, slack float64) bool {
	for _, fl := range faults {
		end := fl.End
		if end < 0 {
			end = t
		}
		if fl.impairs(node) && fl.Start <= t && end >= t-lease-slack {
			return true
		}
	}
	return false
}

// BlockEntry is a blocklist entry first seen in a round at host time T, and the node whose
// address it covers ("" for none of them).
type BlockEntry struct {
	T     float64
	Entry string
	Node  string
	Whole bool // the node's whole address (ip:0/0, or a CIDR range): its agent too
}

// entryCovers says whether blocklist entry e (as `ceph osd blocklist ls` gives it: "ip:port/nonce",
// "[v6]:port/nonce", maybe with a v1:/v2:/any: prefix, or "cidr:ip:port/bits" for a range)
// covers ip, and whether it covers all of ip's clients (port 0 nonce 0, or a range).
func entryCovers(e, ip string) (covers, whole bool) {
	for _, p := range []string{"v1:", "v2:", "any:"} {
		e = strings.TrimPrefix(e, p)
	}
	cidr := strings.HasPrefix(e, "cidr:")
	e = strings.TrimPrefix(e, "cidr:")
	hostport, nonce, _ := strings.Cut(e, "/")
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return false, false
	}
	if cidr {
		_, n, err := net.ParseCIDR(host + "/" + nonce)
		if err != nil {
			return false, false
		}
		return n.Contains(net.ParseIP(ip)), true
	}
	if !net.ParseIP(host).Equal(net.ParseIP(ip)) {
		return false, false
	}
	return true, port == "0" && nonce == "0"
}

// CheckBlocklist holds the sampled blocklists to invariant 5 from the cluster's side: an entry
// that appears during the round (absent from its first sample) and covers a node's address must
// come from a fault that impaired that node in the lease (plus slack) before it was seen; a
// node fenced as a whole (ip:0/0, a range) is called out as such: its agent's own client is cut
// off too. nodes maps each node's IP address to its id. This catches fences the claims do not
// show (a claim overwritten between samples, an image not sampled, a fence outside a takeover).
func CheckBlocklist(samples []Sample, nodes map[string]string, faults []Fault, lease, slack float64) (entries []BlockEntry, vs []Violation) {
	if len(samples) == 0 {
		return nil, nil
	}
	sort.SliceStable(samples, func(i, j int) bool { return samples[i].T < samples[j].T })
	seen := map[string]bool{}
	for _, e := range samples[0].Blocklist {
		seen[e] = true
	}
	ips := make([]string, 0, len(nodes))
	for ip := range nodes {
		ips = append(ips, ip)
	}
	sort.Strings(ips)
	for _, s := range samples[1:] {
		for _, e := range s.Blocklist {
			if seen[e] {
				continue
			}
			seen[e] = true
			be := BlockEntry{T: s.T, Entry: e}
			for _, ip := range ips {
				if c, w := entryCovers(e, ip); c {
					be.Node, be.Whole = nodes[ip], w
					break
				}
			}
			entries = append(entries, be)
			if be.Node == "" || fair(faults, be.Node, s.T, lease, slack) {
				continue
			}
			what := "a client of node " + be.Node
			if be.Whole {
				what = "node " + be.Node + "'s whole address (its agent's own client too)"
			}
			vs = append(vs, Violation{InvLiveKept, fmt.Sprintf("t=%.1f: blocklist entry %s fences %s although no fault impaired it in the %.0f s before", s.T, e, what, lease+slack)})
		}
	}
	return entries, vs
}

// HBSample is one look at a node's heartbeat in a pool (and namespace) at host time T: its mark
// ("incarnation/seq"; "none" or "" when it could not be read).
type HBSample struct {
	T    float64
	Node string
	Pool string
	Mark string
}

// ReadHeartbeats parses "T NODE POOL MARK" lines (tests/chaos/run writes them during slow-pool).
func ReadHeartbeats(r io.Reader) ([]HBSample, error) {
	var out []HBSample
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 4 {
			continue
		}
		t, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		out = append(out, HBSample{T: t, Node: f[1], Pool: f[2], Mark: f[3]})
	}
	return out, sc.Err()
}

// HBGap is the longest a node's heartbeat in a pool was seen unchanged during one slow-pool
// fault's stall.
type HBGap struct {
	Fault      Fault
	Pool       string
	Gap        float64
	Samples    int
	Changes    int
	Unreadable int
}

// CheckHeartbeats holds the heartbeat samples to the slow-pool fault's invariant: while another
// pool's OSD is stalled, the fault's node (live, holding an image in the healthy pool) renews its
// heartbeat there within every lease. For each slow-pool window [Start, End] and each pool sampled
// for its node, the gap is the longest time between two changes of the mark seen, counting from
// the last change seen before Start (or the first sample) and up to End; a gap of a whole lease
// or more is a violation: an observer could have taken the node's images over. (The samples are
// half a second or so apart: a gap is seen at most that much shorter or longer than it was.)
func CheckHeartbeats(hbs []HBSample, faults []Fault, lease float64) (gaps []HBGap, vs []Violation) {
	sort.SliceStable(hbs, func(i, j int) bool { return hbs[i].T < hbs[j].T })
	for _, f := range faults {
		if f.Kind != "slow-pool" || f.End < 0 {
			continue
		}
		pools := map[string]bool{}
		for _, h := range hbs {
			if h.Node == f.Node && h.T >= f.Start && h.T <= f.End {
				pools[h.Pool] = true
			}
		}
		var ps []string
		for p := range pools {
			ps = append(ps, p)
		}
		sort.Strings(ps)
		for _, p := range ps {
			g := HBGap{Fault: f, Pool: p}
			last, since := "", -1.0
			for _, h := range hbs {
				// (from a lease before the stall: an earlier fault's samples are not this one's)
				if h.Node != f.Node || h.Pool != p || h.T > f.End || h.T < f.Start-lease {
					continue
				}
				if h.Mark == "" || h.Mark == "none" {
					if h.T >= f.Start {
						g.Unreadable++
					}
					continue
				}
				if h.T >= f.Start {
					g.Samples++
				}
				if h.Mark != last {
					if since >= 0 && h.T >= f.Start {
						g.Changes++
						g.Gap = max(g.Gap, h.T-since)
					}
					last, since = h.Mark, h.T
				}
			}
			if since >= 0 {
				g.Gap = max(g.Gap, f.End-since)
			}
			gaps = append(gaps, g)
			if g.Samples == 0 {
				vs = append(vs, Violation{InvRenewed, fmt.Sprintf("slow-pool %s at t=%.1f-%.1f: node %s's heartbeat in %s could not be read once during the stall (%d failed looks)", f.Node, f.Start, f.End, f.Node, p, g.Unreadable)})
			} else if g.Gap >= lease {
				vs = append(vs, Violation{InvRenewed, fmt.Sprintf("slow-pool %s at t=%.1f-%.1f: node %s's heartbeat in the healthy pool %s stayed the same for %.1f s (lease %.0f s): its leases there lapsed while it was live", f.Node, f.Start, f.End, f.Node, p, g.Gap, lease)})
			}
		}
	}
	return gaps, vs
}

// ReadSamples parses the sampler's JSON lines (blank and non-JSON lines are skipped: the
// sampler may have been stopped in the middle of one).
func ReadSamples(r io.Reader) ([]Sample, error) { return readJSONLines[Sample](r) }

// readJSONLines parses one JSON object per line, skipping lines that are not one (a writer
// stopped in the middle of a line).
func readJSONLines[T any](r io.Reader) ([]T, error) {
	var out []T
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var v T
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			continue
		}
		out = append(out, v)
	}
	return out, sc.Err()
}
