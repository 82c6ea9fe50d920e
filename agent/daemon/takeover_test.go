package daemon

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/fault"
	"github.com/rbd-owner/rbd-owner/agent/server"
)

// monoClock is a node's monotonic clock that the test moves.
type monoClock struct {
	mu sync.Mutex
	d  time.Duration
}

func (c *monoClock) Now() time.Duration      { c.mu.Lock(); defer c.mu.Unlock(); return c.d }
func (c *monoClock) Advance(d time.Duration) { c.mu.Lock(); c.d += d; c.mu.Unlock() }

// TestTakeoverWaitsOutTheHoldersLeaseOnTheClaimersClock runs two agents on one in-memory
// cluster. node-b's wall clock is an hour ahead: while node-a runs (its heartbeat moves) node-b
// is refused with retry_after_seconds however long it waits on its own clock; once node-a has
// stopped, node-b takes over a lease after its first look.
func TestTakeoverWaitsOutTheHoldersLeaseOnTheClaimersClock(t *testing.T) {
	c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000006")
	a := startMemDaemonWith(t, func(o *Options) { o.Config.NodeID = "node-a" }, c)
	monoB := &monoClock{}
	b := startMemDaemonWith(t, func(o *Options) {
		o.Config.NodeID = "node-b"
		o.Mono = monoB.Now
		o.Now = func() time.Time { return time.Now().Add(time.Hour) }
	}, c)
	defer b.stop()
	ra := a.mapImage(t, c, "shared")
	b.kernel.AddImage("rbd", "", "shared", 16<<20)
	req := api.MapRequest{Cluster: "c1", Pool: "rbd", Image: "shared", Takeover: true, Requester: "test"}
	lease := a.d.cfg.LeaseDuration.D()

	refused := func(what string) *api.Error {
		t.Helper()
		_, err := b.d.Map(asAdmin(context.Background()), req, nil)
		if !fault.Is(err, fault.ClaimedElsewhere) {
			t.Fatalf("%s: %v, want claimed elsewhere", what, err)
		}
		e := server.APIError(err)
		if e.Owner == nil || e.Owner.NodeID != "node-a" {
			t.Fatalf("%s: owner %+v", what, e.Owner)
		}
		return e
	}
	e := refused("first look")
	if e.RetryAfterSeconds <= 0 || e.RetryAfterSeconds > int64(lease/time.Second) {
		t.Fatalf("first look: retry after %d s, want 1..%d", e.RetryAfterSeconds, int64(lease/time.Second))
	}
	// node-b waits out its watch on its own clock, three times; node-a renews in between
	for i := range 3 {
		before := c.M.Version(claim.Image{Pool: "rbd", Image: "shared"})
		hb := c.Writes.Load()
		waitFor(t, "node-a's heartbeat", func() bool { return c.Writes.Load() > hb+1 })
		monoB.Advance(lease + time.Second)
		_ = refused("a live holder after a lease on node-b's clock") // it fails the test itself
		if v := c.M.Version(claim.Image{Pool: "rbd", Image: "shared"}); v != before {
			t.Fatalf("round %d: a refused takeover changed the claim (version %d → %d)", i, before, v)
		}
	}
	a.stop() // node-a dies: its heartbeat stops
	_ = refused("the first look after node-a stopped")
	monoB.Advance(lease - time.Second)
	_ = refused("a moment before node-a's lease ran out on node-b's clock")
	monoB.Advance(time.Second)
	rb, err := b.d.Map(asAdmin(context.Background()), req, nil)
	if err != nil {
		t.Fatalf("takeover of a stopped holder: %v", err)
	}
	if rb.Claim == nil || rb.Claim.Epoch != ra.Claim.Epoch+1 {
		t.Fatalf("takeover: %+v (node-a had epoch %d)", rb.Claim, ra.Claim.Epoch)
	}
	if !c.M.Blocklisted(ra.Claim.Holders[0].ClientAddr) {
		t.Fatalf("node-a's mapping %s was not fenced", ra.Claim.Holders[0].ClientAddr)
	}
}
