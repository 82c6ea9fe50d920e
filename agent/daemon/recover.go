package daemon

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/rbd-owner/rbd-owner/agent/devwatch"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/saga"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// reconciler brings this node's persisted mappings and the kernel's devices together: at start
// (recover), every renew interval (loop, reconcile) and on each device event (deviceEvent). It
// only gathers and decides: each mapping is settled on the executor, one operation per image,
// by the saga's own recovery (saga.Sagas.Resume); the devices nobody explains go to the judge.
// It holds only what that needs; the daemon builds it (New), runs its loop (startLoops), its
// recovery (Run) and hands it the device events (mainLoop).
//
// The fleet benchmark names the calls made under reconcile and recover by those names on the
// stack (fleet_count_test.go): the closures that settle a mapping on the executor are made in
// a method named reconcile…, so that their calls still count as the reconciler's.
type reconciler struct {
	// what it reads of the node
	clusters map[string]*cluster // the configured clusters, by id (never changed after New)
	state    reconciledState     // the persisted mappings (a *state.Store)
	kernel   reconciledKernel    // the devices as the kernel shows them now (a *krbd.Client)
	node     reconciledNode      // the unmanaged devices; the counts recovery reports
	locks    heldLocks           // a device of an image a saga holds now is that saga's to explain
	// what it asks of the rest of the daemon
	ops           settleOps                              // the executor: one operation per image, backed off
	sagas         resumer                                // the sagas' recovery (a *saga.Sagas)
	judge         deviceJudge                            // the judge of devices nobody explains (intrusion.go)
	renew         func(ctx context.Context, cl *cluster) // a round of cl's renewals (renewer.round)
	reportRebuild func(ctx context.Context)              // what a rebuild of the state found (settler.reportRebuild)
	bg            *sync.WaitGroup                        // the daemon's goroutines: recovery's renewals may outlast it
	// where it reports
	log     *logrus.Logger
	metrics reconcileMetrics
	// its clocks and periods
	ticker     func(loop string, every time.Duration) (<-chan time.Time, func()) // Daemon.ticker
	beat       func(loop string)                                                 // Daemon.beat
	every      time.Duration                                                     // renew_interval
	settleWait time.Duration                                                     // map_timeout: how long recovery waits for the settling
}

// reconciledState is what the reconciler reads of the node's state (a *state.Store).
type reconciledState interface {
	Flush() error
	Get(k state.Key) (state.Mapping, bool)
	All() []state.Mapping
}

// reconciledKernel is what the reconciler reads of the kernel (a *krbd.Client).
type reconciledKernel interface {
	List() ([]krbd.Device, error)
	ReadDevice(id int) (krbd.Device, error)
}

// reconciledNode is what the reconciler keeps and reads of what the node knows of itself (a
// *nodestate.Node).
type reconciledNode interface {
	ForgetUnmanaged(id int)
	Counts() (problems, unmanaged int)
}

// heldLocks says whether a saga (or anything else) holds an image now (a *saga.Locks).
type heldLocks interface {
	IsHeld(k state.Key) bool
}

// settleOps is the executor as the reconciler uses it: a settling started (dropped while one
// runs or backs off: the next round asks again), an event's operation queued (never dropped),
// whether one runs, and a wait until none does.
type settleOps interface {
	start(ctx context.Context, key state.Key, op func(ctx context.Context) error) bool
	queue(ctx context.Context, key state.Key, op func(ctx context.Context) error)
	busy(key state.Key) bool
	waitIdle(d time.Duration) bool
}

// resumer is the sagas' recovery: a persisted mapping finished or undone, a mapped device
// found gone (a *saga.Sagas).
type resumer interface {
	Resume(ctx context.Context, cl saga.Cluster, m state.Mapping, devs map[int]krbd.Device) error
	DeviceGone(ctx context.Context, m state.Mapping, how string) error
}

// deviceJudge judges the devices this node's state does not explain (an *intrusionJudge).
type deviceJudge interface {
	judgeAtOnce(ctx context.Context, dv krbd.Device)
	judgeLater(ctx context.Context, dv krbd.Device)
}

// reconcileMetrics are the collectors the reconciler feeds (a *metrics.Metrics).
type reconcileMetrics interface {
	Recovered(took time.Duration)
}

// recover rebuilds the agent's view at start, before any request is answered: it re-adopts
// the devices it owns, finishes or undoes half-done sagas, renews the leases it holds and
// reports what it cannot explain. (Like kubelet's volume manager: rebuild from the kernel, the
// persisted state and the claims.) It waits for that work at most map_timeout (settling) and
// the renew interval (renewing); what still waits for a cluster then goes on in the background.
func (r *reconciler) recover(ctx context.Context) {
	start := time.Now()
	r.reconcile(ctx)
	r.waitSettled()
	r.renewAll(ctx)
	r.reportRebuild(ctx)
	r.reportRecovered(start)
}

