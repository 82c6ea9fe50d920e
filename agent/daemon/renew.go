package daemon

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/fault"
	"github.com/rbd-owner/rbd-owner/agent/nodestate"
	"github.com/rbd-owner/rbd-owner/agent/saga"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// renewer keeps the leases this node holds: per cluster, a heartbeat per place held in
// (heartbeats, heartbeat.go) and every renew interval a round of claim checks and takeover
// watches (round). It holds only what that needs; the daemon builds it (New), runs one loop per
// cluster (startLoops) and a first round at recovery.
type renewer struct {
	// what it reads and keeps of the node
	state     heldState        // the mappings (a *state.Store)
	node      *nodestate.Node  // held claims, problems, lost claims, failing places, fences kept
	unsettled *unsettledHolds  // holds the rebuild could not settle: their places beat too
	watches   *takeoverWatches // the images waiting to be taken over (watchRound)
	locks     *saga.Locks      // a lost claim is judged only while nothing else runs on its image
	checks    claimChecks      // when each claim held is next read (checks.go)
	// what it asks of the other workers
	settler holdSettler // settles again the holds the rebuild could not (rebuild.go)
	fences  fenceKeeper // keeps the fences a claim records (fences.go)
	lost    lostKeeper  // the saga that keeps a lost claim's mapping fenced
	// where it reports
	log     *logrus.Logger
	audit   *audit.Log
	metrics renewMetrics
	renewed *atomic.Int64 // successful heartbeats (Daemon.renewed, for the tests)
	// its node, clocks and periods
	nodeID     string
	mono       func() time.Duration                                              // Options.Mono
	ticker     func(loop string, every time.Duration) (<-chan time.Time, func()) // Daemon.ticker
	beat       func(loop string)                                                 // Daemon.beat
	every      time.Duration                                                     // renew_interval
	hbTimeout  time.Duration                                                     // bounds one heartbeat: the config's HeartbeatTimeout (R in model/lease.pml)
	checkEvery time.Duration                                                     // claimCheckInterval
}

// heldState is what the renewer reads of the node's state (a *state.Store).
type heldState interface {
	Get(k state.Key) (state.Mapping, bool)
	All() []state.Mapping
}

// holdSettler settles again the holds the rebuild could not (a *settler).
type holdSettler interface {
	resettle(ctx context.Context, cl *cluster, store *claim.Store)
}

// lostKeeper keeps a lost claim's mapping fenced (saga.Sagas.KeepFenced).
type lostKeeper interface {
	KeepFenced(ctx context.Context, cl saga.Cluster, m state.Mapping, lost error)
}

// renewMetrics are the collectors the renewer feeds (a *metrics.Metrics).
type renewMetrics interface {
	Liveness(cluster, place string, err error)
	UnexplainedWatchers(cluster string, n int)
	ClaimLost(cluster string)
}

// claimCheckInterval is claim_check_interval (its default when unset), at least a renew
// interval.
func claimCheckInterval(cfg *config.Config) time.Duration {
	c := cfg.ClaimCheckInterval.D()
	if c <= 0 {
		c = config.DefaultClaimCheckInterval.D()
	}
	return max(c, cfg.RenewInterval.D())
}

// heartbeatsOf is cl's heartbeats, writing through r.
func (r *renewer) heartbeatsOf(cl *cluster) *heartbeats {
	return &heartbeats{cl: cl, held: r.held, unsettled: r.unsettled, write: r.heartbeat, node: r.node, setProblem: r.setProblem,
		ticker: r.ticker, every: r.every, hbTimeout: r.hbTimeout, places: map[place]context.CancelFunc{}, since: map[place]time.Time{}}
}

// loop keeps the leases held on one cluster: it runs a heartbeat per place this node holds
// claims in (heartbeats: each on its own schedule, never waiting for anything below), and every
// renew interval a round of claim checks and of takeover watches, started at once. A round
// still running at the next tick (a cluster that does not answer) is not joined by another:
// its calls are bounded and report themselves. It beats every beatEvery; it owns its
// heartbeats and its round, and ends them (and waits for them) when ctx ends.
func (r *renewer) loop(ctx context.Context, cl *cluster, beatEvery time.Duration) {
	name := "renew " + cl.cfg.ID
	tick, stopTick := r.ticker(name, r.every)
	defer stopTick()
	beat := time.NewTicker(beatEvery)
	defer beat.Stop()
	hb := r.heartbeatsOf(cl)
	defer hb.stop()
	inFlight := newRoundInFlight()
	defer inFlight.wait()
	hb.sync(ctx)
	r.startRound(ctx, cl, inFlight)
	for {
		r.beat(name)
		select {
		case <-ctx.Done():
			return
		case <-beat.C:
			hb.sync(ctx)
		case <-tick:
			hb.sync(ctx)
			r.startRound(ctx, cl, inFlight)
		}
	}
}

