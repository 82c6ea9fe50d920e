package daemon

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// sweeper sweeps the pools this node holds or has held claims in: it keeps the fences of every
// claim listed (free or held: a claim released after a takeover, or whose holder died, has
// nobody else to keep them), and removes the free claims of deleted images when the orphan
// sweep is on. It holds only what a sweep needs; the daemon builds it (New) and runs its loop
// (startLoops).
type sweeper struct {
	clusters map[string]*cluster // the configured clusters, by id (never changed after New)
	state    sweptState          // the pools to sweep, and the namespaces this node holds claims in
	fences   fenceKeeper         // keeps a claim's fences; forgets those of places others sweep
	audit    *audit.Log
	log      *logrus.Logger
	mono     func() time.Duration                                              // Options.Mono
	ticker   func(loop string, every time.Duration) (<-chan time.Time, func()) // Daemon.ticker
	beat     func(loop string)                                                 // Daemon.beat
	period   time.Duration                                                     // sweepPeriod
	orphans  bool                                                              // the orphan sweep is on
	marks    sweepMarks                                                        // the sweeps of each place seen
}

// sweptState is what the sweeper reads of the node's state (a *state.Store).
type sweptState interface {
	ClaimPools() []state.Pool
	All() []state.Mapping
}

// fenceKeeper keeps the fences a claim records (a *fenceUpkeep, fences.go).
type fenceKeeper interface {
	keepFences(ctx context.Context, cl *cluster, store *claim.Store, img claim.Image, rec *claim.Record) error
	forgetKeptIn(cluster, pool, ns string)
}

// sweepPeriod is how often each pool is swept: the orphan sweep's interval (when it is on), and
// never less often than an eighth of fence_expiry, since the sweep keeps the fences of claims
// nobody holds (a keeper that misses a sweep or two is still well in time).
func sweepPeriod(cfg *config.Config, fenceExpiry time.Duration) time.Duration {
	p := fenceExpiry / 8
	if cfg.SweepsOrphans() && cfg.OrphanSweepInterval > 0 {
		p = min(p, cfg.OrphanSweepInterval.D())
	}
	return max(p, time.Second)
}

// loop sweeps each pool once per period, each pool's first at a random point in the first
// period so that the nodes of a cluster spread out, scheduled on the monotonic clock. Sweeps run
// off the loop, one per pool at a time; the loop owns them and waits for them when ctx ends. It
// beats every beatEvery.
func (s *sweeper) loop(ctx context.Context, beatEvery time.Duration) {
	tick, stopTick := s.ticker("sweep", min(s.period/8, time.Minute))
	defer stopTick()
	beat := time.NewTicker(beatEvery)
	defer beat.Stop()
	plan := newSweepPlan(s.period)
	for {
		s.beat("sweep")
		select {
		case <-ctx.Done():
			plan.wait() // the sweeps end with ctx
			return
		case <-beat.C:
		case p := <-plan.done:
			delete(plan.running, p)
		case <-tick:
			s.round(ctx, plan)
		}
	}
}

// round starts a sweep of every pool due and not being swept.
func (s *sweeper) round(ctx context.Context, plan *sweepPlan) {
	for _, p := range plan.due(s.state.ClaimPools(), s.mono()) {
		go func() {
			defer func() { plan.done <- p }()
			if _, err := s.sweepPool(ctx, p); err != nil {
				// each failure was logged where it happened; swept again next period
				s.log.WithError(err).WithField("pool", p.Pool).Debug("pool sweep incomplete")
			}
		}()
	}
}

// sweepPlan is the loop's schedule: when each pool is next due (Mono) and which are being
// swept. Only the loop's goroutine touches it; a sweep reports its end on done.
type sweepPlan struct {
	period  time.Duration
	next    map[state.Pool]time.Duration
	running map[state.Pool]bool
	done    chan state.Pool
}

func newSweepPlan(period time.Duration) *sweepPlan {
	return &sweepPlan{period: period, next: map[state.Pool]time.Duration{}, running: map[state.Pool]bool{}, done: make(chan state.Pool)}
}

