package saga

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/cephconn"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/metrics"
	"github.com/rbd-owner/rbd-owner/agent/nodestate"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// Recovery of the phases the map and unmap sagas persist (state.Mapping.Phase): what the kernel
// and the cluster show of an interrupted saga decides whether it is finished or undone
// (decideResume, pure), and Sagas.Resume does it with the sagas' own kernel, claim stores,
// state and audit log. The reconciler (daemon/recover.go) gathers the inputs and runs it one
// at a time per image.

// claimView is what the cluster's claim record says of this node's hold on a mapping's image,
// as far as recovery has read it.
type claimView int

const (
	// claimUnread: not read (yet); a plan that needs it reads it.
	claimUnread claimView = iota
	// claimHeld: this node holds the image (at the epoch found), its device not known to be
	// recorded in the claim.
	claimHeld
	// claimRecorded: held at the mapping's epoch with its device's client recorded (the
	// record step's answer).
	claimRecorded
	// claimLost: the hold is gone: another node holds the image, or this node's hold was
	// fenced (or, for the record step, no hold of this node at the epoch is left).
	claimLost
	// claimAbsent: no claim, or no hold of this node that could be the mapping's.
	claimAbsent
	// claimUnreadable: the claim could not be read (or written) now.
	claimUnreadable
)

func (v claimView) String() string {
	return [...]string{"unread", "held", "recorded", "lost", "absent", "unreadable"}[v]
}

// resumeInput is what decideResume decides on: the persisted mapping's phase and fields, what
// the kernel shows of its device and what the claim says of this node's hold.
type resumeInput struct {
	Phase state.Phase
	// Configured: the mapping's cluster is still in the config.
	Configured bool
	// Claimed: the mapping holds a claim (false for a snapshot).
	Claimed bool
	// Addressed: the state records the device's client address.
	Addressed bool
	// Device: the device the saga made is there (by id and client address, or by names).
	Device bool
	Claim  claimView
	// SelfFenced: this node re-blocklisted the mapping less than a quarter of the fence
	// expiry ago.
	SelfFenced bool
}

// resumePlan is the next thing recovery does to one persisted mapping.
type resumePlan int

const (
	// planLeaveAlone: its cluster is no longer configured: a status problem, nothing done.
	planLeaveAlone resumePlan = iota
	// planKeep: nothing to do (a mapping with its device: the renewals check the claim).
	planKeep
	// planReadClaim: read this node's hold (Sagas.ClaimingEpoch) before deciding.
	planReadClaim
	// planRetry: keep the entry as it is, a status problem, tried again by the reconciler.
	planRetry
	// planRecord: finish the map: record the device's client in the claim (its answer is
	// the claim's view).
	planRecord
	// planAdopt: the device recorded in the claim: write the mapping, phase mapped.
	planAdopt
	// planRemoveDevice: the map's claim is gone: remove its device (forced), drop the entry.
	planRemoveDevice
	// planLeaveDevice: a device of the image without this node's claim: left to the
	// judgement of mappings made outside rbd-owner, the entry dropped.
	planLeaveDevice
	// planUndo: release the claim, then drop the entry.
	planUndo
	// planDrop: drop the entry (nothing of it is left).
	planDrop
	// planDeviceLost: a mapped device gone behind the agent's back: device_lost audited,
	// its claim released, the entry dropped.
	planDeviceLost
	// planUnmap: finish the unmap: remove the device, then decide again without it.
	planUnmap
	// planKeepFenced: a mapping whose claim another node took, or fenced: re-blocklist its
	// client before the fence expires.
	planKeepFenced
)

func (p resumePlan) String() string {
	return [...]string{"leave-alone", "keep", "read-claim", "retry", "record", "adopt", "remove-device",
		"leave-device", "undo", "drop", "device-lost", "unmap", "keep-fenced"}[p]
}

// decideResume is what recovery does next to a persisted mapping, given what is known of it.
// Pure: no I/O.
func decideResume(in resumeInput) resumePlan {
	if !in.Configured {
		return planLeaveAlone
	}
	switch in.Phase {
	case state.Claiming, state.Claimed:
		// a map interrupted after its intent ("claiming") or, in states older agents wrote,
		// after its claim ("claimed"): whether the claim was written only the cluster knows,
		// whether the device was made only the kernel. The map reaches the kernel only once
		// its claim is written.
		if !in.Device {
			if in.Phase == state.Claimed {
				return planUndo // Release itself checks the hold is this node's at the epoch
			}
			switch in.Claim {
			case claimUnread:
				return planReadClaim
			case claimUnreadable:
				return planRetry
			case claimHeld, claimRecorded:
				return planUndo
			}
			return planDrop
		}
		switch in.Claim {
		case claimUnread:
			if in.Phase == state.Claiming {
				return planReadClaim
			}
			return planRecord // the record step is the claim's check
		case claimHeld:
			return planRecord
		case claimRecorded:
			return planAdopt
		case claimUnreadable:
			return planRetry
		case claimAbsent:
			if in.Phase == state.Claiming {
				return planLeaveDevice // not its own device, or its claim taken since
			}
		}
		return planRemoveDevice // the claim is gone and no one was handed the device
	case state.Mapped:
		switch {
		case !in.Device:
			return planDeviceLost
		case in.Claim == claimLost && in.Addressed && !in.SelfFenced:
			return planKeepFenced
		}
		return planKeep // the renewals check the claim
	case state.Unmapping:
		switch {
		case in.Device:
			return planUnmap
		case in.Claimed:
			return planUndo // Release itself checks the hold is this node's at the epoch
		}
		return planDrop
	}
	return planKeep
}