// roundInFlight is the one round of a loop that may run at a time.
type roundInFlight struct {
	busy  chan struct{}  // holds a token while a round runs
	since time.Time      // when the round in flight started (only the loop's goroutine touches it)
	wg    sync.WaitGroup // the round's goroutine
}

func newRoundInFlight() *roundInFlight { return &roundInFlight{busy: make(chan struct{}, 1)} }

// wait waits for the round in flight, if any, to end.
func (f *roundInFlight) wait() { f.wg.Wait() }

// startRound runs a round of cl off the loop, unless the last one still waits for the cluster:
// then every claim held there says so, where people look.
func (r *renewer) startRound(ctx context.Context, cl *cluster, f *roundInFlight) {
	select {
	case f.busy <- struct{}{}:
		f.since = time.Now()
	default:
		r.roundStillRunning(cl, f.since)
		return
	}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		defer func() { <-f.busy }()
		r.round(ctx, cl)
	}()
}

// roundStillRunning reports that the round started at since has not ended: the cluster has not
// answered it yet.
func (r *renewer) roundStillRunning(cl *cluster, since time.Time) {
	msg := fmt.Sprintf("claim not checked: cluster %s has not answered the checks started %s ago", cl.cfg.ID, time.Since(since).Round(time.Second))
	r.log.WithField("cluster", cl.cfg.ID).Warn("the previous round of claim checks is still waiting for the cluster; skipping this one")
	for _, keys := range r.held(cl.cfg.ID) {
		for _, k := range keys {
			if r.problem(k) == "" {
				r.setProblem(k, msg)
			}
		}
	}
}

// round refreshes the takeover watches of cl (watchRound), then checks this node's claims on cl
// as checks.go says: this node's notices read once per place held in, and only the claims they
// name, the ones due for their slow check, and the few that need a look every round read,
// concurrent within renewConcurrency, each bounded by the renew interval; each claim read keeps
// the fences it records (checkClaim). The heartbeats are not here: each place has its own
// (heartbeats).
func (r *renewer) round(ctx context.Context, cl *cluster) {
	ms := r.node.Held(cl.cfg.ID)
	r.checks.keep(keysOf(ms))
	unsettled := r.unsettled.pending(cl.cfg.ID)
	if len(ms) == 0 && !unsettled && len(r.watches.due(cl.cfg.ID, time.Now())) == 0 {
		return
	}
	store, ok := r.store(ctx, cl, ms)
	if !ok {
		return
	}
	if unsettled {
		r.settler.resettle(ctx, cl, store)
	}
	r.watchRound(ctx, cl, store)
	r.retryNotices(ctx, cl, store)
	notices := r.readNotices(ctx, cl, store, ms)
	due, slow := r.dueChecks(cl, ms, notices)
	read := r.checkClaims(ctx, cl, store, due, slow)
	r.clearNotices(ctx, cl, store, notices, read, ms)
}

// keysOf is the set of ms's keys.
func keysOf(ms []state.Mapping) map[state.Key]bool {
	held := map[state.Key]bool{}
	for _, m := range ms {
		held[m.Key] = true
	}
	return held
}

// store is cl's claim store, connecting within a renew interval; when it cannot be had, each
// of ms says so and ok is false.
func (r *renewer) store(ctx context.Context, cl *cluster, ms []state.Mapping) (store *claim.Store, ok bool) {
	cctx, cancel := context.WithTimeout(ctx, r.every)
	store, err := cl.Claims(cctx)
	cancel()
	if err != nil {
		for _, m := range ms {
			r.setProblem(m.Key, "claim not checked: "+err.Error())
		}
		return nil, false
	}
	return store, true
}

// retryNotices writes again the notices of changed holds not written yet (claim.Store).
func (r *renewer) retryNotices(ctx context.Context, cl *cluster, store *claim.Store) {
	nctx, cancel := context.WithTimeout(ctx, r.every)
	defer cancel()
	if left, errs := store.RetryNotices(nctx); len(errs) > 0 {
		r.log.WithError(errors.Join(errs...)).WithField("cluster", cl.cfg.ID).WithField("pending", left).Warn("notices of changed holds still not written; tried again next round")
	}
}

