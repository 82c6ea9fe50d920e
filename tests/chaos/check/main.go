// Command check is the chaos campaign's checker: after a round it holds the images (exported
// from the cluster), the writers' logs, the sampled watchers and claims, and the fault schedule
// to the campaign's invariants, prints a summary and every violation, and exits 1 on any.
//
//	check -dir ROUND_DIR -lease 15 -slack 8 -nodes node-a=203.0.113.11,node-b=203.0.113.12
//
// ROUND_DIR holds images/<image>.img, logs/*.log (the writers' and the live holds'),
// samples.jsonl, faults.txt and, when a slow-pool fault ran, heartbeats.txt.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

func main() {
	dir := flag.String("dir", "", "the round's directory")
	lease := flag.Float64("lease", 15, "lease seconds")
	slack := flag.Float64("slack", 8, "seconds of slack around a lease (renew interval, sampling)")
	nodeList := flag.String("nodes", "", "NODE=IP,…: whose address each blocklist entry covers")
	backHeld := flag.Float64("back-held", 10, "seconds within which a held claim's live fence removed by a fault must be listed again (renew interval + margin)")
	backFree := flag.Float64("back-free", 14, "the same for a free claim's (kept by the pools' sweeps: sweep period + margin)")
	flag.Parse()
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "check: -dir is required")
		os.Exit(2)
	}
	nodes := map[string]string{}
	for _, kv := range strings.Split(*nodeList, ",") {
		if kv == "" {
			continue
		}
		n, ip, ok := strings.Cut(kv, "=")
		if !ok || n == "" || ip == "" {
			fmt.Fprintf(os.Stderr, "check: -nodes: %q is not NODE=IP\n", kv)
			os.Exit(2)
		}
		nodes[ip] = n
	}
	n, err := run(*dir, *lease, *slack, nodes, *backHeld, *backFree, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "check:", err)
		os.Exit(2)
	}
	if n > 0 {
		os.Exit(1)
	}
}

func run(dir string, lease, slack float64, nodes map[string]string, backHeld, backFree float64, out io.Writer) (int, error) {
	r := round{}
	var err error
	if r.logs, err = readLogs(dir); err != nil {
		return 0, err
	}
	if err := r.checkImages(dir); err != nil {
		return 0, err
	}
	if r.samples, err = readSamples(dir); err != nil {
		return 0, err
	}
	ff, err := os.Open(filepath.Join(dir, "faults.txt"))
	if err != nil {
		return 0, err
	}
	r.faults, err = ReadFaults(ff)
	ff.Close()
	if err != nil {
		return 0, err
	}
	var v []Violation
	r.takeovers, v = CheckSamples(r.samples, r.logs, r.faults, lease, slack)
	r.vs = append(r.vs, v...)
	r.entries, v = CheckBlocklist(r.samples, nodes, r.faults, lease, slack)
	r.vs = append(r.vs, v...)
	r.vs = append(r.vs, CheckHolds(r.logs)...)
	if err := r.checkHeartbeats(dir, lease); err != nil {
		return 0, err
	}
	if err := r.checkWatches(dir, backHeld, backFree); err != nil {
		return 0, err
	}
	r.report(out)
	return len(r.vs), nil
}

// round is what run read and found in a round's directory.
type round struct {
	logs      *Logs
	images    int
	blocks    int // blocks checked
	samples   []Sample
	faults    []Fault
	takeovers []Takeover
	entries   []BlockEntry
	gaps      []HBGap
	watch     *WatchSummary // nil: no fence watch this round
	vs        []Violation
}

// checkWatches checks dir/fencewatch.jsonl (the fence watch) against dir/blops.txt (the
// faults' own removals), when the round has a fence watch.
func (r *round) checkWatches(dir string, backHeld, backFree float64) error {
	wf, err := os.Open(filepath.Join(dir, "fencewatch.jsonl"))
	if os.IsNotExist(err) {
		return nil
	} else if err != nil {
		return err
	}
	ws, err := ReadWatches(wf)
	wf.Close()
	if err != nil {
		return err
	}
	var ops []BlOp
	if of, err := os.Open(filepath.Join(dir, "blops.txt")); err == nil {
		ops, err = ReadBlOps(of)
		of.Close()
		if err != nil {
			return err
		}
	} else if !os.IsNotExist(err) {
		return err
	}
	sum, v := CheckWatches(ws, ops, r.faults, backHeld, backFree)
	r.watch = &sum
	r.vs = append(r.vs, v...)
	return nil
}

// readLogs reads every log in dir/logs.
func readLogs(dir string) (*Logs, error) {
	logFiles, _ := filepath.Glob(filepath.Join(dir, "logs", "*.log"))
	var rs []io.Reader
	for _, f := range logFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		rs = append(rs, bytes.NewReader(b))
	}
	return ReadLogs(rs...)
}

// checkImages checks every image exported into dir/images against the logs.
func (r *round) checkImages(dir string) error {
	imgs, _ := filepath.Glob(filepath.Join(dir, "images", "*.img"))
	if len(imgs) == 0 {
		return fmt.Errorf("no images in %s/images", dir)
	}
	r.images = len(imgs)
	for _, f := range imgs {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		c, v := CheckImage(strings.TrimSuffix(filepath.Base(f), ".img"), data, r.logs)
		r.blocks += c
		r.vs = append(r.vs, v...)
	}
	return nil
}

