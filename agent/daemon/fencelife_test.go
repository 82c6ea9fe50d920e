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
	// sweep is node-b's sweep loop's ticker: the test's ticks (sweepSeen, swept), and in a
	// scene that is not stepped those of a real ticker every 20 ms too
	sweep chan time.Time
	// stepped: only the test ticks node-b's sweep loop, and its renewal rounds never run
	// (newSteppedFenceLife)
	stepped bool
}

// newFenceLife starts node-b with its renewal rounds on their usual ticker (every renew
// interval of real time) and its sweep loop's checks every 20 ms of real time (what is due is
// judged on the clocks).
func newFenceLife(t *testing.T, fsid string) *fenceLife { return startFenceLife(t, fsid, false) }

// newSteppedFenceLife is newFenceLife with node-b's renewal rounds stopped and its sweep loop
// ticked by the test alone: nothing of node-b's that keeps fences runs on real time. outlive
// needs it: each of its steps moves the clocks only while nothing of node-b's is looking at
// them, then has one sweep run at the clocks as they are and waits until it has ended.
func newSteppedFenceLife(t *testing.T, fsid string) *fenceLife { return startFenceLife(t, fsid, true) }

func startFenceLife(t *testing.T, fsid string, stepped bool) *fenceLife {
	f := &fenceLife{c: newMemCluster("c1", "rbd", fsid), wall: &wallClock{t: time.Now().UTC()}, mono: &monoClock{}, expiry: time.Hour,
		sweep: make(chan time.Time), stepped: stepped}
	f.c.M.SetClock(f.wall.Now)
	f.b = startMemDaemonWith(t, func(o *Options) {
		o.Config.NodeID = "node-b"
		o.Config.FenceExpiry = config.Duration(f.expiry)
		o.Config.OrphanSweepInterval = config.Duration(time.Hour)
		o.Mono, o.Now = f.mono.Now, f.wall.Now
		o.Ticker = func(loop string, every time.Duration) (<-chan time.Time, func()) {
			switch {
			case loop == "sweep" && stepped:
				return f.sweep, func() {}
			case loop == "sweep":
				return f.feedSweep()
			case loop == "renew c1" && stepped:
				return make(chan time.Time), func() {} // its first round, at start, holds nothing
			}
			tk := time.NewTicker(every)
			return tk.C, tk.Stop
		}
	}, f.c)
	return f
}

// feedSweep feeds f.sweep from a real ticker every 20 ms until its stop is called.
func (f *fenceLife) feedSweep() (<-chan time.Time, func()) {
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

// advance moves both clocks by d.
func (f *fenceLife) advance(d time.Duration) { f.wall.Advance(d); f.mono.Advance(d) }

// tickSweep hands node-b's sweep loop one tick.
func (f *fenceLife) tickSweep(t *testing.T) {
	t.Helper()
	select {
	case f.sweep <- time.Now():
	case <-time.After(30 * time.Second):
		t.Fatal("node-b's sweep loop takes no tick")
	}
}

// sweepSeen returns once node-b's sweep loop has looked at the clocks as they are now, and so
// scheduled the pools it sweeps (the first sweep of each at most one sweep period later): the
// second of two ticks is taken only after the first one's round of scheduling is over. (The
// second one's round may still be running, and may look at the clocks after they moved on.)
func (f *fenceLife) sweepSeen(t *testing.T) {
	t.Helper()
	f.tickSweep(t)
	f.tickSweep(t)
}

// sweptMark is the rbd pool's sweep mark: it moves on when a sweep of it ends having kept every
// fence that was due (sweepPlace).
func (f *fenceLife) sweptMark(t *testing.T) uint64 {
	t.Helper()
	s, err := claim.NewStoreOn(f.c.M, claim.Config{Node: claim.Node{ID: "observer"}})
	if err != nil {
		t.Fatal(err)
	}
	seq, err := s.SweptMark(context.Background(), "rbd", "")
	if err != nil {
		t.Fatal(err)
	}
	return seq
}

// swept has node-b sweep the pool once at the clocks as they are now (one sweep period after
// its last sweep: a sweep is due), and returns once that sweep has recorded itself: the mark
// moved on from before, read before the clocks last moved (the round of the last tick handed
// over before they moved may be the one that starts this sweep, before swept is called). Ticks
// go on until then: one that comes before the loop has reaped the last sweep's goroutine starts
// none, and once one has started the sweep the others find it running or not due.
func (f *fenceLife) swept(t *testing.T, before uint64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second) // turns a hang into a failure, asserts nothing
	for f.sweptMark(t) == before {
		if time.Now().After(deadline) {
			t.Fatalf("node-b's sweep at %s did not end, or did not record itself (a fence it could not keep?)", f.wall.Now().Format(time.RFC3339))
		}
		f.tickSweep(t)
		time.Sleep(time.Millisecond)
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

// outlive moves the clocks through three fence lifetimes, an eighth of one at a time (node-b's
// sweep period), and requires the fence of addr to be on the blocklist after every step, and to
// have more than half its life left once node-b's sweep has run at the clocks of that step (the
// sweep keeps the fences of every claim, held or free). Nothing of node-b's runs while the
// clocks move: each step waits for the sweep to end before the next one.
func (f *fenceLife) outlive(t *testing.T, addr string) {
	t.Helper()
	if !f.stepped {
		t.Fatal("outlive needs a scene from newSteppedFenceLife")
	}
	f.sweepSeen(t)
	step := f.expiry / 8
	for i := 1; i <= 24; i++ {
		mark := f.sweptMark(t) // the last sweep's: recorded before swept returned
		f.advance(step)
		if !f.c.M.Blocklisted(addr) {
			t.Fatalf("after %s: the fence of %s expired", time.Duration(i)*step, addr)
		}
		f.swept(t, mark)
		if until, ok := f.c.M.BlocklistedUntil(addr); !ok || until.Sub(f.wall.Now()) <= f.expiry/2 {
			t.Fatalf("after %s and node-b's sweep: the fence of %s is listed %v, until %s (%s left); want more than half its life left",
				time.Duration(i)*step, addr, ok, until.Format(time.RFC3339), until.Sub(f.wall.Now()))
		}
	}
}

// TestFenceOutlivesItsExpiryWhileTheNewHolderHolds: node-a stops with image mapped; node-b
// takes it over and holds it for three fence lifetimes. node-a's mapping, still there on a
// frozen node, must stay blocklisted all along: its entry is renewed by node-b, the holder of
// record (here at its sweeps of the pool, which keep held claims' fences too).
func TestFenceOutlivesItsExpiryWhileTheNewHolderHolds(t *testing.T) {
	f := newSteppedFenceLife(t, "00000000-0000-4000-8000-000000000024")
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
	f := newSteppedFenceLife(t, "00000000-0000-4000-8000-000000000025")
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
	f := newSteppedFenceLife(t, "00000000-0000-4000-8000-000000000026")
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
	f := newSteppedFenceLife(t, "00000000-0000-4000-8000-000000000029")
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