// dueChecks are the mappings of ms whose claims this round reads (checks.go), and those of
// them due for the slow check itself (their watchers are read too).
func (r *renewer) dueChecks(cl *cluster, ms []state.Mapping, notices map[place]*placeNotices) (due []state.Mapping, slow map[state.Key]bool) {
	now := r.mono()
	slow = map[state.Key]bool{}
	for _, m := range ms {
		everyRound := r.node.IsLost(m.Key) || r.problem(m.Key) != "" || r.node.KeepsFences(cl.cfg.ID, m.Ref.Head())
		if r.checks.due(m, now, false, false) {
			slow[m.Key] = true
		}
		if r.checks.due(m, now, notices[place{m.Pool, m.Namespace}].noticed(m), everyRound) {
			due = append(due, m)
		}
	}
	return due, slow
}

// checkClaims reads the claims of due (checkClaim), concurrent within renewConcurrency, and
// returns those read and judged.
func (r *renewer) checkClaims(ctx context.Context, cl *cluster, store *claim.Store, due []state.Mapping, slow map[state.Key]bool) map[state.Key]bool {
	var mu sync.Mutex
	read := map[state.Key]bool{}
	eachBounded(renewConcurrency, due, func(m state.Mapping) {
		if r.checkClaim(ctx, cl, store, m, slow[m.Key]) {
			r.checks.checked(m.Key, r.mono(), r.checkEvery)
			mu.Lock()
			read[m.Key] = true
			mu.Unlock()
		}
	})
	return read
}

// checkClaim reads one claim: a claim that is no longer this node's is reported (status,
// journal at error priority) and its device left alone: unmapping a file system in use is
// never the agent's call. The record's fences, held or taken, are kept (renewed when due). It
// returns whether the claim could be read.
func (r *renewer) checkClaim(ctx context.Context, cl *cluster, store *claim.Store, m state.Mapping, slow bool) (read bool) {
	rctx, cancel := context.WithTimeout(ctx, r.every)
	rec, err := store.Check(rctx, m.Ref.Head(), m.Epoch)
	cancel()
	read = rec != nil || err == nil || errors.Is(err, claim.ErrFenced)
	if rec != nil {
		defer func() { _ = r.fences.keepFences(ctx, cl, store, m.Ref.Head(), rec) }() // the record's fences, held or taken: a failure is logged, counted and retried next round
	}
	switch {
	case err == nil:
		return r.claimHeld(ctx, cl, store, m, rec, slow)
	case errors.Is(err, claim.ErrFenced):
		return r.claimLost(ctx, cl, m, err)
	default:
		msg := "claim not checked: " + err.Error()
		if r.problem(m.Key) != msg {
			r.log.WithError(err).WithField("image", m.Key.String()).Warn("claim not checked")
		}
		r.setProblem(m.Key, msg)
	}
	return read
}

// claimHeld is checkClaim's case of a claim still this node's: a mapping whose client the
// claim lacks is recorded (recordMapping), its watchers read at its slow check, and a problem
// of its own cleared. It returns true: the claim was read.
func (r *renewer) claimHeld(ctx context.Context, cl *cluster, store *claim.Store, m state.Mapping, rec *claim.Record, slow bool) bool {
	if m.Phase == state.Mapped && !store.Records(rec, m.ClientAddr) && !r.recordMapping(ctx, store, m) {
		return true // a problem now: checked again every round until it is recorded
	}
	if slow {
		r.checkWatchers(ctx, cl, store, m, rec)
	}
	if !r.node.PlaceFailing(cl.cfg.ID, m.Pool, m.Namespace) && r.problem(m.Key) != "" {
		r.setProblem(m.Key, "")
	}
	return true
}

// claimLost is checkClaim's case of a claim fenced or taken (lost, an error of claim.ErrFenced):
// audited once, the claim marked lost, and its mapping kept fenced by the saga. It returns
// whether the claim was judged (false: at the next round, its notice kept).
func (r *renewer) claimLost(ctx context.Context, cl *cluster, m state.Mapping, lost error) bool {
	// an operation on this image (an unmap, a device found gone) may have released the claim
	// after this mapping was listed: judged only when none is under way, and only if the
	// state still names this very mapping; else the next round judges
	unlock, ok := r.locks.TryLock(m.Key)
	if !ok {
		return false // judged at the next round, its notice kept
	}
	defer unlock()
	if cur, ok := r.state.Get(m.Key); !ok || cur.Epoch != m.Epoch || cur.Phase != m.Phase {
		return true // unmapped or changed while the check ran: not a lost claim
	}
	if !r.node.IsLost(m.Key) {
		r.audit.Record(audit.Entry{Event: audit.Renew, Result: audit.Failed, Cluster: m.Cluster, Pool: m.Pool, Namespace: m.Namespace,
			Image: m.Image, Device: m.Device, Epoch: m.Epoch, OwnerNode: r.nodeID, Error: true,
			Message: fmt.Sprintf("claim on %s is lost, device %s left in place: %v", m.Key, m.Device, lost)})
	}
	r.setLost(m.Key, lost.Error()+r.selfFencedNote(m))
	r.lost.KeepFenced(ctx, cl, m, lost)
	return true
}

