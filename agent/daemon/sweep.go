package daemon

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/audit"
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
	check := min(period/4, time.Minute)
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
					next[p] = now + time.Duration(rand.Int64N(int64(period)))
				}
				if running[p] || now < next[p] {
					continue
				}
				running[p], next[p] = true, now+period
				go func() {
					defer func() { done <- p }()
					d.sweepPool(ctx, p)
				}()
			}
		}
	}
}

// sweepPool lists one pool's claims, keeps their fences, and removes the free claims of
// deleted images (when the orphan sweep is on).
func (d *Daemon) sweepPool(ctx context.Context, p state.Pool) (removed int, err error) {
	cl := d.clusters[p.Cluster]
	if cl == nil {
		return 0, nil // a cluster no longer configured
	}
	ctx, cancel := context.WithTimeout(ctx, max(d.sweepPeriod()/2, time.Minute))
	defer cancel()
	store, err := cl.claims(ctx)
	if err != nil {
		d.log.WithError(err).WithField("pool", p.Pool).Warn("pool sweep skipped: cluster unavailable; its fences and orphans wait for the next one")
		return 0, err
	}
	recs, errs := store.ListReadable(ctx, p.Pool)
	for _, err := range errs {
		d.log.WithError(err).WithField("cluster", p.Cluster).WithField("pool", p.Pool).Warn("pool sweep: a claim could not be read (it is skipped; its fences, if any, are kept by its holder and at claims); retried at the next sweep")
	}
	for i := range recs {
		o := &recs[i]
		due, sweepable := store.Due(o.Ref, o), d.cfg.SweepsOrphans() && o.Free()
		if !due && !sweepable {
			continue
		}
		orphan, err := store.IsOrphan(ctx, *o)
		if err != nil {
			errs = append(errs, err)
			d.log.WithError(err).WithField("image", o.Ref.String()).Warn("pool sweep: image not checked")
			if due {
				d.keepFences(ctx, cl, store, o.Ref, o) // when in doubt, keep
			}
			continue
		}
		if !orphan {
			if due {
				d.keepFences(ctx, cl, store, o.Ref, o)
			}
			continue
		}
		// its image is gone by name: but a renamed image, or one moved to the trash, keeps its id
		// and its data, and a fenced mapping of it could write to them: its fences are kept as
		// long as the record lists them live (only a record without any is removed)
		if len(o.Kept()) > 0 {
			if due {
				d.keepFences(ctx, cl, store, o.Ref, o)
			}
			continue
		}
		if !sweepable {
			continue
		}
		ok, err := store.SweepOrphan(ctx, o.Ref)
		if err != nil {
			errs = append(errs, err)
			d.log.WithError(err).WithField("image", o.Ref.String()).Warn("orphan sweep: claim not removed")
			continue
		}
		if ok {
			removed++
			d.audit.Record(audit.Entry{Event: audit.Release, Result: audit.OK, Cluster: p.Cluster, Pool: o.Pool, Namespace: o.Namespace,
				Image: o.Image, Epoch: o.Epoch,
				Message: fmt.Sprintf("orphan sweep: removed the free claim of deleted image %s (epoch %d)", o.Ref, o.Epoch)})
		}
	}
	return removed, errors.Join(errs...)
}