// resumeTexts are the words of a phase's recovery: the status problem of a release that
// failed, and the log line of the entry dropped.
var resumeTexts = map[state.Phase]struct{ releaseFailed, done string }{
	state.Claiming:  {"half-done map: claim release failed, will retry: ", "undid a map interrupted while claiming"},
	state.Claimed:   {"interrupted map: claim release failed, will retry: ", "undid a map interrupted before the device appeared"},
	state.Unmapping: {"interrupted unmap: claim release failed, will retry: ", "finished an interrupted unmap"},
}

// ByNames says whether the device of m's saga is looked for by names (every device of the
// image) rather than by its recorded id and client address: a map interrupted after the kernel
// write (its state says "claiming"; "claimed" in states older agents wrote), or such a map's
// unmap that recorded none (a state written before the device was recorded).
func ByNames(m state.Mapping) bool {
	return m.Phase == state.Claiming || m.Phase == state.Claimed || (m.Phase == state.Unmapping && m.ClientAddr == "")
}

// Resume finishes or undoes one persisted mapping's saga (called with its image's lock held):
// cl is its cluster (nil when no longer configured), devs the devices the kernel shows, by id
// (ByNames says which must be there). An error means it must be tried again later (the problem
// is also in status).
func (s *Sagas) Resume(ctx context.Context, cl Cluster, m state.Mapping, devs map[int]krbd.Device) error {
	r := &resumeRun{s: s, cl: cl, m: m, in: resumeInput{Phase: m.Phase, Configured: cl != nil, Claimed: m.Claimed, Addressed: m.ClientAddr != ""}}
	if cl != nil {
		r.dev = s.resumeDevice(m, devs)
	}
	r.in.Device = r.dev != nil
	for {
		switch p := decideResume(r.in); p {
		case planReadClaim:
			r.readClaim(ctx)
		case planRecord:
			r.record(ctx)
		case planUnmap:
			if _, err := s.Kernel.UnmapDevice(ctx, *r.dev, krbd.UnmapOptions{}); err != nil {
				s.Node.SetProblem(m.Key, "interrupted unmap: "+err.Error())
				return err
			}
			r.in.Device, r.dev = false, nil
		default:
			return r.finish(ctx, p)
		}
	}
}

// resumeRun is one persisted mapping on its way through Resume's plans.
type resumeRun struct {
	s       *Sagas
	cl      Cluster
	m       state.Mapping
	dev     *krbd.Device // the device its saga made, nil when there is none
	in      resumeInput
	cause   error  // what the claim's read or record answered when it was not held
	problem string // the status problem of a claim unreadable
}

// readClaim reads this node's hold of a map interrupted while claiming (planReadClaim).
func (r *resumeRun) readClaim(ctx context.Context) {
	var found []krbd.Device
	if r.dev != nil {
		found = []krbd.Device{*r.dev}
	}
	epoch, err := r.s.ClaimingEpoch(ctx, r.cl, r.m, found)
	switch {
	case err != nil:
		r.in.Claim, r.cause, r.problem = claimUnreadable, err, "half-done map waits for the cluster: "+err.Error()
	case epoch != 0:
		r.in.Claim, r.m.Epoch = claimHeld, epoch
	default:
		r.in.Claim = claimAbsent
	}
}

// record finishes the map: the device's client recorded in the claim, whose answer says
// whether the hold is still this node's (planRecord).
func (r *resumeRun) record(ctx context.Context) {
	store, err := r.cl.Claims(ctx)
	if err == nil {
		_, err = store.SetMapping(ctx, r.m.Ref.Head(), r.m.Epoch, r.dev.ClientAddr, r.dev.DevNode)
	}
	switch {
	case err == nil:
		r.in.Claim = claimRecorded
	case errors.Is(err, claim.ErrFenced):
		r.in.Claim, r.cause = claimLost, err
	default:
		r.in.Claim, r.cause, r.problem = claimUnreadable, err, "interrupted map: "+err.Error()
	}
}

