// Package claim is the ownership protocol: one claim record per RBD image, kept in a RADOS
// object in the image's own pool and namespace, and changed only by single atomic RADOS write
// operations that compare and set (exclusive create, or assert-version + write-full). Two
// nodes that read "free" at the same instant cannot both win: the second write fails its
// compare and the loser re-reads the record and sees the winner.
//
// A holder's epoch is its fencing token: it is unique for the life of the record and rises
// at every change of holder. Taking an image from a dead node first blocklists the exact client
// address of that node's mapping (or its host address when no mapping was recorded yet), and
// only then writes the new holder at a higher epoch. Every step is safe to repeat after a crash.
package claim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/ceph/go-ceph/rados"

	"github.com/rbd-owner/rbd-owner/agent/claim/radosbackend"
	"github.com/rbd-owner/rbd-owner/agent/claim/record"
	"github.com/rbd-owner/rbd-owner/agent/config"
)

// Node is who this agent is.
type Node struct {
	ID       string // node_id: the machine-id unless configured
	Hostname string
	// Addr returns the node's current source address toward the monitors (may be nil).
	Addr func() string
	// AgentVersion is recorded in every holder entry.
	AgentVersion string
	// Incarnation is recorded in every holder entry and heartbeat: it changes when the
	// agent's state is lost (see Holder.Incarnation).
	Incarnation string
	// BootID is the node's kernel boot id (/proc/sys/kernel/random/boot_id), recorded in every
	// holder entry and heartbeat: a fence records it, and another one seen later ends it.
	BootID string
}

// Config configures a Store.
type Config struct {
	Node Node
	// Lease is how long a hold lasts without renewal (default DefaultLease).
	Lease time.Duration
	// FenceExpiry is how long a fenced address stays blocklisted (default DefaultFenceExpiry:
	// long enough to outlive the fenced mapping, unlike Ceph's one-hour default).
	FenceExpiry time.Duration
	// FenceCheck is how often a live fence this store keeps is compared with the cluster's
	// blocklist (the renew interval; default a third of Lease): an entry removed by someone
	// else is back within it (enforce.go).
	FenceCheck time.Duration
	// Now is the wall clock, written into records for people (tests); default time.Now.
	Now func() time.Time
	// Mono is this process's monotonic clock, the only clock a lease is judged on (tests give
	// each node its own); default: the time since the store was made.
	Mono func() time.Duration
	// OnSkew, when set, hears of every holder's heartbeat just seen to change: skew is how far
	// its timestamp is ahead of this node's wall clock, or behind it, when that is more than a
	// second ahead or a third of the lease behind; 0 when within those bounds (a skew reported
	// before is gone).
	OnSkew func(node string, skew time.Duration)
	// OnNoticeFailed, when set, hears of every notice that could not be left for a node whose
	// hold this store changed (the change is done; RetryNotices tries again).
	OnNoticeFailed func(err error)
	// OnIndexBuilt, when set, hears of every index migration this store ran (BuildIndex, from
	// the one listing of a namespace): how many claim objects it found and how long it took.
	OnIndexBuilt func(pool, namespace string, found int, took time.Duration)
}

// Defaults, for a Store made without them: the config's, defined there alone
// (config.DefaultLeaseDuration, and config.DefaultFenceExpiry, which says why it is ten years).
const (
	DefaultLease       = time.Duration(config.DefaultLeaseDuration)
	DefaultFenceExpiry = time.Duration(config.DefaultFenceExpiry)
)

// Store reads and changes the claims of one cluster through its Backend.
// It is safe for concurrent use.
type Store struct {
	b    Backend
	fsid string
	cfg  Config
	// afterFence runs after each blocklisting (tests use it to interleave a holder's renewal)
	afterFence func()
	// swapping is held by the one removal of an entry under way (swapTurn); swapWait runs when
	// a lengthening waits for another to end (tests)
	swapping chan struct{}
	swapWait func()
	obs      *Observer
	// book is when this store last checked each live fence it keeps (fencebook.go)
	book *fenceBook
	// swapMu guards swapSeen: the swap marks of other calls seen, by image (swapmark.go)
	swapMu   sync.Mutex
	swapSeen map[Image]swapSighting
	// view is the cluster's blocklist as last read, and the monitors' clock (listing.go)
	view *blocklistView
	// hb writes this node's heartbeats (heartbeats.go)
	hb *heartbeats
	// notices are the notes left for nodes whose holds this store changed (notices.go)
	notices *noticeBox
	// cache is what this store last saw of each image: records and ids (cache.go)
	cache *recordCache
}