// checkWatchers reports, at warning priority and in a metric, the watchers of a held image that
// no holder's mapping explains: another client mapping or opening it outside rbd-owner, from
// anywhere (an rbd-nbd or librbd client, a krbd mapping on a node without the agent). Read at
// the slow claim check only: two reads of the image per claim_check_interval, never per round.
func (r *renewer) checkWatchers(ctx context.Context, cl *cluster, store *claim.Store, m state.Mapping, rec *claim.Record) {
	wctx, cancel := context.WithTimeout(ctx, r.every)
	defer cancel()
	w, err := store.Unexplained(wctx, m.Ref.Head(), rec)
	if err == nil && len(w) > 0 {
		r.metrics.UnexplainedWatchers(cl.cfg.ID, len(w))
		r.log.WithFields(logrus.Fields{"image": m.Key.String(), "device": m.Device, "watchers": strings.Join(w, ",")}).
			Warn(fmt.Sprintf("%s, which this node holds, has watchers no claim explains: %s; another client maps or opens it outside rbd-owner (an rbd-nbd or librbd client, or a node without the agent): find it with `rbd status %s` and stop it", m.Key, strings.Join(w, ", "), m.Ref.Head()))
	}
	if err != nil && ctx.Err() == nil {
		r.log.WithError(err).WithField("image", m.Key.String()).Warn("the watchers of a held image could not be read at its slow check; read again at the next one")
	}
}

// heartbeat renews this node's liveness in one pool and namespace; a failure is a problem of
// every claim held there (its lease will run out for the others' observers).
func (r *renewer) heartbeat(ctx context.Context, cl *cluster, store *claim.Store, pool, ns string, keys []state.Key) {
	hctx, cancel := context.WithTimeout(ctx, r.hbTimeout)
	err := store.Heartbeat(hctx, pool, ns)
	cancel()
	r.metrics.Liveness(cl.cfg.ID, livenessPlace(pool, ns), err)
	r.node.SetPlaceFailing(cl.cfg.ID, pool, ns, err != nil)
	if err == nil {
		r.renewed.Add(1)
		return
	}
	msg := "lease not renewed: " + err.Error()
	if fault.Is(err, fault.Timeout) || fault.Is(err, fault.Unavailable) {
		msg = fmt.Sprintf("lease not renewed: cluster %s did not answer within %s: %v", cl.cfg.ID, r.hbTimeout, err)
	}
	for _, k := range keys {
		if r.problem(k) != msg {
			r.log.WithError(err).WithField("image", k.String()).Warn("lease not renewed")
		}
		r.setProblem(k, msg)
	}
}

// recordMapping records a mapped device's client address that its claim lacks: a map
// interrupted after its persist, before its record (docs/safety.md, invariant 7). Until it is
// recorded a takeover would fence the whole node. A failure is a problem of the mapping (so
// its claim is checked again every round); it returns whether the client is recorded.
func (r *renewer) recordMapping(ctx context.Context, store *claim.Store, m state.Mapping) bool {
	log := r.log.WithField("image", m.Key.String()).WithField("device", m.Device).WithField("client_addr", m.ClientAddr)
	rctx, cancel := context.WithTimeout(ctx, r.every)
	defer cancel()
	if _, err := store.SetMapping(rctx, m.Ref.Head(), m.Epoch, m.ClientAddr, m.Device); err != nil {
		msg := "the claim does not name this mapping's client, so a takeover would fence the whole node; recording it failed, tried again next round: " + err.Error()
		if r.problem(m.Key) != msg {
			log.WithError(err).Warn("the claim does not name this mapping's client; recording it failed, tried again next round")
		}
		r.setProblem(m.Key, msg)
		return false
	}
	log.Info("recorded in the claim the client of a mapping whose map was interrupted")
	return true
}

// problem is what is wrong with k ("" when nothing is).
func (r *renewer) problem(k state.Key) string {
	msg, _ := r.node.Problem(k)
	return msg
}