// finish does a plan that ends the mapping's recovery.
func (r *resumeRun) finish(ctx context.Context, p resumePlan) error {
	s, m, texts := r.s, r.m, resumeTexts[r.m.Phase]
	switch p {
	case planLeaveAlone:
		s.Node.SetProblem(m.Key, fmt.Sprintf("cluster %q is no longer configured; mapping left alone", m.Cluster))
		return nil
	case planRetry:
		s.Node.SetProblem(m.Key, r.problem)
		return r.cause
	case planAdopt:
		log, dev := s.resumeLog(m), r.dev
		m.Phase, m.DeviceID, m.Device, m.ClientAddr = state.Mapped, dev.ID, dev.DevNode, dev.ClientAddr
		if perr := s.State.Observe(m); perr != nil { // renewed all the same, written later
			log.WithError(perr).Warn("adopted the device of an interrupted map, not yet written to the state file")
		}
		log.WithField("device", dev.DevNode).Info("adopted the device of an interrupted map")
		return nil
	case planRemoveDevice:
		if _, uerr := s.Kernel.UnmapDevice(ctx, *r.dev, krbd.UnmapOptions{Force: true}); uerr != nil {
			err := fmt.Errorf("%w; removing its device failed: %w", r.cause, uerr)
			s.Node.SetProblem(m.Key, "interrupted map: "+err.Error())
			return err
		}
		s.resumeLog(m).WithError(r.cause).Warn("removed the device of an interrupted map whose claim was lost")
	case planLeaveDevice:
		s.resumeLog(m).WithField("device", r.dev.DevNode).Warn("a map interrupted while claiming left no claim of this node, " +
			"but a device of the image is mapped: judged as a mapping made outside rbd-owner")
		s.resumeLog(m).Info(texts.done)
	case planUndo:
		if err := s.Release(ctx, r.cl, m); err != nil {
			s.Node.SetProblem(m.Key, texts.releaseFailed+err.Error())
			return err
		}
		s.resumeLog(m).Info(texts.done)
	case planDrop:
		s.resumeLog(m).Info(texts.done)
	case planDeviceLost:
		return s.DeviceGone(ctx, m, "not present at reconciliation")
	default: // planKeep; planKeepFenced is the renewals' (KeepFenced)
		return nil
	}
	s.dropState(m)
	return nil
}

// resumeLog is the log of m's recovery: its image and phase.
func (s *Sagas) resumeLog(m state.Mapping) *logrus.Entry {
	return s.Log.WithField("image", m.Key.String()).WithField("phase", m.Phase)
}

// resumeDevice is the device m's saga made: by id and client address once known, else by
// names (nil when there is none).
func (s *Sagas) resumeDevice(m state.Mapping, devs map[int]krbd.Device) *krbd.Device {
	if dv, ok := devs[m.DeviceID]; ok && dv.Spec() == m.Ref && m.ClientAddr != "" && dv.ClientAddr == m.ClientAddr {
		return &dv
	}
	if ByNames(m) {
		for _, dv := range devs {
			if dv.Spec() == m.Ref && (m.FSID == "" || dv.ClusterFSID == m.FSID) && !s.ownedByOther(m.Key, dv) {
				return &dv
			}
		}
	}
	return nil
}

// ownedByOther says whether another persisted mapping accounts for dv.
func (s *Sagas) ownedByOther(k state.Key, dv krbd.Device) bool {
	for _, o := range s.State.All() {
		if o.Key != k && o.DeviceID == dv.ID && o.ClientAddr == dv.ClientAddr && o.Phase == state.Mapped {
			return true
		}
	}
	return false
}

// dropState forgets a mapping whose device and claim are gone: from memory at once, from the
// state file once it can be written (the store's failure hook reports a write that fails).
func (s *Sagas) dropState(m state.Mapping) {
	_ = s.State.Forget(m.Key) // reported by the store's failure hook; written by the next Flush
	s.Node.SetProblem(m.Key, "")
}

