package claim

import (
	"sync"
	"time"
)

// fenceBook is the fence upkeep's memory, under its own lock: when this store last checked each
// live entry it keeps (on both its clocks) and last looked at the fenced node's heartbeat, and
// the heartbeat marks of fenced nodes as first seen (silentFor). It says which entries are due.
type fenceBook struct {
	now        func() time.Time
	mono       func() time.Duration
	checkEvery func() time.Duration // how long a check counts: half a fence check
	lookEvery  func() time.Duration // how often a fenced node's heartbeat is read: half a lease
	expiry     time.Duration        // a fence's life: checks older than it are forgotten

	mu     sync.Mutex
	kept   map[string]keptAt
	silent map[string]markSeen // fenced nodes' heartbeat marks, by place and node
}

// due lists the entries of img that are due for a check, leaving out those in skip.
func (f *fenceBook) due(img Image, entries []entry, skip map[string]time.Time) []entry {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []entry
	for _, e := range entries {
		k := keepKey(img, e)
		if _, done := skip[k]; done {
			continue
		}
		if at, ok := f.kept[k]; f.dueAt(at, ok) {
			out = append(out, e)
		}
	}
	return out
}

// keptAt is when this store last checked an entry, on both its clocks: the monotonic one
// (immune to steps of the wall clock) and the wall clock (which goes on while the machine is
// suspended, when the monotonic one stops); and when it last looked at the fenced node's
// heartbeat (monotonic).
type keptAt struct {
	mono   time.Duration
	wall   time.Time
	looked time.Duration
	looks  bool
}

// dueAt says whether an entry this store last checked at k (ok: it did) is due again: never
// checked by this process, or half a FenceCheck ago by either clock.
func (f *fenceBook) dueAt(k keptAt, ok bool) bool {
	return !ok || f.mono()-k.mono >= f.checkEvery() || f.now().Sub(k.wall) >= f.checkEvery()
}

// markNow records that this store just checked (or made) the entry keyed k.
func (f *fenceBook) markNow(k string) { f.markAt(k, f.mono(), f.now()) }

// markAt records that this store checked the entry keyed k on what it knew at mono and wall
// : a check counts from the time it read the listing, not from when it ended.
func (f *fenceBook) markAt(k string, mono time.Duration, wall time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	at := f.kept[k]
	at.mono, at.wall = mono, wall
	f.kept[k] = at
	f.prune()
}

// markLooked records that this store just read the fenced node's heartbeat for entry k.
func (f *fenceBook) markLooked(k string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	at := f.kept[k]
	at.looked, at.looks = f.mono(), true
	f.kept[k] = at
}

// lookDue says whether the fenced node of entry k is due for a look at its heartbeat.
func (f *fenceBook) lookDue(k string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	at, ok := f.kept[k]
	return !ok || !at.looks || f.mono()-at.looked >= f.lookEvery()
}

// silentFor notes a look at a node's heartbeat mark in a place and says for how long this store
// has seen that same mark there (0 at the first look, or when it changed). A mark changes at
// every heartbeat write and never comes back, so the same one twice means no write in between,
// however far apart the looks (unlike a takeover's lease, which the Observer judges only on
// looks at least once a lease apart, nothing here grants a hold).
// other says that the mark is another agent's under the same node id (another incarnation):
// it neither starts nor ends a silence seen before.
func (f *fenceBook) silentFor(key string, mark Mark, other bool) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.mono()
	if seen, ok := f.silent[key]; ok && (seen.mark == mark || other) {
		return now - seen.since
	}
	if len(f.silent) >= maxKnownIDs {
		clear(f.silent)
	}
	f.silent[key] = markSeen{mark: mark, since: now}
	return 0
}

// markSeen is a heartbeat mark as first seen (silentFor).
type markSeen struct {
	mark  Mark
	since time.Duration
}

// prune forgets renewals older than a fence's life (mu held).
func (f *fenceBook) prune() {
	now := f.mono()
	for k, at := range f.kept {
		if now-at.mono > f.expiry {
			delete(f.kept, k)
		}
	}
}

// entry is one live blocklist entry of a record, fence or intruder, as KeepFences sees it.
type entry struct {
	intruder bool
	node     string
	addr     string
	bootID   string
	inc      string
	at       time.Time // when it was fenced: an entry replaced meanwhile is another fence
	expires  time.Time // as recorded
}

// keepKey names an entry in the store's memory of its own checks.
func keepKey(img Image, e entry) string { return img.String() + "\x00" + e.node + "\x00" + e.addr }
