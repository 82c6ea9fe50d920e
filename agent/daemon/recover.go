package daemon

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/devwatch"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/saga"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// recover rebuilds the agent's view at start, before any request is answered: it re-adopts
// the devices it owns, finishes or undoes half-done sagas, renews the leases it holds and
// reports what it cannot explain. (Like kubelet's volume manager: rebuild from the kernel, the
// persisted state and the claims.) It waits for that work at most map_timeout (settling) and
// the renew interval (renewing); what still waits for a cluster then goes on in the background.
func (d *Daemon) recover(ctx context.Context) {
	start := time.Now()
	d.reconcile(ctx)
	if !d.ops.waitIdle(d.cfg.MapTimeout.D()) {
		d.log.WithField("after", d.cfg.MapTimeout.D()).Warn("recovery: some mappings still wait for their cluster; going on in the background")
	}
	var wg sync.WaitGroup
	done := make(chan struct{})
	for _, c := range d.clusters {
		wg.Add(1)
		d.bg.Add(1)
		go func() { defer d.bg.Done(); defer wg.Done(); d.renewer.round(ctx, c) }()
	}
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d.cfg.RenewInterval.D()):
		d.log.Warn("recovery: lease renewals still wait for a cluster; going on in the background")
	}
	d.reportRebuild(ctx)
	d.metrics.Recovered(time.Since(start))
	problems, unmanaged := d.node.Counts()
	d.log.WithField("took", time.Since(start).Round(time.Millisecond)).WithField("mappings", len(d.state.All())).
		WithField("problems", problems).WithField("unmanaged_devices", unmanaged).Info("recovery done")
}

// reconcile brings every persisted mapping to a consistent state and notes the devices that
// nobody explains. It only decides: each mapping's settling runs on the executor (one at a
// time per image, after any saga on it, backed off after a failure).
func (d *Daemon) reconcile(ctx context.Context) {
	_ = d.state.Flush() // what memory holds and the disk does not yet: reported by the store's hook
	devs, err := d.kernel.List()
	if err != nil {
		d.log.WithError(err).Warn("reconcile: cannot list rbd devices")
		return
	}
	mappings := d.state.All()
	for _, m := range mappings {
		key := m.Key
		d.ops.start(ctx, key, func(ctx context.Context) error { return d.settleKey(ctx, key) })
	}
	for _, dv := range devs {
		if !d.explained(dv, mappings) && d.unexplained(dv) {
			d.intrusions.judgeLater(ctx, dv)
		}
	}
}

// explained says whether a device belongs to one of this node's mappings, or may belong to a
// saga or settling still under way on its image.
func (d *Daemon) explained(dv krbd.Device, mappings []state.Mapping) bool {
	for _, m := range mappings {
		if m.DeviceID == dv.ID && m.ClientAddr != "" && m.ClientAddr == dv.ClientAddr {
			return true
		}
		if m.Ref == dv.Spec() && (m.Phase == state.Claiming || m.Phase == state.Claimed || m.Phase == state.Unmapping || d.ops.busy(m.Key)) {
			return true
		}
	}
	for id := range d.clusters {
		if d.locks.IsHeld(state.Key{Cluster: id, Ref: dv.Spec()}) {
			return true // a saga on that image runs now: it decides
		}
	}
	return false
}

// settleKey settles one persisted mapping (called with its image's lock held): it gathers the
// devices its saga may have made and has the saga finish or undo it (saga.Sagas.Resume).
func (d *Daemon) settleKey(ctx context.Context, key state.Key) error {
	m, ok := d.state.Get(key)
	if !ok {
		return nil
	}
	// the device it made: read by its id when the state knows which client made it; every
	// device only when it must be found by names (a listing per mapping made settling 64
	// mappings read 64 × 64 devices' sysfs, 40 s on a busy guest)
	byID := map[int]krbd.Device{}
	switch {
	case saga.ByNames(m):
		devs, err := d.kernel.List()
		if err != nil {
			return fmt.Errorf("settle %s: list devices: %w", key, err)
		}
		for _, dv := range devs {
			byID[dv.ID] = dv
		}
	case m.ClientAddr != "":
		dv, err := d.kernel.ReadDevice(m.DeviceID)
		switch {
		case err == nil:
			byID[dv.ID] = dv
		case !errors.Is(err, krbd.ErrNotFound):
			// unreadable is not gone: never release the claim of a device that may be there
			return fmt.Errorf("settle %s: read its device %s: %w", key, m.Device, err)
		}
	}
	var cl saga.Cluster // nil when no longer configured
	if c := d.clusters[m.Cluster]; c != nil {
		cl = c
	}
	return d.sagas.Resume(ctx, cl, m, byID)
}

// unexplained says whether a device is still there and still not one of ours (the listing
// it came from may be older than a saga that adopted or removed it).
func (d *Daemon) unexplained(dv krbd.Device) bool {
	cur, err := d.kernel.ReadDevice(dv.ID)
	if err != nil || cur.ClientAddr != dv.ClientAddr {
		return false
	}
	for _, m := range d.state.All() {
		if m.DeviceID == dv.ID && m.ClientAddr == dv.ClientAddr {
			return false
		}
	}
	return true
}

// deviceEvent reacts to a device appearing or disappearing.
func (d *Daemon) deviceEvent(ctx context.Context, ev devwatch.Event) {
	switch ev.Kind {
	case devwatch.Removed:
		d.node.ForgetUnmanaged(ev.Device.ID)
		for _, m := range d.state.All() {
			if m.Phase != state.Mapped || m.DeviceID != ev.Device.ID || (ev.Device.ClientAddr != "" && m.ClientAddr != ev.Device.ClientAddr) {
				continue
			}
			// off the main loop, one operation per image, after any saga or operation on it
			// has ended (it re-reads the state they left), never dropped for one that runs (no
			// round repeats the event); retried by the reconciler after a failure
			key, id, addr := m.Key, ev.Device.ID, ev.Device.ClientAddr
			d.ops.queue(ctx, key, func(ctx context.Context) error {
				cur, ok := d.state.Get(key)
				if !ok || cur.Phase != state.Mapped || cur.DeviceID != id || (addr != "" && cur.ClientAddr != addr) {
					return nil
				}
				now, err := d.kernel.ReadDevice(id)
				switch {
				case err == nil && (cur.ClientAddr == "" || now.ClientAddr == cur.ClientAddr):
					return nil // still there, or cannot tell: the reconciler checks it
				case err != nil && !errors.Is(err, krbd.ErrNotFound):
					return fmt.Errorf("device %s: %w", cur.Device, err)
				}
				return d.sagas.DeviceGone(ctx, cur, "remove event")
			})
		}
	case devwatch.Added:
		dv := ev.Device
		for _, m := range d.state.All() {
			if m.DeviceID == dv.ID && m.ClientAddr == dv.ClientAddr {
				return
			}
		}
		// judged at once, once any saga of ours on its image is over (it may be ours)
		d.intrusions.judgeAtOnce(ctx, dv)
	}
}
