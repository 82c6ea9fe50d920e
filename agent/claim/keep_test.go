package claim

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/claim/memory"
	"github.com/rbd-owner/rbd-owner/agent/claim/record"
)

// Fence lifetimes: which fences are kept, when they are renewed, and what ends them.

// keepScene: node-a held img with a mapping; node-b took it over (node-a's mapping fenced).
// Both stores and the cluster share one clock (the monitors' and the nodes').
type keepScene struct {
	m      *memory.Memory
	clk    *nodeClock
	a, b   *Store
	img    Image
	addr   string // node-a's fenced mapping
	bootA  string
	blocks atomic.Int64 // blocklist calls
}

const keepExpiry = time.Hour

func newKeepScene(t *testing.T) *keepScene { t.Helper(); return newKeepSceneWith(t, nil) }

// newKeepSceneWith is newKeepScene with before run on the cluster just before node-b's takeover.
func newKeepSceneWith(t *testing.T, before func(*keepScene)) *keepScene {
	t.Helper()
	ks := newHeldScene(t)
	ctx := context.Background()
	// node-b watches node-a's heartbeat, unchanged for a lease: it takes over
	for _, d := range []time.Duration{lease / 2, lease/2 + time.Second} {
		if _, err := ks.b.Acquire(ctx, Request{Image: ks.img, Takeover: true}); err == nil {
			t.Fatal("takeover before node-a's lease ran out")
		}
		ks.clk.Advance(d)
	}
	if before != nil {
		before(ks)
	}
	if _, err := ks.b.Acquire(ctx, Request{Image: ks.img, Takeover: true}); err != nil {
		t.Fatalf("takeover: %v", err)
	}
	if !ks.m.Blocklisted(ks.addr) {
		t.Fatal("node-a's mapping was not fenced")
	}
	return ks
}

// newHeldScene is the scene before the takeover: node-a holds the image with its mapping
// recorded (and watching it), node-b has not looked yet.
func newHeldScene(t *testing.T) *keepScene {
	t.Helper()
	ks := &keepScene{m: memory.New("fsid"), clk: &nodeClock{wall: time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)},
		img: Image{Pool: "rbd", Image: "img"}, addr: "10.0.0.1:0/1001", bootA: "boot-a-1"}
	ks.m.SetClock(ks.clk.Now)
	ks.m.SetHook(func(_ context.Context, call string, _ Image) error {
		if call == "blocklist" {
			ks.blocks.Add(1)
		}
		return nil
	})
	ks.m.AddImage(ks.img, "id-img")
	ks.a = ks.store(t, "node-a", ks.bootA)
	ks.b = ks.store(t, "node-b", "boot-b-1")
	ctx := context.Background()
	r, err := ks.a.Acquire(ctx, Request{Image: ks.img})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ks.a.SetMapping(ctx, ks.img, r.Holder.Epoch, ks.addr, "/dev/rbd0"); err != nil {
		t.Fatal(err)
	}
	ks.m.SetWatchers(ks.img, ks.addr)
	return ks
}

