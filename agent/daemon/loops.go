package daemon

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/devwatch"
	"github.com/rbd-owner/rbd-owner/agent/fault"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// The agent's loops. Each only decides and hands the work to goroutines it does not wait on,
// so none of them is ever held up by a cluster, the kernel or an API call, and each beats once
// a second: the systemd watchdog is pinged only while every loop beats ("the agent's loops are
// alive"). A slow or stalled cluster shows in status and the journal; it does not stop a loop.
//
//	main        device events (and restarting the device watcher), status for systemd
//	reconcile   every renew interval: persisted state against the kernel's devices
//	renew <id>  one per cluster: a heartbeat per pool and namespace held, each on its own
//	            schedule; every renew interval a round of claim checks, concurrent within
//	            renewConcurrency, each bounded by the renew interval

// renewConcurrency bounds the renewals of one cluster in flight at once.
const renewConcurrency = 8

// loopBeats is when each loop last beat: the watchdog's evidence that none is stuck.
type loopBeats struct {
	mu sync.Mutex
	at map[string]time.Time
}

// beat records that the loop named name is alive.
func (d *Daemon) beat(name string) {
	d.beats.mu.Lock()
	defer d.beats.mu.Unlock()
	if d.beats.at == nil {
		d.beats.at = map[string]time.Time{}
	}
	d.beats.at[name] = time.Now()
}

// stalest returns the loop that beat longest ago, and how long ago.
func (d *Daemon) stalest() (string, time.Duration) {
	d.beats.mu.Lock()
	defer d.beats.mu.Unlock()
	names := make([]string, 0, len(d.beats.at))
	for n := range d.beats.at {
		names = append(names, n)
	}
	sort.Strings(names)
	worst, age := "", time.Duration(0)
	for _, n := range names {
		if a := time.Since(d.beats.at[n]); a > age || worst == "" {
			worst, age = n, a
		}
	}
	return worst, age
}

// mainLoop follows device events and feeds systemd's status. It owns watcher.
func (d *Daemon) mainLoop(ctx context.Context, watcher *devwatch.Watcher) {
	defer func() {
		if err := watcher.Close(); err != nil {
			d.log.WithError(err).Warn("device watcher did not close cleanly")
		}
	}()
	beat := time.NewTicker(d.beatEvery)
	defer beat.Stop()
	events := watcher.Events()
	for n := 0; ; n++ {
		d.beat("main")
		select {
		case <-ctx.Done():
			return
		case <-beat.C:
			if events == nil && n%5 == 0 { // the watcher died: start a new one (it resyncs from sysfs)
				if w, err := devwatch.Start(ctx, d.watchConfig()); err == nil {
					if err := watcher.Close(); err != nil {
						d.log.WithError(err).Warn("the old device watcher did not close cleanly")
					}
					watcher, events = w, w.Events()
					d.log.Info("device watcher restarted")
				} else {
					d.log.WithError(err).Error("device watcher restart failed")
				}
			}
			if n%10 == 0 {
				d.notify(d.statusLine())
			}
		case ev, ok := <-events:
			if !ok {
				d.log.Error("device watcher stopped; restarting it")
				events = nil
				continue
			}
			d.deviceEvent(ctx, ev)
		}
	}
}

// reconcileLoop compares the persisted state with the kernel every renew interval. The
// comparison (which reads every device's sysfs: seconds on a busy node with many devices) runs
// beside the loop, so the loop beats whatever the kernel's pace; the loop takes the next tick
// only once that round is over (ticks meanwhile are dropped), so rounds never overlap.
func (d *Daemon) reconcileLoop(ctx context.Context) {
	tick, stopTick := d.ticker("reconcile", d.cfg.RenewInterval.D())
	defer stopTick()
	beat := time.NewTicker(d.beatEvery)
	defer beat.Stop()
	var round chan struct{} // closed when the round in flight is over; nil when none is
	defer func() {
		if round != nil {
			<-round
		}
	}()
	for {
		d.beat("reconcile")
		ticks := tick
		if round != nil {
			ticks = nil
		}
		select {
		case <-ctx.Done():
			return
		case <-beat.C:
		case <-round:
			round = nil
		case <-ticks:
			done := make(chan struct{})
			round = done
			go func() {
				defer close(done)
				d.reconcile(ctx)
			}()
		}
	}
}