// due returns the pools of pools due at now and not being swept, and marks them running and
// next due a period from now. A pool seen for the first time is due at a random point of the
// first period.
func (sp *sweepPlan) due(pools []state.Pool, now time.Duration) []state.Pool {
	var out []state.Pool
	for _, p := range pools {
		if _, ok := sp.next[p]; !ok {
			sp.next[p] = now + time.Duration(rand.Int64N(int64(sp.period))) //nolint:gosec // jitter that spreads sweeps, not a secret
		}
		if sp.running[p] || now < sp.next[p] {
			continue
		}
		sp.running[p], sp.next[p] = true, now+sp.period
		out = append(out, p)
	}
	return out
}

// wait waits for the sweeps running to end.
func (sp *sweepPlan) wait() {
	for len(sp.running) > 0 {
		delete(sp.running, <-sp.done)
	}
}

// sweepPool sweeps every namespace of one pool (sweepPlace): the default one, the pool's RBD
// namespaces, and the ones this node holds claims in.
func (s *sweeper) sweepPool(ctx context.Context, p state.Pool) (removed int, err error) {
	cl := s.clusters[p.Cluster]
	if cl == nil {
		return 0, nil // a cluster no longer configured
	}
	ctx, cancel := context.WithTimeout(ctx, max(s.period/2, time.Minute))
	defer cancel()
	store, err := cl.Claims(ctx)
	if err != nil {
		s.log.WithError(err).WithField("pool", p.Pool).Warn("pool sweep skipped: cluster unavailable; its fences and orphans wait for the next one")
		return 0, err
	}
	nss, err := store.Namespaces(ctx, p.Pool, s.heldNamespaces(p)...)
	var errs []error
	if err != nil {
		errs = append(errs, err) // the ones known are swept all the same
		s.log.WithError(err).WithField("cluster", p.Cluster).WithField("pool", p.Pool).Warn("pool sweep: the pool's namespaces could not be listed; sweeping the default one and those this node holds claims in")
	}
	for _, ns := range nss {
		n, err := s.sweepPlace(ctx, cl, store, p.Pool, ns)
		removed += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	return removed, errors.Join(errs...)
}

// heldNamespaces are the RBD namespaces of p this node's state names a mapping in.
func (s *sweeper) heldNamespaces(p state.Pool) []string {
	var held []string
	for _, m := range s.state.All() {
		if m.Cluster == p.Cluster && m.Pool == p.Pool && m.Namespace != "" {
			held = append(held, m.Namespace)
		}
	}
	return held
}

// sweepMarks remembers, per place, the sweep sequence this node saw at its last look and when
// (Mono): a place another node swept since that look (made about a period ago) is skipped, so
// that a fleet sweeps each place about once per period between its nodes, not each node once.
type sweepMarks struct {
	mu   sync.Mutex
	seen map[string]sweepSeen
}

type sweepSeen struct {
	seq uint64
	at  time.Duration
}

// skip records a look at key's mark seq at now, and says whether another node swept it since
// this node's last look, at most a period and an eighth ago (its looks come a period apart,
// give or take the loop's tick of an eighth): a node whose last look is older, or that has none
// (it just started), sweeps. So some live node sweeps each place at least every 2¼ periods.
func (s *sweepMarks) skip(key string, seq uint64, now, period time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen == nil {
		s.seen = map[string]sweepSeen{}
	}
	prev, ok := s.seen[key]
	s.seen[key] = sweepSeen{seq: seq, at: now}
	return ok && prev.seq != seq && now-prev.at <= period+period/8
}

// swept records that this node swept key, leaving the mark at seq.
func (s *sweepMarks) swept(key string, seq uint64, now time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seen[key] = sweepSeen{seq: seq, at: now}
}

// sweepPlace sweeps one pool and namespace through its claim index (never a listing, but the
// index's one-time build): it keeps the fences of every claim, free or held, removes the free
// claims of deleted images (when the orphan sweep is on) and the index keys of claims that are
// gone with their images, and records the sweep. It does nothing when another node swept the
// place since this node's last look.
func (s *sweeper) sweepPlace(ctx context.Context, cl *cluster, store *claim.Store, pool, ns string) (removed int, err error) {
	where := livenessPlace(pool, ns)
	key := cl.cfg.ID + "/" + where
	seq, err := store.SweptMark(ctx, pool, ns)
	if err != nil {
		s.log.WithError(err).WithField("cluster", cl.cfg.ID).WithField("place", where).Warn("sweep skipped: the claim index could not be read; retried at the next sweep")
		return 0, err
	}
	if s.marks.skip(key, seq, s.mono(), s.period) {
		// another node keeps this place's free claims' fences now: what this node noted of them
		// at its own last sweep is no longer its to report (rbd_owner_fences_expiring)
		s.fences.forgetKeptIn(cl.cfg.ID, pool, ns)
		return 0, nil
	}
	pl, err := store.ListPlace(ctx, pool, ns, true)
	if err != nil {
		s.log.WithError(err).WithField("cluster", cl.cfg.ID).WithField("place", where).Warn("sweep skipped: the claims could not be listed through the index; retried at the next sweep")
		return 0, err
	}
	removed, errs := s.sweepRecords(ctx, cl, store, where, &pl)
	errs = append(errs, s.dropStale(ctx, store, pl.Stale)...)
	// the mark says the place was swept whole: only when every claim was read and every due
	// renewal made, else the other nodes would skip a sweep that did not keep a fence (F9 of
	// docs/safety.md); they sweep it themselves at their next look
	if len(errs) > 0 {
		return removed, errors.Join(errs...)
	}
	if err := store.MarkSwept(ctx, pool, ns, seq); err != nil {
		return removed, err
	}
	s.marks.swept(key, seq+1, s.mono())
	return removed, nil
}

// sweepRecords reports the claims of a place's listing that could not be read, and sweeps each
// one read (sweepRecord); it returns how many it removed and every error.
func (s *sweeper) sweepRecords(ctx context.Context, cl *cluster, store *claim.Store, where string, pl *claim.PlaceList) (removed int, errs []error) {
	errs = append(errs, pl.Errors...)
	for _, err := range pl.Errors {
		s.log.WithError(err).WithField("cluster", cl.cfg.ID).WithField("place", where).Warn("pool sweep: a claim could not be read (it is skipped; its fences, if any, are kept by its holder and at claims); retried at the next sweep")
	}
	for i := range pl.Records {
		n, err := s.sweepRecord(ctx, cl, store, &pl.Records[i])
		removed += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	return removed, errs
}

// dropStale drops the index keys of claims that are gone with their images.
func (s *sweeper) dropStale(ctx context.Context, store *claim.Store, stale []claim.Image) (errs []error) {
	for _, img := range stale {
		dropped, err := store.DropStaleKey(ctx, img)
		if err != nil {
			errs = append(errs, err)
			s.log.WithError(err).WithField("image", img.String()).Warn("sweep: the index key of a claim that is gone could not be dropped; retried at the next sweep")
		} else if dropped {
			s.log.WithField("image", img.String()).Info("sweep: dropped the index key of a claim that is gone with its image")
		}
	}
	return errs
}

// sweepRecord keeps one listed claim's fences when due, and removes it when it is a free claim
// of a deleted image and the orphan sweep is on.
func (s *sweeper) sweepRecord(ctx context.Context, cl *cluster, store *claim.Store, o *claim.Record) (removed int, err error) {
	due, sweepable := store.Due(o.Ref, o), s.orphans && o.Free()
	if !due && !sweepable {
		return 0, nil
	}
	keep := func() error { // the record's fences, when due
		if !due {
			return nil
		}
		return s.fences.keepFences(ctx, cl, store, o.Ref, o)
	}
	orphan, err := store.IsOrphan(ctx, *o)
	if err != nil {
		s.log.WithError(err).WithField("image", o.Ref.String()).Warn("pool sweep: image not checked")
		if due {
			err = errors.Join(err, keep()) // when in doubt, keep
		}
		return 0, err
	}
	// its image is gone by name: but a renamed image, or one moved to the trash, keeps its id
	// and its data, and a fenced mapping of it could write to them: its fences are kept as
	// long as the record lists them live (only a record without any is removed)
	if !orphan || len(o.Kept()) > 0 {
		return 0, keep()
	}
	if !sweepable {
		return 0, nil
	}
	ok, err := store.SweepOrphan(ctx, o.Ref)
	if err != nil {
		s.log.WithError(err).WithField("image", o.Ref.String()).Warn("orphan sweep: claim not removed")
		return 0, err
	}
	if !ok {
		return 0, nil
	}
	s.audit.Record(audit.Entry{Event: audit.Release, Result: audit.OK, Cluster: cl.cfg.ID, Pool: o.Pool, Namespace: o.Namespace,
		Image: o.Image, Epoch: o.Epoch,
		Message: fmt.Sprintf("orphan sweep: removed the free claim of deleted image %s (epoch %d)", o.Ref, o.Epoch)})
	return 1, nil
}
