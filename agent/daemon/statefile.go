package daemon

import (
	"fmt"
	"sync"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/saga"
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
