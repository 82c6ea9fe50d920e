package daemon

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/fault"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// wallClock is the monitors' clock (blocklist entries expire on it) and the agents' wall clock,
// moved by the test.
type wallClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *wallClock) Now() time.Time          { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *wallClock) Advance(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// fenceLife is a two-node scene on one in-memory cluster for fence lifetimes: node-b's agent
// runs with clocks the test moves (the monitors' and node-b's, together); node-a is whatever
// the test makes it.
type fenceLife struct {
	c      *memCluster
	wall   *wallClock
	mono   *monoClock
	b      *memDaemon
	expiry time.Duration
	// sweep is node-b's sweep loop's ticker: a real one every 20 ms feeds it, and sweepSeen
	// sends the test's own
	sweep chan time.Time
}

func newFenceLife(t *testing.T, fsid string) *fenceLife {
	f := &fenceLife{c: newMemCluster("c1", "rbd", fsid), wall: &wallClock{t: time.Now().UTC()}, mono: &monoClock{}, expiry: time.Hour,
		sweep: make(chan time.Time)}
	f.c.M.SetClock(f.wall.Now)
	f.b = startMemDaemonWith(t, func(o *Options) {
		o.Config.NodeID = "node-b"
		o.Config.FenceExpiry = config.Duration(f.expiry)
		o.Config.OrphanSweepInterval = config.Duration(time.Hour)
		o.Mono, o.Now = f.mono.Now, f.wall.Now
		// the sweep's checks come every 20 ms of real time; what is due is judged on the clocks
		o.Ticker = func(loop string, every time.Duration) (<-chan time.Time, func()) {
			if loop != "sweep" {
				tk := time.NewTicker(every)
				return tk.C, tk.Stop
			}
			tk, stop := time.NewTicker(20*time.Millisecond), make(chan struct{})
			go func() {
				defer tk.Stop()
				for {
					select {
					case now := <-tk.C:
						select {
						case f.sweep <- now:
						case <-stop:
							return
						}
					case <-stop:
						return
					}
				}
			}()
			return f.sweep, func() { close(stop) }
		}
	}, f.c)
	return f
}

// advance moves both clocks by d.
func (f *fenceLife) advance(d time.Duration) { f.wall.Advance(d); f.mono.Advance(d) }

// sweepSeen returns once node-b's sweep loop has looked at the clocks as they are now: the
// second of two ticks is taken only after the first one's round of scheduling is over. (The
// clocks move faster than its 20 ms ticker: a pool first seen only after several steps was
// scheduled past the clocks' last step, and the test waited for a sweep that never came.)
func (f *fenceLife) sweepSeen(t *testing.T) {
	t.Helper()
	for range 2 {
		select {
		case f.sweep <- time.Now():
		case <-time.After(30 * time.Second):
			t.Fatal("node-b's sweep loop takes no tick")
		}
	}
}

// takeOver has node-b map image with takeover once node-a's lease ran out on its clock.
func (f *fenceLife) takeOver(t *testing.T, image string) *api.MapResponse {
	t.Helper()
	f.b.kernel.AddImage("rbd", "", image, 16<<20)
	req := api.MapRequest{Cluster: "c1", Pool: "rbd", Image: image, Takeover: true, Requester: "test"}
	lease := f.b.d.cfg.LeaseDuration.D()
	for _, d := range []time.Duration{lease / 2, lease/2 + time.Second} { // looked at within every lease
		if _, err := f.b.d.Map(asAdmin(context.Background()), req, nil); err == nil {
			t.Fatal("node-b took over before node-a's lease ran out on its clock")
		}
		f.mono.Advance(d)
	}
	resp, err := f.b.d.Map(asAdmin(context.Background()), req, nil)
	if err != nil {
		t.Fatalf("node-b's takeover: %v", err)
	}
	return resp
}

// outlive moves the clocks through three fence lifetimes, an eighth of one at a time, and
// requires the fence of addr to be on the blocklist with more than half its life left before
// every step: whoever keeps it has a few steps to renew it, and the clocks never move past an
// entry that nobody renewed.
func (f *fenceLife) outlive(t *testing.T, addr string) {
	t.Helper()
	step := f.expiry / 8
	for i := 0; i < 24; i++ {
		f.sweepSeen(t)
		waitFor(t, "the fence of "+addr+" renewed with more than half its life left", func() bool {
			until, ok := f.c.M.BlocklistedUntil(addr)
			return ok && until.Sub(f.wall.Now()) > f.expiry/2
		})
		f.advance(step)
		if !f.c.M.Blocklisted(addr) {
			t.Fatalf("after %s: the fence of %s expired", time.Duration(i+1)*step, addr)
		}
	}
}

// TestFenceOutlivesItsExpiryWhileTheNewHolderHolds: node-a stops with image mapped; node-b
// takes it over and holds it for three fence lifetimes. node-a's mapping, still there on a
// frozen node, must stay blocklisted all along: its entry is renewed by the holder of record.
func TestFenceOutlivesItsExpiryWhileTheNewHolderHolds(t *testing.T) {
	f := newFenceLife(t, "00000000-0000-4000-8000-000000000024")
	defer f.b.stop()
	a := startMemDaemonWith(t, func(o *Options) { o.Config.NodeID = "node-a" }, f.c)
	ra := a.mapImage(t, f.c, "held")
	a.stop() // frozen, as far as the cluster can tell: its device stays
	f.takeOver(t, "held")
	addr := ra.Claim.Holders[0].ClientAddr
	if !f.c.M.Blocklisted(addr) {
		t.Fatalf("node-a's mapping %s was not fenced", addr)
	}
	f.outlive(t, addr)
}

// TestFenceOutlivesItsExpiryAfterTheClaimIsReleased: the same, but node-b unmaps the image
// after the takeover, so that nobody holds the claim: its fence is still kept (by node-b's
// sweep of the pool), and stays in the record.
func TestFenceOutlivesItsExpiryAfterTheClaimIsReleased(t *testing.T) {
	f := newFenceLife(t, "00000000-0000-4000-8000-000000000025")
	defer f.b.stop()
	a := startMemDaemonWith(t, func(o *Options) { o.Config.NodeID = "node-a" }, f.c)
	ra := a.mapImage(t, f.c, "released")
	a.stop()
	f.takeOver(t, "released")
	if _, err := f.b.d.Unmap(context.Background(), api.UnmapRequest{Cluster: "c1", Pool: "rbd", Image: "released"}, nil); err != nil {
		t.Fatalf("node-b's unmap: %v", err)
	}
	img := claim.Image{Pool: "rbd", Image: "released"}
	rec := inspectMem(t, f.c, img)
	if !rec.Free() || len(rec.Fences) != 1 {
		t.Fatalf("after the release: holders %+v, fences %+v; want free, with node-a's fence", rec.Holders, rec.Fences)
	}
	addr := ra.Claim.Holders[0].ClientAddr
	f.outlive(t, addr)
	if rec := inspectMem(t, f.c, img); len(rec.Fences) != 1 || rec.Fences[0].Addr != addr {
		t.Fatalf("the record lost the fence: %+v", rec.Fences)
	}
}

// TestWholeNodeFenceOutlivesItsExpiry: node-a claimed the image but recorded no mapping
// address before it stopped, so node-b's takeover fences its whole address (ip:0/0). node-a's
// agent is cut by that fence too and cannot keep anything: node-b must.
func TestWholeNodeFenceOutlivesItsExpiry(t *testing.T) {
	f := newFenceLife(t, "00000000-0000-4000-8000-000000000026")
	defer f.b.stop()
	img := claim.Image{Pool: "rbd", Image: "whole"}
	f.c.M.AddImage(img, "id-whole")
	a, err := claim.NewStoreOn(f.c.M, claim.Config{Node: claim.Node{ID: "node-a", Addr: func() string { return "10.0.0.1" }}, Lease: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Acquire(context.Background(), claim.Request{Image: img}); err != nil {
		t.Fatal(err)
	}
	f.takeOver(t, "whole")
	if !f.c.M.Blocklisted("10.0.0.1:0/0") {
		t.Fatal("node-a's whole address was not fenced")
	}
	f.outlive(t, "10.0.0.1:0/0")
}

func inspectMem(t *testing.T, c *memCluster, img claim.Image) *claim.Record {
	t.Helper()
	s, err := claim.NewStoreOn(c.M, claim.Config{Node: claim.Node{ID: "observer"}})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := s.Inspect(context.Background(), img)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// cutBackend is a node's view of a cluster that the test can cut it off from (every call
// fails, as through a partition) and heal.
type cutBackend struct {
	claim.Backend
	cut atomic.Bool
}

var errCut = fmt.Errorf("%w: cut off from the cluster (test)", fault.ErrUnavailable)

func (c *cutBackend) Read(ctx context.Context, loc claim.Image, oid string) ([]byte, uint64, error) {
	if c.cut.Load() {
		return nil, 0, errCut
	}
	return c.Backend.Read(ctx, loc, oid)
}

func (c *cutBackend) CompareAndWrite(ctx context.Context, loc claim.Image, oid string, ver uint64, data []byte) (uint64, error) {
	if c.cut.Load() {
		return 0, errCut
	}
	return c.Backend.CompareAndWrite(ctx, loc, oid, ver, data)
}

func (c *cutBackend) ReadKeys(ctx context.Context, loc claim.Image, oid string, keys []string) (map[string][]byte, uint64, error) {
	if c.cut.Load() {
		return nil, 0, errCut
	}
	return c.Backend.ReadKeys(ctx, loc, oid, keys)
}

func (c *cutBackend) SetKeys(ctx context.Context, loc claim.Image, oid string, kv map[string][]byte) (uint64, error) {
	if c.cut.Load() {
		return 0, errCut
	}
	return c.Backend.SetKeys(ctx, loc, oid, kv)
}

func (c *cutBackend) RemoveKeys(ctx context.Context, loc claim.Image, oid string, keys []string, ver uint64) error {
	if c.cut.Load() {
		return errCut
	}
	return c.Backend.RemoveKeys(ctx, loc, oid, keys, ver)
}

func (c *cutBackend) Blocklist(ctx context.Context, addr string, expire time.Duration) (time.Time, error) {
	if c.cut.Load() {
		return time.Time{}, errCut
	}
	return c.Backend.Blocklist(ctx, addr, expire)
}

// cutNode starts node-a's agent on f's cluster through a cutBackend, with boot id boot.
func (f *fenceLife) cutNode(t *testing.T, boot string, stateDir ...string) (*memDaemon, *cutBackend) {
	t.Helper()
	cb := &cutBackend{Backend: f.c.M}
	a := startMemDaemonWith(t, func(o *Options) {
		o.Config.NodeID = "node-a"
		o.BootID = boot
		if len(stateDir) > 0 {
			o.Config.StateDir = stateDir[0]
		}
		o.Connect = func(context.Context, config.Cluster) (Connection, error) {
			return Connection{Backend: cb, Secret: memSecret}, nil
		}
	}, f.c)
	return a, cb
}

// TestFenceEndsOnceTheFencedNodeUnmaps: node-a is cut off with image mapped, node-b takes it
// over; node-a comes back, finds its claim lost (the device is left), and its operator unmaps
// it: node-a's agent records the mapping gone in the fence, and node-b stops renewing it.
func TestFenceEndsOnceTheFencedNodeUnmaps(t *testing.T) {
	f := newFenceLife(t, "00000000-0000-4000-8000-000000000027")
	defer f.b.stop()
	a, cb := f.cutNode(t, "boot-a-1")
	defer a.stop()
	ra := a.mapImage(t, f.c, "healed")
	addr := ra.Claim.Holders[0].ClientAddr
	cb.cut.Store(true)
	f.takeOver(t, "healed")
	img := claim.Image{Pool: "rbd", Image: "healed"}
	if fs := inspectMem(t, f.c, img).Fences; len(fs) != 1 || fs[0].BootID != "boot-a-1" {
		t.Fatalf("fences %+v; want node-a's, with its boot id", fs)
	}
	cb.cut.Store(false)
	waitFor(t, "node-a to find its claim lost", func() bool { return a.d.isLost(state.Key{Cluster: "c1", Ref: img}) })
	if _, err := a.d.Unmap(context.Background(), api.UnmapRequest{Cluster: "c1", Pool: "rbd", Image: "healed"}, nil); err != nil {
		t.Fatalf("node-a's unmap of its lost mapping: %v", err)
	}
	fs := inspectMem(t, f.c, img).Fences
	if len(fs) != 1 || fs[0].Live() || !strings.Contains(fs[0].Gone, "unmapped") {
		t.Fatalf("fences %+v; want node-a's marked gone (unmapped)", fs)
	}
	until, _ := f.c.M.BlocklistedUntil(addr)
	f.advance(f.expiry / 2)
	time.Sleep(100 * time.Millisecond) // a few of node-b's rounds: none may renew it
	if u, _ := f.c.M.BlocklistedUntil(addr); u.After(until) {
		t.Fatalf("a gone fence was renewed (until %s, was %s)", u, until)
	}
	f.advance(f.expiry)
	if f.c.M.Blocklisted(addr) {
		t.Fatal("the entry of a gone fence did not run out")
	}
}

// TestFenceEndsOnceTheFencedNodeRebooted: node-a is cut off with image mapped, node-b takes it
// over; node-a reboots (its devices gone, a new boot id, its state directory kept): its agent
// finds the fenced mapping gone and records it, or node-b sees the new boot in its heartbeat;
// either way the fence ends, saying why, and its entry runs out.
func TestFenceEndsOnceTheFencedNodeRebooted(t *testing.T) {
	f := newFenceLife(t, "00000000-0000-4000-8000-000000000028")
	defer f.b.stop()
	a, cb := f.cutNode(t, "boot-a-1")
	ra := a.mapImage(t, f.c, "rebooted")
	addr := ra.Claim.Holders[0].ClientAddr
	cb.cut.Store(true)
	f.takeOver(t, "rebooted")
	a.stop()
	a2, _ := f.cutNode(t, "boot-a-2", a.d.cfg.StateDir) // the same node after a reboot
	defer a2.stop()
	a2.mapImage(t, f.c, "other")
	img := claim.Image{Pool: "rbd", Image: "rebooted"}
	f.advance(f.expiry / 4) // node-b's next renewal of the fence is due
	waitFor(t, "the fence to end", func() bool { return !inspectMem(t, f.c, img).Fences[0].Live() })
	if g := inspectMem(t, f.c, img).Fences[0].Gone; !strings.Contains(g, "unmapped") && !strings.Contains(g, "boot-a-2") {
		t.Fatalf("gone %q; want the unmap or the reboot named", g)
	}
	f.advance(f.expiry)
	if f.c.M.Blocklisted(addr) {
		t.Fatal("the entry of a rebooted node's fence did not run out")
	}
}

// TestFenceIsKeptWhenAnotherAgentShowsTheNodesName: node-a is cut off with image mapped, node-b
// takes it over; then an agent with another state directory (a second machine given node-a's
// id, or node-a with its state lost) writes node-a's heartbeat with another boot id. That says
// nothing of the fenced kernel: the fence stays live and is renewed.
func TestFenceIsKeptWhenAnotherAgentShowsTheNodesName(t *testing.T) {
	f := newFenceLife(t, "00000000-0000-4000-8000-000000000029")
	defer f.b.stop()
	a, cb := f.cutNode(t, "boot-a-1")
	ra := a.mapImage(t, f.c, "kept")
	addr := ra.Claim.Holders[0].ClientAddr
	cb.cut.Store(true)
	f.takeOver(t, "kept")
	twin, _ := f.cutNode(t, "boot-twin") // a fresh state directory: another incarnation
	defer twin.stop()
	twin.mapImage(t, f.c, "twin")
	f.outlive(t, addr)
	if fs := inspectMem(t, f.c, claim.Image{Pool: "rbd", Image: "kept"}).Fences; !fs[0].Live() {
		t.Fatalf("the fence ended: %q", fs[0].Gone)
	}
	a.stop()
}