// waitSettled waits for the settling the first round started, at most map_timeout.
func (r *reconciler) waitSettled() {
	if !r.ops.waitIdle(r.settleWait) {
		r.log.WithField("after", r.settleWait).Warn("recovery: some mappings still wait for their cluster; going on in the background")
	}
}

// renewAll runs a renew round of every cluster at once, and waits for them at most a renew
// interval; the rounds (owned by the daemon's goroutines) go on past that.
func (r *reconciler) renewAll(ctx context.Context) {
	var wg sync.WaitGroup
	done := make(chan struct{})
	for _, c := range r.clusters {
		wg.Add(1)
		r.bg.Add(1)
		go func() { defer r.bg.Done(); defer wg.Done(); r.renew(ctx, c) }()
	}
	r.bg.Add(1)
	go func() { defer r.bg.Done(); wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(r.every):
		r.log.Warn("recovery: lease renewals still wait for a cluster; going on in the background")
	}
}

// reportRecovered records how long recovery took and says what it left.
func (r *reconciler) reportRecovered(start time.Time) {
	r.metrics.Recovered(time.Since(start))
	problems, unmanaged := r.node.Counts()
	r.log.WithField("took", time.Since(start).Round(time.Millisecond)).WithField("mappings", len(r.state.All())).
		WithField("problems", problems).WithField("unmanaged_devices", unmanaged).Info("recovery done")
}

// loop reconciles every renew interval. The round (which reads every device's sysfs: seconds
// on a busy node with many devices) runs beside the loop, so the loop beats whatever the
// kernel's pace; the loop takes the next tick only once that round is over (ticks meanwhile
// are dropped), so rounds never overlap. It beats every beatEvery; it owns its round and waits
// for it when ctx ends.
func (r *reconciler) loop(ctx context.Context, beatEvery time.Duration) {
	tick, stopTick := r.ticker("reconcile", r.every)
	defer stopTick()
	beat := time.NewTicker(beatEvery)
	defer beat.Stop()
	var round chan struct{} // closed when the round in flight is over; nil when none is
	defer func() {
		if round != nil {
			<-round
		}
	}()
	for {
		r.beat("reconcile")
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
				r.reconcile(ctx)
			}()
		}
	}
}

// reconcile brings every persisted mapping to a consistent state and notes the devices that
// nobody explains: it writes what the state still owes the disk, lists the kernel's devices
// and the state's mappings, starts each mapping's settling, and hands the devices nobody
// explains to the judge. It only decides: each mapping's settling runs on the executor (one at
// a time per image, after any saga on it, backed off after a failure).
func (r *reconciler) reconcile(ctx context.Context) {
	_ = r.state.Flush() // what memory holds and the disk does not yet: reported by the store's hook
	devs, err := r.kernel.List()
	if err != nil {
		r.log.WithError(err).Warn("reconcile: cannot list rbd devices")
		return
	}
	mappings := r.state.All()
	r.reconcileMappings(ctx, mappings)
	r.reconcileDevices(ctx, devs, mappings)
}

// reconcileMappings starts the settling of each mapping on the executor (settleKey).
func (r *reconciler) reconcileMappings(ctx context.Context, mappings []state.Mapping) {
	for _, m := range mappings {
		key := m.Key
		r.ops.start(ctx, key, func(ctx context.Context) error { return r.settleKey(ctx, key) })
	}
}

// reconcileDevices hands the devices that nobody explains, and that are still there and still
// not one of this node's, to the judge.
func (r *reconciler) reconcileDevices(ctx context.Context, devs []krbd.Device, mappings []state.Mapping) {
	for _, dv := range devs {
		if !r.explained(dv, mappings) && r.unexplained(dv) {
			r.judge.judgeLater(ctx, dv)
		}
	}
}

// explained says whether a device belongs to one of this node's mappings, or may belong to a
// saga or settling still under way on its image.
func (r *reconciler) explained(dv krbd.Device, mappings []state.Mapping) bool {
	for _, m := range mappings {
		if m.DeviceID == dv.ID && m.ClientAddr != "" && m.ClientAddr == dv.ClientAddr {
			return true
		}
		if m.Ref == dv.Spec() && (m.Phase == state.Claiming || m.Phase == state.Claimed || m.Phase == state.Unmapping || r.ops.busy(m.Key)) {
			return true
		}
	}
	for id := range r.clusters {
		if r.locks.IsHeld(state.Key{Cluster: id, Ref: dv.Spec()}) {
			return true // a saga on that image runs now: it decides
		}
	}
	return false
}

