package daemon

import (
	"context"
	"fmt"
	"maps"
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
// claim checks) of a node holding 64 claims in one pool and 4 in another costs one heartbeat
// write and one notice read per pool, and no claim read once each claim was read (a claim
// taken over announces itself by a notice; the slow check reads each once per
// claim_check_interval): O(places), not O(volumes). The heartbeat is written against the
// version this node wrote last, without a read.
func TestRenewalCostsOneWritePerPool(t *testing.T) {
	m := claim.NewMemory("00000000-0000-4000-8000-000000000005")
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
	// one renew interval's work: each place's heartbeat once, and the round of claim checks
	hb := newHeartbeats(d, d.clusters["c1"])
	round := func() map[string]int {
		m.Counts(true)
		for p := range d.held("c1") {
			hb.beat(context.Background(), p)
		}
		d.renewRound(context.Background(), d.clusters["c1"])
		return m.Counts(true)
	}
	if first := round(); first["read claim"] != 68 {
		t.Fatalf("the first round read %d claims, want each once (68): %v", first["read claim"], first)
	}
	for i := range 3 {
		got := round()
		t.Logf("renewal round %d, 68 claims in 2 pools: %v", i+2, got)
		want := map[string]int{"write heartbeat": 2, "readkeys notice": 2}
		if !maps.Equal(got, want) {
			t.Fatalf("renewal round %d did %v, want %v (a heartbeat write and a notice read per pool, no claim read)", i+2, got, want)
		}
	}
	for _, p := range d.Status().Problems {
		t.Errorf("problem after the rounds: %s", p)
	}
}