func (ks *keepScene) store(t *testing.T, id, boot string) *Store {
	t.Helper()
	s, err := NewStoreOn(ks.m, Config{Node: Node{ID: id, Incarnation: "inc-" + id, BootID: boot,
		Addr: func() string { return fmt.Sprintf("10.0.0.%d", id[len(id)-1]-'a'+1) }}, Lease: lease, FenceExpiry: keepExpiry, Now: ks.clk.Now, Mono: ks.clk.Mono})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (ks *keepScene) record(t *testing.T) *Record {
	t.Helper()
	rec, err := ks.b.Inspect(context.Background(), ks.img)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// TestTakeoverRecordsTheFencedBootAndCountsAsKept: the fence records node-a's boot id, the
// expiry the cluster lists, that this project listed the entry, and the store that made it does
// not check it again before half a fence check has passed.
func TestTakeoverRecordsTheFencedBootAndCountsAsKept(t *testing.T) {
	ks := newKeepScene(t)
	f := ks.record(t).Fences
	if len(f) != 1 || f[0].BootID != ks.bootA || !f[0].Live() || f[0].Addr != ks.addr || f[0].RenewedBy != "node-b" || !f[0].Made {
		t.Fatalf("fences %+v; want one live fence of %s with boot id %s, made by this project", f, ks.addr, ks.bootA)
	}
	if until, ok := ks.m.BlocklistedUntil(ks.addr); !ok || !until.Equal(f[0].Expires) {
		t.Fatalf("listed until %s (%v), recorded %s", until, ok, f[0].Expires)
	}
	if ks.b.Due(ks.img, ks.record(t)) {
		t.Fatal("a fence just made is due for a check")
	}
	ks.clk.Advance(ks.b.checkEvery() - time.Millisecond)
	if ks.b.Due(ks.img, ks.record(t)) {
		t.Fatal("due before half a fence check")
	}
	ks.clk.Advance(time.Millisecond)
	if !ks.b.Due(ks.img, ks.record(t)) {
		t.Fatal("not due after half a fence check")
	}
}

// TestKeepFencesSendsNothingWhileTheEntryIsInForce: a due check of an entry in force reads the
// listing and adds nothing; at once after, nothing is due and nothing is read.
func TestKeepFencesSendsNothingWhileTheEntryIsInForce(t *testing.T) {
	ks := newKeepScene(t)
	ctx := context.Background()
	ks.clk.Advance(ks.b.checkEvery())
	ks.m.Counts(true)
	before := ks.blocks.Load()
	rep, err := ks.b.KeepFences(ctx, ks.img)
	if err != nil || len(rep.Renewed)+len(rep.Faults) != 0 || ks.blocks.Load() != before {
		t.Fatalf("in force: renewed %+v faults %+v (%v), %d blocklist calls", rep.Renewed, rep.Faults, err, ks.blocks.Load()-before)
	}
	if n := ks.m.Counts(true)["blocklist-ls"]; n != 1 {
		t.Fatalf("%d listing reads, want 1", n)
	}
	if len(rep.Live) != 1 || rep.Live[0].Addr != ks.addr {
		t.Fatalf("live %+v", rep.Live)
	}
	if rep, err := ks.b.KeepFences(ctx, ks.img); err != nil || len(rep.Faults) != 0 || ks.m.Counts(true)["blocklist-ls"] != 0 {
		t.Fatalf("just checked: checked again %+v (%v)", rep.Faults, err)
	}
}

// TestAStoreThatNeverCheckedAFenceChecksItAtOnce: another agent (a sweep after a restart, say)
// that has not checked a fence itself does so at its first look, and finds it in force. Its
// first look adds the listed entry once, which changes nothing but has the monitors name their
// clock (an entry's life is not judged on this node's own); later looks add nothing.
func TestAStoreThatNeverCheckedAFenceChecksItAtOnce(t *testing.T) {
	ks := newKeepScene(t)
	c := ks.store(t, "node-c", "boot-c")
	if !c.Due(ks.img, ks.record(t)) {
		t.Fatal("a fence node-c never checked is not due for it")
	}
	before := ks.blocks.Load()
	listed, _ := ks.m.BlocklistedUntil(ks.addr)
	rep, err := c.KeepFences(context.Background(), ks.img)
	if err != nil || len(rep.Faults) != 0 || ks.blocks.Load() != before+1 || c.Due(ks.img, ks.record(t)) {
		t.Fatalf("faults %+v, %v, %d blocklist calls; want none but the one that reads the monitors' clock", rep.Faults, err, ks.blocks.Load()-before)
	}
	if until, _ := ks.m.BlocklistedUntil(ks.addr); !until.Equal(listed) {
		t.Fatalf("the entry's expiry moved from %s to %s", listed, until)
	}
	ks.clk.Advance(keepExpiry / 8) // due again, far from aging
	before = ks.blocks.Load()
	if !c.Due(ks.img, ks.record(t)) {
		t.Fatal("not due again after an eighth of fence_expiry")
	}
	if rep, err := c.KeepFences(context.Background(), ks.img); err != nil || len(rep.Faults) != 0 || ks.blocks.Load() != before {
		t.Fatalf("the next look: faults %+v, %v, %d blocklist calls; want none", rep.Faults, err, ks.blocks.Load()-before)
	}
}

// TestFenceOfARebootedNodeLapses: once node-a's heartbeat shows another boot id, its fence is
// marked gone with the reason and no longer renewed; a heartbeat with the same boot id (node-a
// restarted its agent only) changes nothing.
func TestFenceOfARebootedNodeLapses(t *testing.T) {
	ks := newKeepScene(t)
	ctx := context.Background()
	restarted := ks.store(t, "node-a", ks.bootA) // the agent restarted, not the node
	if err := restarted.Heartbeat(ctx, "rbd", ""); err != nil {
		t.Fatal(err)
	}
	ks.clk.Advance(lease)
	if rep, err := ks.b.KeepFences(ctx, ks.img); err != nil || len(rep.Gone) != 0 || !ks.m.Blocklisted(ks.addr) {
		t.Fatalf("same boot: gone %+v (%v); want it kept", rep.Gone, err)
	}
	rebooted := ks.store(t, "node-a", "boot-a-2")
	if err := rebooted.Heartbeat(ctx, "rbd", ""); err != nil {
		t.Fatal(err)
	}
	ks.clk.Advance(lease)
	n := ks.blocks.Load()
	rep, err := ks.b.KeepFences(ctx, ks.img)
	if err != nil || len(rep.Gone) != 1 || len(rep.Renewed) != 0 || ks.blocks.Load() != n {
		t.Fatalf("rebooted: renewed %+v gone %+v (%v), %d blocklist calls; want it gone, not renewed", rep.Renewed, rep.Gone, err, ks.blocks.Load()-n)
	}
	f := ks.record(t).Fences[0]
	if f.Live() || !strings.Contains(f.Gone, "rebooted") || !strings.Contains(f.Gone, "boot-a-2") {
		t.Fatalf("record: gone %q", f.Gone)
	}
	if len(ks.record(t).LiveFences()) != 0 {
		t.Fatal("a gone fence is still kept")
	}
	// this project listed the entry: it is removed at the next check, and the record says so
	if rep, err := ks.b.KeepFences(ctx, ks.img); err != nil || len(rep.Lifted) != 1 || rep.Lifted[0] != ks.addr {
		t.Fatalf("lifted %+v, %v", rep.Lifted, err)
	}
	if ks.m.Blocklisted(ks.addr) || ks.record(t).Fences[0].LiftedAt.IsZero() || ks.b.Due(ks.img, ks.record(t)) {
		t.Fatal("the entry of a gone fence this project listed was not removed, or not recorded so")
	}
}

// TestFenceGoneByTheFencedNodesReport: node-a's agent reports its fenced mapping unmapped; the
// fence is marked gone (another node's or another address's report changes nothing).
func TestFenceGoneByTheFencedNodesReport(t *testing.T) {
	ks := newKeepScene(t)
	ctx := context.Background()
	for _, c := range []struct{ node, addr string }{{"node-c", ks.addr}, {"node-a", "10.0.0.1:0/999"}} {
		if n, err := ks.a.FenceGone(ctx, ks.img, c.node, c.addr, "unmapped"); err != nil || n != 0 {
			t.Fatalf("report of %s %s: %d marked, %v", c.node, c.addr, n, err)
		}
	}
	v := ks.m.Version(ks.img)
	if n, err := ks.a.FenceGone(ctx, ks.img, "node-a", ks.addr, "node node-a's agent found /dev/rbd0 unmapped"); err != nil || n != 1 {
		t.Fatalf("report: %d marked, %v", n, err)
	}
	if ks.m.Version(ks.img) == v {
		t.Fatal("the report wrote nothing")
	}
	if f := ks.record(t).Fences[0]; f.Live() || f.GoneAt.IsZero() {
		t.Fatalf("fence %+v, want gone", f)
	}
	ks.clk.Advance(keepExpiry / 2)
	if rep, err := ks.b.KeepFences(ctx, ks.img); err != nil || len(rep.Renewed)+len(rep.Live) != 0 {
		t.Fatalf("a gone fence kept: %+v (%v)", rep, err)
	}
}

// TestReleaseKeepsTheFencesAndEndsOnlyItsOwnMappings: a released claim keeps the fences of
// others' mappings (live); the releasing node's own fenced mapping (an admin's fence of it)
// is marked gone, since it releases only once its device is gone.
func TestReleaseKeepsTheFencesAndEndsOnlyItsOwnMappings(t *testing.T) {
	ks := newKeepScene(t)
	ctx := context.Background()
	h := ks.record(t).Holder("node-b")
	if _, err := ks.b.SetMapping(ctx, ks.img, h.Epoch, "10.0.0.2:0/2002", "/dev/rbd3"); err != nil {
		t.Fatal(err)
	}
	if _, err := ks.b.Fence(ctx, ks.img); err != nil { // an admin fences node-b's mapping
		t.Fatal(err)
	}
	if ok, err := ks.b.Release(ctx, ks.img, h.Epoch); err != nil || !ok {
		t.Fatalf("release: %v %v", ok, err)
	}
	rec := ks.record(t)
	if !rec.Free() || len(rec.Fences) != 2 {
		t.Fatalf("after the release: holders %+v fences %+v", rec.Holders, rec.Fences)
	}
	for _, f := range rec.Fences {
		if want := f.NodeID == "node-a"; f.Live() != want {
			t.Fatalf("fence of %s %s: live %v, want %v (%q)", f.NodeID, f.Addr, f.Live(), want, f.Gone)
		}
	}
}

// TestLiveFencesAreNeverTrimmed: a record keeps every live fence however many there are; only
// fences known gone are dropped, oldest first, beyond the history bound.
func TestLiveFencesAreNeverTrimmed(t *testing.T) {
	var r Record
	for i := range record.MaxFences + 4 {
		r.AddFence(Fence{NodeID: "n", Addr: fmt.Sprintf("10.0.0.9:0/%d", i), Gone: map[bool]string{true: "gone"}[i%2 == 0]})
	}
	live := len(r.LiveFences())
	if live != (record.MaxFences+4)/2 {
		t.Fatalf("%d live fences kept of %d", live, (record.MaxFences+4)/2)
	}
	if len(r.Fences) != record.MaxFences {
		t.Fatalf("%d fences kept, want %d (gone ones trimmed)", len(r.Fences), record.MaxFences)
	}
	for i := range record.MaxFences + 4 {
		r.AddFence(Fence{NodeID: "m", Addr: fmt.Sprintf("10.0.0.8:0/%d", i)})
	}
	if got := len(r.LiveFences()); got != live+record.MaxFences+4 {
		t.Fatalf("%d live fences after %d more, want %d", got, record.MaxFences+4, live+record.MaxFences+4)
	}
	r.AddFence(Fence{NodeID: "m", Addr: "10.0.0.8:0/0", Epoch: 9}) // the same mapping fenced again
	if got := len(r.LiveFences()); got != live+record.MaxFences+4 {
		t.Fatalf("a fence made again was added twice: %d", got)
	}
}

// TestIntruderOfARebootedNodeIsDropped: an intruder's fence is kept like a claim's fence, and
// ends when its node's heartbeat shows another boot id.
func TestIntruderOfARebootedNodeIsDropped(t *testing.T) {
	ks := newKeepScene(t)
	ctx := context.Background()
	h := ks.record(t).Holder("node-b")
	if _, err := ks.b.SetMapping(ctx, ks.img, h.Epoch, "10.0.0.2:0/2002", "/dev/rbd3"); err != nil {
		t.Fatal(err)
	}
	c := ks.store(t, "node-c", "boot-c-1")
	res, err := c.Unmanaged(ctx, Unmanaged{Image: ks.img, ClientAddr: "10.0.0.3:0/3003", Device: "/dev/rbd7", OwnClient: true}, FenceIfClaimed)
	if err != nil || res.Intruder == nil || res.Intruder.BootID != "boot-c-1" {
		t.Fatalf("intruder: %+v %v", res, err)
	}
	_ = ks.m.Unblocklist(ctx, "10.0.0.3:0/3003") // removed by someone: put back by the holder's check
	ks.clk.Advance(lease)
	if rep, err := ks.b.KeepFences(ctx, ks.img); err != nil || len(rep.Live) != 2 || len(rep.Faults) != 1 || !rep.Faults[0].Intruder {
		t.Fatalf("kept %+v faults %+v (%v); want node-a's fence and node-c's intruder, put back", rep.Live, rep.Faults, err)
	}
	if until, ok := ks.m.BlocklistedUntil("10.0.0.3:0/3003"); !ok || !until.Equal(ks.clk.Now().Add(keepExpiry)) {
		t.Fatalf("intruder's entry until %s (%v)", until, ok)
	}
	if err := ks.store(t, "node-c", "boot-c-2").Heartbeat(ctx, "rbd", ""); err != nil {
		t.Fatal(err)
	}
	ks.clk.Advance(lease)
	if _, err := ks.b.KeepFences(ctx, ks.img); err != nil {
		t.Fatal(err)
	}
	if in := ks.record(t).Intruders; len(in) != 0 {
		t.Fatalf("intruders %+v after its node rebooted", in)
	}
}

// wholeNodeScene: node-a claimed img without recording a mapping and stopped; node-b took it
// over, fencing node-a's whole address.
func wholeNodeScene(t *testing.T) *keepScene {
	t.Helper()
	ks := &keepScene{m: memory.New("fsid"), clk: &nodeClock{wall: time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)},
		img: Image{Pool: "rbd", Namespace: "ns", Image: "img"}, addr: "10.0.0.1:0/0", bootA: "boot-a-1"}
	ks.m.SetClock(ks.clk.Now)
	ks.m.AddImage(ks.img, "id-img")
	ks.a = ks.store(t, "node-a", ks.bootA)
	ks.b = ks.store(t, "node-b", "boot-b-1")
	ctx := context.Background()
	if _, err := ks.a.Acquire(ctx, Request{Image: ks.img}); err != nil {
		t.Fatal(err)
	}
	for _, d := range []time.Duration{lease / 2, lease/2 + time.Second} {
		if _, err := ks.b.Acquire(ctx, Request{Image: ks.img, Takeover: true}); err == nil {
			t.Fatal("takeover before node-a's lease ran out")
		}
		ks.clk.Advance(d)
	}
	r, err := ks.b.Acquire(ctx, Request{Image: ks.img, Takeover: true})
	if err != nil || len(r.Fenced) != 1 || !r.Fenced[0].WholeNode() {
		t.Fatalf("takeover: %+v, %v; want node-a's whole address fenced", r, err)
	}
	ks.addr = r.Fenced[0].Addr
	return ks
}

// TestUnfenceNodeNeedsARebootOrForce: lifting a node's whole-node fence is refused while its
// heartbeat shows the boot the fence was made against, and nothing changes; once it shows
// another boot id the fence is marked gone, saying so, and the entry removed.
func TestUnfenceNodeNeedsARebootOrForce(t *testing.T) {
	ks := wholeNodeScene(t)
	ctx := context.Background()
	c := ks.store(t, "node-c", "boot-c")
	v := ks.m.Version(ks.img)
	if _, err := c.UnfenceNode(ctx, "node-a", "admin", false); !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("unfence of a node not seen rebooted: %v; want busy, naming --force", err)
	}
	if !ks.m.Blocklisted(ks.addr) || ks.m.Version(ks.img) != v {
		t.Fatal("a refused unfence changed something")
	}
	if _, err := c.UnfenceNode(ctx, "node-z", "admin", true); !errors.Is(err, ErrNoClaim) {
		t.Fatalf("unfence of a node with no fence: %v", err)
	}
	// node-a rebooted (say with a new address, so it could write its heartbeat)
	if err := ks.store(t, "node-a", "boot-a-2").Heartbeat(ctx, "rbd", "ns"); err != nil {
		t.Fatal(err)
	}
	res, err := c.UnfenceNode(ctx, "node-a", "lifted by an admin", false)
	if err != nil || res.Forced || len(res.Lifted) != 1 || res.Lifted[0] != ks.addr {
		t.Fatalf("unfence after a reboot: %+v, %v", res, err)
	}
	if ks.m.Blocklisted(ks.addr) {
		t.Fatal("the whole-node entry is still listed")
	}
	f := ks.record(t).Fences[0]
	if f.Live() || !strings.Contains(f.Gone, "lifted by an admin") || !strings.Contains(f.Gone, "boot-a-2") {
		t.Fatalf("fence gone %q", f.Gone)
	}
}

