package claim

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

type claimerKey struct{}

// freeShortScene is a keepScene whose image node-b released after its takeover: a free record
// keeping node-a's fence, whose entry someone listed again for ten minutes only.
func freeShortScene(t *testing.T) *keepScene {
	t.Helper()
	ks := newKeepScene(t)
	ctx := context.Background()
	if ok, err := ks.b.Release(ctx, ks.img, ks.record(t).Epoch); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if err := ks.m.Unblocklist(ctx, ks.addr); err != nil {
		t.Fatal(err)
	}
	if _, err := ks.m.Blocklist(ctx, ks.addr, 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	return ks
}

// TestTwoClaimersOfAFreeRecordNeverRemoveAnEntryUnderTheOthersClaim is model/fence.pml's
// swap-after-claim: node-c and node-d claim a free record whose fence's entry is short. node-c
// decides to remove and add it again before its claim; node-d claims meanwhile. node-c's remove
// must not land after node-d's claim: node-d would map and write while node-a's fenced client is
// off the blocklist. With the swap mark node-c writes the mark first, node-d is refused (busy)
// while it lives, and node-c removes, adds and claims.
func TestTwoClaimersOfAFreeRecordNeverRemoveAnEntryUnderTheOthersClaim(t *testing.T) {
	ks := freeShortScene(t)
	c, d := ks.store(t, "node-c", "boot-c-1"), ks.store(t, "node-d", "boot-d-1")
	cctx := context.WithValue(context.Background(), claimerKey{}, "node-c")
	var dErr error
	removes, dTried := 0, false
	ks.m.SetHook(func(ctx context.Context, call string, _ Image) error {
		if call != "unblocklist" || ctx.Value(claimerKey{}) != "node-c" {
			return nil
		}
		removes++
		if !dTried { // node-c is about to remove the entry: node-d claims now
			dTried = true
			_, dErr = d.Acquire(context.Background(), Request{Image: ks.img})
		}
		if rec := ks.record(t); !rec.Free() {
			t.Errorf("node-c removes %s while node %s's claim is written: its mapping would write beside node-a's fenced client", ks.addr, rec.Holders[0].NodeID)
		}
		return nil
	})
	r, err := c.Acquire(cctx, Request{Image: ks.img})
	if err != nil {
		t.Fatalf("node-c's claim: %v", err)
	}
	if !dTried || removes != 1 {
		t.Fatalf("node-c removed the entry %d times (node-d tried: %v); want once", removes, dTried)
	}
	if !errors.Is(dErr, ErrBusy) || !strings.Contains(dErr.Error(), "node-c") {
		t.Fatalf("node-d's claim during node-c's swap: %v; want busy, naming node-c", dErr)
	}
	if until, ok := ks.m.BlocklistedUntil(ks.addr); !ok || until.Sub(ks.clk.Now()) < keepExpiry-time.Second {
		t.Fatalf("after the claim: listed %v until %s; want a whole fence_expiry", ok, until)
	}
	rec := ks.record(t)
	if rec.Swap != nil || rec.Format != FormatVersion || r.Holder.NodeID != "node-c" {
		t.Fatalf("record after the claim: format %d, swap %+v, holder %s; want format %d, no mark, node-c", rec.Format, rec.Swap, r.Holder.NodeID, FormatVersion)
	}
	// node-d was refused, not harmed: it is told to retry, and a retry now is refused as held
	if _, err := d.Acquire(context.Background(), Request{Image: ks.img}); !errors.Is(err, ErrClaimedElsewhere) {
		t.Fatalf("node-d again: %v; want claimed elsewhere", err)
	}
}

// TestAMarkLeftByAStoppedClaimerLapses: node-c stops between its remove and its add (its add
// and its writes fail from then on), leaving its mark and node-a's entry off the blocklist with no
// claim written. node-d is refused while the mark lives (by node-d's own clock from its first
// sight of it), then claims: it adds the entry whole first, and its write drops the mark.
func TestAMarkLeftByAStoppedClaimerLapses(t *testing.T) {
	ks := freeShortScene(t)
	c, d := ks.store(t, "node-c", "boot-c-1"), ks.store(t, "node-d", "boot-d-1")
	cctx := context.WithValue(context.Background(), claimerKey{}, "node-c")
	stopped := false
	ks.m.SetHook(func(ctx context.Context, call string, _ Image) error {
		if ctx.Value(claimerKey{}) != "node-c" {
			return nil
		}
		if call == "unblocklist" {
			stopped = true
			return nil
		}
		if stopped {
			return errors.New("node-c is stopped (test)")
		}
		return nil
	})
	if _, err := c.Acquire(cctx, Request{Image: ks.img}); err == nil {
		t.Fatal("node-c claimed with its add failing")
	}
	rec := ks.record(t)
	if rec.Swap == nil || rec.Swap.Node != "node-c" || rec.Format != SwapFormat || !rec.Free() || ks.m.Blocklisted(ks.addr) {
		t.Fatalf("after node-c stopped: %+v, listed %v; want node-c's mark in format %d, no claim, the entry removed", rec, ks.m.Blocklisted(ks.addr), SwapFormat)
	}
	for _, after := range []time.Duration{0, swapMarkLife - time.Second} {
		ks.clk.Advance(after)
		if _, err := d.Acquire(context.Background(), Request{Image: ks.img}); !errors.Is(err, ErrBusy) {
			t.Fatalf("node-d's claim %s after its first sight of the mark: %v; want busy", after, err)
		}
	}
	ks.clk.Advance(time.Second)
	if _, err := d.Acquire(context.Background(), Request{Image: ks.img}); err != nil {
		t.Fatalf("node-d's claim once the mark lapsed: %v", err)
	}
	if until, ok := ks.m.BlocklistedUntil(ks.addr); !ok || until.Sub(ks.clk.Now()) < keepExpiry-time.Second {
		t.Fatalf("after node-d's claim: listed %v until %s; want added whole before it", ok, until)
	}
	if rec := ks.record(t); rec.Swap != nil || rec.Format != FormatVersion {
		t.Fatalf("node-d's claim left the mark: %+v", rec)
	}
}

// TestAHoldAgainNeverRemovesAnEntryBesideItsOwnMapping: node-b holds the image, mapped, beside
// node-a's fence, whose entry someone listed again for ten minutes; node-a is seen alive. node-b
// maps it again (Acquire of its own hold): its mapping may write, so the short entry is not
// removed (that would leave node-a's client uncut beside it); it stays listed, reported by the
// keepers, and the claim goes on.
func TestAHoldAgainNeverRemovesAnEntryBesideItsOwnMapping(t *testing.T) {
	ks := newKeepScene(t)
	ctx := context.Background()
	if err := ks.m.Unblocklist(ctx, ks.addr); err != nil {
		t.Fatal(err)
	}
	if _, err := ks.m.Blocklist(ctx, ks.addr, 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := ks.a.Heartbeat(ctx, ks.img.Pool, ks.img.Namespace); err != nil { // node-a seen alive
		t.Fatal(err)
	}
	ks.clk.Advance(ks.b.checkEvery()) // its fence due for a check
	ks.m.Counts(true)
	if r, err := ks.b.Acquire(ctx, Request{Image: ks.img}); err != nil || !r.Again {
		t.Fatalf("node-b's hold again: %+v %v", r, err)
	}
	if n := ks.m.Counts(false)["unblocklist"]; n != 0 {
		t.Fatalf("node-b removed entries %d times beside its own mapping", n)
	}
	if until, ok := ks.m.BlocklistedUntil(ks.addr); !ok || until.Sub(ks.clk.Now()) > 10*time.Minute {
		t.Fatalf("listed %v until %s; want the entry left as listed", ok, until)
	}
}

// TestAnAdminFenceOverAShortEntryLengthensItUnderTheMark: node-a's mapping was listed for ten
// minutes (librbd's lock break) when an admin on node-b fences the image: the entry is removed and
// added again whole before the fenced mark is written, under the swap mark (a taker of the fenced
// hold could otherwise claim and map between the remove and the add), and the mark is gone after.
func TestAnAdminFenceOverAShortEntryLengthensItUnderTheMark(t *testing.T) {
	ks := newHeldScene(t)
	ctx := context.Background()
	if _, err := ks.m.Blocklist(ctx, ks.addr, 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	var marked bool
	ks.m.SetHook(func(_ context.Context, call string, _ Image) error {
		if call == "unblocklist" {
			rec, err := ks.a.Inspect(context.Background(), ks.img)
			marked = err == nil && rec.Swap != nil && rec.Swap.Node == "node-b"
		}
		return nil
	})
	res, err := ks.b.Fence(ctx, ks.img)
	if err != nil || len(res.Fences) != 1 {
		t.Fatalf("fence: %+v %v", res, err)
	}
	if !marked {
		t.Fatal("the entry was removed without node-b's swap mark in the record")
	}
	if until, ok := ks.m.BlocklistedUntil(ks.addr); !ok || until.Sub(ks.clk.Now()) < keepExpiry-time.Second {
		t.Fatalf("after the fence: listed %v until %s; want the whole fence_expiry", ok, until)
	}
	if rec := ks.record(t); rec.Swap != nil || rec.Format != FormatVersion || !rec.Holders[0].Fenced {
		t.Fatalf("record after the fence: %+v", rec)
	}
}