// DeviceGone handles a managed device that disappeared without the agent (phase mapped, no
// device): its claim is released (no device, no claim) and device_lost is audited. A release
// that fails leaves the entry in phase unmapping, which Resume finishes.
func (s *Sagas) DeviceGone(ctx context.Context, m state.Mapping, how string) error {
	var cl Cluster
	if m.Cluster != "" { // a mapping names its cluster: never "the only one"
		cl, _ = s.Agent.Cluster(m.Cluster)
	}
	e := audit.Entry{Event: audit.DeviceLost, Result: audit.OK, Cluster: m.Cluster, Pool: m.Pool, Namespace: m.Namespace,
		Image: m.Image, Device: m.Device, Epoch: m.Epoch, OwnerNode: s.Config.NodeID}
	if !s.RebootedBefore.IsZero() && m.UpdatedAt.Before(s.RebootedBefore) {
		// a reboot removes every krbd device: nothing was done behind the agent's back
		e.Warning = true
		e.Message = fmt.Sprintf("%s (%s) is gone: this node rebooted since it was mapped; releasing its claim", m.Device, m.Key)
	} else {
		s.Metrics.DeviceLost(m.Cluster)
		e.Error = true
		e.Message = fmt.Sprintf("%s (%s) was unmapped outside rbd-owner (%s); releasing its claim", m.Device, m.Key, how)
	}
	s.Audit.Record(e)
	if m.Claimed && cl != nil {
		if err := s.Release(ctx, cl, m); err != nil {
			s.Node.SetProblem(m.Key, "device lost; claim release failed, will retry: "+err.Error())
			m.Phase = state.Unmapping // the reconciler finishes the release
			if perr := s.State.Observe(m); perr != nil {
				// in memory all the same (the next reconcile finishes the release, without
				// reporting the device lost again); on disk the old record (phase mapped)
				// stays until a write succeeds: after a restart it comes back here
				s.Log.WithError(perr).WithField("image", m.Key.String()).Warn("device lost: the pending claim release is not yet written to the state file")
			}
			return err
		}
	}
	s.dropState(m)
	return nil
}

// lostView is what a renewal's lost claim (ErrFenced) says of m's hold: lost when the record
// shows the image held by others or this hold fenced; absent when the record merely vanished.
func lostView(m state.Mapping, lost error, nodeID string) claimView {
	var le *claim.LostError
	if !errors.As(lost, &le) || le.Record == nil {
		return claimAbsent
	}
	h := le.Record.Holder(nodeID)
	if len(le.Record.Holders) > 0 && (h == nil || h.Fenced || h.Epoch != m.Epoch) {
		return claimLost
	}
	return claimAbsent
}

// KeepFenced re-blocklists this node's own mapping of an image another node now holds, before
// the fence that took it expires: the device is left mapped (unmapping a file system in use is
// not the agent's call), and when the blocklist entry ran out its kernel client would write
// again. Only done when the record shows the image held by others or this hold fenced, so a
// mapping whose record merely vanished is not cut off. The status problem of the claim says
// until when the entry holds, as the monitors recorded it (on their clock, not this node's).
func (s *Sagas) KeepFenced(ctx context.Context, cl Cluster, m state.Mapping, lost error) {
	in := resumeInput{Phase: m.Phase, Configured: true, Claimed: m.Claimed, Addressed: m.ClientAddr != "",
		Device: true, Claim: lostView(m, lost, s.Config.NodeID)}
	if decideResume(in) != planKeepFenced { // not even with its device there
		return
	}
	if _, err := s.Kernel.ReadDevice(m.DeviceID); err != nil {
		return // gone: the reconciler handles it
	}
	if last, ok := s.Node.SelfFenceOf(m.Key); ok && time.Since(last.At) < s.Config.FenceExpiry.D()/4 {
		in.SelfFenced = true
	}
	if decideResume(in) != planKeepFenced {
		return
	}
	store, ok := cl.Connected()
	if !ok {
		return
	}
	bctx, cancel := context.WithTimeout(ctx, 2*cephconn.DefaultTimeout)
	defer cancel()
	until, err := store.Backend().Blocklist(bctx, m.ClientAddr, s.Config.FenceExpiry.D())
	if err != nil {
		s.Log.WithError(err).WithField("image", m.Key.String()).Error("cannot keep this node's lost mapping fenced")
		return
	}
	f := nodestate.SelfFence{Addr: m.ClientAddr, Device: m.Device, Until: until, At: time.Now()}
	s.Node.NoteSelfFence(m.Key, f)
	s.setLost(m.Key, lost.Error()+"; "+SelfFenceText(f))
	s.Metrics.Fenced(m.Cluster, metrics.CauseOwnLost)
	s.Audit.Record(audit.Entry{Event: audit.Fence, Cluster: m.Cluster, Pool: m.Pool, Namespace: m.Namespace, Image: m.Image,
		Device: m.Device, Epoch: m.Epoch, OwnerNode: s.Config.NodeID, Warning: true,
		Message: fmt.Sprintf("%s lost its claim and stays mapped: %s", m.Device, SelfFenceText(f))})
}

// SelfFenceText says what the self-fence f of a lost mapping keeps.
func SelfFenceText(f nodestate.SelfFence) string {
	return fmt.Sprintf("its client %s is kept blocklisted until %s (the monitors' expiry); unmap %s", f.Addr, f.Until.UTC().Format(time.RFC3339), f.Device)
}
