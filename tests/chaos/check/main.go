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
	n, err := run(*dir, *lease, *slack, nodes, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "check:", err)
		os.Exit(2)
	}
	if n > 0 {
		os.Exit(1)
	}
}

func run(dir string, lease, slack float64, nodes map[string]string, out io.Writer) (int, error) {
	logFiles, _ := filepath.Glob(filepath.Join(dir, "logs", "*.log"))
	var rs []io.Reader
	for _, f := range logFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			return 0, err
		}
		rs = append(rs, bytes.NewReader(b))
	}
	logs, err := ReadLogs(rs...)
	if err != nil {
		return 0, err
	}
	var vs []Violation
	imgs, _ := filepath.Glob(filepath.Join(dir, "images", "*.img"))
	if len(imgs) == 0 {
		return 0, fmt.Errorf("no images in %s/images", dir)
	}
	blocks := 0
	for _, f := range imgs {
		data, err := os.ReadFile(f)
		if err != nil {
			return 0, err
		}
		c, v := CheckImage(strings.TrimSuffix(filepath.Base(f), ".img"), data, logs)
		blocks += c
		vs = append(vs, v...)
	}
	sf, err := os.Open(filepath.Join(dir, "samples.jsonl"))
	if err != nil {
		return 0, err
	}
	samples, err := ReadSamples(sf)
	sf.Close()
	if err != nil {
		return 0, err
	}
	if len(samples) == 0 {
		return 0, fmt.Errorf("no samples in %s/samples.jsonl: the sampler recorded nothing, so who watched the images is unknown", dir)
	}
	ff, err := os.Open(filepath.Join(dir, "faults.txt"))
	if err != nil {
		return 0, err
	}
	faults, err := ReadFaults(ff)
	ff.Close()
	if err != nil {
		return 0, err
	}
	takeovers, v := CheckSamples(samples, logs, faults, lease, slack)
	vs = append(vs, v...)
	entries, v := CheckBlocklist(samples, nodes, faults, lease, slack)
	vs = append(vs, v...)
	vs = append(vs, CheckHolds(logs)...)
	var gaps []HBGap
	if hf, err := os.Open(filepath.Join(dir, "heartbeats.txt")); err == nil {
		hbs, err := ReadHeartbeats(hf)
		hf.Close()
		if err != nil {
			return 0, err
		}
		gaps, v = CheckHeartbeats(hbs, faults, lease)
		vs = append(vs, v...)
	} else if !os.IsNotExist(err) {
		return 0, err
	}
	for _, f := range faults {
		if f.Kind == "slow-pool" && f.End >= 0 && !slices.ContainsFunc(gaps, func(g HBGap) bool { return g.Fault == f }) {
			vs = append(vs, Violation{InvRenewed, fmt.Sprintf("slow-pool %s at t=%.1f-%.1f: no heartbeat samples of it in heartbeats.txt", f.Node, f.Start, f.End)})
		}
	}
	kinds := map[string]int{}
	for _, f := range faults {
		kinds[f.Kind]++
	}
	var ks []string
	for k, c := range kinds {
		ks = append(ks, fmt.Sprintf("%s=%d", k, c))
	}
	sort.Strings(ks)
	fmt.Fprintf(out, "check: %d images, %d blocks checked, %d acknowledged writes, %d samples, %d takeovers, faults: %s\n",
		len(imgs), blocks, logs.NAcked, len(samples), len(takeovers), strings.Join(ks, " "))
	for _, t := range takeovers {
		fmt.Fprintf(out, "check: takeover t=%.1f %s: %s fenced by %s\n", t.T, t.Image, t.Fenced, t.By)
	}
	for _, e := range entries {
		who := e.Node
		if who == "" {
			who = "no node"
		} else if e.Whole {
			who += " (whole address)"
		}
		fmt.Fprintf(out, "check: blocklisted t=%.1f %s: %s\n", e.T, e.Entry, who)
	}
	var held []string
	for img, node := range logs.Holds {
		held = append(held, img+" by "+node)
	}
	sort.Strings(held)
	for _, h := range held {
		fmt.Fprintf(out, "check: live hold %s\n", h)
	}
	for _, m := range logs.HoldMissed {
		fmt.Fprintf(out, "check: live hold never mapped (the fault did not run as meant): %s\n", m)
	}
	for _, g := range gaps {
		fmt.Fprintf(out, "check: slow-pool t=%.1f-%.1f: %s's heartbeat in %s: longest unchanged %.1f s (%d changes, %d looks, %d unreadable)\n",
			g.Fault.Start, g.Fault.End, g.Fault.Node, g.Pool, g.Gap, g.Changes, g.Samples, g.Unreadable)
	}
	for _, v := range vs {
		fmt.Fprintf(out, "VIOLATION %s: %s\n", v.Invariant, v.Detail)
	}
	fmt.Fprintf(out, "check: %d violations\n", len(vs))
	return len(vs), nil
}
