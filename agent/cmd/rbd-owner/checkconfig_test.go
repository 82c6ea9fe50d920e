package main

import (
	"encoding/base64"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/internal/agentflags"
)

// TestCheckConfig: `rbd-owner check-config [--config PATH]` loads the file as the agent would
// and exits 0 when the agent would start with it, 1 with the agent's own error (one line,
// naming the file, the line and the key) when it would not, 2 on a usage mistake. The packages run it before they
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
	nested := write("nested.yaml", strings.Replace(node, "keyring:", "keyrng:", 1))
	noClusters := write("noclusters.yaml", "node_id: node-a\n")
	for _, tc := range []struct {
		args         []string
		code         int
		stdout, errs string
	}{
		{[]string{"check-config", "--config", good}, exitOK, good + ": the agent accepts it (node node-a, clusters lab; lease_duration 1m0s exceeds the lease bound 50s for renew_interval 10s)", ""},
		{[]string{"check-config", "--config=" + good}, exitOK, "the agent accepts it", ""},
		{[]string{"check-config", "--config", short}, exitFailed, "",
			"rbd-owner check-config: config " + short + ": line 7: lease_duration: 5s is too short for renew_interval 2s: a lease must exceed renew_interval (2s) + " +
				"the OSDs' failover (osd_failover, 30s) + a read's answer (10s) = 42s, or a heartbeat stalled by a stopped OSD makes this live node look dead; " +
				"raise lease_duration above 42s (no renew_interval makes a lease of 40s or less safe)\n"},
		{[]string{"check-config", "--config", typo}, exitFailed, "", "rbd-owner check-config: config " + typo + ": line 7: lease_duraton: unknown key; did you mean lease_duration?\n"},
		{[]string{"check-config", "--config", nested}, exitFailed, "", "rbd-owner check-config: config " + nested + ": line 6: clusters[0].keyrng: unknown key; did you mean keyring?\n"},
		{[]string{"check-config", "--config", noClusters}, exitFailed, "", "rbd-owner check-config: config " + noClusters + ": clusters: missing; add the Ceph clusters this node maps images from, " +
			"e.g. clusters: [{id: ceph-a, monitors: [10.0.0.1:6789], user: rbd-owner, keyring: /etc/ceph/ceph.client.rbd-owner.keyring}] (or clusters: [] for none yet)\n"},
		{[]string{"check-config", "--config", filepath.Join(dir, "absent.yaml")}, exitFailed, "", "absent.yaml"},
		{[]string{"check-config", "--config", good, "extra"}, exitUsage, "", `unexpected argument "extra"`},
		{[]string{"check-config", "--bogus"}, exitUsage, "", "bogus"},
	} {
		code, out, errs := cli(tc.args...)
		if code != tc.code || !strings.Contains(out, tc.stdout) || !strings.Contains(errs, tc.errs) {
			t.Errorf("%q: exit %d stdout %q stderr %q; want exit %d, stdout with %q, stderr with %q", tc.args, code, out, errs, tc.code, tc.stdout, tc.errs)
		}
		if strings.HasPrefix(tc.errs, "rbd-owner check-config: ") && errs != tc.errs {
			t.Errorf("%q: stderr\n %q\nwant exactly\n %q", tc.args, errs, tc.errs)
		}
		if code == exitFailed && strings.Count(strings.TrimSpace(errs), "\n") != 0 {
			t.Errorf("%q: the error is not one line: %q", tc.args, errs)
		}
	}
	if code, out, _ := cli("help"); code != exitOK || !strings.Contains(out, "\n  check-config ") {
		t.Errorf("usage does not list check-config: %q", out)
	}
	if code, out, _ := cli("help", "check-config"); code != exitOK || !strings.Contains(out, "check-config [--config PATH]") {
		t.Errorf("check-config's help has no usage line: %q", out)
	}
}

