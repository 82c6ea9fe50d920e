// Command fleettable prints the fleet benchmark's tables from the JSON lines TestFleet wrote
// (agent/daemon/fleet_test.go; tests/bench/fleet runs it): for each revision and fleet size,
// the steady state's RADOS calls per node per renew interval by kind and the OSD's own totals
// per second, what a churn cycle and a takeover cost, and per kind a least-squares line
// ops/s = a + b·nodes with a projection to a larger fleet.
//
//	fleettable [-nodes 1000] [-vols 100] [-renew 20s] results.jsonl
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"slices"
	"sort"
	"strings"
	"time"
)

type line struct {
	Rev                string   `json:"rev"`
	Nodes              int      `json:"nodes"`
	Vols               int      `json:"vols"`
	RenewS             float64  `json:"renew_s"`
	Phase              string   `json:"phase"`
	Seconds            float64  `json:"seconds"`
	Kind               string   `json:"kind"`
	Count              *float64 `json:"count"`
	PerSec             *float64 `json:"per_sec"`
	PerNodePerInterval *float64 `json:"per_node_per_interval"`
	Value              *float64 `json:"value"`
}

// run is one measurement: a revision at one fleet size.
type run struct {
	rev         string
	nodes, vols int
	renew       float64
	lines       map[string]map[string]line // phase → kind → line
}

func (r *run) get(phase, kind string) (line, bool) {
	l, ok := r.lines[phase][kind]
	return l, ok
}

func (r *run) column() string { return fmt.Sprintf("%s N=%d", r.rev, r.nodes) }

func main() {
	projNodes := flag.Int("nodes", 1000, "project the fits to this many nodes")
	projVols := flag.Int("vols", 100, "... each mapping this many volumes")
	projRenew := flag.Duration("renew", 20*time.Second, "... at this renew_interval (the default's)")
	projSweep := flag.Duration("sweep", time.Hour, "... and this orphan_sweep_interval (the default's)")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: fleettable [-nodes N] [-vols V] [-renew D] [-sweep D] results.jsonl")
		os.Exit(2)
	}
	runs, err := load(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleettable:", err)
		os.Exit(1)
	}
	if len(runs) == 0 {
		fmt.Fprintln(os.Stderr, "fleettable: no measurements in", flag.Arg(0))
		os.Exit(1)
	}
	steady(runs)
	churnAndTakeover(runs)
	fits(runs, *projNodes, *projVols, projRenew.Seconds(), projSweep.Seconds())
}