// TestUnfenceNodeForced: with force, a node not seen rebooted is unfenced, and the result
// says it was forced.
func TestUnfenceNodeForced(t *testing.T) {
	ks := wholeNodeScene(t)
	res, err := ks.b.UnfenceNode(context.Background(), "node-a", "forced by an admin", true)
	if err != nil || !res.Forced || len(res.Fences) != 1 || res.Fences[0].Rebooted != "" {
		t.Fatalf("forced unfence: %+v, %v", res, err)
	}
	if ks.m.Blocklisted(ks.addr) || ks.record(t).Fences[0].Live() {
		t.Fatal("not lifted")
	}
}

// TestAcquireRenewsTheRecordsDueFencesFirst is F6 of docs/safety.md: every keeper of a fence
// was down for longer than its entry's life (node-b, the holder, dead; nobody swept), so the
// entry ran out while node-a's mapping may still exist. node-b's agent comes back and asks for
// its hold again, or another node claims the released image: before its claim is written, the
// claimer blocklists the record's live fences again, and a claimer that cannot is refused.
func TestAcquireRenewsTheRecordsDueFencesFirst(t *testing.T) {
	for _, who := range []string{"node-b restarted", "node-c"} {
		t.Run(who, func(t *testing.T) {
			ks := newKeepScene(t)
			ctx := context.Background()
			if who == "node-c" {
				h := ks.record(t).Holder("node-b")
				if ok, err := ks.b.Release(ctx, ks.img, h.Epoch); err != nil || !ok {
					t.Fatalf("release: %v %v", ok, err)
				}
			}
			ks.clk.Advance(keepExpiry + time.Minute) // every keeper down: the entry ran out
			if ks.m.Blocklisted(ks.addr) {
				t.Fatal("the entry did not run out")
			}
			id := "node-b"
			if who == "node-c" {
				id = "node-c"
			}
			claimer := ks.store(t, id, "boot-"+id+"-2") // a new process: it has renewed nothing
			fail := errors.New("monitors unreachable")
			ks.m.SetHook(func(_ context.Context, call string, _ Image) error {
				if call == "blocklist" {
					return fail
				}
				return nil
			})
			v := ks.m.Version(ks.img)
			if _, err := claimer.Acquire(ctx, Request{Image: ks.img}); !errors.Is(err, fail) {
				t.Fatalf("acquire while the fence cannot be renewed: %v; want it refused", err)
			}
			if ks.m.Version(ks.img) != v {
				t.Fatal("a refused acquire wrote the claim")
			}
			ks.m.SetHook(nil)
			if _, err := claimer.Acquire(ctx, Request{Image: ks.img}); err != nil {
				t.Fatalf("acquire: %v", err)
			}
			if !ks.m.Blocklisted(ks.addr) {
				t.Fatalf("%s claimed without blocklisting node-a's live fence %s again", id, ks.addr)
			}
			if f := ks.record(t).Fences[0]; f.RenewedBy != id || !f.Expires.After(ks.clk.Now()) {
				t.Fatalf("the record's fence: renewed by %q, expires %s", f.RenewedBy, f.Expires)
			}
		})
	}
}

