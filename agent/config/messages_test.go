package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestErrorsInTheFilesTerms: a config the agent refuses is told in one line a person acts on at
// once: the file, the line, the key's path, what is wrong and what to write instead; a key that
// is close to a known one is suggested, a far one gets the list of keys.
func TestErrorsInTheFilesTerms(t *testing.T) {
	const cl = "clusters:\n  - id: ceph-a\n    monitors: [203.0.113.1:6789]\n    user: rbd-owner\n    keyring: /etc/ceph/k\n"
	const head = "node_id: node-a\n" + cl // lines 1 to 6
	for _, tc := range []struct{ name, doc, want string }{
		{"typo, with a suggestion", head + "lease_duraton: 30s\n",
			"line 7: lease_duraton: unknown key; did you mean lease_duration?"},
		{"another spelling of a key", head + "Lease-Duration: 30s\n",
			"line 7: Lease-Duration: unknown key; did you mean lease_duration?"},
		{"unknown key, nothing close", head + "colour: blue\n",
			"line 7: colour: unknown key; the keys here are node_id, socket, csi_socket, state_dir, clusters, lease_duration, " +
				"renew_interval, osd_failover, takeover_policy, unmanaged, fence_expiry, map_timeout, mount_timeout, map_options, orphan_sweep, " +
				"orphan_sweep_interval, claim_check_interval, metrics_listen, per_image_metrics"},
		{"a key set twice", head + "lease_duration: 60s\nlease_duration: 90s\n",
			"line 8: lease_duration: set twice (first on line 7); keep one"},
		{"duration in words", head + "lease_duration: 30 seconds\n",
			`line 7: lease_duration: "30 seconds" is not a duration; write 30s (a number and a unit: ms, s, m or h)`},
		{"duration without a unit", head + "map_timeout: 60\n",
			`line 7: map_timeout: "60" is not a duration (it has no unit); write 60s or 60m, as you mean it`},
		{"duration in days", head + "fence_expiry: 7d\n",
			`line 7: fence_expiry: "7d" is not a duration; write 168h (the largest unit is h)`},
		{"no duration at all", head + "renew_interval: soon\n",
			`line 7: renew_interval: "soon" is not a duration; write a number and a unit (ms, s, m or h), e.g. 30s, 1m or 1h30m`},
		{"a list for a duration", head + "lease_duration: [60s]\n",
			`line 7: lease_duration: a list is not a duration; write a number and a unit (ms, s, m or h), e.g. 30s, 1m or 1h30m`},
		{"bad enum value", head + "takeover_policy: sometimes\n",
			`line 7: takeover_policy: "sometimes" is not accepted; the values are manual, after-fence and after-lease-expiry`},
		{"enum value close to one", head + "unmanaged: Report\n",
			`line 7: unmanaged: "Report" is not accepted; did you mean report? (the values are fence-if-claimed, adopt-or-fence and report)`},
		{"wrong type: bool", head + "per_image_metrics: maybe\n",
			`line 7: per_image_metrics: "maybe" is not accepted; write true or false`},
		{"wrong type: list for a word", "node_id: [a, b]\n" + cl,
			"line 1: node_id: a list is not accepted here; write a single value"},
		{"wrong type: word for a list", "node_id: node-a\nclusters:\n  - id: ceph-a\n    monitors: 203.0.113.1:6789\n",
			`line 4: clusters[0].monitors: "203.0.113.1:6789" is not a list; write [203.0.113.1:6789]`},
		{"wrong type: word for map_options, not echoed", head + "map_options: secret=AQBsecretvalue==\n",
			`line 7: map_options: a single value is not a list; put the option in brackets, e.g. [queue_depth=128]`},
		{"a keyring that is not a path, not echoed", strings.Replace(head, "/etc/ceph/k", "AQBsecretvalue==", 1),
			`line 6: clusters[0].keyring: must be the absolute path of the keyring file (not the key), e.g. /etc/ceph/ceph.client.rbd-owner.keyring`},
		{"wrong type: mapping in a list", head + "map_options: [queue_depth: 128]\n",
			`line 7: map_options[0]: a mapping is not accepted; write each entry as one value (quote it if it holds ": ")`},
		{"missing clusters", "node_id: node-a\nlease_duration: 60s\n",
			"clusters: missing; add the Ceph clusters this node maps images from, e.g. clusters: [{id: ceph-a, " +
				"monitors: [10.0.0.1:6789], user: rbd-owner, keyring: /etc/ceph/ceph.client.rbd-owner.keyring}] (or clusters: [] for none yet)"},
		{"an empty file", "",
			"clusters: missing; add the Ceph clusters this node maps images from, e.g. clusters: [{id: ceph-a, " +
				"monitors: [10.0.0.1:6789], user: rbd-owner, keyring: /etc/ceph/ceph.client.rbd-owner.keyring}] (or clusters: [] for none yet)"},
		{"clusters without the dash", "node_id: node-a\nclusters:\n  id: ceph-a\n  monitors: [203.0.113.1:6789]\n",
			`line 3: clusters: a mapping is not a list; start each entry with "- ", e.g. "- id: ceph-a"`},
		{"a cluster that is a word", "node_id: node-a\nclusters:\n  - ceph-a\n",
			`line 3: clusters[0]: "ceph-a" is not accepted; write the entry's keys (id, monitors, user, keyring, map_options) under its "- "`},
		{"nested typo", "node_id: node-a\nclusters:\n  - id: ceph-a\n    monitors: [203.0.113.1:6789]\n    user: rbd-owner\n    keyrng: /etc/ceph/k\n",
			"line 6: clusters[0].keyrng: unknown key; did you mean keyring?"},
		{"nested unknown key", "node_id: node-a\nclusters:\n  - id: ceph-a\n    mons: [203.0.113.1:6789]\n",
			"line 4: clusters[0].mons: unknown key; the keys here are id, monitors, user, keyring, map_options"},
		{"nested key missing: the entry's line", "node_id: node-a\nclusters:\n  - id: ceph-a\n    monitors: [203.0.113.1:6789]\n    user: rbd-owner\n",
			"line 3: clusters[0].keyring: missing; add the path of the file that holds the user's key, e.g. keyring: /etc/ceph/ceph.client.rbd-owner.keyring"},
		{"nested bad value", head + "  - id: ceph-b\n    monitors: [203.0.113.2:6789]\n    user: client.rbd-owner\n    keyring: /etc/ceph/k\n",
			`line 9: clusters[1].user: "client.rbd-owner": give the id without the "client." prefix`},
		{"a check across keys: the line of the key named", head + "lease_duration: 5s\nrenew_interval: 2s\n",
			"line 7: lease_duration: 5s is too short for renew_interval 2s: a lease must exceed renew_interval (2s) + the OSDs' failover " +
				"(osd_failover, 30s) + a read's answer (10s) = 42s, or a heartbeat stalled by a stopped OSD makes this live node look dead; " +
				"raise lease_duration above 42s (no renew_interval makes a lease of 40s or less safe)"},
		{"a default refused: no line", head + "socket: /run/rbd-owner/csi/agent.sock\n",
			`csi_socket: "/run/rbd-owner/csi/csi.sock" must be in a directory of its own, not beside socket "/run/rbd-owner/csi/agent.sock" (a pod mounts that directory)`},
		{"not YAML", head + "lease_duration: 60s\n  renew_interval: 5s\n",
			`line 8: not valid YAML at or just after this line (mapping values are not allowed in this context); check the indentation, and quote a value that holds ": " or starts with a special character`},
		{"not a mapping", "- node_id: node-a\n",
			`line 1: a list is not a config; write one "key: value" per line, e.g. lease_duration: 60s`},
	} {
		path := filepath.Join(t.TempDir(), "config.yaml")
		if err := os.WriteFile(path, []byte(tc.doc), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := Load(path, machineID(t))
		want := "config " + path + ": " + tc.want
		if err == nil || err.Error() != want {
			t.Errorf("%s:\n got %v\nwant %s", tc.name, err, want)
		}
		if err != nil && strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: not one line: %q", tc.name, err)
		}
	}
}