// renewLoop keeps the leases held on one cluster: it runs a heartbeat per place this node holds
// claims in (heartbeats: each on its own schedule, never waiting for anything below), and every
// renew interval a round of claim checks and of takeover watches, started at once. A round
// still running at the next tick (a cluster that does not answer) is not joined by another:
// its calls are bounded and report themselves.
func (d *Daemon) renewLoop(ctx context.Context, cl *cluster) {
	name := "renew " + cl.cfg.ID
	tick, stopTick := d.ticker(name, d.cfg.RenewInterval.D())
	defer stopTick()
	beat := time.NewTicker(d.beatEvery)
	defer beat.Stop()
	hb := newHeartbeats(d, cl)
	defer hb.stop()
	var round sync.WaitGroup
	defer round.Wait()
	busy := make(chan struct{}, 1)
	var since time.Time // when the round in flight started (only this goroutine touches it)
	start := func() {
		select {
		case busy <- struct{}{}:
			since = time.Now()
		default:
			// the cluster has not answered the last round yet: say so where people look
			msg := fmt.Sprintf("claim not checked: cluster %s has not answered the checks started %s ago", cl.cfg.ID, time.Since(since).Round(time.Second))
			d.log.WithField("cluster", cl.cfg.ID).Warn("the previous round of claim checks is still waiting for the cluster; skipping this one")
			for _, keys := range d.held(cl.cfg.ID) {
				for _, k := range keys {
					if d.problem(k) == "" {
						d.setProblem(k, msg)
					}
				}
			}
			return
		}
		round.Add(1)
		go func() {
			defer round.Done()
			defer func() { <-busy }()
			d.renewRound(ctx, cl)
		}()
	}
	hb.sync(ctx)
	start()
	for {
		d.beat(name)
		select {
		case <-ctx.Done():
			return
		case <-beat.C:
			hb.sync(ctx)
		case <-tick:
			hb.sync(ctx)
			start()
		}
	}
}

// renewRound refreshes the takeover watches of cl (watchRound), then checks this node's claims
// on cl as checks.go says: this node's notices read once per place held in, and only the claims
// they name, the ones due for their slow check, and the few that need a look every round read,
// concurrent within renewConcurrency, each bounded by the renew interval. The heartbeats are not
// here: each place has its own (heartbeats).
func (d *Daemon) renewRound(ctx context.Context, cl *cluster) {
	ms := d.node.Held(cl.cfg.ID)
	held := map[state.Key]bool{}
	for _, m := range ms {
		held[m.Key] = true
	}
	d.checks.keep(held)
	unsettled := d.unsettled.pending(cl.cfg.ID)
	if len(ms) == 0 && !unsettled && len(d.watches.due(cl.cfg.ID, time.Now())) == 0 {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, d.cfg.RenewInterval.D())
	store, err := cl.Claims(cctx)
	cancel()
	if err != nil {
		for _, m := range ms {
			d.setProblem(m.Key, "claim not checked: "+err.Error())
		}
		return
	}
	if unsettled {
		d.resettle(ctx, cl, store)
	}
	d.watchRound(ctx, cl, store)
	nctx, cancel := context.WithTimeout(ctx, d.cfg.RenewInterval.D())
	if left, errs := store.RetryNotices(nctx); len(errs) > 0 {
		d.log.WithError(errors.Join(errs...)).WithField("cluster", cl.cfg.ID).WithField("pending", left).Warn("notices of changed holds still not written; tried again next round")
	}
	cancel()
	notices := d.readNotices(ctx, cl, store, ms)
	now := d.opts.Mono()
	var due []state.Mapping
	slow := map[state.Key]bool{} // due for the slow check itself: its watchers are read too
	for _, m := range ms {
		everyRound := d.isLost(m.Key) || d.problem(m.Key) != "" || d.keepsFences(cl.cfg.ID, m.Ref.Head())
		if d.checks.due(m, now, false, false) {
			slow[m.Key] = true
		}
		if d.checks.due(m, now, notices[place{m.Pool, m.Namespace}].noticed(m), everyRound) {
			due = append(due, m)
		}
	}
	var mu sync.Mutex
	read := map[state.Key]bool{} // claims read and judged this round
	eachBounded(renewConcurrency, due, func(m state.Mapping) {
		if d.checkClaim(ctx, cl, store, m, slow[m.Key]) {
			d.checks.checked(m.Key, d.opts.Mono(), d.claimCheckInterval())
			mu.Lock()
			read[m.Key] = true
			mu.Unlock()
		}
	})
	d.clearNotices(ctx, cl, store, notices, read, ms)
}

