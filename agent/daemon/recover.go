package daemon

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/cephconn"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/devwatch"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/metrics"
	"github.com/rbd-owner/rbd-owner/agent/nodestate"
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
		go func() { defer d.bg.Done(); defer wg.Done(); d.renewRound(ctx, c) }()
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
			d.judgeLater(ctx, dv)
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

// settleKey settles one persisted mapping (called with its image's lock held).
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
	case m.Phase == state.Claiming || m.Phase == state.Claimed || (m.Phase == state.Unmapping && m.ClientAddr == ""):
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
	return d.settle(ctx, m, byID)
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

// settle finishes or undoes one mapping's saga. An error means it must be tried again later
// (the problem is also in status).
func (d *Daemon) settle(ctx context.Context, m state.Mapping, devs map[int]krbd.Device) error {
	cl := d.clusters[m.Cluster]
	if cl == nil {
		d.setProblem(m.Key, fmt.Sprintf("cluster %q is no longer configured; mapping left alone", m.Cluster))
		return nil
	}
	dev := d.settledDevice(m, devs)
	switch m.Phase {
	case state.Claiming:
		return d.settleClaiming(ctx, cl, m, dev)
	case state.Claimed:
		if dev != nil {
			return d.settleClaimedMapped(ctx, cl, m, *dev)
		}
		if err := d.sagas.Release(ctx, cl, m); err != nil {
			d.setProblem(m.Key, "interrupted map: claim release failed, will retry: "+err.Error())
			return err
		}
		d.settleLog(m).Info("undid a map interrupted before the device appeared")
		d.dropState(m)
		return nil
	case state.Mapped:
		if dev != nil {
			return nil // the renewals check the claim
		}
		return d.deviceGone(ctx, m, "not present at reconciliation")
	case state.Unmapping:
		return d.settleUnmapping(ctx, cl, m, dev)
	}
	return nil
}

func (d *Daemon) settleLog(m state.Mapping) *logrus.Entry {
	return d.log.WithField("image", m.Key.String()).WithField("phase", m.Phase)
}

// settledDevice is the device m's saga made: by id and client address once known, else by
// names (nil when there is none).
func (d *Daemon) settledDevice(m state.Mapping, devs map[int]krbd.Device) *krbd.Device {
	if dv, ok := devs[m.DeviceID]; ok && dv.Spec() == m.Ref && m.ClientAddr != "" && dv.ClientAddr == m.ClientAddr {
		return &dv
	}
	if m.Phase == state.Claiming || m.Phase == state.Claimed || (m.Phase == state.Unmapping && m.ClientAddr == "") {
		// the device of a map interrupted after the kernel write (its state says "claiming";
		// "claimed" in states older agents wrote), or of such a map's unmap that recorded none
		// (a state written before the device was recorded): by names
		for _, dv := range devs {
			if dv.Spec() == m.Ref && (m.FSID == "" || dv.ClusterFSID == m.FSID) && !d.ownedByOther(m.Key, dv) {
				return &dv
			}
		}
	}
	return nil
}

// settleClaiming finishes or undoes a map interrupted after its intent: whether the claim
// was written is only known to the cluster, and whether the kernel made the device only to
// the kernel (the map writes no state between the claim and the recorded device). A device
// of the image (dev, found by names) whose claim is this node's is adopted; with no device
// the claim is released; a device whose claim is not this node's is left to the judgement
// of mappings made outside rbd-owner.
func (d *Daemon) settleClaiming(ctx context.Context, cl *cluster, m state.Mapping, dev *krbd.Device) error {
	var devs []krbd.Device
	if dev != nil {
		devs = []krbd.Device{*dev}
	}
	epoch, err := d.sagas.ClaimingEpoch(ctx, cl, m, devs)
	if err != nil {
		d.setProblem(m.Key, "half-done map waits for the cluster: "+err.Error())
		return err
	}
	switch {
	case dev != nil && epoch != 0:
		// the kernel mapped it after the claim was written: record it and keep it
		m.Epoch = epoch
		return d.settleClaimedMapped(ctx, cl, m, *dev)
	case dev != nil:
		// the map reaches the kernel only once its claim is written: this device is not its
		// own, or its claim was taken since (fencing it); judged like any other mapping
		d.settleLog(m).WithField("device", dev.DevNode).Warn("a map interrupted while claiming left no claim of this node, " +
			"but a device of the image is mapped: judged as a mapping made outside rbd-owner")
	case epoch != 0:
		m.Epoch = epoch
		if err := d.sagas.Release(ctx, cl, m); err != nil {
			d.setProblem(m.Key, "half-done map: claim release failed, will retry: "+err.Error())
			return err
		}
	}
	d.settleLog(m).Info("undid a map interrupted while claiming")
	d.dropState(m)
	return nil
}