// readSamples reads dir/samples.jsonl, which must hold some.
func readSamples(dir string) ([]Sample, error) {
	sf, err := os.Open(filepath.Join(dir, "samples.jsonl"))
	if err != nil {
		return nil, err
	}
	samples, err := ReadSamples(sf)
	sf.Close()
	if err != nil {
		return nil, err
	}
	if len(samples) == 0 {
		return nil, fmt.Errorf("no samples in %s/samples.jsonl: the sampler recorded nothing, so who watched the images is unknown", dir)
	}
	return samples, nil
}

// checkHeartbeats checks dir/heartbeats.txt (there when a slow-pool fault ran) against the
// faults: each slow-pool fault that ended must have samples.
func (r *round) checkHeartbeats(dir string, lease float64) error {
	if hf, err := os.Open(filepath.Join(dir, "heartbeats.txt")); err == nil {
		hbs, err := ReadHeartbeats(hf)
		hf.Close()
		if err != nil {
			return err
		}
		var v []Violation
		r.gaps, v = CheckHeartbeats(hbs, r.faults, lease)
		r.vs = append(r.vs, v...)
	} else if !os.IsNotExist(err) {
		return err
	}
	for _, f := range r.faults {
		if f.Kind == "slow-pool" && f.End >= 0 && !slices.ContainsFunc(r.gaps, func(g HBGap) bool { return g.Fault == f }) {
			r.vs = append(r.vs, Violation{InvRenewed, fmt.Sprintf("slow-pool %s at t=%.1f-%.1f: no heartbeat samples of it in heartbeats.txt", f.Node, f.Start, f.End)})
		}
	}
	return nil
}

// report prints the summary, what happened (takeovers, blocklist entries, live holds, slow
// pools) and every violation.
func (r *round) report(out io.Writer) {
	kinds := map[string]int{}
	for _, f := range r.faults {
		kinds[f.Kind]++
	}
	var ks []string
	for k, c := range kinds {
		ks = append(ks, fmt.Sprintf("%s=%d", k, c))
	}
	sort.Strings(ks)
	fmt.Fprintf(out, "check: %d images, %d blocks checked, %d acknowledged writes, %d samples, %d takeovers, faults: %s\n",
		r.images, r.blocks, r.logs.NAcked, len(r.samples), len(r.takeovers), strings.Join(ks, " "))
	for _, t := range r.takeovers {
		fmt.Fprintf(out, "check: takeover t=%.1f %s: %s fenced by %s\n", t.T, t.Image, t.Fenced, t.By)
	}
	for _, e := range r.entries {
		who := e.Node
		if who == "" {
			who = "no node"
		} else if e.Whole {
			who += " (whole address)"
		}
		fmt.Fprintf(out, "check: blocklisted t=%.1f %s: %s\n", e.T, e.Entry, who)
	}
	var held []string
	for img, node := range r.logs.Holds {
		held = append(held, img+" by "+node)
	}
	sort.Strings(held)
	for _, h := range held {
		fmt.Fprintf(out, "check: live hold %s\n", h)
	}
	for _, m := range r.logs.HoldMissed {
		fmt.Fprintf(out, "check: live hold never mapped (the fault did not run as meant): %s\n", m)
	}
	for _, g := range r.gaps {
		fmt.Fprintf(out, "check: slow-pool t=%.1f-%.1f: %s's heartbeat in %s: longest unchanged %.1f s (%d changes, %d looks, %d unreadable)\n",
			g.Fault.Start, g.Fault.End, g.Fault.Node, g.Pool, g.Gap, g.Changes, g.Samples, g.Unreadable)
	}
	if w := r.watch; w != nil {
		excused, missing, up := 0, 0, 0
		var backs []string
		for _, g := range w.Gaps {
			switch {
			case g.Op != nil && g.Back >= 0:
				excused++
				backs = append(backs, fmt.Sprintf("%.1f", g.Back))
			case g.Op == nil && !g.Down:
				up++
			default:
				missing++
			}
		}
		fmt.Fprintf(out, "check: fence watch: %d looks over %.0f s (longest step %.1f s), %d entry checks of %d live fences, %d times not listed after a fault's removal (back after %s s), %d missing otherwise while the node was down, %d while it was up (alive-short: not judged)\n",
			w.Looks, w.Span, w.MaxStep, w.Checks, w.Fences, excused, strings.Join(append(backs, "-")[:max(len(backs), 1)], ","), missing, up)
		for _, g := range w.Gaps {
			how := "no fault removed it"
			if g.Op != nil {
				how = fmt.Sprintf("removed by the fault (%s) at t=%.1f, back after %.1f s", g.Op.Kind, g.Op.T, g.Back)
			}
			fmt.Fprintf(out, "check: fence not listed t=%.1f-%.1f %s %s (node %s, held %v, node down %v, %d looks): %s\n", g.Start, g.End, g.Image, g.Addr, g.Node, g.Held, g.Down, g.Looks, how)
		}
	}
	for _, v := range r.vs {
		fmt.Fprintf(out, "VIOLATION %s: %s\n", v.Invariant, v.Detail)
	}
	fmt.Fprintf(out, "check: %d violations\n", len(r.vs))
}
