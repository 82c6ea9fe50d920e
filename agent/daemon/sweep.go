package daemon

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// sweepPeriod is how often each pool is swept: the orphan sweep's interval (when it is on), and
// never less often than an eighth of fence_expiry, since the sweep keeps the fences of claims
// nobody holds (a keeper that misses a sweep or two is still well in time).
func (d *Daemon) sweepPeriod() time.Duration {
	p := d.fenceExpiry() / 8
	if d.cfg.SweepsOrphans() && d.cfg.OrphanSweepInterval > 0 {
		p = min(p, d.cfg.OrphanSweepInterval.D())
	}
	return max(p, time.Second)
}

// sweepLoop sweeps the pools this node holds or has held claims in: it keeps the fences of
// every claim listed (free or held: a claim released after a takeover, or whose holder died,
// has nobody else to keep them), and removes the free claims of deleted images when the orphan
// sweep is on. One listing per pool per sweepPeriod, each pool's first at a random point in the
// first period so that the nodes of a cluster spread out, scheduled on the monotonic clock.
// Sweeps run off the loop, one per pool at a time.
func (d *Daemon) sweepLoop(ctx context.Context) {
	period := d.sweepPeriod()
	check := min(period/8, time.Minute)
	tick, stopTick := d.ticker("sweep", check)
	defer stopTick()
	beat := time.NewTicker(d.beatEvery)
	defer beat.Stop()
	next := map[state.Pool]time.Duration{}
	running := map[state.Pool]bool{}
	done := make(chan state.Pool)
	for {
		d.beat("sweep")
		select {
		case <-ctx.Done():
			for len(running) > 0 { // the sweeps end with ctx
				delete(running, <-done)
			}
			return
		case <-beat.C:
		case p := <-done:
			delete(running, p)
		case <-tick:
			now := d.opts.Mono()
			for _, p := range d.state.ClaimPools() {
				if _, ok := next[p]; !ok {
					next[p] = now + time.Duration(rand.Int64N(int64(period))) //nolint:gosec // jitter that spreads sweeps, not a secret
				}
				if running[p] || now < next[p] {
					continue
				}
				running[p], next[p] = true, now+period
				go func() {
					defer func() { done <- p }()
					if _, err := d.sweepPool(ctx, p); err != nil {
						// each failure was logged where it happened; swept again next period
						d.log.WithError(err).WithField("pool", p.Pool).Debug("pool sweep incomplete")
					}
				}()
			}
		}
	}
}