// unexplained says whether a device is still there and still not one of ours (the listing
// it came from may be older than a saga that adopted or removed it).
func (r *reconciler) unexplained(dv krbd.Device) bool {
	cur, err := r.kernel.ReadDevice(dv.ID)
	if err != nil || cur.ClientAddr != dv.ClientAddr {
		return false
	}
	for _, m := range r.state.All() {
		if m.DeviceID == dv.ID && m.ClientAddr == dv.ClientAddr {
			return false
		}
	}
	return true
}

// settleKey settles one persisted mapping (called with its image's lock held): it gathers the
// devices its saga may have made (devicesOf) and has the saga finish or undo it
// (saga.Sagas.Resume).
func (r *reconciler) settleKey(ctx context.Context, key state.Key) error {
	m, ok := r.state.Get(key)
	if !ok {
		return nil
	}
	byID, err := r.devicesOf(key, m)
	if err != nil {
		return err
	}
	var cl saga.Cluster // nil when no longer configured
	if c := r.clusters[m.Cluster]; c != nil {
		cl = c
	}
	return r.sagas.Resume(ctx, cl, m, byID)
}

// devicesOf is the devices m's saga may have made, by id: read by its id when the state knows
// which client made it; every device only when it must be found by names (a listing per
// mapping made settling 64 mappings read 64 × 64 devices' sysfs, 40 s on a busy guest).
func (r *reconciler) devicesOf(key state.Key, m state.Mapping) (map[int]krbd.Device, error) {
	byID := map[int]krbd.Device{}
	switch {
	case saga.ByNames(m):
		devs, err := r.kernel.List()
		if err != nil {
			return nil, fmt.Errorf("settle %s: list devices: %w", key, err)
		}
		for _, dv := range devs {
			byID[dv.ID] = dv
		}
	case m.ClientAddr != "":
		dv, err := r.kernel.ReadDevice(m.DeviceID)
		switch {
		case err == nil:
			byID[dv.ID] = dv
		case !errors.Is(err, krbd.ErrNotFound):
			// unreadable is not gone: never release the claim of a device that may be there
			return nil, fmt.Errorf("settle %s: read its device %s: %w", key, m.Device, err)
		}
	}
	return byID, nil
}

// deviceEvent reacts to a device appearing or disappearing.
func (r *reconciler) deviceEvent(ctx context.Context, ev devwatch.Event) {
	switch ev.Kind {
	case devwatch.Removed:
		r.deviceRemoved(ctx, ev.Device)
	case devwatch.Added:
		r.deviceAdded(ctx, ev.Device)
	}
}

// deviceRemoved has the saga of each mapping of a device that is gone release its claim.
func (r *reconciler) deviceRemoved(ctx context.Context, gone krbd.Device) {
	r.node.ForgetUnmanaged(gone.ID)
	for _, m := range r.state.All() {
		if m.Phase != state.Mapped || m.DeviceID != gone.ID || (gone.ClientAddr != "" && m.ClientAddr != gone.ClientAddr) {
			continue
		}
		// off the main loop, one operation per image, after any saga or operation on it
		// has ended (it re-reads the state they left), never dropped for one that runs (no
		// round repeats the event); retried by the reconciler after a failure
		key, id, addr := m.Key, gone.ID, gone.ClientAddr
		r.ops.queue(ctx, key, func(ctx context.Context) error {
			cur, ok := r.state.Get(key)
			if !ok || cur.Phase != state.Mapped || cur.DeviceID != id || (addr != "" && cur.ClientAddr != addr) {
				return nil
			}
			now, err := r.kernel.ReadDevice(id)
			switch {
			case err == nil && (cur.ClientAddr == "" || now.ClientAddr == cur.ClientAddr):
				return nil // still there, or cannot tell: the reconciler checks it
			case err != nil && !errors.Is(err, krbd.ErrNotFound):
				return fmt.Errorf("device %s: %w", cur.Device, err)
			}
			return r.sagas.DeviceGone(ctx, cur, "remove event")
		})
	}
}

// deviceAdded has a device that just appeared judged at once, unless it is one of this node's
// mappings: once any saga of ours on its image is over (it may be ours).
func (r *reconciler) deviceAdded(ctx context.Context, dv krbd.Device) {
	for _, m := range r.state.All() {
		if m.DeviceID == dv.ID && m.ClientAddr == dv.ClientAddr {
			return
		}
	}
	r.judge.judgeAtOnce(ctx, dv)
}
