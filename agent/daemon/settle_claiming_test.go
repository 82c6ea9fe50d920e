package daemon

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// noReconcile is a Ticker that never ticks the reconcile loop (the test settles by hand).
func noReconcile(o *Options) {
	never := make(chan time.Time)
	o.Ticker = func(loop string, every time.Duration) (<-chan time.Time, func()) {
		if loop == "reconcile" {
			return never, func() {}
		}
		tk := time.NewTicker(every)
		return tk.C, tk.Stop
	}
}

// crashedMap starts node-m on c with no reconcile round, adds image, and maps it with a
// simulated kill at the map saga's step: the state is what the killed agent left.
func crashedMap(t *testing.T, c *memCluster, image, step string) *memDaemon {
	t.Helper()
	var crash atomic.Bool
	crash.Store(true)
	n := startMemDaemonWith(t, func(o *Options) {
		noReconcile(o)
		o.Fault = func(saga, s string) error {
			if crash.Load() && saga == "map" && s == step {
				return ErrCrash
			}
			return nil
		}
	}, c)
	t.Cleanup(func() { n.stop() })
	addImage(n, c, image)
	_, err := n.d.Map(context.Background(), api.MapRequest{Cluster: c.ID, Pool: c.Pool, Image: image}, nil)
	crash.Store(false)
	if !errors.Is(err, ErrCrash) {
		t.Fatalf("want the simulated crash, got %v", err)
	}
	return n
}

