package daemon

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/claim/memory"
	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// TestOrphanSweep: the free claim of a deleted image is removed; a held one, a live image's and
// one taken between the check and the delete are not.
func TestOrphanSweep(t *testing.T) {
	c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000003")
	n := startMemDaemon(t, c)
	defer n.stop()
	bg := context.Background()
	for _, name := range []string{"gone", "kept", "held", "raced"} {
		n.mapImage(t, c, name)
	}
	for _, name := range []string{"gone", "kept", "raced"} {
		if _, err := n.d.Unmap(bg, api.UnmapRequest{Cluster: "c1", Pool: "rbd", Image: name}, nil); err != nil {
			t.Fatal(err)
		}
	}
	img := func(name string) claim.Image { return claim.Image{Pool: "rbd", Image: name} }
	c.M.RemoveImage(img("gone"))
	c.M.RemoveImage(img("held")) // (a mapped image cannot really be removed; its claim must stay anyway)
	c.M.RemoveImage(img("raced"))
	// "raced": recreated and claimed by another node between the sweep's check and its delete
	other, err := claim.NewStoreOn(c.M, claim.Config{Node: claim.Node{ID: "node-x"}})
	if err != nil {
		t.Fatal(err)
	}
	hook := func(ctx context.Context, call string, im claim.Image) error {
		if call == "imageid" && im == img("raced") {
			c.M.SetHook(nil)
			c.M.AddImage(img("raced"), "id-raced-2")
			if _, err := other.Acquire(ctx, claim.Request{Image: img("raced")}); err != nil {
				t.Errorf("the racing acquire: %v", err)
			}
		}
		return nil
	}
	c.M.SetHook(hook)
	if got := n.d.state.ClaimPools(); len(got) != 1 || got[0] != (state.Pool{Cluster: "c1", Pool: "rbd"}) {
		t.Fatalf("claim pools %+v", got)
	}
	removed, err := n.d.sweeper.sweepPool(bg, state.Pool{Cluster: "c1", Pool: "rbd"})
	if err != nil || removed != 1 {
		t.Fatalf("sweep removed %d (%v), want 1", removed, err)
	}
	for name, want := range map[string]bool{"gone": false, "kept": true, "held": true, "raced": true} {
		if v := c.M.Version(img(name)); (v != 0) != want {
			t.Errorf("%s: record present %v, want %v", name, v != 0, want)
		}
	}
	if rec, err := other.Inspect(bg, img("raced")); err != nil || rec.Holder("node-x") == nil {
		t.Errorf("the claim taken meanwhile: %+v %v", rec, err)
	}
}

// TestOrphanSweepRunsByItself: with the sweep on, a deleted image's free claim disappears
// without anyone asking.
func TestOrphanSweepRunsByItself(t *testing.T) {
	c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000004")
	n := startMemDaemonWith(t, func(o *Options) { o.Config.OrphanSweepInterval = config.Duration(200 * time.Millisecond) }, c)
	defer n.stop()
	n.mapImage(t, c, "gone")
	if _, err := n.d.Unmap(context.Background(), api.UnmapRequest{Cluster: "c1", Pool: "rbd", Image: "gone"}, nil); err != nil {
		t.Fatal(err)
	}
	c.M.RemoveImage(claim.Image{Pool: "rbd", Image: "gone"})
	waitFor(t, "the sweep to remove the orphaned claim", func() bool {
		return c.M.Version(claim.Image{Pool: "rbd", Image: "gone"}) == 0
	})
}

