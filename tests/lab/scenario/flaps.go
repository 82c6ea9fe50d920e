package scenario

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

var osdDown = regexp.MustCompile(`osd\.[0-9]+ (failed \(|marked itself down|marked down)`)

// cephFlaps holds the monitors' cluster log since the lab's cluster came up (each monitor's own
// log: every release writes those) against the ledger of the lab's own faults (CephFault): one
// line per OSD and one for the monitors, and an error when an OSD was marked down more often
// than the lab stopped it, or when more monitor elections ran than the lab's monitor faults
// explain (two each: one without it, one with it back): a daemon that flapped on its own, under
// load or a too-tight heartbeat grace.
func cephFlaps(ledgerPath, monLogDir string) ([]string, error) {
	faults, since, err := readLedger(ledgerPath)
	if err != nil {
		return nil, err
	}
	logs, _ := filepath.Glob(filepath.Join(monLogDir, "mon.*.log"))
	var entries []string
	for _, p := range logs {
		f, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "log_channel(cluster)") {
				entries = append(entries, sc.Text())
			}
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
	}
	if len(entries) == 0 {
		return nil, errors.New("no cluster log entries in the monitors' logs")
	}
	sort.Strings(entries)
	elections, downs := 0, map[string]int{}
	for _, ln := range entries {
		if first, _, _ := strings.Cut(ln, " "); first < since {
			continue
		}
		if strings.Contains(ln, " is new leader, mons ") {
			elections++
		}
		if m := osdDown.FindString(ln); m != "" {
			downs[strings.Fields(m)[0]]++
		}
	}
	monFaults := 0
	for d, n := range faults {
		if strings.HasPrefix(d, "mon.") {
			monFaults += n
		}
		if _, ok := downs[d]; strings.HasPrefix(d, "osd.") && !ok {
			downs[d] = 0
		}
	}
	var lines []string
	bad := false
	osds := make([]string, 0, len(downs))
	for d := range downs {
		osds = append(osds, d)
	}
	sort.Strings(osds)
	for _, d := range osds {
		lines = append(lines, fmt.Sprintf("%s marked down %d times, stopped by the lab %d times", d, downs[d], faults[d]))
		bad = bad || downs[d] > faults[d]
	}
	lines = append(lines, fmt.Sprintf("monitor elections %d, monitor faults %d (at most %d elections)", elections, monFaults, 2*monFaults))
	if bad || elections > 2*monFaults {
		return lines, errors.New("more down-markings or elections than the lab's faults explain")
	}
	return lines, nil
}

// readLedger reads the lab's fault ledger: how often it stopped each daemon, and when the cluster
// came up (its start line, as the cluster log's time stamps begin: UTC, to the second).
func readLedger(path string) (map[string]int, string, error) {
	ledger, err := os.ReadFile(path)
	if err != nil {
		return nil, "", fmt.Errorf("no ledger: %w", err)
	}
	faults := map[string]int{}
	var since string
	for _, ln := range strings.Split(string(ledger), "\n") {
		f := strings.Fields(ln)
		if len(f) < 2 {
			continue
		}
		if f[1] != "start" {
			faults[f[1]]++
			continue
		}
		if since == "" {
			sec, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				return nil, "", fmt.Errorf("ledger line %q: %w", ln, err)
			}
			since = time.Unix(sec, 0).UTC().Format("2006-01-02T15:04:05")
		}
	}
	if since == "" {
		return nil, "", errors.New("the ledger has no start line")
	}
	return faults, since, nil
}