// TestEveryKeyDecodes: the decoder knows every type of Config and Cluster: a document that sets
// every key decodes each into its field.
func TestEveryKeyDecodes(t *testing.T) {
	doc := `node_id: node-a
socket: /run/x/a.sock
csi_socket: /run/y/csi.sock
state_dir: /var/lib/x
clusters:
  - id: ceph-a
    monitors: [203.0.113.1:6789, 203.0.113.2:6789]
    user: rbd-owner
    keyring: /etc/ceph/k
    map_options: [ms_mode=crc]
lease_duration: 90s
renew_interval: 10s
takeover_policy: after-lease-expiry
unmanaged: report
fence_expiry: 2h
map_timeout: 20s
mount_timeout: 25s
map_options: [queue_depth=128]
orphan_sweep: false
orphan_sweep_interval: 2h
metrics_listen: "127.0.0.1:9283"
per_image_metrics: true
`
	c, err := Parse([]byte(doc), machineID(t))
	if err != nil {
		t.Fatal(err)
	}
	cl := c.Clusters[0]
	if c.NodeID != "node-a" || c.Socket != "/run/x/a.sock" || c.CSISocket != "/run/y/csi.sock" || c.StateDir != "/var/lib/x" ||
		cl.ID != "ceph-a" || len(cl.Monitors) != 2 || cl.Monitors[1] != "203.0.113.2:6789" || cl.User != "rbd-owner" ||
		cl.Keyring != "/etc/ceph/k" || cl.MapOptions[0] != "ms_mode=crc" || c.LeaseDuration.D().String() != "1m30s" ||
		c.RenewInterval.D().String() != "10s" || c.TakeoverPolicy != TakeoverAfterLeaseExpiry || c.Unmanaged != UnmanagedReport ||
		c.FenceExpiry.D().String() != "2h0m0s" || c.MapTimeout.D().String() != "20s" || c.MountTimeout.D().String() != "25s" ||
		c.MapOptions[0] != "queue_depth=128" || c.SweepsOrphans() || c.OrphanSweepInterval.D().String() != "2h0m0s" ||
		c.MetricsListen != "127.0.0.1:9283" || !c.PerImageMetrics {
		t.Fatalf("decoded: %+v", c)
	}
	// anchors, aliases and merge keys, as yaml.v3 decodes them; a mapping's own keys win
	c, err = Parse([]byte(`clusters:
  - &common
    id: ceph-a
    monitors: [203.0.113.1:6789]
    user: rbd-owner
    keyring: /etc/ceph/k
  - <<: *common
    id: ceph-b
    map_options: &opts [queue_depth=128]
map_options: *opts
`), machineID(t))
	if err != nil || len(c.Clusters) != 2 || c.Clusters[1].ID != "ceph-b" || c.Clusters[1].User != "rbd-owner" ||
		c.Clusters[1].Monitors[0] != "203.0.113.1:6789" || c.Clusters[0].MapOptions != nil || c.MapOptions[0] != "queue_depth=128" {
		t.Fatalf("merge keys: %v %+v", err, c)
	}
	if _, err := Parse([]byte("clusters:\n  - <<: [a]\n"), machineID(t)); err == nil || err.Error() != `line 2: clusters[0].<<: "a" cannot be merged; merge a mapping, e.g. <<: *common` {
		t.Fatalf("merge of a list of words: %v", err)
	}
	// null is the default, as before
	c, err = Parse([]byte("clusters:\nlease_duration:\norphan_sweep:\n"), machineID(t))
	if err != nil || c.LeaseDuration.D().String() != "1m0s" || !c.SweepsOrphans() || len(c.Clusters) != 0 {
		t.Fatalf("null values: %v %+v", err, c)
	}
}

// TestClosest: a suggestion only when the word is close to one name.
func TestClosest(t *testing.T) {
	names := []string{"node_id", "lease_duration", "renew_interval", "map_options", "map_timeout", "id", "user"}
	for word, want := range map[string]string{
		"lease_duraton": "lease_duration", "lease_durration": "lease_duration", "lease_duratoin": "lease_duration",
		"LEASE_DURATION": "lease_duration", "renew-interval": "renew_interval", "map_optoins": "map_options",
		"map_timout": "map_timeout", "nodeid": "node_id", "usr": "user", "ud": "id",
		"colour": "", "lease": "", "timeout": "", "u": "", "interval": "",
	} {
		if got := closest(word, names); got != want {
			t.Errorf("closest(%q) = %q, want %q", word, got, want)
		}
	}
}