// TestAPlaceIsSweptOncePerPeriodByTheFleetAndNeverListed: two nodes sweep the same pool; the
// first sweep builds the index of each of its namespaces (one listing each, from claims made
// before the index; a namespace without claims too, so that it is not listed again), and
// from then on, each period, one node sweeps through the index and the other finds the mark
// moved and reads nothing more: the fleet reads each claim once per period, not once per node.
func TestAPlaceIsSweptOncePerPeriodByTheFleetAndNeverListed(t *testing.T) {
	m := memory.New("00000000-0000-4000-8000-000000000008")
	a, monoA := roundDaemonAs(t, m, "node-c", 6, 6)
	b, monoB := roundDaemonAs(t, m, "node-d", 0, 0)
	m.AddImage(claim.Image{Pool: "rbd", Namespace: "empty", Image: "e"}, "id-e") // a namespace without claims
	pool := state.Pool{Cluster: "c1", Pool: "rbd"}
	period := a.sweeper.period
	m.Counts(true)
	if _, err := a.sweeper.sweepPool(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	if got := m.Counts(true); got["objects"] != 2 || got["read claim"] != 6 {
		t.Fatalf("the first sweep did %v, want one listing per namespace (the indexes' build) and each claim read", got)
	}
	for i := range 4 {
		monoA.Advance(period)
		monoB.Advance(period)
		for _, d := range []*Daemon{b, a} {
			if _, err := d.sweeper.sweepPool(context.Background(), pool); err != nil {
				t.Fatal(err)
			}
		}
		got := m.Counts(true)
		t.Logf("period %d: %v", i+1, got)
		if got["objects"] != 0 {
			t.Fatalf("period %d: a sweep listed the pool: %v", i+1, got)
		}
		if got["read claim"] != 6 {
			t.Fatalf("period %d: the two nodes read %d claims, want each claim once (one sweep): %v", i+1, got["read claim"], got)
		}
	}
}

// TestANodeThatSkipsASweepStopsReportingItsFences: the fences of a free claim are kept by the
// node that sweeps its pool; a node that finds the pool swept by another stops counting them as
// fences it keeps (rbd_owner_fences_expiring would warn of renewals it no longer makes).
func TestANodeThatSkipsASweepStopsReportingItsFences(t *testing.T) {
	m := memory.New("00000000-0000-4000-8000-000000000009")
	a, monoA := roundDaemonAs(t, m, "node-c", 0, 0)
	b, monoB := roundDaemonAs(t, m, "node-d", 0, 0)
	ctx := context.Background()
	img := freeFencedClaim(t, m)
	pool := state.Pool{Cluster: "c1", Pool: "rbd"}
	for _, d := range []*Daemon{a, b} {
		if _, err := d.sweeper.sweepPool(ctx, pool); err != nil {
			t.Fatal(err)
		}
	}
	if !a.fences.keepsFences("c1", img) || !b.fences.keepsFences("c1", img) {
		t.Fatal("the nodes that swept do not note the free claim's fence")
	}
	monoA.Advance(a.sweeper.period)
	monoB.Advance(b.sweeper.period)
	if _, err := a.sweeper.sweepPool(ctx, pool); err != nil { // b swept since a's last look: a skips
		t.Fatal(err)
	}
	if a.fences.keepsFences("c1", img) {
		t.Fatal("a node that skipped the sweep still counts the fence as one it keeps")
	}
	if len(a.fences.keptSnapshot()) != 0 || len(b.fences.keptSnapshot()) != 1 {
		t.Fatalf("fences kept: node-c %v, node-d %v; want none and one", a.fences.keptSnapshot(), b.fences.keptSnapshot())
	}
}

// TestASweepThatCouldNotKeepAFenceIsNotMarked: a sweep whose repair of a fence failed (its
// entry removed by someone, and the add refused) does not record itself, so the other nodes
// sweep at their next look instead of skipping (F9 of docs/safety.md: a holder that cannot
// blocklist would otherwise stop everyone's renewals).
func TestASweepThatCouldNotKeepAFenceIsNotMarked(t *testing.T) {
	m := memory.New("00000000-0000-4000-8000-00000000000a")
	a, _ := roundDaemonAs(t, m, "node-c", 0, 0)
	ctx := context.Background()
	freeFencedClaim(t, m)
	_ = m.Unblocklist(ctx, "10.0.0.5:0/5")
	m.SetHook(func(_ context.Context, call string, _ claim.Image) error {
		if call == "blocklist" {
			return errors.New("osd blocklist refused (test)")
		}
		return nil
	})
	pool := state.Pool{Cluster: "c1", Pool: "rbd"}
	if _, err := a.sweeper.sweepPool(ctx, pool); err == nil {
		t.Fatal("a sweep whose fence renewal failed reported no error")
	}
	store, err := a.clusters["c1"].Claims(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if seq, err := store.SweptMark(ctx, "rbd", ""); seq != 0 || err != nil {
		t.Fatalf("the failed sweep was recorded: mark %d, %v", seq, err)
	}
	m.SetHook(nil)
	if _, err := a.sweeper.sweepPool(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if seq, _ := store.SweptMark(ctx, "rbd", ""); seq != 1 {
		t.Fatalf("the whole sweep was not recorded: mark %d", seq)
	}
}

// TestASweepThatLeftAFenceShortIsNotMarked: a sweep that found a live fence's entry listed
// shorter than recorded and could not lengthen it (its node was not seen down, so no cover of
// it may be listed) reports it and does not record itself: the other nodes sweep the place at
// their next look (one of them may see the node down and lengthen the entry) instead of
// skipping it for a period on the word of a sweep that left a fence short.
func TestASweepThatLeftAFenceShortIsNotMarked(t *testing.T) {
	m := memory.New("00000000-0000-4000-8000-00000000000b")
	a, _ := roundDaemonAs(t, m, "node-c", 0, 0)
	ctx := context.Background()
	freeFencedClaim(t, m)
	if err := m.Unblocklist(ctx, "10.0.0.5:0/5"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Blocklist(ctx, "10.0.0.5:0/5", 10*time.Minute); err != nil { // as librbd's lock break, say
		t.Fatal(err)
	}
	pool := state.Pool{Cluster: "c1", Pool: "rbd"}
	if _, err := a.sweeper.sweepPool(ctx, pool); err == nil {
		t.Fatal("a sweep that left a fence short reported no error")
	}
	if until, ok := m.BlocklistedUntil("10.0.0.5:0/5"); !ok || time.Until(until) > 11*time.Minute {
		t.Fatalf("the entry of a node not seen down was changed: listed %v until %v", ok, until)
	}
	store, err := a.clusters["c1"].Claims(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if seq, err := store.SweptMark(ctx, "rbd", ""); seq != 0 || err != nil {
		t.Fatalf("the sweep that left a fence short was recorded: mark %d, %v", seq, err)
	}
}

// freeFencedClaim makes, on m, a free claim that keeps a live fence: another node held the image
// "fenced" with a mapping, an admin fenced it and force-released the claim.
func freeFencedClaim(t *testing.T, m *memory.Memory) claim.Image {
	t.Helper()
	ctx := context.Background()
	img := claim.Image{Pool: "rbd", Image: "fenced"}
	m.AddImage(img, "id-fenced")
	x := otherNode(t, m)
	r, err := x.Acquire(ctx, claim.Request{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := x.SetMapping(ctx, img, r.Holder.Epoch, "10.0.0.5:0/5", "/dev/rbd0"); err != nil {
		t.Fatal(err)
	}
	if _, err := x.Fence(ctx, img); err != nil {
		t.Fatal(err)
	}
	if ok, err := x.ForceRelease(ctx, img); !ok || err != nil {
		t.Fatal(ok, err)
	}
	return img
}