// checkWatchers reports, at warning priority and in a metric, the watchers of a held image that
// no holder's mapping explains: another client mapping or opening it outside rbd-owner, from
// anywhere (an rbd-nbd or librbd client, a krbd mapping on a node without the agent). Read at
// the slow claim check only: two reads of the image per claim_check_interval, never per round.
func (d *Daemon) checkWatchers(ctx context.Context, cl *cluster, store *claim.Store, m state.Mapping, rec *claim.Record) {
	wctx, cancel := context.WithTimeout(ctx, d.cfg.RenewInterval.D())
	defer cancel()
	w, err := store.Unexplained(wctx, m.Ref.Head(), rec)
	if err == nil && len(w) > 0 {
		d.metrics.UnexplainedWatchers(cl.cfg.ID, len(w))
		d.log.WithFields(logrus.Fields{"image": m.Key.String(), "device": m.Device, "watchers": strings.Join(w, ",")}).
			Warn(fmt.Sprintf("%s, which this node holds, has watchers no claim explains: %s; another client maps or opens it outside rbd-owner (an rbd-nbd or librbd client, or a node without the agent): find it with `rbd status %s` and stop it", m.Key, strings.Join(w, ", "), m.Ref.Head()))
	}
	if err != nil && ctx.Err() == nil {
		d.log.WithError(err).WithField("image", m.Key.String()).Warn("the watchers of a held image could not be read at its slow check; read again at the next one")
	}
}

// claimCheckInterval is claim_check_interval (its default when unset), at least a renew
// interval.
func (d *Daemon) claimCheckInterval() time.Duration {
	c := d.cfg.ClaimCheckInterval.D()
	if c <= 0 {
		c = config.DefaultClaimCheckInterval.D()
	}
	return max(c, d.cfg.RenewInterval.D())
}

// eachBounded runs f on every item, at most n at once, and returns once all are done.
func eachBounded[T any](n int, items []T, f func(T)) {
	sem := make(chan struct{}, n)
	var wg sync.WaitGroup
	for _, it := range items {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			f(it)
		}()
	}
	wg.Wait()
}

// heartbeat renews this node's liveness in one pool and namespace; a failure is a problem of
// every claim held there (its lease will run out for the others' observers).
func (d *Daemon) heartbeat(ctx context.Context, cl *cluster, store *claim.Store, pool, ns string, keys []state.Key) {
	hctx, cancel := context.WithTimeout(ctx, d.heartbeatTimeout())
	err := store.Heartbeat(hctx, pool, ns)
	cancel()
	d.metrics.Liveness(cl.cfg.ID, livenessPlace(pool, ns), err)
	d.node.SetPlaceFailing(cl.cfg.ID, pool, ns, err != nil)
	if err == nil {
		d.renewed.Add(1)
		return
	}
	msg := "lease not renewed: " + err.Error()
	if fault.Is(err, fault.Timeout) || fault.Is(err, fault.Unavailable) {
		msg = fmt.Sprintf("lease not renewed: cluster %s did not answer within %s: %v", cl.cfg.ID, d.heartbeatTimeout(), err)
	}
	for _, k := range keys {
		if d.problem(k) != msg {
			d.log.WithError(err).WithField("image", k.String()).Warn("lease not renewed")
		}
		d.setProblem(k, msg)
	}
}

