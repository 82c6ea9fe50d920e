package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckConfig: `rbd-owner check-config [--config PATH]` loads the file as the agent would
// and exits 0 when the agent would start with it, 1 with the agent's own error (one line,
// naming the file) when it would not, 2 on a usage mistake. The packages run it before they
// restart the agent on an upgrade.
func TestCheckConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, doc string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const node = "node_id: node-a\nclusters:\n  - id: lab\n    monitors: [203.0.113.1:6789]\n    user: rbdowner\n    keyring: /etc/ceph/k\n"
	good := write("good.yaml", node+"lease_duration: 60s\n")
	short := write("short.yaml", node+"lease_duration: 5s\nrenew_interval: 2s\n")
	typo := write("typo.yaml", node+"lease_duraton: 60s\n")
	for _, tc := range []struct {
		args         []string
		code         int
		stdout, errs string
	}{
		{[]string{"check-config", "--config", good}, exitOK, good + ": the agent accepts it (node node-a, clusters lab; lease_duration 1m0s exceeds the lease bound 50s for renew_interval 20s)", ""},
		{[]string{"check-config", "--config=" + good}, exitOK, "the agent accepts it", ""},
		{[]string{"check-config", "--config", short}, exitFailed, "",
			"rbd-owner check-config: config " + short + ": lease_duration: 5s is too short for renew_interval 2s: a lease must exceed renew_interval (2s) + the heartbeat's deadline (2s) + its write's answer (10s) + a read's answer (10s) = 24s; raise lease_duration above 24s"},
		{[]string{"check-config", "--config", typo}, exitFailed, "", "rbd-owner check-config: config " + typo + ": lease_duraton: "},
		{[]string{"check-config", "--config", filepath.Join(dir, "absent.yaml")}, exitFailed, "", "absent.yaml"},
		{[]string{"check-config", "--config", good, "extra"}, exitUsage, "", "want 0 argument(s)"},
		{[]string{"check-config", "--bogus"}, exitUsage, "", "bogus"},
	} {
		code, out, errs := cli(tc.args...)
		if code != tc.code || !strings.Contains(out, tc.stdout) || !strings.Contains(errs, tc.errs) {
			t.Errorf("%q: exit %d stdout %q stderr %q; want exit %d, stdout with %q, stderr with %q", tc.args, code, out, errs, tc.code, tc.stdout, tc.errs)
		}
		if code == exitFailed && strings.Count(strings.TrimSpace(errs), "\n") != 0 {
			t.Errorf("%q: the error is not one line: %q", tc.args, errs)
		}
	}
	if code, out, _ := cli("help"); code != exitOK || !strings.Contains(out, "check-config [--config PATH]") {
		t.Errorf("usage does not list check-config: %q", out)
	}
}
