package saga

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/fault"
	"github.com/rbd-owner/rbd-owner/agent/image"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// TestKeyedLocksForget: entries exist only while held or waited for, and one image's lock
// serialises while others proceed.
func TestKeyedLocksForget(t *testing.T) {
	var k Locks
	bg := context.Background()
	for i := range 100 {
		key := state.Key{Cluster: "c", Ref: image.Ref{Pool: "rbd", Image: fmt.Sprintf("img%d", i)}}
		unlock, err := k.Lock(bg, key)
		if err != nil {
			t.Fatal(err)
		}
		unlock()
		if u, ok := k.TryLock(key); !ok {
			t.Fatalf("tryLock %s after unlock failed", key)
		} else {
			u()
		}
	}
	if n := k.Held(); n != 0 {
		t.Fatalf("%d entries left after every lock was released", n)
	}

	a := state.Key{Cluster: "c", Ref: image.Ref{Pool: "rbd", Image: "a"}}
	b := state.Key{Cluster: "c", Ref: image.Ref{Pool: "rbd", Image: "b"}}
	unlockA, err := k.Lock(bg, a)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := k.TryLock(a); ok {
		t.Fatal("tryLock of a held image succeeded")
	}
	unlockB, err := k.Lock(bg, b) // another image is not blocked
	if err != nil {
		t.Fatal(err)
	}
	unlockB()
	// a waiter whose context ends gives up with a busy error and leaves no entry behind
	ctx, cancel := context.WithCancel(bg)
	cancel()
	if _, err := k.Lock(ctx, a); !errors.Is(err, fault.ErrBusy) {
		t.Fatalf("lock with a dead context: %v, want busy", err)
	}
	// a waiter gets the lock once the holder lets go (ordered by channels, not by time)
	got := make(chan func())
	go func() {
		u, err := k.Lock(bg, a)
		if err != nil {
			t.Error(err)
			close(got)
			return
		}
		got <- u
	}()
	select {
	case <-got:
		t.Fatal("the waiter got a held lock")
	case <-time.After(50 * time.Millisecond): // only a chance to misbehave; no bound is asserted
	}
	unlockA()
	u, ok := <-got
	if !ok {
		t.Fatal("waiter failed")
	}
	u()
	if n := k.Held(); n != 0 {
		t.Fatalf("%d entries left", n)
	}
}

// TestKeyedLocksConcurrent: many goroutines on a few images; the map is empty at the end and
// no two holders of one image overlap.
func TestKeyedLocksConcurrent(t *testing.T) {
	var k Locks
	var wg sync.WaitGroup
	inside := make([]int32, 4)
	var mu sync.Mutex
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				img := (g + i) % len(inside)
				unlock, err := k.Lock(context.Background(), state.Key{Ref: image.Ref{Image: fmt.Sprint(img)}})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				inside[img]++
				n := inside[img]
				mu.Unlock()
				if n != 1 {
					t.Errorf("image %d held by %d at once", img, n)
				}
				runtime.Gosched() // let another goroutine try to get in while this one holds it
				mu.Lock()
				inside[img]--
				mu.Unlock()
				unlock()
			}
		}()
	}
	wg.Wait()
	if n := k.Held(); n != 0 {
		t.Fatalf("%d entries left", n)
	}
}
