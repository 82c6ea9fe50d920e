package daemon

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/saga"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// The agent's own state file going wrong: set aside when it cannot be used at start, and the
// view rebuilt from the kernel and the clusters (as kubelet's volume manager reconstructs from
// the mount table); writes that fail later. Neither stops the agent: its heartbeats, and with
// them its leases, go on; only maps are refused while the state cannot be written.

// watchState reports the state file's trouble: the file set aside at start, and every write
// that fails from now on.
func (d *Daemon) watchState() {
	var logged struct {
		sync.Mutex
		msg string
		at  time.Time
	}
	d.state.OnWriteFailure(func(err error) {
		d.metrics.StateWriteFailed()
		// every failure counts; the journal hears of a new error, or the same again every
		// ten minutes (the reconciler retries a pending write every renew interval)
		logged.Lock()
		again := err.Error() == logged.msg && time.Since(logged.at) < 10*time.Minute
		if !again {
			logged.msg, logged.at = err.Error(), time.Now()
		}
		logged.Unlock()
		if !again {
			d.log.WithError(err).Error("cannot write the state file: " + saga.StateNextStep(d.cfg.StateDir, err) + " (maps and unmaps are refused until it can be written; leases are kept)")
		}
	})
	if err, _ := d.state.WriteFailure(); err != nil { // a write at open, before the hook was there
		d.metrics.StateWriteFailed()
		d.log.WithError(err).Error("cannot write the state file: " + saga.StateNextStep(d.cfg.StateDir, err) + " (maps and unmaps are refused until it can be written; leases are kept)")
	}
	sa := d.state.SetAside()
	if sa == nil {
		return
	}
	d.metrics.StateSetAside()
	d.log.WithField("kept_as", sa.KeptAs).WithError(sa.Reason).
		Warn("the state file could not be used and is set aside; rebuilding this node's view from the kernel and the clusters")
}

// stateWriteProblem is status's line for a state file that cannot be written.
func (d *Daemon) stateWriteProblem(err error) string {
	return fmt.Sprintf("%v; maps and unmaps are refused until it can be written: %s; leases are kept", err, saga.StateNextStep(d.cfg.StateDir, err))
}

// reportRebuild says, once recovery is over, what the rebuild after a set-aside state found:
// the devices adopted back (their claims name them), those not, and this node's holds without a
// device, released or not (settleListedHolds).
func (d *Daemon) reportRebuild(ctx context.Context) {
	sa := d.state.SetAside()
	if sa == nil {
		return
	}
	// the judgements of the devices recovery found run beside it: wait for them (bounded)
	deadline := time.Now().Add(d.cfg.MapTimeout.D())
	for d.judging.Load() > 0 && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	var adopted []string
	for _, m := range d.state.All() {
		if m.Phase == state.Mapped {
			adopted = append(adopted, m.Device+" ("+m.Key.String()+")")
		}
	}
	var others []string
	for _, u := range d.node.UnmanagedDevices() {
		others = append(others, u.Dev.DevNode+" ("+u.Dev.Spec().String()+"): "+u.Problem())
	}
	sort.Strings(adopted)
	sort.Strings(others)
	d.metrics.StateRebuilt(len(adopted), len(others))
	kept := "could not be kept aside"
	if sa.KeptAs != "" {
		kept = "is kept as " + sa.KeptAs
	}
	released, unsettled := d.settleListedHolds(ctx)
	holds := fmt.Sprintf("claims of this node that its heartbeats list and no device here accounts for: %d released%s", len(released), listText(released))
	if len(unsettled) > 0 {
		holds += fmt.Sprintf(", %d not settled%s: find them with `rbd-owner claims --node %s` and release each one not in use with `rbd-owner release POOL/IMAGE` on this node (without --force: it keeps a claim whose device is mapped here)",
			len(unsettled), listText(unsettled), d.cfg.NodeID)
	}
	msg := fmt.Sprintf("state rebuilt: %s could not be used (%v) and %s; from the kernel and the clusters: %d rbd device(s) adopted back%s, %d not%s; %s",
		sa.Path, sa.Reason, kept, len(adopted), listText(adopted), len(others), listText(others), holds)
	d.audit.Record(audit.Entry{Event: audit.StateRebuilt, Result: audit.OK, OwnerNode: d.cfg.NodeID, Warning: true, Message: msg})
}

// settleListedHolds finds, after a rebuild, the holds this node's own heartbeats list in every
// place of every connected cluster, and settles each that the rebuilt state does not name
// (settleHold). The ones it cannot settle stay listed and their places' heartbeats go on
// (unsettled.go) until a later round settles them: this node still holds those claims.
func (d *Daemon) settleListedHolds(ctx context.Context) (released, unsettled []string) {
	for _, cl := range d.clusters {
		r, u := d.settleCluster(ctx, cl)
		released, unsettled = append(released, r...), append(unsettled, u...)
	}
	sort.Strings(released)
	sort.Strings(unsettled)
	return released, unsettled
}