// TestAnEntryPutBackWhileItsFenceEndedIsRemovedAgain is the e2e's race (a CI run, 2026-12-06):
// node-b's keeper read node-a's fence live, node-a's agent then marked it gone and removed its
// entry (this project listed it), and node-b, finding the entry missing, put it back. Its
// record step then finds the fence gone and lifted already: the entry it just added is removed
// again, or nobody ever would.
func TestAnEntryPutBackWhileItsFenceEndedIsRemovedAgain(t *testing.T) {
	ks := newKeepScene(t)
	ctx := context.Background()
	if err := ks.m.Unblocklist(ctx, ks.addr); err != nil { // found missing by node-b's check
		t.Fatal(err)
	}
	var done atomic.Bool
	ks.m.SetHook(func(_ context.Context, call string, _ Image) error {
		if call == "blocklist-ls" && done.CompareAndSwap(false, true) {
			func() { // node-a unmapped: its agent marks the fence gone and lifts it
				if n, err := ks.a.FenceGone(ctx, ks.img, "node-a", ks.addr, "node node-a's agent found its mapping unmapped"); err != nil || n != 1 {
					t.Errorf("fence gone: %d, %v", n, err)
				}
				if _, err := ks.a.KeepFences(ctx, ks.img); err != nil {
					t.Errorf("node-a's lift: %v", err)
				}
			}()
		}
		return nil
	})
	ks.clk.Advance(keepExpiry / 8) // node-b's check is due
	rep, err := ks.b.KeepFences(ctx, ks.img)
	if err != nil {
		t.Fatal(err)
	}
	f := ks.record(t).Fences[0]
	if f.Live() || f.LiftedAt.IsZero() {
		t.Fatalf("the fence: gone %q lifted %s; want it gone and lifted (by node-a)", f.Gone, f.LiftedAt)
	}
	if ks.m.Blocklisted(ks.addr) {
		t.Fatalf("node-b's check left the entry of an ended fence listed (report %+v)", rep)
	}
}
