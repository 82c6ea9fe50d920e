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

// sweepLoop removes the free claims of deleted images from the pools this node holds or has
// held claims in: one listing per pool per orphan_sweep_interval, each pool's first sweep at a
// random point in the first interval so that the nodes of a cluster spread out. Sweeps run off
// the loop, one per pool at a time.
func (d *Daemon) sweepLoop(ctx context.Context) {
	period := d.cfg.OrphanSweepInterval.D()
	check := min(period/4, time.Minute)
	tick, stopTick := d.ticker("sweep", check)
	defer stopTick()
	beat := time.NewTicker(d.beatEvery)
	defer beat.Stop()
	next := map[state.Pool]time.Time{}
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
			now := time.Now()
			for _, p := range d.state.ClaimPools() {
				if _, ok := next[p]; !ok {
					next[p] = now.Add(time.Duration(rand.Int64N(int64(period))))
				}
				if running[p] || now.Before(next[p]) {
					continue
				}
				running[p], next[p] = true, now.Add(period)
				go func() {
					defer func() { done <- p }()
					d.sweepPool(ctx, p)
				}()
			}
		}
	}
}

// sweepPool lists one pool's orphaned claims and removes the free ones.
func (d *Daemon) sweepPool(ctx context.Context, p state.Pool) (removed int, err error) {
	cl := d.clusters[p.Cluster]
	if cl == nil {
		return 0, nil // a cluster no longer configured
	}
	ctx, cancel := context.WithTimeout(ctx, max(d.cfg.OrphanSweepInterval.D()/2, time.Minute))
	defer cancel()
	store, err := cl.claims(ctx)
	if err != nil {
		d.log.WithError(err).WithField("pool", p.Pool).Warn("orphan sweep skipped: cluster unavailable")
		return 0, err
	}
	orphans, err := store.Orphans(ctx, p.Pool)
	if err != nil {
		d.log.WithError(err).WithField("cluster", p.Cluster).WithField("pool", p.Pool).Warn("orphan sweep: listing failed")
		return 0, err
	}
	var errs []error
	for _, o := range orphans {
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