// settleCluster is settleListedHolds on one cluster, connecting to it if need be (a rebuilt state
// with no mapping of it has not connected yet). When its holds cannot be listed, the renew round
// tries again (unsettledHolds.unread).
func (d *Daemon) settleCluster(ctx context.Context, cl *cluster) (released, unsettled []string) {
	lctx, cancel := context.WithTimeout(ctx, 2*d.cfg.RenewInterval.D())
	defer cancel()
	devs, err := d.kernel.List()
	if err != nil {
		d.unsettled.unlisted(cl.cfg.ID, true)
		return nil, []string{"(the rbd devices could not be listed: " + err.Error() + ")"}
	}
	store, err := cl.Claims(lctx)
	if err != nil {
		d.unsettled.unlisted(cl.cfg.ID, true)
		return nil, []string{"(cluster " + cl.cfg.ID + " not reached: " + err.Error() + ")"}
	}
	listed, errs := store.ListedHolds(lctx, d.cfg.NodeID)
	for _, err := range errs {
		unsettled = append(unsettled, "("+err.Error()+")")
	}
	d.unsettled.unlisted(cl.cfg.ID, len(errs) > 0)
	for _, img := range listed {
		key := state.Key{Cluster: cl.cfg.ID, Ref: img}
		if rel, why := d.settleHold(lctx, cl, store, devs, img); rel {
			released = append(released, key.String())
		} else if why != "" {
			unsettled = append(unsettled, key.String()+" ("+why+")")
		}
	}
	return released, unsettled
}

// settleHold settles one hold of img that this node's heartbeat lists: nothing to do when the
// state names a mapping of it, or the claim names no hold of this node; released when no device
// here accounts for it; else why it is not settled (a device mapped here that was not adopted, a
// read or a release that failed), and it is kept listed, its place's heartbeat going on.
func (d *Daemon) settleHold(ctx context.Context, cl *cluster, store *claim.Store, devs []krbd.Device, img claim.Image) (released bool, why string) {
	defer func() { d.unsettled.note(cl.cfg.ID, img, why, store) }()
	if d.names(cl.cfg.ID, img) {
		return false, ""
	}
	if hasDevice(devs, store.FSID(), img) {
		return false, "mapped here, not adopted"
	}
	rec, err := store.Inspect(ctx, img)
	if err != nil {
		if errors.Is(err, claim.ErrNoClaim) {
			return false, ""
		}
		return false, err.Error()
	}
	h := rec.Holder(d.cfg.NodeID)
	if h == nil {
		return false, "" // listed, not held: the next heartbeat drops it
	}
	ok, err := store.Release(ctx, img, h.Epoch)
	if err != nil {
		return false, "release failed: " + err.Error()
	}
	if ok {
		key := state.Key{Cluster: cl.cfg.ID, Ref: img}
		d.audit.Record(audit.Entry{Event: audit.Release, Result: audit.OK, Cluster: cl.cfg.ID, Pool: img.Pool, Namespace: img.Namespace,
			Image: img.Image, Epoch: h.Epoch, OwnerNode: d.cfg.NodeID,
			Message: fmt.Sprintf("state rebuilt: released this node's claim on %s at epoch %d, which its heartbeat listed and no device here accounts for", key, h.Epoch)})
	}
	return ok, ""
}

// hasDevice says whether a device of img (its head or a snapshot) on the cluster of fsid is
// mapped here.
func hasDevice(devs []krbd.Device, fsid string, img claim.Image) bool {
	for _, dv := range devs {
		if dv.Pool == img.Pool && dv.Namespace == img.Namespace && dv.Image == img.Image && (dv.ClusterFSID == "" || fsid == "" || dv.ClusterFSID == fsid) {
			return true
		}
	}
	return false
}

// names says whether the state names a mapping of img (its head or a snapshot) on cluster.
func (d *Daemon) names(cluster string, img claim.Image) bool {
	for _, m := range d.state.All() {
		if m.Cluster == cluster && m.Ref.Head() == img {
			return true
		}
	}
	return false
}

// resettle tries again to settle the holds of cl not settled at the rebuild (settleHold), and
// reads its listed holds if the rebuild could not (settleCluster); those still not settled keep
// their places' heartbeats going.
func (d *Daemon) resettle(ctx context.Context, cl *cluster, store *claim.Store) {
	d.unsettled.mu.Lock()
	unread := d.unsettled.unread[cl.cfg.ID]
	d.unsettled.mu.Unlock()
	if unread {
		released, unsettled := d.settleCluster(ctx, cl)
		if len(released)+len(unsettled) > 0 {
			d.log.WithField("cluster", cl.cfg.ID).Warn(fmt.Sprintf("after the state's rebuild, this node's holds its heartbeats list and no device here accounts for: %d released%s, %d not settled%s", len(released), listText(released), len(unsettled), listText(unsettled)))
		}
		return
	}
	imgs := d.unsettled.images(cl.cfg.ID)
	if len(imgs) == 0 {
		return
	}
	devs, err := d.kernel.List()
	if err != nil {
		return // tried again next round
	}
	sctx, cancel := context.WithTimeout(ctx, d.cfg.RenewInterval.D())
	defer cancel()
	for _, img := range imgs {
		before := d.unsettled.why(cl.cfg.ID, img)
		if _, why := d.settleHold(sctx, cl, store, devs, img); why != "" && why != before {
			d.log.WithField("image", img.String()).WithField("cluster", cl.cfg.ID).
				Warn("a hold of this node that its heartbeat lists and its state does not name is not settled (" + why + "): its place's heartbeat goes on; tried again next round")
		}
	}
}
