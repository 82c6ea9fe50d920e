package saga

import (
	"context"
	"fmt"
	"sync"

	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// Locks serialises the sagas of one image; different images proceed in parallel. An
// image's entry lives only while someone holds or waits for its lock, so the map does not grow
// with every image the node has ever seen.
type Locks struct {
	mu sync.Mutex
	m  map[state.Key]*keyLock
}

type keyLock struct {
	ch   chan struct{} // holds one token while the lock is held
	refs int           // holders and waiters
}

func (k *Locks) ref(key state.Key) *keyLock {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = map[state.Key]*keyLock{}
	}
	l := k.m[key]
	if l == nil {
		l = &keyLock{ch: make(chan struct{}, 1)}
		k.m[key] = l
	}
	l.refs++
	return l
}

func (k *Locks) unref(key state.Key, l *keyLock) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if l.refs--; l.refs == 0 {
		delete(k.m, key)
	}
}

// Lock waits for the image's lock, at most until ctx ends.
func (k *Locks) Lock(ctx context.Context, key state.Key) (func(), error) {
	l := k.ref(key)
	select {
	case l.ch <- struct{}{}:
		return func() { <-l.ch; k.unref(key, l) }, nil
	case <-ctx.Done():
		k.unref(key, l)
		return nil, fmt.Errorf("%w: another operation on %s is still running", claim.ErrBusy, key)
	}
}

// TryLock takes the lock only if it is free.
func (k *Locks) TryLock(key state.Key) (func(), bool) {
	l := k.ref(key)
	select {
	case l.ch <- struct{}{}:
		return func() { <-l.ch; k.unref(key, l) }, true
	default:
		k.unref(key, l)
		return nil, false
	}
}

// IsHeld says whether someone holds (or waits for) key's lock.
func (k *Locks) IsHeld(key state.Key) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.m[key] != nil
}

// Held is the number of images with an entry (tests).
func (k *Locks) Held() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.m)
}

// Refs is how many hold or wait for an image's lock.
func (k *Locks) Refs(key state.Key) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	if l := k.m[key]; l != nil {
		return l.refs
	}
	return 0
}
