package claim

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/claim/memory"
	"github.com/rbd-owner/rbd-owner/agent/claim/record"
)

// memNode is one node's Store on a shared in-memory cluster.
func memNode(t *testing.T, m *memory.Memory, id string, clk *clock) *Store {
	t.Helper()
	s, err := NewStoreOn(m, Config{Node: Node{ID: id, Hostname: "host-" + id, AgentVersion: "test"}, Lease: 15 * time.Second,
		FenceExpiry: time.Hour, Now: clk.Now, Mono: clk.Mono})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestMemoryVersionSemantics: the in-memory backend keeps RADOS's compare-and-set rules.
func TestMemoryVersionSemantics(t *testing.T) {
	ctx := context.Background()
	m := memory.New("fsid")
	img := Image{Pool: "rbd", Image: "x"}
	m.AddImage(img, "id1")
	if _, err := m.CompareAndWrite(ctx, img, record.ObjectOf(img), 0, []byte("a")); err != nil {
		t.Fatal(err)
	}
	if _, err := m.CompareAndWrite(ctx, img, record.ObjectOf(img), 0, []byte("b")); !errors.Is(err, ErrConflict) {
		t.Fatalf("exclusive create of an existing object: %v", err)
	}
	_, v1, _ := m.Read(ctx, img, record.ObjectOf(img))
	if _, err := m.CompareAndWrite(ctx, img, record.ObjectOf(img), v1+1, []byte("c")); !errors.Is(err, ErrConflict) {
		t.Fatalf("write at a wrong version: %v", err)
	}
	if _, err := m.CompareAndWrite(ctx, img, record.ObjectOf(img), v1, []byte("d")); err != nil {
		t.Fatal(err)
	}
	data, v2, _ := m.Read(ctx, img, record.ObjectOf(img))
	if string(data) != "d" || v2 <= v1 {
		t.Fatalf("after write: %q v%d (was v%d)", data, v2, v1)
	}
	if err := m.CompareAndRemove(ctx, img, record.ObjectOf(img), v1); !errors.Is(err, ErrConflict) {
		t.Fatalf("remove at an old version: %v", err)
	}
	if err := m.CompareAndRemove(ctx, img, record.ObjectOf(img), v2); err != nil {
		t.Fatal(err)
	}
	if d, v, err := m.Read(ctx, img, record.ObjectOf(img)); d != nil || v != 0 || err != nil {
		t.Fatalf("after remove: %q %d %v", d, v, err)
	}
}

// TestMemoryRaceExactlyOneOwner: many nodes acquire one free image at once, round after round;
// exactly one wins each round and every loser is told who.
func TestMemoryRaceExactlyOneOwner(t *testing.T) {
	m := memory.New("fsid")
	clk := newClock()
	img := Image{Pool: "rbd", Image: "race"}
	m.AddImage(img, "id1")
	stores := make([]*Store, 16)
	for i := range stores {
		stores[i] = memNode(t, m, fmt.Sprintf("n%02d", i), clk)
	}
	var lastEpoch uint64
	for round := range 30 {
		var wg sync.WaitGroup
		wins := make(chan *Result, len(stores))
		errs := make(chan error, len(stores))
		for _, s := range stores {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, err := s.Acquire(context.Background(), Request{Image: img})
				if err != nil {
					errs <- err
					return
				}
				wins <- r
			}()
		}
		wg.Wait()
		close(wins)
		close(errs)
		var winners []*Result
		for r := range wins {
			winners = append(winners, r)
		}
		if len(winners) != 1 {
			t.Fatalf("round %d: %d winners", round, len(winners))
		}
		w := winners[0]
		for err := range errs {
			var held *HeldError
			if !errors.As(err, &held) || held.Owner().NodeID != w.Holder.NodeID {
				t.Fatalf("round %d: loser error %v does not name the winner %s", round, err, w.Holder.NodeID)
			}
		}
		if w.Holder.Epoch <= lastEpoch {
			t.Fatalf("round %d: epoch %d did not grow past %d", round, w.Holder.Epoch, lastEpoch)
		}
		lastEpoch = w.Holder.Epoch
		var owner *Store
		for _, s := range stores {
			if s.NodeID() == w.Holder.NodeID {
				owner = s
			}
		}
		if ok, err := owner.Release(context.Background(), img, w.Holder.Epoch); !ok || err != nil {
			t.Fatalf("round %d: release: %v %v", round, ok, err)
		}
	}
}