// setProblem records what is wrong with k, or ("") that nothing is any more.
func (r *renewer) setProblem(k state.Key, p string) { r.node.SetProblem(k, p) }

// setLost records that this node's claim on k is gone (fenced or taken over), counted once.
func (r *renewer) setLost(k state.Key, why string) {
	if r.node.SetLost(k, why) {
		r.metrics.ClaimLost(k.Cluster)
	}
}

// held returns the places of cl where this node holds claims, or may, in every phase, and
// their mappings' keys: claiming (a claim write that may have been applied, until the
// reconciler settles it; were its liveness to stop, a watcher would judge that claim expired
// and fence this live node whole: docs/safety.md, F5) and unmapping (a device that may still be
// open and writing until its claim is released) as much as claimed and mapped.
func (r *renewer) held(clusterID string) map[place][]state.Key {
	out := map[place][]state.Key{}
	for _, m := range r.state.All() {
		if m.Cluster == clusterID && m.Claimed {
			p := place{m.Pool, m.Namespace}
			out[p] = append(out[p], m.Key)
		}
	}
	return out
}

// readNotices reads this node's notice object in every place of ms, at most renewConcurrency
// at once, each bounded by the renew interval.
func (r *renewer) readNotices(ctx context.Context, cl *cluster, store *claim.Store, ms []state.Mapping) map[place]*placeNotices {
	out := map[place]*placeNotices{}
	var places []place
	for _, m := range ms {
		p := place{m.Pool, m.Namespace}
		if out[p] == nil {
			out[p] = &placeNotices{}
			places = append(places, p)
		}
	}
	var mu sync.Mutex
	eachBounded(renewConcurrency, places, func(p place) {
		nctx, cancel := context.WithTimeout(ctx, r.every)
		ns, ver, err := store.Notices(nctx, p.pool, p.namespace)
		cancel()
		pn := &placeNotices{byImage: map[string]claim.Notice{}, ver: ver, failed: err != nil}
		if err != nil && ctx.Err() == nil {
			r.log.WithError(err).WithField("cluster", cl.cfg.ID).WithField("place", p.String()).Warn("notices not read: every claim held there is read this round instead")
		}
		for _, n := range ns {
			pn.byImage[n.Image] = n
		}
		mu.Lock()
		out[p] = pn
		mu.Unlock()
	})
	return out
}

// clearNotices removes, in each place, the notices handled this round: those of claims read
// (whatever the read found: a lost claim is lost in this node's memory and state from then on),
// and those of holds this node no longer has. A notice written since the round's read stays.
func (r *renewer) clearNotices(ctx context.Context, cl *cluster, store *claim.Store, notices map[place]*placeNotices, read map[state.Key]bool, ms []state.Mapping) {
	held := map[place]map[string]state.Mapping{}
	for _, m := range ms {
		p := place{m.Pool, m.Namespace}
		if held[p] == nil {
			held[p] = map[string]state.Mapping{}
		}
		held[p][m.Image] = m
	}
	for p, pn := range notices {
		if pn == nil || pn.failed || len(pn.byImage) == 0 {
			continue
		}
		var done []string
		for img, n := range pn.byImage {
			m, ok := held[p][img]
			if !ok || read[m.Key] || (n.Epoch != 0 && n.Epoch != m.Epoch) {
				done = append(done, img)
			}
		}
		cctx, cancel := context.WithTimeout(ctx, r.every)
		err := store.ClearNotices(cctx, p.pool, p.namespace, done, pn.ver)
		cancel()
		if err != nil && ctx.Err() == nil {
			r.log.WithError(err).WithField("cluster", cl.cfg.ID).WithField("place", p.String()).Warn("notices not cleared: they are read again next round")
		}
	}
}

// watchRound refreshes the watches of cl's images, concurrent within renewConcurrency, each
// bounded by the heartbeat deadline. An image no other node holds any more is forgotten.
func (r *renewer) watchRound(ctx context.Context, cl *cluster, store *claim.Store) {
	eachBounded(renewConcurrency, r.watches.due(cl.cfg.ID, time.Now()), func(k state.Key) {
		wctx, cancel := context.WithTimeout(ctx, r.hbTimeout)
		leases, err := store.Watch(wctx, k.Ref.Head())
		cancel()
		switch {
		case err != nil:
			r.log.WithError(err).WithField("image", k.String()).Debug("takeover watch: not refreshed")
		case len(leases) == 0:
			r.watches.drop(k) // free, or this node's: nothing to wait for
		}
	})
}