// settleClaimedMapped finishes a map whose device appeared but whose reply was never sent:
// nobody uses the device yet; it is recorded in the claim and kept, so a retried request finds
// it, or removed when the claim is lost meanwhile.
func (d *Daemon) settleClaimedMapped(ctx context.Context, cl *cluster, m state.Mapping, dev krbd.Device) error {
	log := d.settleLog(m)
	store, err := cl.Claims(ctx)
	if err == nil {
		_, err = store.SetMapping(ctx, m.Ref.Head(), m.Epoch, dev.ClientAddr, dev.DevNode)
	}
	if err == nil {
		m.Phase, m.DeviceID, m.Device, m.ClientAddr = state.Mapped, dev.ID, dev.DevNode, dev.ClientAddr
		if perr := d.state.Observe(m); perr != nil { // renewed all the same, written later
			log.WithError(perr).Warn("adopted the device of an interrupted map, not yet written to the state file")
		}
		log.WithField("device", dev.DevNode).Info("adopted the device of an interrupted map")
		return nil
	}
	if errors.Is(err, claim.ErrFenced) {
		// the claim is gone and no one was handed the device: remove it
		_, uerr := d.kernel.UnmapDevice(ctx, dev, krbd.UnmapOptions{Force: true})
		if uerr == nil {
			log.WithError(err).Warn("removed the device of an interrupted map whose claim was lost")
			d.dropState(m)
			return nil
		}
		err = fmt.Errorf("%w; removing its device failed: %w", err, uerr)
	}
	d.setProblem(m.Key, "interrupted map: "+err.Error())
	return err
}

// settleUnmapping finishes an interrupted unmap: the device removed, the claim released.
func (d *Daemon) settleUnmapping(ctx context.Context, cl *cluster, m state.Mapping, dev *krbd.Device) error {
	if dev != nil {
		if _, err := d.kernel.UnmapDevice(ctx, *dev, krbd.UnmapOptions{}); err != nil {
			d.setProblem(m.Key, "interrupted unmap: "+err.Error())
			return err
		}
	}
	if m.Claimed {
		if err := d.sagas.Release(ctx, cl, m); err != nil {
			d.setProblem(m.Key, "interrupted unmap: claim release failed, will retry: "+err.Error())
			return err
		}
	}
	d.settleLog(m).Info("finished an interrupted unmap")
	d.dropState(m)
	return nil
}

// ownedByOther says whether another persisted mapping accounts for dv.
func (d *Daemon) ownedByOther(k state.Key, dv krbd.Device) bool {
	for _, o := range d.state.All() {
		if o.Key != k && o.DeviceID == dv.ID && o.ClientAddr == dv.ClientAddr && o.Phase == state.Mapped {
			return true
		}
	}
	return false
}

// dropState forgets a mapping whose device and claim are gone: from memory at once, from the
// state file once it can be written (the store's failure hook reports a write that fails).
func (d *Daemon) dropState(m state.Mapping) {
	_ = d.state.Forget(m.Key) // reported by the store's failure hook; written by the next Flush
	d.setProblem(m.Key, "")
}

