package claim

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/internal/cephtest"
)

// TestBlocklistReturnsTheMonitorsExpiry: on a real cluster, the expiry Blocklist returns is the
// one `osd blocklist ls` shows for the address.
func TestBlocklistReturnsTheMonitorsExpiry(t *testing.T) {
	a := newNode(t, "nodeA", nil)
	addr := fakeClientAddr(41)
	until, err := a.Backend().Blocklist(ctx(t), addr, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Backend().Unblocklist(context.Background(), addr) })
	out, _, err := cephtest.AdminConn(t).MonCommand([]byte(`{"prefix":"osd blocklist ls","format":"json"}`))
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	var listed []map[string]string
	if err := dec.Decode(&listed); err != nil {
		t.Fatalf("osd blocklist ls: %v: %s", err, out)
	}
	for _, e := range listed {
		if strings.TrimPrefix(e["addr"], "any:") != addr {
			continue
		}
		shown, err := time.Parse("2006-01-02T15:04:05.000000-0700", e["until"])
		if err != nil {
			t.Fatalf("osd blocklist ls shows %q: %v", e["until"], err)
		}
		if !until.Equal(shown) {
			t.Fatalf("Blocklist returned %v, osd blocklist ls shows %v", until, shown)
		}
		return
	}
	t.Fatalf("osd blocklist ls does not list %s: %s", addr, out)
}

// TestBlocklistEntriesReadsRangesOnARealCluster: entries someone else added with Ceph's own
// commands (`osd blocklist range add`, as ceph-csi fences a node Kubernetes declared out of
// service, and `osd blocklist add IP:0/0`, its fallback) are read by the agent's user and cover
// every client of those ips.
func TestBlocklistEntriesReadsRangesOnARealCluster(t *testing.T) {
	a := newNode(t, "nodeA", nil)
	admin := cephtest.AdminConn(t)
	mon := func(cmd string) {
		t.Helper()
		if _, st, err := admin.MonCommand([]byte(cmd)); err != nil {
			t.Fatalf("%s: %v %s", cmd, err, st)
		}
	}
	mon(`{"prefix":"osd blocklist","blocklistop":"add","range":"range","addr":"127.0.0.13/32","expire":600.0}`)
	t.Cleanup(func() {
		_, _, _ = admin.MonCommand([]byte(`{"prefix":"osd blocklist","blocklistop":"rm","range":"range","addr":"127.0.0.13/32"}`))
	})
	mon(`{"prefix":"osd blocklist","blocklistop":"add","addr":"127.0.0.14:0/0","expire":600.0}`)
	t.Cleanup(func() {
		_, _, _ = admin.MonCommand([]byte(`{"prefix":"osd blocklist","blocklistop":"rm","addr":"127.0.0.14:0/0"}`))
	})
	entries, err := a.Backend().BlocklistEntries(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	for addr, by := range map[string]string{"127.0.0.13:0/42": "cidr:127.0.0.13:0/32", "127.0.0.13:0/0": "cidr:127.0.0.13:0/32",
		"127.0.0.14:0/42": "127.0.0.14:0/0", "127.0.0.15:0/42": ""} {
		e, ok := Covering(entries, addr)
		if got := map[bool]string{true: e.String()}[ok]; got != by {
			t.Errorf("%s: covered by %q, want %q (entries %v)", addr, got, by, entries)
		}
	}
}