// recordMapping records a mapped device's client address that its claim lacks: a map
// interrupted after its persist, before its record (docs/safety.md, invariant 7). Until it is
// recorded a takeover would fence the whole node. A failure is a problem of the mapping (so
// its claim is checked again every round); it returns whether the client is recorded.
func (d *Daemon) recordMapping(ctx context.Context, store *claim.Store, m state.Mapping) bool {
	log := d.log.WithField("image", m.Key.String()).WithField("device", m.Device).WithField("client_addr", m.ClientAddr)
	rctx, cancel := context.WithTimeout(ctx, d.cfg.RenewInterval.D())
	defer cancel()
	if _, err := store.SetMapping(rctx, m.Ref.Head(), m.Epoch, m.ClientAddr, m.Device); err != nil {
		msg := "the claim does not name this mapping's client, so a takeover would fence the whole node; recording it failed, tried again next round: " + err.Error()
		if d.problem(m.Key) != msg {
			log.WithError(err).Warn("the claim does not name this mapping's client; recording it failed, tried again next round")
		}
		d.setProblem(m.Key, msg)
		return false
	}
	log.Info("recorded in the claim the client of a mapping whose map was interrupted")
	return true
}

// checkClaim reads one claim: a claim that is no longer this node's is reported (status,
// journal at error priority) and its device left alone: unmapping a file system in use is
// never the agent's call. It returns whether the claim could be read.
func (d *Daemon) checkClaim(ctx context.Context, cl *cluster, store *claim.Store, m state.Mapping, slow bool) (read bool) {
	rctx, cancel := context.WithTimeout(ctx, d.cfg.RenewInterval.D())
	rec, err := store.Check(rctx, m.Ref.Head(), m.Epoch)
	cancel()
	read = rec != nil || err == nil || errors.Is(err, claim.ErrFenced)
	if rec != nil {
		defer func() { _ = d.keepFences(ctx, cl, store, m.Ref.Head(), rec) }() // the record's fences, held or taken: a failure is logged, counted and retried next round
	}
	switch {
	case err == nil:
		if m.Phase == state.Mapped && !store.Records(rec, m.ClientAddr) && !d.recordMapping(ctx, store, m) {
			return read // a problem now: checked again every round until it is recorded
		}
		if slow {
			d.checkWatchers(ctx, cl, store, m, rec)
		}
		if !d.node.PlaceFailing(cl.cfg.ID, m.Pool, m.Namespace) && d.problem(m.Key) != "" {
			d.setProblem(m.Key, "")
		}
	case errors.Is(err, claim.ErrFenced):
		// an operation on this image (an unmap, a device found gone) may have released the claim
		// after this mapping was listed: judged only when none is under way, and only if the
		// state still names this very mapping; else the next round judges
		unlock, ok := d.locks.TryLock(m.Key)
		if !ok {
			return false // judged at the next round, its notice kept
		}
		defer unlock()
		if cur, ok := d.state.Get(m.Key); !ok || cur.Epoch != m.Epoch || cur.Phase != m.Phase {
			return // unmapped or changed while the check ran: not a lost claim
		}
		if !d.isLost(m.Key) {
			d.audit.Record(audit.Entry{Event: audit.Renew, Result: audit.Failed, Cluster: m.Cluster, Pool: m.Pool, Namespace: m.Namespace,
				Image: m.Image, Device: m.Device, Epoch: m.Epoch, OwnerNode: d.cfg.NodeID, Error: true,
				Message: fmt.Sprintf("claim on %s is lost, device %s left in place: %v", m.Key, m.Device, err)})
		}
		d.setLost(m.Key, err.Error()+d.selfFencedNote(m))
		d.sagas.KeepFenced(ctx, cl, m, err)
	default:
		msg := "claim not checked: " + err.Error()
		if d.problem(m.Key) != msg {
			d.log.WithError(err).WithField("image", m.Key.String()).Warn("claim not checked")
		}
		d.setProblem(m.Key, msg)
	}
	return read
}
