package daemon

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/krbd/fakekernel"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
)

// TestRenewalCostsOneWritePerPool: a renew interval's work (the heartbeats and the round of
// claim checks) of a node holding 64 claims in one pool and 4 in another writes 2 objects (one heartbeat per pool) and no claim: liveness costs O(pools),
// not O(volumes). It reads each claim once (to learn whether one was taken).
func TestRenewalCostsOneWritePerPool(t *testing.T) {
	m := claim.NewMemory("00000000-0000-4000-8000-000000000005")
	var writes, reads atomic.Int64
	m.SetHook(func(ctx context.Context, call string, img claim.Image) error {
		switch call {
		case "write":
			writes.Add(1)
		case "read":
			reads.Add(1)
		}
		return nil
	})
	k, err := fakekernel.New(t.TempDir(), fakekernel.Options{FSID: m.FSID()})
	if err != nil {
		t.Fatal(err)
	}
	if err := k.AddUser("u", memSecret); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, "node-c", 20*time.Second, config.Cluster{ID: "c1", Monitors: []string{"203.0.113.1:6789"}, User: "u", Keyring: "/nonexistent"})
	cfg.LeaseDuration = config.Duration(60 * time.Second) // the defaults: 60 s lease, 20 s renewals
	log := quietLog()
	kc := k.Config()
	kc.Poll = 5 * time.Millisecond
	d, err := New(Options{Config: cfg, Log: log, Audit: audit.NewWithSink(log, func(audit.Entry) {}), Kernel: krbd.New(kc),
		Peers: &peercred.Policy{AdminGroup: -1, CSIGroup: -1},
		Connect: func(context.Context, config.Cluster) (Connection, error) {
			return Connection{Backend: m, Secret: memSecret}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 68 {
		pool := "rbd"
		if i >= 64 {
			pool = "other"
		}
		name := fmt.Sprintf("v%02d", i)
		m.AddImage(claim.Image{Pool: pool, Image: name}, "id-"+name)
		k.AddImage(pool, "", name, 1<<20)
		if _, err := d.Map(context.Background(), api.MapRequest{Cluster: "c1", Pool: pool, Image: name}, nil); err != nil {
			t.Fatal(err)
		}
	}
	w0, r0 := writes.Load(), reads.Load()
	// one renew interval's work: each place's heartbeat once, and the round of claim checks
	hb := newHeartbeats(d, d.clusters["c1"])
	for p := range d.held("c1") {
		hb.beat(context.Background(), p)
	}
	d.renewRound(context.Background(), d.clusters["c1"])
	w, r := writes.Load()-w0, reads.Load()-r0
	t.Logf("one renewal round, 68 claims in 2 pools: %d writes, %d reads (per minute at 20 s: %d writes)", w, r, 3*w)
	if w != 2 {
		t.Fatalf("a renewal round wrote %d objects, want 2 (one heartbeat per pool)", w)
	}
	if r != 68+2 {
		t.Fatalf("a renewal round read %d objects, want 70 (each claim, each heartbeat before it is rewritten)", r)
	}
	for _, p := range d.Status().Problems {
		t.Errorf("problem after the round: %s", p)
	}
}
