package daemon

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
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

// listText is ": a, b" or "".
func listText(items []string) string {
	if len(items) == 0 {
		return ""
	}
	return ": " + strings.Join(items, ", ")
}

// settleListedHolds finds, after a rebuild, the holds this node's own heartbeats list in every
// place of every connected cluster (claim.Store.ListedHolds) that the rebuilt state does not
// name, and releases each one whose image has no device on this node (a map killed between its
// claim and the kernel, a device unmapped while the state was lost): kept, nobody would renew
// or release it, and its place's heartbeat would stop. A hold with a device here (one the rebuild
// could not adopt) is left for a person. It returns the images released and those not settled,
// with why.
func (d *Daemon) settleListedHolds(ctx context.Context) (released, unsettled []string) {
	devs, err := d.kernel.List()
	if err != nil {
		return nil, []string{"(the rbd devices could not be listed: " + err.Error() + ")"}
	}
	for _, cl := range d.clusters {
		store, _, ok := cl.connected()
		if !ok {
			unsettled = append(unsettled, "(cluster "+cl.cfg.ID+" not connected)")
			continue
		}
		lctx, cancel := context.WithTimeout(ctx, 2*d.cfg.RenewInterval.D())
		listed, errs := store.ListedHolds(lctx, d.cfg.NodeID)
		for _, err := range errs {
			unsettled = append(unsettled, "("+err.Error()+")")
		}
		for _, img := range listed {
			key := state.Key{Cluster: cl.cfg.ID, Ref: img}
			if named := d.names(cl.cfg.ID, img); named || hasDevice(devs, store.FSID(), img) {
				if !named {
					unsettled = append(unsettled, key.String()+" (mapped here, not adopted)")
				}
				continue
			}
			rec, err := store.Inspect(lctx, img)
			if err != nil {
				if !errors.Is(err, claim.ErrNoClaim) {
					unsettled = append(unsettled, key.String()+" ("+err.Error()+")")
				}
				continue
			}
			h := rec.Holder(d.cfg.NodeID)
			if h == nil {
				continue // listed, not held: the next heartbeat drops it
			}
			if ok, err := store.Release(lctx, img, h.Epoch); err != nil {
				unsettled = append(unsettled, key.String()+" (release failed: "+err.Error()+")")
			} else if ok {
				released = append(released, key.String())
				d.audit.Record(audit.Entry{Event: audit.Release, Result: audit.OK, Cluster: cl.cfg.ID, Pool: img.Pool, Namespace: img.Namespace,
					Image: img.Image, Epoch: h.Epoch, OwnerNode: d.cfg.NodeID,
					Message: fmt.Sprintf("state rebuilt: released this node's claim on %s at epoch %d, which its heartbeat listed and no device here accounts for", key, h.Epoch)})
			}
		}
		cancel()
	}
	sort.Strings(released)
	sort.Strings(unsettled)
	return released, unsettled
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
