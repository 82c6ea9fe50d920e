package claim

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// blocklistView is the cluster's blocklist as this store last read it, and the monitors' clock
// as estimated from this store's own fresh entries: one sub-protocol of the fence upkeep, with
// its own lock. A listing serves callers for half a fence check; then the next call reads anew.
type blocklistView struct {
	b     Backend
	now   func() time.Time
	mono  func() time.Duration
	serve func() time.Duration // how long a listing is used: half a fence check

	mu   sync.Mutex
	list listing
	mon  monClock
}

// listing is the cluster's blocklist as this store last read it.
type listing struct {
	entries []BlockEntry
	at      time.Duration // Mono of the read
	ok      bool
}

// monClock estimates the monitors' clock without this node's wall clock: a fresh entry added
// for e is listed until the monitors' now + e, so their now at that add was until - e; from
// there it moves with this process's monotonic clock.
type monClock struct {
	base time.Time
	at   time.Duration
	ok   bool
}

// entries returns the cluster's blocklist as read less than half a fence check ago, reading it
// when there is none: the claims checked in one round share one read, and each round reads
// anew. Callers wait for one read at a time.
func (v *blocklistView) entries(ctx context.Context) ([]BlockEntry, error) {
	entries, _, err := v.read(ctx)
	return entries, err
}

// read is entries, with when (on both clocks) the listing returned was read: a check
// made on it counts from then.
func (v *blocklistView) read(ctx context.Context) ([]BlockEntry, keptAt, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	mono, wall := v.mono(), v.now()
	if v.list.ok && mono-v.list.at < v.serve() {
		return v.list.entries, keptAt{mono: v.list.at, wall: wall.Add(v.list.at - mono)}, nil
	}
	entries, err := v.b.BlocklistEntries(ctx)
	if err != nil {
		return nil, keptAt{}, fmt.Errorf("read the cluster's blocklist: %w", err)
	}
	v.list = listing{entries: entries, at: mono, ok: true}
	return entries, keptAt{mono: mono, wall: wall}, nil
}

// changed forgets the listing: this store just changed the blocklist.
func (v *blocklistView) changed() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.list.ok = false
}

// monKnown says whether this store has read the monitors' clock (from a fresh add of its own);
// until it has, monNow is this node's wall clock, which may be minutes off theirs.
func (v *blocklistView) monKnown() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.mon.ok
}

// monNow is the monitors' clock as this store estimates it (this node's wall clock until it has
// added a fresh entry).
func (v *blocklistView) monNow() time.Time {
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.mon.ok {
		return v.now()
	}
	return v.mon.base.Add(v.mono() - v.mon.at)
}

// learnMonClock notes a fresh entry's expiry (added for expire, the call started at Mono
// before): the monitors' now at the add is until - expire, no earlier than before.
func (v *blocklistView) learnMonClock(until time.Time, expire, before time.Duration) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.mon = monClock{base: until.Add(-expire), at: before, ok: true}
}
