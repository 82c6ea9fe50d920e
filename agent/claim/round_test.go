package claim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/claim/memory"
	"github.com/rbd-owner/rbd-owner/agent/claim/record"
)

// roundWait bounds every wait of these tests: far longer than any step takes, so that only a
// call that never comes (a sequence where a round should be) ends one.
const roundWait = 10 * time.Second

// Acquire's first round sends the image's look, the record's read, this node's heartbeat and
// the caller's Durable at once: each of them here waits, in the backend, until all four have
// started. Sent one after the other, the first would wait for ever (here: roundWait).
func TestAcquireSendsItsFirstRoundAtOnce(t *testing.T) {
	m := memory.New("fsid")
	img := Image{Pool: "rbd", Image: "x"}
	m.AddImage(img, "id1")
	s := memNode(t, m, "a", newClock())
	if err := s.Heartbeat(context.Background(), "rbd", ""); err != nil { // known: one write, no read
		t.Fatal(err)
	}
	var (
		mu      sync.Mutex
		started = map[string]bool{}
		all     = make(chan struct{})
	)
	arrive := func(name string) error {
		mu.Lock()
		if !started[name] {
			started[name] = true
			if len(started) == 4 {
				close(all)
			}
		}
		mu.Unlock()
		select {
		case <-all:
			return nil
		case <-time.After(roundWait):
			mu.Lock()
			defer mu.Unlock()
			return fmt.Errorf("%s: only %v started beside it: sent one after the other", name, started)
		}
	}
	first := true
	m.SetHook(func(_ context.Context, call string, _ Image) error {
		mu.Lock()
		wait := first && (call == "image" || call == "read" || call == "write")
		mu.Unlock()
		if !wait {
			return nil
		}
		return arrive(call)
	})
	res, err := s.Acquire(context.Background(), Request{Image: img, Durable: func(context.Context) error {
		err := arrive("durable")
		mu.Lock()
		first = false // the compare-and-set comes after the round
		mu.Unlock()
		return err
	}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Holder.NodeID != "a" || res.Holder.Epoch == 0 {
		t.Fatalf("claim: %+v", res.Holder)
	}
}

// Nothing is written for the claim before Durable returns: no fence of an expired holder, no
// index key, no claim; and a Durable that fails ends Acquire with no claim, no fence, and the
// image not left among this node's holds.
func TestAcquireWritesNothingBeforeDurable(t *testing.T) {
	for _, fail := range []bool{false, true} {
		t.Run(fmt.Sprintf("durable-fails=%v", fail), func(t *testing.T) {
			ctx := context.Background()
			m := memory.New("fsid")
			img := Image{Pool: "rbd", Image: "x"}
			m.AddImage(img, "id1")
			clk := newClock()
			a, b := memNode(t, m, "a", clk), memNode(t, m, "b", clk)
			held, err := a.Acquire(ctx, Request{Image: img})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := a.SetMapping(ctx, img, held.Holder.Epoch, "10.0.0.1:0/1", "/dev/rbd0"); err != nil {
				t.Fatal(err)
			}
			if err := b.Heartbeat(ctx, "rbd", ""); err != nil { // b's listing is known to it
				t.Fatal(err)
			}
			for range 5 { // b watches a's lease run out (a writes no heartbeat meanwhile)
				if _, err := b.Watch(ctx, img); err != nil {
					t.Fatal(err)
				}
				clk.Advance(5 * time.Second)
			}
			before := m.Version(img)
			boom := errors.New("state file: disk full")
			var sawWrite []string
			res, err := b.Acquire(ctx, Request{Image: img, Takeover: true, Durable: func(context.Context) error {
				if m.Blocklisted("10.0.0.1:0/1") {
					sawWrite = append(sawWrite, "a fence")
				}
				if m.Version(img) != before {
					sawWrite = append(sawWrite, "the claim")
				}
				if fail {
					return boom
				}
				return nil
			}})
			if len(sawWrite) > 0 {
				t.Fatalf("written before Durable returned: %v", sawWrite)
			}
			if !fail {
				if err != nil || res.Holder.NodeID != "b" || len(res.Fenced) != 1 {
					t.Fatalf("takeover after Durable: %+v, %v", res, err)
				}
				return
			}
			if !errors.Is(err, boom) {
				t.Fatalf("Durable's error: got %v", err)
			}
			if m.Blocklisted("10.0.0.1:0/1") || m.Version(img) != before {
				t.Fatal("a failed Durable still fenced or claimed")
			}
			if slices.Contains(b.Holds(img.Pool, img.Namespace), img.Image) {
				t.Fatalf("a claim never sent is still among b's holds: %v", b.Holds(img.Pool, img.Namespace))
			}
		})
	}
}

// A refused Acquire drops the image it listed among this node's holds, but never one that was
// listed before (a hold this node has).
func TestRefusedAcquireUnlistsOnlyItsOwnListing(t *testing.T) {
	ctx := context.Background()
	m := memory.New("fsid")
	x, y := Image{Pool: "rbd", Image: "x"}, Image{Pool: "rbd", Image: "y"}
	m.AddImage(x, "id1")
	m.AddImage(y, "id2")
	clk := newClock()
	a, b := memNode(t, m, "a", clk), memNode(t, m, "b", clk)
	if _, err := a.Acquire(ctx, Request{Image: x}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, Request{Image: y}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, Request{Image: x}); !errors.Is(err, ErrClaimedElsewhere) {
		t.Fatalf("x is a's: got %v", err)
	}
	if _, err := b.Acquire(ctx, Request{Image: y, Access: RWX}); err == nil {
		t.Fatal("y asked again with another access: want a refusal")
	}
	if err := b.Heartbeat(ctx, "rbd", ""); err != nil {
		t.Fatal(err)
	}
	if got := b.Holds("rbd", ""); !slices.Equal(got, []string{"y"}) {
		t.Fatalf("b's holds after two refusals: %v, want [y]", got)
	}
}

// Many heartbeats at once in one place share their writes: every caller's hold is listed, and
// none fails its compare against another's write.
func TestHeartbeatsAtOnceShareTheirWrites(t *testing.T) {
	const callers = 64
	ctx := context.Background()
	m := memory.New("fsid")
	m.AddImage(Image{Pool: "rbd", Image: "x"}, "id1")
	s := memNode(t, m, "a", newClock())
	gate := make(chan struct{})
	var wg sync.WaitGroup
	errs := make([]error, callers)
	for i := range callers {
		wg.Go(func() {
			<-gate
			s.NoteHold(Image{Pool: "rbd", Image: fmt.Sprintf("img%02d", i)}, true)
			errs[i] = s.Heartbeat(ctx, "rbd", "")
		})
	}
	m.Counts(true)
	close(gate)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("caller %d: %v", i, err)
		}
	}
	data, _, err := m.Read(ctx, Image{Pool: "rbd"}, record.HeartbeatObject("a"))
	if err != nil {
		t.Fatal(err)
	}
	hb, err := decodeHeartbeat(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(hb.Holds) != callers {
		t.Fatalf("the heartbeat lists %d holds, want %d: %v", len(hb.Holds), callers, hb.Holds)
	}
	if w := m.Counts(false)["write heartbeat"]; w > callers {
		t.Fatalf("%d heartbeat writes for %d callers", w, callers)
	}
}

// Right after the claim, recording the mapping is one compare-and-set against the record the
// claim wrote: no read. Its release after it too.
func TestSetMappingAfterTheClaimIsOneWrite(t *testing.T) {
	ctx := context.Background()
	m := memory.New("fsid")
	img := Image{Pool: "rbd", Image: "x"}
	m.AddImage(img, "id1")
	a := memNode(t, m, "a", newClock())
	res, err := a.Acquire(ctx, Request{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	m.Counts(true)
	rec, err := a.SetMapping(ctx, img, res.Holder.Epoch, "10.0.0.1:0/1", "/dev/rbd0")
	if err != nil {
		t.Fatal(err)
	}
	if h := rec.Holder("a"); h == nil || h.ClientAddr != "10.0.0.1:0/1" {
		t.Fatalf("recorded: %+v", rec.Holders)
	}
	if got := m.Counts(true); got["read claim"] != 0 || got["write claim"] != 1 {
		t.Fatalf("record after the claim: %v, want one claim write and no read", got)
	}
	if ok, err := a.Release(ctx, img, res.Holder.Epoch); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
	if got := m.Counts(false); got["read claim"] != 0 || got["write claim"] != 1 {
		t.Fatalf("release after the record: %v, want one claim write and no read", got)
	}
}

// The record a store last saw is only a guess: changed since by another node, by an admin or
// by another agent of this node, the compare fails or the decision is made again on a fresh
// read, never on the guess.
func TestAGuessedRecordIsNeverTrustedForARefusal(t *testing.T) {
	ctx := context.Background()
	m := memory.New("fsid")
	img := Image{Pool: "rbd", Image: "x"}
	m.AddImage(img, "id1")
	clk := newClock()
	a := memNode(t, m, "a", clk)
	res, err := a.Acquire(ctx, Request{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := a.Release(ctx, img, res.Holder.Epoch); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
	// the agent restarted (a new store of node a) and claimed it again: a's old store last saw
	// it free
	again := memNode(t, m, "a", clk)
	res2, err := again.Acquire(ctx, Request{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.SetMapping(ctx, img, res2.Holder.Epoch, "10.0.0.1:0/2", "/dev/rbd0"); err != nil {
		t.Fatalf("recording on a record guessed free, held in fact: %v", err)
	}
	// an admin fences it behind a's back: the guess says held, the cluster says fenced
	if _, err := again.Fence(ctx, img); err != nil {
		t.Fatal(err)
	}
	var lost *LostError
	if _, err := a.SetMapping(ctx, img, res2.Holder.Epoch, "10.0.0.1:0/3", "/dev/rbd0"); !errors.As(err, &lost) {
		t.Fatalf("recording on a record fenced since it was last seen: want a LostError, got %v", err)
	}
}
