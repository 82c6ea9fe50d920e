package scenario

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A cluster log and a ledger as the lab leaves them: the start line, then the faults it caused.
func writeFlapsFixture(t *testing.T, ledger, monLog string) (string, string) {
	t.Helper()
	dir := t.TempDir()
	logDir := filepath.Join(dir, "log")
	if err := os.Mkdir(logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	lp := filepath.Join(dir, "ceph-faults.txt")
	if err := os.WriteFile(lp, []byte(ledger), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(logDir, "mon.a.log"), []byte(monLog), 0o644); err != nil {
		t.Fatal(err)
	}
	return lp, logDir
}

// 1796688000 is 2026-12-08T00:00:00Z.
const flapsStart = "1796688000 start\n"

func TestCephFlapsCountsAgainstTheLedger(t *testing.T) {
	log := strings.Join([]string{
		// before the cluster came up: not counted
		"2026-12-07T23:59:59.000+0000 7f 0 log_channel(cluster) log [INF] : mon.a is new leader, mons a in quorum (ranks 0)",
		"2026-12-08T00:00:01.000+0000 7f 0 log_channel(cluster) log [INF] : mon.a is new leader, mons a in quorum (ranks 0)",
		"2026-12-08T00:01:00.000+0000 7f 0 log_channel(cluster) log [INF] : osd.0 failed (root=default,host=h0) (2 reporters from different host after 20.0 >= grace 20.0)",
		"2026-12-08T00:01:30.000+0000 7f 0 log_channel(cluster) log [INF] : mon.a is new leader, mons a,b in quorum (ranks 0,1)",
		"2026-12-08T00:01:31.000+0000 7f 0 some other line: osd.1 marked down",
	}, "\n") + "\n"
	lp, dir := writeFlapsFixture(t, flapsStart+"1796688060 osd.0\n1796688080 mon.b\n", log)
	lines, err := cephFlaps(lp, dir)
	if err != nil {
		t.Fatalf("cephFlaps: %v (%v)", err, lines)
	}
	want := []string{"osd.0 marked down 1 times, stopped by the lab 1 times", "monitor elections 2, monitor faults 1 (at most 2 elections)"}
	if strings.Join(lines, ";") != strings.Join(want, ";") {
		t.Errorf("lines %q, want %q", lines, want)
	}
}

func TestCephFlapsFindsADaemonThatFlappedOnItsOwn(t *testing.T) {
	for name, c := range map[string]struct{ ledger, log string }{
		"an OSD marked down the lab never stopped": {flapsStart,
			"2026-12-08T00:01:00.000+0000 7f 0 log_channel(cluster) log [INF] : osd.1 marked itself down and dead\n"},
		"more elections than twice the monitor faults": {flapsStart + "1796688080 mon.b\n", strings.Repeat(
			"2026-12-08T00:01:30.000+0000 7f 0 log_channel(cluster) log [INF] : mon.a is new leader, mons a,b in quorum (ranks 0,1)\n", 3)},
	} {
		t.Run(name, func(t *testing.T) {
			lp, dir := writeFlapsFixture(t, c.ledger, c.log)
			if lines, err := cephFlaps(lp, dir); err == nil {
				t.Errorf("no flap found: %q", lines)
			}
		})
	}
}

func TestCephFlapsRefusesWhatItCannotRead(t *testing.T) {
	lp, dir := writeFlapsFixture(t, "1796688060 osd.0\n", "2026-12-08T00:01:00.000+0000 log_channel(cluster) x\n")
	if _, err := cephFlaps(lp, dir); err == nil || !strings.Contains(err.Error(), "start") {
		t.Errorf("a ledger without its start line: %v", err)
	}
	lp, dir = writeFlapsFixture(t, flapsStart, "no cluster entries here\n")
	if _, err := cephFlaps(lp, dir); err == nil {
		t.Error("monitor logs without cluster entries were taken as no flapping")
	}
}
