// Command table prints the benchmark's table from the JSON lines kbench and tests/bench/run
// wrote ({"what","op","ms","err","value"}): median and p90 of each measurement, the ratios the
// benchmark is about, and the single figures (slab, connections, RSS, READY times, writes).
//
//	table results.jsonl
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"sort"
	"strings"
)

type result struct {
	What  string  `json:"what"`
	Op    string  `json:"op"`
	Ms    float64 `json:"ms"`
	Err   string  `json:"err"`
	Value float64 `json:"value"`
}

type series struct {
	vals []float64
	errs int
}

func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: table results.jsonl")
		os.Exit(2)
	}
	f, err := os.Open(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "table:", err)
		os.Exit(1)
	}
	defer f.Close()
	data := map[string]*series{}
	values := map[string]float64{}
	var order []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 16<<20) // a failed rbd's error can be long (a crash dump)
	for sc.Scan() {
		var r result
		if json.Unmarshal(sc.Bytes(), &r) != nil || r.What == "" {
			continue
		}
		key := r.What + " " + r.Op
		if r.Value != 0 || strings.HasSuffix(r.Op, "-kb") || strings.HasSuffix(r.Op, "-conns") || strings.HasPrefix(r.Op, "rss") || strings.HasPrefix(r.Op, "ready") || strings.HasPrefix(r.Op, "writes") {
			values[key] = r.Value
			if !slices.Contains(order, key) {
				order = append(order, key)
			}
			continue
		}
		s := data[key]
		if s == nil {
			s = &series{}
			data[key] = s
			order = append(order, key)
		}
		if r.Err != "" {
			s.errs++
			continue
		}
		s.vals = append(s.vals, r.Ms)
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "table:", err)
		os.Exit(1)
	}
	med := func(key string) float64 {
		if s := data[key]; s != nil {
			return quantile(s.vals, 0.5)
		}
		return math.NaN()
	}
	fmt.Printf("%-28s %-10s %6s %10s %10s %10s %7s\n", "measurement", "op", "runs", "median ms", "p90 ms", "p99 ms", "errors")
	for _, k := range order {
		s := data[k]
		if s == nil {
			continue
		}
		what, op, _ := strings.Cut(k, " ")
		fmt.Printf("%-28s %-10s %6d %10.1f %10.1f %10.1f %7d\n", what, op, len(s.vals), quantile(s.vals, 0.5), quantile(s.vals, 0.9), quantile(s.vals, 0.99), s.errs)
	}
	fmt.Println()
	fmt.Println("ratios of medians (map; unmap)")
	// each against the raw floor, and rbd-owner against Ceph's rbd waiting (or not) for udevd alike
	for _, p := range [][2]string{{"rbd", "raw"}, {"cli", "raw"}, {"api", "raw"}, {"rbd-noudev", "raw"}, {"cli-noudev", "raw"},
		{"api-noudev", "raw"}, {"cli", "rbd"}, {"api", "rbd"}, {"cli-noudev", "rbd-noudev"}, {"api-noudev", "rbd-noudev"}} {
		m, u := med(p[0]+" map")/med(p[1]+" map"), med(p[0]+" unmap")/med(p[1]+" unmap")
		if math.IsNaN(m) {
			continue // not measured in this run
		}
		fmt.Printf("  %-10s / %-10s  map %5.2fx   unmap %5.2fx\n", p[0], p[1], m, u)
	}
	fmt.Println()
	fmt.Println("single figures")
	for _, k := range order {
		if v, ok := values[k]; ok {
			fmt.Printf("  %-40s %12.1f\n", k, v)
		}
	}
}