// claimReader reads c's claims as a node of its own.
func claimReader(t *testing.T, c *memCluster) *claim.Store {
	t.Helper()
	r, err := claim.NewStoreOn(c.M, claim.Config{Node: claim.Node{ID: "node-r"}, Lease: time.Minute, FenceExpiry: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestSettleClaimingAdoptsTheDeviceOfAnInterruptedMap: the map writes no state between its
// claim and the recorded device, so an agent killed after the kernel's map (before or after
// the record step) leaves phase "claiming". Recovery finds the device by names, sees the claim
// is this node's (no mapping recorded, or this very device's), records it and keeps it: never
// a released claim under a live device (docs/safety.md, variant ae).
func TestSettleClaimingAdoptsTheDeviceOfAnInterruptedMap(t *testing.T) {
	for _, step := range []string{"record", "persist"} {
		t.Run(step, func(t *testing.T) {
			c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000061")
			n := crashedMap(t, c, "x", step)
			key := state.Key{Cluster: "c1", Ref: claimRef(c, "x")}
			if m, _ := n.d.state.Get(key); m.Phase != state.Claiming || m.ClientAddr != "" {
				t.Fatalf("state after the crash: %+v, want phase claiming and no device", m)
			}
			devs, err := n.d.kernel.List()
			if err != nil || len(devs) != 1 {
				t.Fatalf("devices after the crash: %v %v", devs, err)
			}
			if err := n.d.reconciler.settleKey(context.Background(), key); err != nil {
				t.Fatal(err)
			}
			m, ok := n.d.state.Get(key)
			if !ok || m.Phase != state.Mapped || m.DeviceID != devs[0].ID || m.ClientAddr != devs[0].ClientAddr {
				t.Fatalf("after settling: %+v (ok %v), want mapped on %+v", m, ok, devs[0])
			}
			rec, err := claimReader(t, c).Inspect(context.Background(), claim.Image{Pool: "rbd", Image: "x"})
			if err != nil {
				t.Fatal(err)
			}
			h := rec.Holder("node-m")
			if h == nil || h.Epoch != m.Epoch || h.ClientAddr != devs[0].ClientAddr {
				t.Fatalf("claim after settling: %+v, want node-m at epoch %d with %s", rec.Holders, m.Epoch, devs[0].ClientAddr)
			}
		})
	}
}

// TestSettleClaimingLeavesADeviceWhoseClaimIsAnothers: a "claiming" state, a device of the
// image on this node, and the claim held by another node: the map never reached the kernel (it
// maps only once its claim is written), so the device is not its own. Recovery forgets the
// state without touching the device or the other node's claim; the device is then judged as a
// mapping made outside rbd-owner (fenced: node-a holds the image).
func TestSettleClaimingLeavesADeviceWhoseClaimIsAnothers(t *testing.T) {
	c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000062")
	al := &auditLog{}
	n := startMemDaemonWith(t, func(o *Options) {
		noReconcile(o)
		o.Config.Unmanaged = config.UnmanagedFenceIfClaimed
		o.Audit = audit.NewWithSink(o.Log, al.Record)
	}, c)
	defer n.stop()
	addImage(n, c, "y")
	a, epoch := holdElsewhere(t, c, "y", "10.9.9.9:0/1")
	key := state.Key{Cluster: "c1", Ref: claimRef(c, "y")}
	if err := n.d.state.Put(state.Mapping{Key: key, FSID: c.M.FSID(), Phase: state.Claiming, Access: string(claim.RWO), Claimed: true}); err != nil {
		t.Fatal(err)
	}
	dv := handMap(t, n, c, "y", "noshare") // explained by the half-done map: not judged yet
	if err := n.d.reconciler.settleKey(context.Background(), key); err != nil {
		t.Fatal(err)
	}
	if m, ok := n.d.state.Get(key); ok {
		t.Fatalf("the claiming state was kept: %+v", m)
	}
	if devs, _ := n.d.kernel.List(); len(devs) != 1 || devs[0].ID != dv.ID {
		t.Fatalf("devices after settling: %+v, want %s left alone", devs, dv.DevNode)
	}
	if c.M.Blocklisted("10.9.9.9:0/1") {
		t.Fatal("the holder's mapping was fenced")
	}
	img := claim.Image{Pool: c.Pool, Image: "y"}
	if _, err := a.Renew(context.Background(), img, epoch); err != nil {
		t.Fatalf("node-a lost its claim: %v", err)
	}
	n.d.reconciler.reconcile(context.Background())
	waitFor(t, "the device judged, fenced and audited", func() bool {
		return c.M.Blocklisted(dv.ClientAddr) && len(al.Find(audit.UnmanagedDevice, audit.Fenced)) > 0
	})
	if got := al.Find(audit.UnmanagedDevice, audit.Fenced); len(got) != 1 || got[0].Device != dv.DevNode {
		t.Fatalf("audit: %+v", got)
	}
}

// TestSettleClaimingReleasesTheHoldOfAGoneDevice: a map interrupted after its record step
// (phase "claiming", the claim naming the device's client), then the device removed by hand
// before the agent settles: no device of the image is left, so the hold, whatever mapping it
// records, is this node's interrupted map's, and is released. Releasing only a hold with no
// mapping recorded would forget the state and keep the claim for ever (docs/safety.md,
// variant af).
func TestSettleClaimingReleasesTheHoldOfAGoneDevice(t *testing.T) {
	c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000064")
	n := crashedMap(t, c, "z", "persist")
	devs, err := n.d.kernel.List()
	if err != nil || len(devs) != 1 {
		t.Fatalf("devices after the crash: %v %v", devs, err)
	}
	reader := claimReader(t, c)
	img := claim.Image{Pool: "rbd", Image: "z"}
	if rec, err := reader.Inspect(context.Background(), img); err != nil || rec.Holder("node-m") == nil || rec.Holder("node-m").ClientAddr != devs[0].ClientAddr {
		t.Fatalf("claim after the crash: %+v %v, want node-m with %s recorded", rec, err, devs[0].ClientAddr)
	}
	handUnmap(t, n, devs[0])
	key := state.Key{Cluster: "c1", Ref: claimRef(c, "z")}
	if err := n.d.reconciler.settleKey(context.Background(), key); err != nil {
		t.Fatal(err)
	}
	if m, ok := n.d.state.Get(key); ok {
		t.Fatalf("the claiming state was kept: %+v", m)
	}
	rec, err := reader.Inspect(context.Background(), img)
	if err == nil && rec.Holder("node-m") != nil {
		t.Fatalf("node-m still holds z with no state and no device: %+v", rec.Holders)
	}
	if err != nil && !errors.Is(err, claim.ErrNoClaim) {
		t.Fatal(err)
	}
}

// TestRefusedMapKeepsAnInterruptedMapsState: a map interrupted after its claim (phase
// "claiming", this node's rwo hold written), then, before the reconciler settles it, a map of
// the same image with another access, which the claim refuses. The refusal writes back the
// interrupted map's state instead of forgetting it, so the reconciler still releases that
// hold; forgetting it kept the claim for ever (docs/safety.md, variant ag).
func TestRefusedMapKeepsAnInterruptedMapsState(t *testing.T) {
	c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000065")
	n := crashedMap(t, c, "w", "map")
	key := state.Key{Cluster: "c1", Ref: claimRef(c, "w")}
	if _, err := n.d.Map(context.Background(), api.MapRequest{Cluster: "c1", Pool: "rbd", Image: "w", Access: string(claim.ROX)}, nil); err == nil {
		t.Fatal("a rox map over this node's rwo hold was not refused")
	}
	if m, ok := n.d.state.Get(key); !ok || m.Phase != state.Claiming {
		t.Fatalf("after the refused map: %+v (ok %v), want the interrupted map's claiming state", m, ok)
	}
	if err := n.d.reconciler.settleKey(context.Background(), key); err != nil {
		t.Fatal(err)
	}
	rec, err := claimReader(t, c).Inspect(context.Background(), claim.Image{Pool: "rbd", Image: "w"})
	if err == nil && rec.Holder("node-m") != nil {
		t.Fatalf("node-m still holds w with no state and no device: %+v", rec.Holders)
	}
	if _, ok := n.d.state.Get(key); ok {
		t.Fatal("the claiming state outlived its settling")
	}
}
