package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func machineID(t *testing.T) string {
	p := filepath.Join(t.TempDir(), "machine-id")
	if err := os.WriteFile(p, []byte("0123456789abcdef0123456789abcdef\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

const good = `
node_id: node-a
clusters:
  - id: ceph-a
    monitors: [203.0.113.1:6789]
    user: rbd-owner
    keyring: /etc/ceph/ceph.client.rbd-owner.keyring
    map_options: [ms_mode=prefer-crc]
lease_duration: 90s
takeover_policy: after-lease-expiry
map_options: [queue_depth=128]
`

func TestParseGoodAndDefaults(t *testing.T) {
	c, err := Parse([]byte(good), machineID(t))
	if err != nil {
		t.Fatal(err)
	}
	if c.NodeID != "node-a" || c.LeaseDuration.D() != 90*time.Second || c.RenewInterval.D() != 10*time.Second ||
		c.TakeoverPolicy != TakeoverAfterLeaseExpiry || c.FenceExpiry != DefaultFenceExpiry || DefaultFenceExpiry.D() != 87600*time.Hour || c.Unmanaged != UnmanagedFenceIfClaimed ||
		c.Socket != DefaultSocket || c.CSISocket != DefaultCSISocket || c.StateDir != DefaultStateDir || c.Clusters[0].MapOptions[0] != "ms_mode=prefer-crc" {
		t.Fatalf("parsed: %+v", c)
	}
	cl, err := c.Cluster("")
	if err != nil || cl.ID != "ceph-a" {
		t.Fatalf("only cluster: %v %v", cl, err)
	}
	if _, err := c.Cluster("other"); err == nil {
		t.Fatal("unknown cluster accepted")
	}
}

// metrics_listen is off by default and takes host:port.
func TestMetricsListen(t *testing.T) {
	c, err := Parse([]byte(good), machineID(t))
	if err != nil {
		t.Fatal(err)
	}
	if c.MetricsListen != "" || c.PerImageMetrics {
		t.Fatalf("metrics defaults: listen %q, per image %v", c.MetricsListen, c.PerImageMetrics)
	}
	for _, addr := range []string{"127.0.0.1:9283", "[::1]:9283", ":9283"} {
		c, err := Parse([]byte(good+"metrics_listen: \""+addr+"\"\nper_image_metrics: true\n"), machineID(t))
		if err != nil || c.MetricsListen != addr || !c.PerImageMetrics {
			t.Fatalf("metrics_listen %q: %v %+v", addr, err, c)
		}
	}
}

func TestNodeIDFromMachineID(t *testing.T) {
	c, err := Parse([]byte("clusters: []\n"), machineID(t))
	if err != nil {
		t.Fatal(err)
	}
	if c.NodeID != "0123456789abcdef0123456789abcdef" || c.TakeoverPolicy != TakeoverAfterFence {
		t.Fatalf("defaults: %+v", c)
	}
	if _, err := Parse([]byte("clusters: []\n"), filepath.Join(t.TempDir(), "absent")); err == nil || !strings.Contains(err.Error(), "node_id") {
		t.Fatalf("no node id anywhere: %v", err)
	}
}

// The packaged default config must load as shipped.
func TestShippedConfigParses(t *testing.T) {
	c, err := Load("../../packaging/config.yaml", machineID(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Clusters) != 0 || c.TakeoverPolicy != TakeoverAfterFence {
		t.Fatalf("shipped config: %+v", c)
	}
}

func TestBadConfigNamesTheKey(t *testing.T) {
	cl := "clusters:\n  - id: c\n    monitors: [m:6789]\n    user: u\n    keyring: /k\n"
	if _, err := Parse([]byte("node_id: n\nclusters: []\nmap_options: [\"secret=AQBsecretvalue==\"]\n"), machineID(t)); err == nil || strings.Contains(err.Error(), "AQBsecretvalue") {
		t.Errorf("a refused option's value must not be echoed: %v", err)
	}
	for _, tc := range []struct{ doc, key string }{
		{"lease_duration: 60\n", "lease_duration"},
		{"lease_duration: soon\n", "not a duration"},
		{"lease_duration: 2s\n", "lease_duration"},
		{"renew_interval: 50s\n", "renew_interval"},
		{"takeover_policy: always\n", "takeover_policy"},
		{"unmanaged: fence\n", "unmanaged"},
		{"fence_expiry: 10m\n", "fence_expiry"},
		{"nodeid: x\n", "nodeid"},
		{"socket: relative.sock\n", "socket"},
		{"csi_socket: csi.sock\n", "csi_socket"},
		{"csi_socket: /run/rbd-owner/csi.sock\n", "csi_socket: \"/run/rbd-owner/csi.sock\" must be in a directory of its own"},
		{"csi_socket: /run/rbd-owner/rbd-owner.sock\n", "csi_socket"},
		{"map_options: [exclusive]\n", "map_options[0]"},
		{"map_options: [\"secret=AQ==\"]\n", "map_options[0]: option \"secret\" is not allowed"},
		{"map_options: [\"a,b\"]\n", "map_options[0]"},
		{"clusters:\n  - id: c\n    user: u\n    keyring: /k\n", "clusters[0].monitors"},
		{"clusters:\n  - id: c\n    monitors: [m]\n    user: client.u\n    keyring: /k\n", "clusters[0].user"},
		{"clusters:\n  - id: c\n    monitors: [m]\n    user: u\n    keyring: k\n", "clusters[0].keyring"},
		{"clusters:\n  - monitors: [m]\n    user: u\n    keyring: /k\n", "clusters[0].id"},
		{cl + cl[len("clusters:\n"):], "clusters[1].id"},
		{"clusters:\n  - id: c\n    monitors: [m]\n    user: u\n    keyring: /k\n    map_options: [noshare]\n", "clusters[0].map_options[0]"},
		{"clusters:\n  - id: c\n    mons: [m]\n", "mons"},
		// a monitor the kernel or librados could not reach is refused at load, not at the first map
		{"clusters:\n  - id: c\n    monitors: [\"10.0.0.1:6789\", \"10.0.0.2:67890\"]\n    user: u\n    keyring: /k\n", `clusters[0].monitors[1]: monitor "10.0.0.2:67890": port "67890"`},
		{"clusters:\n  - id: c\n    monitors: [\"[v2:10.0.0.1:3300/0,v1:10.0.0.1:6789/0\"]\n    user: u\n    keyring: /k\n", "clusters[0].monitors[0]"},
		{"clusters:\n  - id: c\n    monitors: [\"mon_a\"]\n    user: u\n    keyring: /k\n", "clusters[0].monitors[0]"},
		{"metrics_listen: 9283\n", "metrics_listen"},
		{"metrics_listen: \"127.0.0.1:http\"\n", "metrics_listen"},
		{"metrics_listen: \"127.0.0.1:0\"\n", "metrics_listen"},
		{"metrics_listen: \"[::1]:70000\"\n", "metrics_listen"},
		{"per_image_metrics: maybe\n", "per_image_metrics"},
	} {
		doc := "node_id: n\n" + tc.doc
		if !strings.Contains(doc, "clusters:") {
			doc += "clusters: []\n"
		}
		_, err := Parse([]byte(doc), machineID(t))
		if err == nil || !strings.Contains(err.Error(), tc.key) {
			t.Errorf("%q: want an error naming %q, got %v", tc.doc, tc.key, err)
		}
	}
}

// ClusterByMonitors finds a cluster by one of its monitors in any form a caller writes them:
// ceph-csi's plain "ip:port" list, typed addresses, or the pieces of an address vector.
func TestClusterByMonitors(t *testing.T) {
	doc := "node_id: n\nclusters:\n" +
		"  - id: a\n    monitors: [\"[v2:10.0.0.1:3300/0,v1:10.0.0.1:6789/0]\", \"[v2:10.0.0.2:3300/0,v1:10.0.0.2:6789/0]\"]\n    user: u\n    keyring: /k\n" +
		"  - id: b\n    monitors: [\"10.0.1.1:6789,10.0.1.2:6789\"]\n    user: u\n    keyring: /k\n" +
		"  - id: c\n    monitors: [\"mon-c.example\"]\n    user: u\n    keyring: /k\n"
	c, err := Parse([]byte(doc), machineID(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		mons []string
		want string
	}{
		{[]string{"10.0.0.2:3300"}, "a"},
		{[]string{"v1:10.0.0.1:6789/0"}, "a"},
		{[]string{"10.0.0.9:6789", "10.0.0.1"}, "a"},
		{[]string{"10.0.1.2:6789"}, "b"},
		{[]string{"10.0.1.2"}, "b"},
		{[]string{"MON-C.example:3300"}, "c"},
		{[]string{"10.0.1.2:3300"}, "no configured cluster has monitor 10.0.1.2:3300"},
		{[]string{"10.0.0.1:6789", "10.0.1.1:6789"}, "several configured clusters (a, b)"},
		{[]string{"10.0.0.1:6789x"}, `the monitors given: monitor "10.0.0.1:6789x"`},
		{nil, "no monitor address given"},
	} {
		cl, err := c.ClusterByMonitors(tc.mons)
		switch {
		case err != nil && !strings.Contains(err.Error(), tc.want):
			t.Errorf("%v: %v, want %q", tc.mons, err, tc.want)
		case err == nil && cl.ID != tc.want:
			t.Errorf("%v: cluster %s, want %s", tc.mons, cl.ID, tc.want)
		}
	}
}

// TestShortFencesOnlyWithTheTestSwitch: fence_expiry below an hour is refused unless the test
// labs' switch is set, and then only down to a minute.
func TestShortFencesOnlyWithTheTestSwitch(t *testing.T) {
	parse := func(doc string) error { _, err := Parse([]byte("clusters: []\n"+doc), machineID(t)); return err }
	t.Setenv(ShortFencesEnv, "")
	if err := parse("fence_expiry: 2m\n"); err == nil || !strings.Contains(err.Error(), "at least 1h") {
		t.Fatalf("2m without the switch: %v", err)
	}
	t.Setenv(ShortFencesEnv, "1")
	if err := parse("fence_expiry: 2m\n"); err != nil {
		t.Fatalf("2m with the switch: %v", err)
	}
	if err := parse("fence_expiry: 30s\n"); err == nil || !strings.Contains(err.Error(), "at least 1m") {
		t.Fatalf("30s with the switch: %v", err)
	}
}

// TestLoadInJudgesInTheEnvironmentGiven: LoadIn judges a file as an agent with the environment
// it is given would, whatever this process's environment (check-config compares the two).
func TestLoadInJudgesInTheEnvironmentGiven(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte("clusters: []\nfence_expiry: 2m\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, process := range []string{"", "1"} {
		t.Setenv(ShortFencesEnv, process)
		if got := ProcessEnv(); got.ShortFences != (process == "1") {
			t.Errorf("switch %q: ProcessEnv %+v", process, got)
		}
		if c, err := LoadIn(path, machineID(t), Env{ShortFences: true}); err != nil || c.FenceExpiry.D() != 2*time.Minute {
			t.Errorf("switch %q in this process, judged with it: %v", process, err)
		}
		if _, err := LoadIn(path, machineID(t), Env{}); err == nil || !strings.Contains(err.Error(), "fence_expiry: 2m0s is too short (at least 1h0m0s)") {
			t.Errorf("switch %q in this process, judged without it: %v", process, err)
		}
		if _, err := Load(path, machineID(t)); (err == nil) != (process == "1") {
			t.Errorf("switch %q: Load judges in this process's environment: %v", process, err)
		}
	}
}
