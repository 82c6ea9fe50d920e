package daemon

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// TestHeartbeatGoesOnWhileAClaimMayHaveBeenWritten: a map whose claim write failed in a way
// that may have applied (a timeout) keeps the "claiming" state for the reconciler to settle. The
// claim may exist, so this node's liveness in that pool must go on meanwhile: were it to stop, a
// node watching that claim would judge it expired after a lease and, as no mapping address was
// recorded, fence this live node's whole address (docs/safety.md, F5).
func TestHeartbeatGoesOnWhileAClaimMayHaveBeenWritten(t *testing.T) {
	c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000036")
	var beats atomic.Int64
	var fail atomic.Bool
	c.M.SetHook(func(_ context.Context, call string, img claim.Image) error {
		switch {
		case call == "write" && img.Image == "":
			beats.Add(1)
		case call == "write" && img.Image == "x" && fail.Load():
			return errors.New("osd op timed out") // unclassified: it may have been applied
		}
		return nil
	})
	// no reconcile round: it would settle the claiming state
	n := startMemDaemonWith(t, noReconcile, c)
	defer n.stop()
	c.M.AddImage(claim.Image{Pool: "rbd", Image: "x"}, "id-x")
	n.kernel.AddImage("rbd", "", "x", 16<<20)
	fail.Store(true)
	if _, err := n.d.Map(context.Background(), api.MapRequest{Cluster: "c1", Pool: "rbd", Image: "x"}, nil); err == nil {
		t.Fatal("the map succeeded")
	}
	ms := n.d.state.All()
	if len(ms) != 1 || ms[0].Phase != state.Claiming {
		t.Fatalf("want the claiming state kept, got %+v", ms)
	}
	b0 := beats.Load()
	waitFor(t, "3 heartbeats in rbd while the claim may exist", func() bool { return beats.Load() >= b0+3 })
}

// TestHeartbeatGoesOnWhileAnUnmapIsStuck: an unmap stuck on EBUSY (the device is open, and may
// still be written) holds its claim until the device is gone; this node's liveness in that
// pool must go on meanwhile, even when it is the pool's only claim.
func TestHeartbeatGoesOnWhileAnUnmapIsStuck(t *testing.T) {
	c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000037")
	var beats atomic.Int64
	c.M.SetHook(func(_ context.Context, call string, img claim.Image) error {
		if call == "write" && img.Image == "" {
			beats.Add(1)
		}
		return nil
	})
	n := startMemDaemonWith(t, func(o *Options) {
		kc := o.Kernel.Config()
		kc.EBusyRetry = time.Hour // the unmap stays stuck until the device is closed
		o.Kernel = krbd.New(kc)
	}, c)
	defer n.stop()
	busy := n.mapImage(t, c, "only")
	dev, err := n.d.kernel.FindByPath(busy.Device)
	if err != nil {
		t.Fatal(err)
	}
	n.kernel.SetOpen(dev.ID, true)
	unmapped := make(chan error, 1)
	go func() {
		_, err := n.d.Unmap(context.Background(), api.UnmapRequest{Cluster: "c1", Pool: "rbd", Image: "only"}, nil)
		unmapped <- err
	}()
	waitFor(t, "the unmapping state", func() bool {
		ms := n.d.state.All()
		return len(ms) == 1 && ms[0].Phase == state.Unmapping
	})
	b0 := beats.Load()
	waitFor(t, "3 heartbeats in rbd while the unmap is stuck", func() bool { return beats.Load() >= b0+3 })
	select {
	case err := <-unmapped:
		t.Fatalf("the unmap of an open device ended: %v", err)
	default:
	}
	n.kernel.SetOpen(dev.ID, false)
	select {
	case err := <-unmapped:
		if err != nil {
			t.Fatalf("unmap after close: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("unmap did not finish after the device was closed")
	}
}
