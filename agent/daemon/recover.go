package daemon

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/cephconn"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/devwatch"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// recover rebuilds the agent's view at start, before any request is answered: it re-adopts
// the devices it owns, finishes or undoes half-done sagas, and reports what it cannot explain.
// (Like kubelet's volume manager: rebuild from the kernel, the persisted state and the claims.)
func (d *Daemon) recover(ctx context.Context) {
	start := time.Now()
	d.reconcile(ctx)
	d.renewAll(ctx)
	d.mu.Lock()
	problems, unmanaged := len(d.problems), len(d.unmanaged)
	d.mu.Unlock()
	d.log.WithField("took", time.Since(start).Round(time.Millisecond)).WithField("mappings", len(d.state.All())).
		WithField("problems", problems).WithField("unmanaged_devices", unmanaged).Info("recovery done")
}

// reconcile brings every persisted mapping to a consistent state and notes the devices that
// nobody explains. It skips images whose saga is running.
func (d *Daemon) reconcile(ctx context.Context) {
	devs, err := d.kernel.List()
	if err != nil {
		d.log.WithError(err).Warn("reconcile: cannot list rbd devices")
		return
	}
	byID := map[int]krbd.Device{}
	for _, dv := range devs {
		byID[dv.ID] = dv
	}
	explained := map[int]bool{}
	for _, m := range d.state.All() {
		if dv, ok := byID[m.DeviceID]; ok && (m.Phase == state.Mapped || m.Phase == state.Unmapping) && dv.Spec() == specOf(m) && dv.ClientAddr == m.ClientAddr {
			explained[dv.ID] = true
		}
		unlock, ok := d.locks.tryLock(m.Key)
		if !ok {
			for _, dv := range devs { // a saga is running on it: its device is explained
				if dv.Spec() == specOf(m) {
					explained[dv.ID] = true
				}
			}
			continue
		}
		if cur, ok := d.state.Get(m.Key); ok {
			// list again under the lock: a saga that finished since the first listing may have
			// made a device that the old list does not have
			if fresh, err := d.kernel.List(); err == nil {
				byID = map[int]krbd.Device{}
				for _, dv := range fresh {
					byID[dv.ID] = dv
				}
			}
			if id, adopted := d.settle(ctx, cur, byID); adopted {
				explained[id] = true
			}
		}
		unlock()
	}
	for _, dv := range devs {
		if !explained[dv.ID] && d.unexplained(dv) {
			d.noteUnmanaged(dv)
		}
	}
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

// settle finishes or undoes one mapping's saga. It returns the id of the device it kept.
func (d *Daemon) settle(ctx context.Context, m state.Mapping, devs map[int]krbd.Device) (int, bool) {
	cl := d.clusters[m.Cluster]
	log := d.log.WithField("image", m.Key.String()).WithField("phase", m.Phase)
	if cl == nil {
		d.setProblem(m.Key, fmt.Sprintf("cluster %q is no longer configured; mapping left alone", m.Cluster))
		if dv, ok := devs[m.DeviceID]; ok {
			return dv.ID, true
		}
		return 0, false
	}
	spec := specOf(m)
	// the device this mapping made: by id and client address once known, else by names
	var dev *krbd.Device
	if dv, ok := devs[m.DeviceID]; ok && dv.Spec() == spec && m.ClientAddr != "" && dv.ClientAddr == m.ClientAddr {
		dev = &dv
	} else if m.Phase == state.Claimed {
		for _, dv := range devs {
			if dv.Spec() == spec && (m.FSID == "" || dv.ClusterFSID == m.FSID) && !d.ownedByOther(m.Key, dv) {
				dv := dv
				dev = &dv
				break
			}
		}
	}
	switch m.Phase {
	case state.Claiming:
		// crashed while writing the claim: whether it was written is only known to the cluster
		epoch, err := d.claimingEpoch(ctx, cl, m)
		if err != nil {
			d.setProblem(m.Key, "half-done map waits for the cluster: "+err.Error())
			return 0, false
		}
		if epoch != 0 {
			m.Epoch = epoch
			if err := d.release(ctx, cl, m); err != nil {
				d.setProblem(m.Key, "half-done map: claim release failed, will retry: "+err.Error())
				return 0, false
			}
		}
		log.Info("undid a map interrupted while claiming")
		d.dropState(m)
		return 0, false
	case state.Claimed:
		if dev != nil {
			// the map happened but its reply was never sent: nobody uses the device yet;
			// record it in the claim and keep it, so a retried request finds it
			store, err := cl.claims()
			if err == nil {
				_, err = store.SetMapping(ctx, claim.Image{Pool: m.Pool, Namespace: m.Namespace, Name: m.Image}, m.Epoch, dev.ClientAddr, dev.DevNode)
			}
			if err == nil {
				m.Phase, m.DeviceID, m.Device, m.ClientAddr = state.Mapped, dev.ID, dev.DevNode, dev.ClientAddr
				if err := d.state.Put(m); err == nil {
					log.WithField("device", dev.DevNode).Info("adopted the device of an interrupted map")
					return dev.ID, true
				}
			}
			if errors.Is(err, claim.ErrFenced) {
				// the claim is gone and no one was handed the device: remove it
				if _, uerr := d.kernel.UnmapDevice(ctx, *dev, krbd.UnmapOptions{Force: true}); uerr == nil {
					log.WithError(err).Warn("removed the device of an interrupted map whose claim was lost")
					d.dropState(m)
					return 0, false
				}
			}
			d.setProblem(m.Key, "interrupted map: "+fmt.Sprint(err))
			return dev.ID, true
		}
		if err := d.release(ctx, cl, m); err != nil {
			d.setProblem(m.Key, "interrupted map: claim release failed, will retry: "+err.Error())
			return 0, false
		}
		log.Info("undid a map interrupted before the device appeared")
		d.dropState(m)
		return 0, false
	case state.Mapped:
		if dev != nil {
			return dev.ID, true // renewAll checks the claim
		}
		d.deviceGone(ctx, m, "not present at reconciliation")
		return 0, false
	case state.Unmapping:
		if dev != nil {
			if _, err := d.kernel.UnmapDevice(ctx, *dev, krbd.UnmapOptions{}); err != nil {
				d.setProblem(m.Key, "interrupted unmap: "+err.Error())
				return dev.ID, true
			}
		}
		if m.Claimed {
			if err := d.release(ctx, cl, m); err != nil {
				d.setProblem(m.Key, "interrupted unmap: claim release failed, will retry: "+err.Error())
				return 0, false
			}
		}
		log.Info("finished an interrupted unmap")
		d.dropState(m)
	}
	return 0, false
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

func (d *Daemon) dropState(m state.Mapping) {
	if err := d.state.Delete(m.Key); err != nil {
		d.log.WithError(err).Error("cannot persist state")
	}
	d.setProblem(m.Key, "")
}

// deviceGone handles a managed device that disappeared without the agent: its claim is
// released (no device, no claim) and device_lost is audited.
func (d *Daemon) deviceGone(ctx context.Context, m state.Mapping, how string) {
	cl := d.clusters[m.Cluster]
	d.audit.Record(audit.Entry{Event: audit.DeviceLost, Result: audit.OK, Cluster: m.Cluster, Pool: m.Pool, Namespace: m.Namespace,
		Image: m.Image, Device: m.Device, Epoch: m.Epoch, OwnerNode: d.cfg.NodeID, Error: true,
		Message: fmt.Sprintf("%s (%s) was unmapped outside rbd-owner (%s); releasing its claim", m.Device, m.Key, how)})
	if m.Claimed && cl != nil {
		if err := d.release(ctx, cl, m); err != nil {
			d.setProblem(m.Key, "device lost; claim release failed, will retry: "+err.Error())
			m.Phase = state.Unmapping // the reconciler finishes the release
			if perr := d.state.Put(m); perr != nil {
				// the old record (phase mapped) stays: the next reconcile finds its device
				// gone and comes back here, so the release is still retried
				d.log.WithError(perr).WithField("image", m.Key.String()).Error("device lost: could not persist the pending claim release; the next reconcile retries it")
			}
			return
		}
	}
	d.dropState(m)
}

// deviceEvent reacts to a device appearing or disappearing.
func (d *Daemon) deviceEvent(ctx context.Context, ev devwatch.Event) {
	switch ev.Kind {
	case devwatch.Removed:
		d.forgetUnmanaged(ev.Device.ID)
		for _, m := range d.state.All() {
			if m.Phase != state.Mapped || m.DeviceID != ev.Device.ID || (ev.Device.ClientAddr != "" && m.ClientAddr != ev.Device.ClientAddr) {
				continue
			}
			unlock, ok := d.locks.tryLock(m.Key)
			if !ok {
				continue // a saga on this image runs: it owns the outcome
			}
			if cur, ok := d.state.Get(m.Key); ok && cur.Phase == state.Mapped && cur.DeviceID == ev.Device.ID {
				if _, err := d.kernel.ReadDevice(cur.DeviceID); err != nil {
					d.deviceGone(ctx, cur, "remove event")
				}
			}
			unlock()
		}
	case devwatch.Added:
		dv := ev.Device
		for _, m := range d.state.All() {
			if m.DeviceID == dv.ID && m.ClientAddr == dv.ClientAddr {
				return
			}
		}
		// a saga of ours may be mapping it right now: decide once that saga is over
		key := state.Key{Pool: dv.Pool, Namespace: dv.Namespace, Image: dv.Image, Snap: dv.Snap}
		d.bg.Add(1)
		go func() {
			defer d.bg.Done()
			for _, c := range d.clusters {
				key.Cluster = c.cfg.ID
				wctx, cancel := context.WithTimeout(ctx, d.cfg.MapTimeout.D()+time.Minute)
				unlock, err := d.locks.lock(wctx, key)
				cancel()
				if err == nil {
					unlock()
				}
			}
			for _, m := range d.state.All() {
				if m.DeviceID == dv.ID && m.ClientAddr == dv.ClientAddr {
					return
				}
			}
			if _, err := d.kernel.ReadDevice(dv.ID); err == nil {
				d.noteUnmanaged(dv)
			}
		}()
	}
}

func (d *Daemon) noteUnmanaged(dv krbd.Device) {
	d.mu.Lock()
	old, seen := d.unmanaged[dv.ID]
	d.unmanaged[dv.ID] = dv
	d.mu.Unlock()
	if seen && old.ClientAddr == dv.ClientAddr {
		return // audited once
	}
	d.audit.Record(audit.Entry{Event: audit.UnmanagedDevice, Result: audit.OK, Pool: dv.Pool, Namespace: dv.Namespace, Image: dv.Image,
		Device: dv.DevNode, Warning: true,
		Message: fmt.Sprintf("%s maps %s but was not mapped by rbd-owner: it holds no claim (unmap it and map through rbd-owner)", dv.DevNode, dv.Spec())})
}

func (d *Daemon) forgetUnmanaged(id int) {
	d.mu.Lock()
	delete(d.unmanaged, id)
	d.mu.Unlock()
}

// renewAll renews the lease of every claim held; a claim that cannot be renewed any more is
// reported (status, journal at error priority) and its device left alone: unmapping a
// filesystem in use is never the agent's call.
func (d *Daemon) renewAll(ctx context.Context) {
	down := map[string]bool{} // clusters that did not answer this round: do not wait on them again
	for _, m := range d.state.All() {
		if !m.Claimed || (m.Phase != state.Mapped && m.Phase != state.Claimed) {
			continue
		}
		cl := d.clusters[m.Cluster]
		if cl == nil || down[m.Cluster] {
			continue
		}
		store, err := cl.claims()
		if err != nil {
			d.setProblem(m.Key, "lease not renewed: "+err.Error())
			down[m.Cluster] = true
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, d.cfg.RenewInterval.D())
		_, err = store.Renew(rctx, claim.Image{Pool: m.Pool, Namespace: m.Namespace, Name: m.Image}, m.Epoch)
		cancel()
		switch {
		case err == nil:
			if p := d.problem(m.Key); p != "" {
				d.setProblem(m.Key, "")
			}
		case errors.Is(err, claim.ErrFenced):
			if !d.isLost(m.Key) {
				d.audit.Record(audit.Entry{Event: audit.Renew, Result: audit.Failed, Cluster: m.Cluster, Pool: m.Pool, Namespace: m.Namespace,
					Image: m.Image, Device: m.Device, Epoch: m.Epoch, OwnerNode: d.cfg.NodeID, Error: true,
					Message: fmt.Sprintf("claim on %s is lost, device %s left in place: %v", m.Key, m.Device, err)})
			}
			d.setLost(m.Key, err.Error())
			d.keepFenced(cl, m, err)
		default:
			d.setProblem(m.Key, "lease not renewed: "+err.Error())
			if errors.Is(err, cephconn.ErrUnavailable) {
				down[m.Cluster] = true
			}
		}
	}
}

// keepFenced re-blocklists this node's own mapping of an image another node now holds, before
// the fence that took it expires: the device is left mapped (unmapping a file system in use is
// not the agent's call), and when the blocklist entry ran out its kernel client would write
// again. Only done when the record shows the image held by others or this hold fenced, so a
// mapping whose record merely vanished is not cut off.
func (d *Daemon) keepFenced(cl *cluster, m state.Mapping, lost error) {
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
	d.mu.Lock()
	last := d.selfFenced[m.Key]
	d.mu.Unlock()
	if time.Since(last) < d.cfg.FenceExpiry.D()/4 {
		return
	}
	cl.mu.Lock()
	conn := cl.conn
	cl.mu.Unlock()
	if conn == nil {
		return
	}
	until, err := cephconn.Blocklist(conn, m.ClientAddr, d.cfg.FenceExpiry.D())
	if err != nil {
		d.log.WithError(err).WithField("image", m.Key.String()).Error("cannot keep this node's lost mapping fenced")
		return
	}
	d.mu.Lock()
	d.selfFenced[m.Key] = time.Now()
	d.mu.Unlock()
	d.audit.Record(audit.Entry{Event: audit.Fence, Cluster: m.Cluster, Pool: m.Pool, Namespace: m.Namespace, Image: m.Image,
		Device: m.Device, Epoch: m.Epoch, OwnerNode: d.cfg.NodeID, Warning: true,
		Message: fmt.Sprintf("%s lost its claim and stays mapped: its client %s is kept blocklisted until %s; unmap it", m.Device, m.ClientAddr, until.UTC().Format(time.RFC3339))})
}

func specOf(m state.Mapping) krbd.Spec {
	return krbd.Spec{Pool: m.Pool, Namespace: m.Namespace, Image: m.Image, Snap: m.Snap}
}
