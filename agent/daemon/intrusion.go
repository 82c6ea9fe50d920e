package daemon

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/cephconn"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/nodestate"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// judgeAtOnce judges a device that just appeared (its add uevent), as soon as no saga of this
// node holds its image: nothing queues it behind other images' work, and no backoff delays it.
func (d *Daemon) judgeAtOnce(ctx context.Context, dv krbd.Device) {
	d.bg.Add(1)
	d.judging.Add(1)
	go func() {
		defer d.bg.Done()
		defer d.judging.Add(-1)
		defer d.node.Judged(dv)
		if err := d.judgeUnmanaged(ctx, dv, true); err != nil {
			// the reconciler judges it again
			d.log.WithError(err).WithField("device", dv.DevNode).Error("judging a device this agent's state does not name failed; retrying at the next reconciliation")
		}
	}()
}

// judgeLater queues the judgement of an unexplained device found by the reconciler on the
// executor (one operation per image, backed off after a failure).
func (d *Daemon) judgeLater(ctx context.Context, dv krbd.Device) {
	cl := d.clusterOfDevice(dv)
	if cl == nil {
		if waiting := d.unconnected(); len(waiting) > 0 {
			// its cluster may be one not connected yet: judged once connected (judgeAtOnce
			// connects first), never before its claim is read; one attempt at a time
			if d.node.NotePending(dv, "cluster "+strings.Join(waiting, ", ")+" not connected yet", true) {
				d.judgeAtOnce(ctx, dv)
			}
			return
		}
		d.noteUnmanaged(nodestate.Unmanaged{Dev: dv, Why: "its cluster (fsid " + orNone(dv.ClusterFSID) + ") is none of the configured clusters"})
		return
	}
	key := state.Key{Cluster: cl.cfg.ID, Ref: dv.Spec()}
	d.ops.start(ctx, key, func(ctx context.Context) error { return d.judgeUnmanaged(ctx, dv, false) })
}

