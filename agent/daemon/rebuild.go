package daemon

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/audit"
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
// the devices adopted back (their claims name them), those not, and that this node's holds
// without a device could not be checked (nothing lists a node's claims yet).
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
	msg := fmt.Sprintf("state rebuilt: %s could not be used (%v) and %s; from the kernel and the clusters: %d rbd device(s) adopted back%s, %d not%s; "+
		"claims of this node that have no device here could not be checked (nothing lists a node's claims yet): find them with `rbd-owner claims` and release each one not in use with `rbd-owner release POOL/IMAGE` on this node (without --force: it keeps a claim whose device is mapped here)",
		sa.Path, sa.Reason, kept, len(adopted), listText(adopted), len(others), listText(others))
	d.audit.Record(audit.Entry{Event: audit.StateRebuilt, Result: audit.OK, OwnerNode: d.cfg.NodeID, Warning: true, Message: msg})
}

// listText is ": a, b" or "".
func listText(items []string) string {
	if len(items) == 0 {
		return ""
	}
	return ": " + strings.Join(items, ", ")
}
