// Command check is the chaos campaign's checker: after a round it holds the images (exported
// from the cluster), the writers' logs, the sampled watchers and claims, and the fault schedule
// to the campaign's invariants, prints a summary and every violation, and exits 1 on any.
//
//	check -dir ROUND_DIR -lease 15 -slack 8
//
// ROUND_DIR holds images/<image>.img, logs/<node>.log, samples.jsonl and faults.txt.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	dir := flag.String("dir", "", "the round's directory")
	lease := flag.Float64("lease", 15, "lease seconds")
	slack := flag.Float64("slack", 8, "seconds of slack around a lease (renew interval, sampling)")
	flag.Parse()
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "check: -dir is required")
		os.Exit(2)
	}
	n, err := run(*dir, *lease, *slack, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "check:", err)
		os.Exit(2)
	}
	if n > 0 {
		os.Exit(1)
	}
}

func run(dir string, lease, slack float64, out io.Writer) (int, error) {
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
	for _, v := range vs {
		fmt.Fprintf(out, "VIOLATION %s: %s\n", v.Invariant, v.Detail)
	}
	fmt.Fprintf(out, "check: %d violations\n", len(vs))
	return len(vs), nil
}