// TestCheckConfigSaysWhenTheAgentsEnvironmentDecides: check-config runs in the CLI's
// environment, not the agent unit's; when its verdict on fence_expiry depends on the test labs'
// switch (config.ShortFencesEnv), one line says so: in the error when it refuses, after the
// summary when it accepts. A verdict the switch does not change says nothing of it.
func TestCheckConfigSaysWhenTheAgentsEnvironmentDecides(t *testing.T) {
	dir := t.TempDir()
	write := func(name, doc string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("node_id: node-a\nclusters: []\n"+doc), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	short, hour, tooShort := write("short.yaml", "fence_expiry: 2m\n"), write("hour.yaml", "fence_expiry: 1h\n"), write("30s.yaml", "fence_expiry: 30s\n")
	const note = "fence_expiry 2m is accepted only with RBD_OWNER_TEST_SHORT_FENCES=1 in the agent's unit environment (test labs only); this check ran "
	t.Setenv(config.ShortFencesEnv, "")
	code, out, errs := cli("check-config", "--config", short)
	if code != exitFailed || out != "" || !strings.HasPrefix(errs, "rbd-owner check-config: config "+short+": line 3: fence_expiry: 2m0s is too short (at least 1h0m0s)") ||
		!strings.HasSuffix(errs, "; "+note+"without it\n") || strings.Count(errs, "\n") != 1 {
		t.Errorf("2m, run without the switch: exit %d stdout %q stderr %q", code, out, errs)
	}
	t.Setenv(config.ShortFencesEnv, "1")
	code, out, errs = cli("check-config", "--config", short)
	if lines := strings.Split(out, "\n"); code != exitOK || errs != "" || len(lines) != 3 || !strings.Contains(lines[0], "the agent accepts it") || lines[1] != "note: "+note+"with it" {
		t.Errorf("2m, run with the switch: exit %d stdout %q stderr %q", code, out, errs)
	}
	for _, env := range []string{"", "1"} {
		t.Setenv(config.ShortFencesEnv, env)
		if code, out, errs := cli("check-config", "--config", hour); code != exitOK || strings.Count(out, "\n") != 1 || errs != "" {
			t.Errorf("1h, switch %q: exit %d stdout %q stderr %q", env, code, out, errs)
		}
		if code, _, errs := cli("check-config", "--config", tooShort); code != exitFailed || strings.Contains(errs, config.ShortFencesEnv) {
			t.Errorf("30s, switch %q: exit %d stderr %q", env, code, errs)
		}
	}
}

// TestCheckConfigRefusesAKeyThisNodeCannotUse: an aes256k key in a cluster's keyring on a
// kernel before Linux 7.0, or with a librados before Ceph 19.2.6 and 20.2.4, is refused in one
// line naming the cluster, the keyring, the key type, the kernel's and librados's releases (the
// agent program says librados's: a fake one here), what each needs and what to do. On Linux
// 7.0 with a librados that reads it, with an aes key, or with a librados release not known (no
// agent program, or one that does not say) and Linux 7.0, the config is accepted.
func TestCheckConfigRefusesAKeyThisNodeCannotUse(t *testing.T) {
	dir := t.TempDir()
	key := func(typ uint16, n int) string {
		b := make([]byte, 12+n)
		binary.LittleEndian.PutUint16(b, typ)
		binary.LittleEndian.PutUint16(b[10:], uint16(n))
		return base64.StdEncoding.EncodeToString(b)
	}
	write := func(name, doc string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(doc), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// the agent program as check-config runs it: the release in the environment, exit 1
	// without one
	agent := write("rbd-owner-agent", "#!/bin/sh\n[ \"$*\" = "+agentflags.LibradosVersion+" ] || exit 2\n"+
		"[ -n \"$RBD_OWNER_TEST_LIBRADOS\" ] || exit 1\necho \"$RBD_OWNER_TEST_LIBRADOS\"\n", 0o755)
	defer func(old func() string, oldAgent string) { kernelRelease, agentPath = old, oldAgent }(kernelRelease, agentPath)
	const refused = ": invalid argument: the key is aes256k, which this node cannot use: "
	const todo = ": keep this user's key aes until the nodes run "
	const rook = " (Rook: its CSI key type; by hand: a new aes key for the user)\n"
	for _, tc := range []struct {
		typ              uint16
		kernel, librados string // librados "none": no agent program
		refusal          string // what the line says after "the key is aes256k, which this node cannot use: "
	}{
		{2, "6.12.48+deb13-amd64", "16.2.15", "its kernel 6.12.48+deb13-amd64 needs Linux 7.0 and its librados 16.2.15 needs Ceph 19.2.6 or 20.2.4" +
			todo + "Linux 7.0 and those libraries" + rook},
		{2, "7.2.0-1-amd64", "19.2.3", "its librados 19.2.3 needs Ceph 19.2.6 or 20.2.4 (its kernel 7.2.0-1-amd64 reads it)" + todo + "those libraries" + rook},
		{2, "6.1.0-40-amd64", "20.2.4", "its kernel 6.1.0-40-amd64 needs Linux 7.0 (its librados 20.2.4 reads it)" + todo + "Linux 7.0" + rook},
		{2, "6.1.0-40-amd64", "none", "its kernel 6.1.0-40-amd64 needs Linux 7.0 (librados version unknown; it needs Ceph 19.2.6 or 20.2.4)" + todo + "Linux 7.0" + rook},
		{2, "6.1.0-40-amd64", "", "its kernel 6.1.0-40-amd64 needs Linux 7.0 (librados version unknown; it needs Ceph 19.2.6 or 20.2.4)" + todo + "Linux 7.0" + rook},
		{2, "7.2.0-1-amd64", "20.2.4", ""}, {2, "7.0.0", "19.2.6", ""}, {2, "7.2.0-1-amd64", "none", ""}, {2, "7.2.0-1-amd64", "", ""},
		{1, "6.1.0-40-amd64", "16.2.15", ""},
	} {
		kr := write("keyring", "[client.rbdowner]\n\tkey = "+key(tc.typ, 16*int(tc.typ))+"\n", 0o600)
		cfg := write("c.yaml", "node_id: node-a\nclusters:\n  - id: lab\n    monitors: [203.0.113.1:6789]\n    user: rbdowner\n    keyring: "+kr+"\n", 0o600)
		kernelRelease = func() string { return tc.kernel }
		agentPath = agent
		if tc.librados == "none" {
			agentPath = filepath.Join(dir, "absent")
		}
		t.Setenv("RBD_OWNER_TEST_LIBRADOS", tc.librados)
		code, _, errs := cli("check-config", "--config", cfg)
		want := ""
		if tc.refusal != "" {
			want = "rbd-owner check-config: " + cfg + ": clusters[0] (lab): client.rbdowner's key in " + kr + refused + tc.refusal
		}
		if wantCode := map[bool]int{true: exitOK, false: exitFailed}[want == ""]; code != wantCode || errs != want {
			t.Errorf("key type %d on kernel %s, librados %q: exit %d, stderr\n %q\nwant exit %d, stderr\n %q", tc.typ, tc.kernel, tc.librados, code, errs, wantCode, want)
		}
	}
}

// TestCheckConfigRefusesAKeyringWithAPendingKey: a keyring written from `ceph auth get` while a
// rotation is pending (Ceph 20.2: a "pending key" line) is refused in one line naming the
// cluster, the keyring's line and what to write, since librados would refuse to load it at the
// agent's next connection; the same keyring with the key line alone is accepted.
func TestCheckConfigRefusesAKeyringWithAPendingKey(t *testing.T) {
	dir := t.TempDir()
	kr := filepath.Join(dir, "keyring")
	cfg := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(cfg, []byte("node_id: node-a\nclusters:\n  - id: lab\n    monitors: [203.0.113.1:6789]\n    user: rbdowner\n    keyring: "+kr+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const cur, pending = "AQBzXHxlAAAAABAAAQIDBAUGBwgJCgsMDQ4PEA==", "AQCqX3xlAAAAABAAkbZ8g6fMt6zA1cJrVhFZ0w=="
	defer func(old func() string) { kernelRelease = old }(kernelRelease)
	kernelRelease = func() string { return "6.1.0-40-amd64" }
	for _, tc := range []struct {
		ring string
		code int
	}{
		{"[client.rbdowner]\n\tkey = " + cur + "\n\tpending key = " + pending + "\n\tcaps mon = \"profile rbd\"\n", exitFailed},
		{"[client.rbdowner]\n\tkey = " + pending + "\n", exitOK},
	} {
		if err := os.WriteFile(kr, []byte(tc.ring), 0o600); err != nil {
			t.Fatal(err)
		}
		code, _, errs := cli("check-config", "--config", cfg)
		if code != tc.code {
			t.Fatalf("%q: exit %d (%s), want %d", tc.ring, code, errs, tc.code)
		}
		if tc.code != exitFailed {
			continue
		}
		for _, want := range []string{"clusters[0] (lab)", kr, "line 3", "pending key", "ceph auth get-key client.rbdowner"} {
			if !strings.Contains(errs, want) || strings.Count(errs, "\n") != 1 {
				t.Errorf("%q, want one line naming %q", errs, want)
			}
		}
	}
}