// NewStore returns a Store on a RADOS connection (owned by the caller).
func NewStore(conn *rados.Conn, cfg Config) (*Store, error) {
	b, err := radosbackend.New(conn)
	if err != nil {
		return nil, err
	}
	return NewStoreOn(b, cfg)
}

// NewStoreOn returns a Store on any Backend (Memory in tests).
func NewStoreOn(b Backend, cfg Config) (*Store, error) {
	if cfg.Node.ID == "" {
		return nil, errors.New("claim store: node id is empty")
	}
	if cfg.Lease <= 0 {
		cfg.Lease = DefaultLease
	}
	if cfg.Lease < time.Second {
		return nil, fmt.Errorf("claim store: lease %s is shorter than a second", cfg.Lease)
	}
	if cfg.FenceExpiry <= 0 {
		cfg.FenceExpiry = DefaultFenceExpiry
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Mono == nil {
		start := time.Now()
		cfg.Mono = func() time.Duration { return time.Since(start) } // monotonic reading
	}
	s := &Store{b: b, fsid: b.FSID(), cfg: cfg, obs: NewObserver(), swapSeen: map[Image]swapSighting{}, swapping: make(chan struct{}, 1)}
	s.book = &fenceBook{now: cfg.Now, mono: cfg.Mono, checkEvery: s.checkEvery, lookEvery: s.rebootLookEvery, expiry: cfg.FenceExpiry,
		kept: map[string]keptAt{}, silent: map[string]markSeen{}}
	s.hb = newHeartbeats(b, cfg.Node.ID, cfg.Now, s.me)
	s.cache = newRecordCache()
	s.notices = &noticeBox{b: b, self: cfg.Node.ID, now: cfg.Now}
	s.view = &blocklistView{b: b, now: cfg.Now, mono: cfg.Mono, serve: func() time.Duration { return s.fenceCheck() / 2 }}
	return s, nil
}

// FSID is the cluster's fsid.
func (s *Store) FSID() string { return s.fsid }

// NodeID is this agent's node id.
func (s *Store) NodeID() string { return s.cfg.Node.ID }

// Backend is the store's cluster side.
func (s *Store) Backend() Backend { return s.b }

// read returns the record and its object version; (nil, 0, nil) when there is none.
func (s *Store) read(ctx context.Context, img Image) (*Record, uint64, error) {
	r := s.readAt(ctx, img)
	return r.rec, r.ver, r.err
}

func (s *Store) readAt(ctx context.Context, img Image) readResult {
	data, ver, err := s.b.Read(ctx, img, record.ObjectOf(img))
	if err != nil || data == nil {
		return readResult{err: err}
	}
	rec, err := record.Decode(data)
	if err != nil {
		return readResult{err: fmt.Errorf("read claim of %s (object %s): %w", img, record.ObjectOf(img), err)}
	}
	return readResult{rec: rec, ver: ver}
}

// cas writes rec if and only if the object is still at version ver (0: does not exist yet),
// in ONE atomic write. A lost race returns ErrConflict.
func (s *Store) cas(ctx context.Context, img Image, ver uint64, rec *Record) error {
	rec.UpdatedAt = s.cfg.Now().UTC()
	rec.Format = FormatVersion // a legacy record is rewritten in this agent's format
	if rec.Swap != nil {
		rec.Format = SwapFormat // agents before the mark refuse it (swapmark.go)
	}
	data, err := record.Encode(rec)
	if err != nil {
		return fmt.Errorf("write claim of %s: %w", img, err)
	}
	nv, err := s.b.CompareAndWrite(ctx, img, record.ObjectOf(img), ver, data)
	if err != nil {
		s.cache.remember(img, nil, 0) // lost, or its fate unknown: read it again next time
		return err
	}
	s.cache.remember(img, rec, nv)
	return nil
}

// maxAttempts bounds the compare-and-set retries of one operation.
const maxAttempts = 64

// update runs read → decide → compare-and-set until the write wins. decide gets the current
// record (nil when none) and returns the record to write, or nil to write nothing; it may
// run several times and must only look at its arguments (and may fence, which is idempotent).
// A write that creates the claim object, rewrites a record of an older format (which an agent
// from before the index may have left unindexed), or changes the record's image id, indexes the
// claim first (I1), at every attempt: a retry after the object was removed meanwhile, or a
// record of an earlier image of the name (whose key a removal may have taken), is keyed again
// (model/index.pml, variants r and t).
func (s *Store) update(ctx context.Context, img Image, decide func(cur *Record, ver uint64) (*Record, error)) (*Record, error) {
	return s.updateFrom(ctx, img, nil, decide)
}

// updateFrom is update whose first attempt decides on a read made already (first, when not
// nil: Acquire reads the record beside the image); the attempts after a lost race read again.
func (s *Store) updateFrom(ctx context.Context, img Image, first *readResult, decide func(cur *Record, ver uint64) (*Record, error)) (*Record, error) {
	return s.updateOn(ctx, img, first, false, decide)
}

// updateKnown is update whose first attempt decides on the record this store last read or
// wrote, with no read, and lets the compare-and-set say whether it is still the record: one
// round trip where update takes two. Only a write is trusted on that guess: a decision to
// write nothing, or an error, is made again on a fresh read. decide must have no side effect
// (no fence): it may run on a record that is no longer there.
func (s *Store) updateKnown(ctx context.Context, img Image, decide func(cur *Record, ver uint64) (*Record, error)) (*Record, error) {
	return s.updateOn(ctx, img, s.cache.lastSeen(img), true, decide)
}

func (s *Store) updateOn(ctx context.Context, img Image, first *readResult, guess bool, decide func(cur *Record, ver uint64) (*Record, error)) (*Record, error) {
	if err := record.ValidateImage(img); err != nil {
		return nil, err
	}
	for attempt := 0; attempt < maxAttempts; attempt++ {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("claim %s: %w", img, err)
		}
		var r readResult
		guessing := attempt == 0 && first != nil && guess
		if attempt == 0 && first != nil {
			r = *first
		} else {
			r = s.readAt(ctx, img)
		}
		cur, ver, err := r.rec, r.ver, r.err
		if err != nil {
			return nil, err
		}
		if !guessing {
			s.cache.remember(img, cur, ver) // the records this store changes, not every one it lists
		}
		var in *Record
		if cur != nil {
			in = cur.Clone()
		}
		next, err := decide(in, ver)
		if guessing && (err != nil || next == nil) {
			continue // decided on a guess: decide again on what the cluster has
		}
		if err != nil || next == nil {
			return cur, err
		}
		if cur == nil || cur.Format < FormatVersion || next.ImageID != cur.ImageID {
			if err := s.indexAdd(ctx, img); err != nil {
				return nil, fmt.Errorf("no claim written: %w", err)
			}
		}
		err = s.cas(ctx, img, ver, next)
		if err == nil {
			return next, nil
		}
		if !errors.Is(err, ErrConflict) {
			return nil, err
		}
		if guessing {
			continue // the record changed since this store last saw it: read it
		}
		// lost a race: back off a little, at random, so that a crowd spreads out
		time.Sleep(time.Duration(rand.IntN(1+attempt)) * time.Millisecond) //nolint:gosec // jitter, not a secret
	}
	return nil, fmt.Errorf("%w: claim of %s changed %d times in a row while writing", ErrBusy, img, maxAttempts)
}

// inspectImage checks that the image exists and lists its watchers, other than this client:
// one round trip when the image still has the id this store last saw (Backend.ImageInfo).
func (s *Store) inspectImage(ctx context.Context, img Image) (record.ImageInfo, error) {
	known := s.cache.id(img)
	info, err := s.b.ImageInfo(ctx, img, known)
	if err != nil {
		return record.ImageInfo{}, err
	}
	if info.ID != known {
		s.cache.noteID(img, info.ID)
	}
	own := s.b.OwnAddr() // without it every watcher counts, ours too: stricter, never looser
	kept := info.Watchers[:0:0]
	for _, w := range info.Watchers {
		if own == "" || w != own { // a read-only open may watch too; that is us
			kept = append(kept, w)
		}
	}
	info.Watchers = kept
	return info, nil
}

// imageExists says whether img still exists with the given id ("" accepts any id).
func (s *Store) imageExists(ctx context.Context, img Image, id string) (bool, error) {
	got, ok, err := s.b.ImageID(ctx, img)
	if err != nil || !ok {
		return false, err
	}
	return id == "" || got == id, nil
}