// sweepPool sweeps every namespace of one pool (sweepPlace): the default one, the pool's RBD
// namespaces, and the ones this node holds claims in.
func (d *Daemon) sweepPool(ctx context.Context, p state.Pool) (removed int, err error) {
	cl := d.clusters[p.Cluster]
	if cl == nil {
		return 0, nil // a cluster no longer configured
	}
	ctx, cancel := context.WithTimeout(ctx, max(d.sweepPeriod()/2, time.Minute))
	defer cancel()
	store, err := cl.Claims(ctx)
	if err != nil {
		d.log.WithError(err).WithField("pool", p.Pool).Warn("pool sweep skipped: cluster unavailable; its fences and orphans wait for the next one")
		return 0, err
	}
	var held []string
	for _, m := range d.state.All() {
		if m.Cluster == p.Cluster && m.Pool == p.Pool && m.Namespace != "" {
			held = append(held, m.Namespace)
		}
	}
	nss, err := store.Namespaces(ctx, p.Pool, held...)
	var errs []error
	if err != nil {
		errs = append(errs, err) // the ones known are swept all the same
		d.log.WithError(err).WithField("cluster", p.Cluster).WithField("pool", p.Pool).Warn("pool sweep: the pool's namespaces could not be listed; sweeping the default one and those this node holds claims in")
	}
	for _, ns := range nss {
		n, err := d.sweepPlace(ctx, cl, store, p.Pool, ns)
		removed += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	return removed, errors.Join(errs...)
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
func (d *Daemon) sweepPlace(ctx context.Context, cl *cluster, store *claim.Store, pool, ns string) (removed int, err error) {
	where := livenessPlace(pool, ns)
	key := cl.cfg.ID + "/" + where
	seq, err := store.SweptMark(ctx, pool, ns)
	if err != nil {
		d.log.WithError(err).WithField("cluster", cl.cfg.ID).WithField("place", where).Warn("sweep skipped: the claim index could not be read; retried at the next sweep")
		return 0, err
	}
	if d.sweepMarks.skip(key, seq, d.opts.Mono(), d.sweepPeriod()) {
		// another node keeps this place's free claims' fences now: what this node noted of them
		// at its own last sweep is no longer its to report (rbd_owner_fences_expiring)
		d.forgetKeptIn(cl.cfg.ID, pool, ns)
		return 0, nil
	}
	pl, err := store.ListPlace(ctx, pool, ns, true)
	if err != nil {
		d.log.WithError(err).WithField("cluster", cl.cfg.ID).WithField("place", where).Warn("sweep skipped: the claims could not be listed through the index; retried at the next sweep")
		return 0, err
	}
	errs := pl.Errors
	for _, err := range pl.Errors {
		d.log.WithError(err).WithField("cluster", cl.cfg.ID).WithField("place", where).Warn("pool sweep: a claim could not be read (it is skipped; its fences, if any, are kept by its holder and at claims); retried at the next sweep")
	}
	for i := range pl.Records {
		n, err := d.sweepRecord(ctx, cl, store, &pl.Records[i])
		removed += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	for _, img := range pl.Stale {
		dropped, err := store.DropStaleKey(ctx, img)
		if err != nil {
			errs = append(errs, err)
			d.log.WithError(err).WithField("image", img.String()).Warn("sweep: the index key of a claim that is gone could not be dropped; retried at the next sweep")
		} else if dropped {
			d.log.WithField("image", img.String()).Info("sweep: dropped the index key of a claim that is gone with its image")
		}
	}
	// the mark says the place was swept whole: only when every claim was read and every due
	// renewal made, else the other nodes would skip a sweep that did not keep a fence (F9 of
	// docs/safety.md); they sweep it themselves at their next look
	if len(errs) > 0 {
		return removed, errors.Join(errs...)
	}
	if err := store.MarkSwept(ctx, pool, ns, seq); err != nil {
		return removed, err
	}
	d.sweepMarks.swept(key, seq+1, d.opts.Mono())
	return removed, nil
}

// sweepRecord keeps one listed claim's fences when due, and removes it when it is a free claim
// of a deleted image and the orphan sweep is on.
func (d *Daemon) sweepRecord(ctx context.Context, cl *cluster, store *claim.Store, o *claim.Record) (removed int, err error) {
	due, sweepable := store.Due(o.Ref, o), d.cfg.SweepsOrphans() && o.Free()
	if !due && !sweepable {
		return 0, nil
	}
	orphan, err := store.IsOrphan(ctx, *o)
	if err != nil {
		d.log.WithError(err).WithField("image", o.Ref.String()).Warn("pool sweep: image not checked")
		if due {
			err = errors.Join(err, d.keepFences(ctx, cl, store, o.Ref, o)) // when in doubt, keep
		}
		return 0, err
	}
	if !orphan {
		if due {
			return 0, d.keepFences(ctx, cl, store, o.Ref, o)
		}
		return 0, nil
	}
	// its image is gone by name: but a renamed image, or one moved to the trash, keeps its id
	// and its data, and a fenced mapping of it could write to them: its fences are kept as
	// long as the record lists them live (only a record without any is removed)
	if len(o.Kept()) > 0 {
		if due {
			return 0, d.keepFences(ctx, cl, store, o.Ref, o)
		}
		return 0, nil
	}
	if !sweepable {
		return 0, nil
	}
	ok, err := store.SweepOrphan(ctx, o.Ref)
	if err != nil {
		d.log.WithError(err).WithField("image", o.Ref.String()).Warn("orphan sweep: claim not removed")
		return 0, err
	}
	if !ok {
		return 0, nil
	}
	d.audit.Record(audit.Entry{Event: audit.Release, Result: audit.OK, Cluster: cl.cfg.ID, Pool: o.Pool, Namespace: o.Namespace,
		Image: o.Image, Epoch: o.Epoch,
		Message: fmt.Sprintf("orphan sweep: removed the free claim of deleted image %s (epoch %d)", o.Ref, o.Epoch)})
	return 1, nil
}