func orNone(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// clusterOfDevice is the configured cluster a device belongs to (by fsid), nil when none is
// connected with that fsid. With one cluster and a kernel that shows no fsid, that cluster.
func (d *Daemon) clusterOfDevice(dv krbd.Device) *cluster {
	if dv.ClusterFSID == "" && len(d.clusters) == 1 {
		for _, c := range d.clusters {
			return c
		}
	}
	return d.clusterByFSID(dv.ClusterFSID)
}

// judgeUnmanaged decides what to do with a device this agent did not map, by its image's
// claim (claim.Store.Unmanaged), holding the image's lock so that a saga of this node cannot
// be mistaken for an intruder: it fences a mapping of an image held elsewhere, adopts one this
// node's claim records or (adopt-or-fence) a free one, and reports the rest. lockWait says
// whether to wait for the lock (an add uevent) or run under the caller's (the executor).
func (d *Daemon) judgeUnmanaged(ctx context.Context, dv krbd.Device, lockWait bool) error {
	cl := d.judgingCluster(ctx, dv, lockWait)
	if cl == nil {
		if waiting := d.unconnected(); len(waiting) > 0 {
			d.node.NotePending(dv, "cluster "+strings.Join(waiting, ", ")+" not connected", false)
			return nil // the reconciler tries again
		}
		d.noteUnmanaged(nodestate.Unmanaged{Dev: dv, Why: "its cluster (fsid " + orNone(dv.ClusterFSID) + ") is none of the configured clusters"})
		return nil
	}
	if lockWait {
		lctx, cancel := context.WithTimeout(ctx, d.cfg.MapTimeout.D()+time.Minute)
		unlock, err := d.locks.Lock(lctx, state.Key{Cluster: cl.cfg.ID, Ref: dv.Spec()})
		cancel()
		if err != nil {
			return fmt.Errorf("device %s: waiting for its image: %w", dv.DevNode, err)
		}
		defer unlock()
	}
	dv, ok := d.stillUnexplained(cl, dv)
	if !ok {
		return nil
	}
	prev, seen := d.node.UnmanagedOf(dv)
	if seen && prev.Verdict == claim.FenceIntruder && time.Since(prev.FencedAt) < d.cfg.FenceExpiry.D()/4 {
		return nil // fenced recently enough: the next look blocklists again before it runs out
	}
	return d.judgeByClaim(ctx, cl, dv)
}

// judgingCluster is the configured cluster of a device to judge; with connect, one not
// connected yet is connected first (connecting is part of reacting at once). nil: none.
func (d *Daemon) judgingCluster(ctx context.Context, dv krbd.Device, connect bool) *cluster {
	cl := d.clusterOfDevice(dv)
	if cl != nil || !connect {
		return cl
	}
	cctx, cancel := context.WithTimeout(ctx, 2*cephconn.DefaultTimeout)
	defer cancel()
	for _, c := range d.clusters {
		if s, err := c.Claims(cctx); err == nil && (s.FSID() == dv.ClusterFSID || dv.ClusterFSID == "") {
			return c
		}
	}
	return nil
}

// stillUnexplained is the device as the kernel shows it now, unless it is gone, changed, or
// explained by this node's state by now (ok false).
func (d *Daemon) stillUnexplained(cl *cluster, dv krbd.Device) (krbd.Device, bool) {
	cur, err := d.kernel.ReadDevice(dv.ID)
	if err != nil || cur.ClientAddr != dv.ClientAddr || cur.Spec() != dv.Spec() {
		return dv, false
	}
	for _, m := range d.state.All() {
		if m.DeviceID == cur.ID && m.ClientAddr == cur.ClientAddr {
			return cur, false
		}
		if m.Ref == cur.Spec() && m.Cluster == cl.cfg.ID && (m.Phase == state.Claiming || m.Phase == state.Claimed) {
			return cur, false // a half-done map of ours: the reconciler's settle adopts or removes it
		}
	}
	return cur, true
}

// judgeByClaim reads the device's image's claim and acts on the verdict: fence, adopt, report.
func (d *Daemon) judgeByClaim(ctx context.Context, cl *cluster, dv krbd.Device) error {
	u := claim.Unmanaged{Image: dv.Spec().Head(), ImageID: dv.ImageID, ClientAddr: dv.ClientAddr, Device: dv.DevNode,
		ReadOnly: dv.ReadOnly}
	var err error
	u.SharedWith, err = d.sharingClient(dv)
	if err != nil {
		return fmt.Errorf("device %s: %w", dv.DevNode, err)
	}
	u.OwnClient = len(u.SharedWith) == 0 && (dv.Options.NoShare || !dv.Options.Known)
	if dv.ClientAddr == "" {
		d.noteUnmanaged(nodestate.Unmanaged{Dev: dv, Cluster: cl.cfg.ID, Why: "the kernel shows no client_addr, so it cannot be fenced"})
		return nil
	}
	if err := dv.Spec().Head().Validate(); err != nil {
		// no claim can name it (the agent refuses such names), so none protects it, and none
		// will: reported as it is, not judged again and again
		d.noteUnmanaged(nodestate.Unmanaged{Dev: dv, Cluster: cl.cfg.ID, Why: "rbd-owner does not manage an image of that name: " + err.Error()})
		return nil
	}
	store, err := cl.Claims(ctx)
	if err != nil {
		d.node.NotePending(dv, err.Error(), false)
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, 2*cephconn.DefaultTimeout)
	defer cancel()
	res, err := store.Unmanaged(cctx, u, claim.UnmanagedPolicy(d.cfg.Unmanaged))
	if err != nil && (res == nil || res.Intruder == nil) {
		if res != nil && res.Action == claim.FenceIntruder {
			// another node holds the image and this mapping can write: say so loudly, and
			// try again (the executor backs off)
			d.fenceFailed(cl, dv, res, err)
			return err
		}
		d.node.NotePending(dv, "acting on its claim failed: "+err.Error(), false)
		return err
	}
	entry := nodestate.Unmanaged{Dev: dv, Cluster: cl.cfg.ID, Verdict: res.Action, Why: res.Why, Unfenceable: res.Unfenceable}
	if len(res.Holders) > 0 {
		entry.Owner = res.Holders[0].NodeID
	}
	switch res.Action {
	case claim.FenceIntruder:
		d.fencedIntruder(cl, dv, u, res, entry, err)
	case claim.Adopt, claim.AdoptOwn:
		d.adopted(cl, store, dv, res)
	default:
		d.noteUnmanaged(entry)
	}
	return nil
}

// fencedIntruder records and audits a device fenced as an intruder; err is a failure to record
// the fence in the claim (the fence stands; the next reconciliation records it).
func (d *Daemon) fencedIntruder(cl *cluster, dv krbd.Device, u claim.Unmanaged, res *claim.UnmanagedResult, entry nodestate.Unmanaged, err error) {
	d.metrics.IntruderFenced(cl.cfg.ID)
	entry.FencedAt, entry.FencedUntil = time.Now(), res.Intruder.Expires
	d.noteUnmanaged(entry)
	shared := ""
	if len(u.SharedWith) > 0 {
		shared = fmt.Sprintf("; its kernel client also served %s, which is fenced with it (mapped without noshare)", strings.Join(u.SharedWith, ", "))
	} else if !u.OwnClient {
		shared = "; it was mapped without noshare: any mapping that joins its kernel client is fenced too"
	}
	d.audit.Record(audit.Entry{Event: audit.UnmanagedDevice, Result: audit.Fenced, Cluster: cl.cfg.ID, Pool: dv.Pool, Namespace: dv.Namespace,
		Image: dv.Image, Device: dv.DevNode, OwnerNode: entry.Owner, Error: true,
		Message: fmt.Sprintf("FENCED %s: it maps %s outside rbd-owner while %s; its client %s is blocklisted until %s, so it cannot write (node %s keeps the image)%s; unmap it, then run `rbd-owner unfence %s`",
			dv.DevNode, dv.Spec(), res.Why, dv.ClientAddr, res.Intruder.Expires.UTC().Format(time.RFC3339), entry.Owner, shared, u.Image)})
	if err != nil {
		d.log.WithError(err).WithField("device", dv.DevNode).Warn("the fence stands but is not recorded in the claim; the next reconciliation records it")
		entry.FencedAt = time.Time{} // look again at the next reconciliation
		d.noteUnmanaged(entry)
	}
}

// adopted takes a device this node's claim now covers into the state and audits it.
func (d *Daemon) adopted(cl *cluster, store *claim.Store, dv krbd.Device, res *claim.UnmanagedResult) {
	m := state.Mapping{Key: state.Key{Cluster: cl.cfg.ID, Ref: dv.Spec()}, FSID: store.FSID(), Phase: state.Mapped,
		Epoch: res.Holder.Epoch, Access: string(claim.RWO), Claimed: true, DeviceID: dv.ID, Device: dv.DevNode, ClientAddr: dv.ClientAddr}
	if res.Record != nil {
		m.Access = string(res.Record.Access)
	}
	if perr := d.state.Observe(m); perr != nil {
		// adopted all the same: in memory, so renewed (a device whose claim is this node's
		// must be, whatever the disk says); written once the state file can be (Flush)
		d.log.WithError(perr).WithField("device", dv.DevNode).Warn("adopted a device, not yet written to the state file; its lease is renewed meanwhile")
	}
	d.node.ForgetUnmanaged(dv.ID)
	d.setProblem(m.Key, "")
	d.metrics.Adopted(cl.cfg.ID)
	msg := fmt.Sprintf("%s maps %s outside rbd-owner: %s: adopted at epoch %d; rbd-owner manages it from now on (unmap it with rbd-owner unmap)",
		dv.DevNode, dv.Spec(), res.Why, m.Epoch)
	if res.Action == claim.AdoptOwn {
		// this agent mapped it, and lost its state since (a rebuild, an interrupted map): not
		// a mapping made outside rbd-owner
		msg = fmt.Sprintf("%s maps %s, mapped by this agent before its state was lost: %s: adopted back at epoch %d; rbd-owner manages it again (unmap it with rbd-owner unmap)",
			dv.DevNode, dv.Spec(), res.Why, m.Epoch)
	}
	d.audit.Record(audit.Entry{Event: audit.UnmanagedDevice, Result: audit.Adopted, Cluster: cl.cfg.ID, Pool: dv.Pool, Namespace: dv.Namespace,
		Image: dv.Image, Device: dv.DevNode, Epoch: m.Epoch, OwnerNode: d.cfg.NodeID, Warning: true, Message: msg})
}

// fenceFailed records an intruder that could not be fenced: it can still write to an image
// another node holds. An error-priority audit entry says so (once per error), status shows it,
// and the judgement is retried.
func (d *Daemon) fenceFailed(cl *cluster, dv krbd.Device, res *claim.UnmanagedResult, err error) {
	entry := nodestate.Unmanaged{Dev: dv, Cluster: cl.cfg.ID, Verdict: claim.FenceIntruder, Why: res.Why, FenceErr: err.Error()}
	if len(res.Holders) > 0 {
		entry.Owner = res.Holders[0].NodeID
	}
	prev, seen := d.node.UnmanagedOf(dv)
	d.noteUnmanaged(entry)
	if seen && prev.FenceErr == entry.FenceErr {
		return
	}
	d.audit.Record(audit.Entry{Event: audit.UnmanagedDevice, Result: audit.Failed, Cluster: cl.cfg.ID, Pool: dv.Pool, Namespace: dv.Namespace,
		Image: dv.Image, Device: dv.DevNode, OwnerNode: entry.Owner, Error: true,
		Message: fmt.Sprintf("could NOT fence %s: it maps %s outside rbd-owner while %s, and can write: %v; retrying. Unmap it now (rbd unmap %s)",
			dv.DevNode, dv.Spec(), res.Why, err, dv.DevNode)})
}

// sharingClient names the other devices on this node that use dv's kernel client.
func (d *Daemon) sharingClient(dv krbd.Device) ([]string, error) {
	devs, err := d.kernel.List()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, o := range devs {
		if o.ID != dv.ID && o.ClientAddr != "" && o.ClientAddr == dv.ClientAddr {
			out = append(out, o.DevNode)
		}
	}
	return out, nil
}

// noteUnmanaged records what was decided about a device and audits a report once per device.
func (d *Daemon) noteUnmanaged(u nodestate.Unmanaged) {
	old, seen := d.node.NoteUnmanaged(u)
	if u.Pending || u.Verdict != claim.Report || (seen && !old.Pending && old.Why == u.Why) {
		return // fences and adoptions are audited where they happen; a report once
	}
	if u.Unfenceable {
		d.audit.Record(audit.Entry{Event: audit.UnmanagedDevice, Result: audit.Reported, Cluster: u.Cluster, Pool: u.Dev.Pool,
			Namespace: u.Dev.Namespace, Image: u.Dev.Image, Device: u.Dev.DevNode, OwnerNode: u.Owner, Error: true,
			Message: fmt.Sprintf("%s maps %s outside rbd-owner while %s", u.Dev.DevNode, u.Dev.Spec(), u.Why)})
		return
	}
	d.audit.Record(audit.Entry{Event: audit.UnmanagedDevice, Result: audit.Reported, Cluster: u.Cluster, Pool: u.Dev.Pool,
		Namespace: u.Dev.Namespace, Image: u.Dev.Image, Device: u.Dev.DevNode, OwnerNode: u.Owner, Warning: true,
		Message: fmt.Sprintf("%s maps %s but was not mapped by rbd-owner: no claim protects it (%s); unmap it and map through rbd-owner",
			u.Dev.DevNode, u.Dev.Spec(), orNone(u.Why))})
}

// unconnected names the configured clusters not connected now, sorted.
func (d *Daemon) unconnected() []string {
	var out []string
	for id, c := range d.clusters {
		if _, _, ok := c.connected(); !ok {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}