func load(path string) ([]*run, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var revs []string
	byKey := map[string]*run{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var l line
		if json.Unmarshal(sc.Bytes(), &l) != nil || l.Kind == "" || l.Phase == "" {
			continue
		}
		if !slices.Contains(revs, l.Rev) {
			revs = append(revs, l.Rev)
		}
		key := fmt.Sprintf("%s|%d|%d", l.Rev, l.Nodes, l.Vols)
		r := byKey[key]
		if r == nil {
			r = &run{rev: l.Rev, nodes: l.Nodes, vols: l.Vols, renew: l.RenewS, lines: map[string]map[string]line{}}
			byKey[key] = r
		}
		if r.lines[l.Phase] == nil {
			r.lines[l.Phase] = map[string]line{}
		}
		r.lines[l.Phase][l.Kind] = l
		if l.Value != nil {
			figures[l.Kind] = true
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	var runs []*run
	for _, r := range byKey {
		runs = append(runs, r)
	}
	sort.Slice(runs, func(i, j int) bool {
		a, b := runs[i], runs[j]
		if a.rev != b.rev {
			return slices.Index(revs, a.rev) < slices.Index(revs, b.rev)
		}
		if a.vols != b.vols {
			return a.vols < b.vols
		}
		return a.nodes < b.nodes
	})
	return runs, nil
}

// kinds returns the kinds of phase in any run that pass keep, counted kinds first.
func kinds(runs []*run, phase string, keep func(string) bool) []string {
	var out []string
	for _, r := range runs {
		for k := range r.lines[phase] {
			if keep(k) && !slices.Contains(out, k) {
				out = append(out, k)
			}
		}
	}
	rank := func(k string) int {
		switch {
		case strings.HasPrefix(k, "osd "):
			return 3
		case k == "all counted calls":
			return 2
		case strings.HasPrefix(k, "error ") || strings.HasPrefix(k, "map-error") || strings.HasPrefix(k, "unmap-error"):
			return 1
		}
		return 0
	}
	sort.Slice(out, func(i, j int) bool {
		if ri, rj := rank(out[i]), rank(out[j]); ri != rj {
			return ri < rj
		}
		return out[i] < out[j]
	})
	return out
}

func header(title string, runs []*run) {
	fmt.Println()
	fmt.Println(title)
	fmt.Printf("  %-36s", "")
	for _, r := range runs {
		fmt.Printf(" %16s", r.column())
	}
	fmt.Println()
}

func row(name string, runs []*run, val func(*run) (float64, bool), format string) {
	fmt.Printf("  %-36s", name)
	for _, r := range runs {
		if v, ok := val(r); ok {
			fmt.Printf(" %16s", fmt.Sprintf(format, v))
		} else {
			fmt.Printf(" %16s", "-")
		}
	}
	fmt.Println()
}

func counted(k string) bool {
	return !strings.HasPrefix(k, "audit ") && !strings.HasPrefix(k, "items ") && !isFigure(k)
}

// figures are the kinds given as a value (CPU, memory, times), not as a count.
var figures = map[string]bool{}

func isFigure(k string) bool { return figures[k] }

func steady(runs []*run) {
	vols := map[int]bool{}
	renews := map[float64]bool{}
	for _, r := range runs {
		vols[r.vols], renews[r.renew] = true, true
	}
	title := "steady state: calls per node per renew interval, by kind (the wrapper's count; osd: the OSD's perf counters)"
	header(title, runs)
	for _, k := range kinds(runs, "steady", counted) {
		row(k, runs, func(r *run) (float64, bool) {
			l, ok := r.get("steady", k)
			if !ok || l.PerNodePerInterval == nil {
				return 0, false
			}
			return *l.PerNodePerInterval, true
		}, "%.3f")
	}
	header("steady state: per second (at the measured renew interval)", runs)
	for _, k := range []string{"all counted calls", "osd op_r", "osd op_w", "osd op_rw", "osd op"} {
		row(k, runs, func(r *run) (float64, bool) {
			l, ok := r.get("steady", k)
			if !ok || l.PerSec == nil {
				return 0, false
			}
			return *l.PerSec, true
		}, "%.1f")
	}
	for _, k := range []string{"cpu-cores test process", "cpu-cores osd", "cpu-cores mon", "heap-alloc-mb", "rss-mb", "threads"} {
		row(k, runs, figure("steady", k), "%.2f")
	}
	row("renew interval s", runs, func(r *run) (float64, bool) { return r.renew, true }, "%.1f")
	row("volumes per node", runs, func(r *run) (float64, bool) { return float64(r.vols), true }, "%.0f")
	row("steady phase s", runs, func(r *run) (float64, bool) {
		l, ok := r.get("steady", "all counted calls")
		return l.Seconds, ok
	}, "%.1f")
}

func figure(phase, k string) func(*run) (float64, bool) {
	return func(r *run) (float64, bool) {
		l, ok := r.get(phase, k)
		if !ok || l.Value == nil {
			return 0, false
		}
		return *l.Value, true
	}
}

// background says whether a kind is the agents' periodic work (renewals, heartbeats, sweeps,
// reconciliation), which goes on during every phase: the steady state measures it.
func background(k string) bool {
	for _, o := range []string{"@renew", "@heartbeat", "@sweep", "@reconcile"} {
		if strings.HasSuffix(k, o) || strings.Contains(k, o+":") {
			return true
		}
	}
	return false
}

// count is a kind's count in phase.
func count(r *run, phase, k string) (float64, bool) {
	l, ok := r.get(phase, k)
	if !ok || l.Count == nil {
		return 0, false
	}
	return *l.Count, true
}

// own is what the phase's own work called (every kind but the background's), and beyond the
// OSD's ops in the phase less what the steady state's rate makes in the same time: both what the
// phase's work cost. The second is rough: the background's rounds come in bursts, and a short
// phase holds one more or one fewer of them.
func own(r *run, phase string) (float64, bool) {
	var sum float64
	found := false
	for k, l := range r.lines[phase] {
		if l.Count != nil && counted(k) && !background(k) && !strings.HasPrefix(k, "osd ") && k != "all counted calls" &&
			!strings.HasPrefix(k, "error ") && !strings.Contains(k, "map-error") {
			sum += *l.Count
			found = true
		}
	}
	return sum, found
}

func beyond(r *run, phase, k string) (float64, bool) {
	v, ok := count(r, phase, k)
	if !ok {
		return 0, false
	}
	if s, ok := r.get("steady", k); ok && s.PerSec != nil {
		v -= *s.PerSec * r.lines[phase][k].Seconds
	}
	return v, true
}

// phaseWork prints the calls of a phase's own work by kind (divided by per's value when per is
// not ""), the OSD's ops beyond the steady state's, and the figures.
func phaseWork(title, phase, per string, runs []*run, figs []string) {
	header(title, runs)
	div := func(r *run) (float64, bool) {
		if per == "" {
			return 1, true
		}
		c, ok := r.get(phase, per)
		if !ok || c.Value == nil || *c.Value == 0 {
			return 0, false
		}
		return *c.Value, true
	}
	format := "%.0f"
	if per != "" {
		format = "%.2f"
	}
	for _, k := range kinds(runs, phase, func(k string) bool {
		return counted(k) && !background(k) && k != "all counted calls" && !strings.HasPrefix(k, "osd ")
	}) {
		row(k, runs, func(r *run) (float64, bool) {
			v, ok := count(r, phase, k)
			d, ok2 := div(r)
			return v / d, ok && ok2
		}, format)
	}
	row("the phase's own calls", runs, func(r *run) (float64, bool) {
		v, ok := own(r, phase)
		d, ok2 := div(r)
		return v / d, ok && ok2
	}, format)
	for _, k := range []string{"osd op_r", "osd op_rw", "osd op"} {
		row(k+" beyond the steady state's", runs, func(r *run) (float64, bool) {
			v, ok := beyond(r, phase, k)
			d, ok2 := div(r)
			return v / d, ok && ok2
		}, format)
	}
	for _, k := range figs {
		row(k, runs, figure(phase, k), "%.2f")
	}
}

func churnAndTakeover(runs []*run) {
	phaseWork("churn: calls per unmap+map cycle, by kind (the renewals', heartbeats' and sweeps' are in the steady state)",
		"churn", "churn-cycles", runs, []string{"churn-cycles"})
	phaseWork("takeover of the dead node's images by the others: calls, by kind (the renewals', heartbeats' and sweeps' are in the steady state)",
		"takeover", "", runs, []string{"takeover-images", "takeover-map-attempts", "takeover-lease-s", "takeover-s", "takeover-from-death-s"})
	header("setup (agents start, every image mapped)", runs)
	for _, k := range []string{"maps-per-s", "all counted calls", "osd op", "cpu-cores test process", "rss-mb", "threads"} {
		row(k, runs, func(r *run) (float64, bool) {
			l, ok := r.get("setup", k)
			switch {
			case !ok:
				return 0, false
			case l.Value != nil:
				return *l.Value, true
			case l.Count != nil:
				return *l.Count, true
			}
			return 0, false
		}, "%.1f")
	}
}

// fit is the least-squares line y = a + b·x and its R².
func fit(x, y []float64) (a, b, r2 float64) {
	n := float64(len(x))
	var sx, sy, sxx, sxy float64
	for i := range x {
		sx, sy, sxx, sxy = sx+x[i], sy+y[i], sxx+x[i]*x[i], sxy+x[i]*y[i]
	}
	den := n*sxx - sx*sx
	if len(x) < 2 || den == 0 {
		return math.NaN(), math.NaN(), math.NaN()
	}
	b = (n*sxy - sx*sy) / den
	a = (sy - b*sx) / n
	mean := sy / n
	var ssr, sst float64
	for i := range x {
		e := y[i] - (a + b*x[i])
		ssr += e * e
		sst += (y[i] - mean) * (y[i] - mean)
	}
	r2 = 1
	if sst > 0 {
		r2 = 1 - ssr/sst
	}
	return a, b, r2
}

// perVolume says whether a kind's steady-state cost grows with the volumes a node holds (a call
// on a claim's object, but the sweep's) rather than with the nodes alone (heartbeats, the
// monitor).
func perVolume(kind string) bool {
	return strings.Contains(kind, " claim @") && !strings.HasSuffix(kind, "@sweep")
}

// sweep says whether a kind is the pool sweep's: each node lists the pool once per sweep period
// and reads every claim in it, so the fleet's cost is nodes × (nodes × volumes) per period.
func sweep(kind string) bool { return strings.HasSuffix(kind, "@sweep") }

// runGroup is the runs of one revision at one number of volumes per node.
type runGroup struct {
	rev  string
	vols int
	runs []*run
}

func fits(runs []*run, pNodes, pVols int, pRenew, pSweep float64) {
	var groups []*runGroup
	for _, r := range runs {
		i := slices.IndexFunc(groups, func(g *runGroup) bool { return g.rev == r.rev && g.vols == r.vols })
		if i < 0 {
			groups = append(groups, &runGroup{rev: r.rev, vols: r.vols})
			i = len(groups) - 1
		}
		groups[i].runs = append(groups[i].runs, r)
	}
	fmt.Println()
	fmt.Printf("steady state: least squares, per kind, of the fleet's calls per renew interval = a + b·nodes; projected to %d nodes × %d volumes,\n", pNodes, pVols)
	fmt.Printf("renew_interval %gs and a sweep every %gs\n", pRenew, pSweep)
	fmt.Println("  (per renew interval, so that runs with different intervals fit one line; ops/s = that / renew_interval.")
	fmt.Println("  Kinds on a claim object are projected with b scaled by the volumes per node, the others with the nodes")
	fmt.Println("  alone. The sweep's kinds (@sweep) are not a line: each node lists the pool and reads every claim in it")
	fmt.Println("  once per sweep period, nodes × nodes × volumes reads per period; they are projected from the claims each")
	fmt.Println("  listing returned and the reads per claim listed. The OSD's totals are fitted, not projected: compare")
	fmt.Println("  them with the counted calls.)")
	for _, g := range groups {
		if len(g.runs) < 2 {
			fmt.Printf("\n  %s, %d volumes per node: one fleet size only, no line to fit\n", g.rev, g.vols)
			continue
		}
		var ns []string
		for _, r := range g.runs {
			ns = append(ns, fmt.Sprint(r.nodes))
		}
		fmt.Printf("\n  %s, %d volumes per node, nodes %s\n", g.rev, g.vols, strings.Join(ns, " "))
		total := fitKinds(g, pNodes, pVols, pRenew)
		projectSweep(g, pNodes, pVols, pRenew, pSweep, total)
	}
}

// fitKinds prints the line fitted to each steady-state kind of g's runs and its projection,
// and returns the projected calls per renew interval of all but the sweep.
func fitKinds(g *runGroup, pNodes, pVols int, pRenew float64) float64 {
	fmt.Printf("  %-36s %12s %12s %8s %16s %14s\n", "kind", "a /interval", "b /int./node", "R²", "proj /interval", fmt.Sprintf("proj ops/s %gs", pRenew))
	scale := float64(pVols) / float64(g.vols)
	var total float64
	for _, k := range kinds(g.runs, "steady", func(k string) bool {
		return counted(k) && !strings.HasPrefix(k, "error ") && !strings.Contains(k, "map-error") && k != "all counted calls"
	}) {
		var x, y []float64
		for _, r := range g.runs {
			v := 0.0 // a kind a run did not see: none of it
			if l, ok := r.get("steady", k); ok && l.PerNodePerInterval != nil {
				v = *l.PerNodePerInterval * float64(r.nodes)
			}
			x, y = append(x, float64(r.nodes)), append(y, v)
		}
		a, b, r2 := fit(x, y)
		proj, projS := "-", "-"
		switch {
		case strings.HasPrefix(k, "osd "):
		case sweep(k):
			proj, projS = "(sweep: below)", ""
		default:
			perNode := b
			if perVolume(k) {
				perNode = b * scale
			}
			p := a + perNode*float64(pNodes)
			total += p
			proj, projS = fmt.Sprintf("%.0f", p), fmt.Sprintf("%.0f", p/pRenew)
		}
		fmt.Printf("  %-36s %12.2f %12.3f %8.4f %16s %14s\n", k, a, b, r2, proj, projS)
	}
	fmt.Printf("  %-36s %12s %12s %8s %16.0f %14.0f\n", "all but the sweep", "", "", "", total, total/pRenew)
	return total
}

// projectSweep prints the sweep's cost in g's runs and its projection, beside the rest (total
// calls per renew interval).
func projectSweep(g *runGroup, pNodes, pVols int, pRenew, pSweep, total float64) {
	// the claims each listing returned, and the sweep's reads per claim listed, over the whole
	// run (a listing's reads may fall in the next phase, or between two)
	var perClaim []float64
	for _, r := range g.runs {
		var listings, listed, reads float64
		for phase := range r.lines {
			l, _ := count(r, phase, "list-objects @sweep")
			i, _ := count(r, phase, "items list-objects @sweep")
			c, _ := count(r, phase, "read claim @sweep")
			listings, listed, reads = listings+l, listed+i, reads+c
		}
		period := "?"
		if p, ok := r.get("steady", "sweep-period-s"); ok && p.Value != nil {
			period = fmt.Sprintf("%g", *p.Value)
		}
		if listed > 0 {
			perClaim = append(perClaim, reads/listed)
			fmt.Printf("  sweep at %d nodes (every %ss): %.0f listings in the run returned %.0f claims each (%d in the pool once set up); %.3f reads per claim listed\n",
				r.nodes, period, listings, listed/listings, r.nodes*r.vols, reads/listed)
		}
	}
	if len(perClaim) == 0 {
		fmt.Println("  sweep: no listing in the runs (a sweep period is much longer than they are)")
		return
	}
	var m float64
	for _, v := range perClaim {
		m += v
	}
	m /= float64(len(perClaim))
	perSec := float64(pNodes) * m * float64(pNodes*pVols) / pSweep
	fmt.Printf("  sweep projected: %d nodes each listing the %d claims of the pool and reading %.3f per claim every %gs: %.0f reads/s;\n",
		pNodes, pNodes*pVols, m, pSweep, perSec)
	fmt.Printf("  with the rest at renew %gs: %.0f ops/s\n", pRenew, total/pRenew+perSec)
}