// TestMemoryTakeoverOnlyAfterExpiryAndFencesFirst: with each node's own clock, a takeover is
// refused while the holder's lease is live on the claimer's clock, and once it is allowed the
// holder's mapping is blocklisted before the record changes hands.
func TestMemoryTakeoverOnlyAfterExpiryAndFencesFirst(t *testing.T) {
	ctx := context.Background()
	m := memory.New("fsid")
	img := Image{Pool: "rbd", Image: "t"}
	m.AddImage(img, "id1")
	clkA, clkB := newClock(), newClock()
	a, b := memNode(t, m, "node-a", clkA), memNode(t, m, "node-b", clkB)
	ra, err := a.Acquire(ctx, Request{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.SetMapping(ctx, img, ra.Holder.Epoch, "10.0.0.1:0/7", "/dev/rbd0"); err != nil {
		t.Fatal(err)
	}
	m.SetWatchers(img, "10.0.0.1:0/7")
	if _, err := b.Acquire(ctx, Request{Image: img, Takeover: true}); !errors.Is(err, ErrClaimedElsewhere) {
		t.Fatalf("takeover of a live lease: %v", err)
	}
	if m.Blocklisted("10.0.0.1:0/7") {
		t.Fatal("a refused takeover fenced the holder")
	}
	var versionAtFence uint64
	m.SetHook(func(_ context.Context, call string, _ Image) error {
		if call == "blocklist" {
			versionAtFence = m.Version(img)
		}
		return nil
	})
	silence(t, b, img, clkB.Advance, 16*time.Second)
	rb, err := b.Acquire(ctx, Request{Image: img, Takeover: true})
	if err != nil {
		t.Fatal(err)
	}
	if !m.Blocklisted("10.0.0.1:0/7") || len(rb.Fenced) != 1 || rb.Holder.Epoch != ra.Holder.Epoch+1 {
		t.Fatalf("takeover: fenced %v, result %+v", m.Blocklisted("10.0.0.1:0/7"), rb)
	}
	if versionAtFence == 0 || versionAtFence == m.Version(img) {
		t.Fatalf("the record changed before the fence (version at fence %d, now %d)", versionAtFence, m.Version(img))
	}
	if _, err := a.Renew(ctx, img, ra.Holder.Epoch); !errors.Is(err, ErrFenced) {
		t.Fatalf("the old holder renewed after the takeover: %v", err)
	}
}

// TestMemoryStalledCluster: a call blocked in the cluster returns when its context ends, and
// other images' calls are not held up by it.
func TestMemoryStalledCluster(t *testing.T) {
	m := memory.New("fsid")
	clk := newClock()
	slow, fast := Image{Pool: "rbd", Image: "slow"}, Image{Pool: "rbd", Image: "fast"}
	m.AddImage(slow, "id1")
	m.AddImage(fast, "id2")
	s := memNode(t, m, "node-a", clk)
	entered := make(chan struct{})
	m.SetHook(func(ctx context.Context, call string, img Image) error {
		if img == slow && call == "image" {
			close(entered)
			<-ctx.Done() // a cluster that never answers
			return ctx.Err()
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { _, err := s.Acquire(ctx, Request{Image: slow}); done <- err }()
	<-entered
	if _, err := s.Acquire(context.Background(), Request{Image: fast}); err != nil {
		t.Fatalf("another image while one call is stalled: %v", err)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("stalled call: %v", err)
	}
}

// TestReleaseOfALostHoldSaysWhy: a release by a node that no longer holds the image releases
// nothing and says why: who holds it now, that an admin force-released it, or that another node
// took it over and has released it since.
func TestReleaseOfALostHoldSaysWhy(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	at := clk.Now().UTC().Format(time.RFC3339)
	for _, tc := range []struct {
		name string
		then func(t *testing.T, b *Store, img Image)
		want string
	}{
		{"held by another", func(t *testing.T, b *Store, img Image) {
			if _, err := b.Acquire(ctx, Request{Image: img, TakeFenced: true}); err != nil {
				t.Fatal(err)
			}
		}, "node nodeB fenced this node's mapping 10.0.0.1:0/7 at " + at + " and node nodeB holds it now (epoch 2)"},
		{"force-released", func(t *testing.T, b *Store, img Image) {
			if _, err := b.ForceRelease(ctx, img); err != nil {
				t.Fatal(err)
			}
		}, "an admin force-released it (rbd-owner release --force) after node nodeB fenced this node's mapping 10.0.0.1:0/7 at " + at},
		{"taken and released since", func(t *testing.T, b *Store, img Image) {
			r, err := b.Acquire(ctx, Request{Image: img, TakeFenced: true})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := b.Release(ctx, img, r.Holder.Epoch); err != nil {
				t.Fatal(err)
			}
		}, "node nodeB fenced this node's mapping 10.0.0.1:0/7 at " + at + ", took it over and has released it since"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := memory.New("fsid")
			img := Image{Pool: "rbd", Image: "x"}
			m.AddImage(img, "id1")
			a, b := memNode(t, m, "nodeA", clk), memNode(t, m, "nodeB", clk)
			r, err := a.Acquire(ctx, Request{Image: img})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := a.SetMapping(ctx, img, r.Holder.Epoch, "10.0.0.1:0/7", "/dev/rbd0"); err != nil {
				t.Fatal(err)
			}
			if _, err := b.Fence(ctx, img); err != nil {
				t.Fatal(err)
			}
			tc.then(t, b, img)
			got, err := a.ReleaseHold(ctx, img, r.Holder.Epoch)
			if err != nil || got.Released || got.NotHeld != tc.want {
				t.Fatalf("release of a lost hold: %+v %v\nwant NotHeld %q", got, err, tc.want)
			}
		})
	}
}