// deviceGone handles a managed device that disappeared without the agent: its claim is
// released (no device, no claim) and device_lost is audited.
func (d *Daemon) deviceGone(ctx context.Context, m state.Mapping, how string) error {
	cl := d.clusters[m.Cluster]
	e := audit.Entry{Event: audit.DeviceLost, Result: audit.OK, Cluster: m.Cluster, Pool: m.Pool, Namespace: m.Namespace,
		Image: m.Image, Device: m.Device, Epoch: m.Epoch, OwnerNode: d.cfg.NodeID}
	if !d.rebootedBefore.IsZero() && m.UpdatedAt.Before(d.rebootedBefore) {
		// a reboot removes every krbd device: nothing was done behind the agent's back
		e.Warning = true
		e.Message = fmt.Sprintf("%s (%s) is gone: this node rebooted since it was mapped; releasing its claim", m.Device, m.Key)
	} else {
		d.metrics.DeviceLost(m.Cluster)
		e.Error = true
		e.Message = fmt.Sprintf("%s (%s) was unmapped outside rbd-owner (%s); releasing its claim", m.Device, m.Key, how)
	}
	d.audit.Record(e)
	if m.Claimed && cl != nil {
		if err := d.sagas.Release(ctx, cl, m); err != nil {
			d.setProblem(m.Key, "device lost; claim release failed, will retry: "+err.Error())
			m.Phase = state.Unmapping // the reconciler finishes the release
			if perr := d.state.Observe(m); perr != nil {
				// in memory all the same (the next reconcile finishes the release, without
				// reporting the device lost again); on disk the old record (phase mapped)
				// stays until a write succeeds: after a restart it comes back here
				d.log.WithError(perr).WithField("image", m.Key.String()).Warn("device lost: the pending claim release is not yet written to the state file")
			}
			return err
		}
	}
	d.dropState(m)
	return nil
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
				return d.deviceGone(ctx, cur, "remove event")
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
		d.judgeAtOnce(ctx, dv)
	}
}

// keepFenced re-blocklists this node's own mapping of an image another node now holds, before
// the fence that took it expires: the device is left mapped (unmapping a file system in use is
// not the agent's call), and when the blocklist entry ran out its kernel client would write
// again. Only done when the record shows the image held by others or this hold fenced, so a
// mapping whose record merely vanished is not cut off. The status problem of the claim says
// until when the entry holds, as the monitors recorded it (on their clock, not this node's).
func (d *Daemon) keepFenced(ctx context.Context, cl *cluster, m state.Mapping, lost error) {
	var le *claim.LostError
	if !errors.As(lost, &le) || le.Record == nil || m.ClientAddr == "" || m.Phase != state.Mapped {
		return
	}
	h := le.Record.Holder(d.cfg.NodeID)
	if !(len(le.Record.Holders) > 0 && (h == nil || h.Fenced || h.Epoch != m.Epoch)) {
		return
	}
	if _, err := d.kernel.ReadDevice(m.DeviceID); err != nil {
		return // gone: the reconciler handles it
	}
	if last, ok := d.node.SelfFenceOf(m.Key); ok && time.Since(last.At) < d.cfg.FenceExpiry.D()/4 {
		return
	}
	store, _, ok := cl.connected()
	if !ok {
		return
	}
	bctx, cancel := context.WithTimeout(ctx, 2*cephconn.DefaultTimeout)
	defer cancel()
	until, err := store.Backend().Blocklist(bctx, m.ClientAddr, d.cfg.FenceExpiry.D())
	if err != nil {
		d.log.WithError(err).WithField("image", m.Key.String()).Error("cannot keep this node's lost mapping fenced")
		return
	}
	f := nodestate.SelfFence{Addr: m.ClientAddr, Device: m.Device, Until: until, At: time.Now()}
	d.node.NoteSelfFence(m.Key, f)
	d.setLost(m.Key, lost.Error()+"; "+selfFenceText(f))
	d.metrics.Fenced(m.Cluster, metrics.CauseOwnLost)
	d.audit.Record(audit.Entry{Event: audit.Fence, Cluster: m.Cluster, Pool: m.Pool, Namespace: m.Namespace, Image: m.Image,
		Device: m.Device, Epoch: m.Epoch, OwnerNode: d.cfg.NodeID, Warning: true,
		Message: fmt.Sprintf("%s lost its claim and stays mapped: %s", m.Device, selfFenceText(f))})
}
