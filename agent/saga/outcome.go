package saga

import (
	"errors"
	"fmt"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// How a saga's failure is recorded and undone: a step says it when it fails, the saga's end
// does it (outcome).
type kind int

const (
	quiet   kind = iota // nothing recorded (the lock not had, a fault injected at a step, a denial already audited)
	refused             // the request is refused: audited as a refusal, counted by cause
	failed              // the request failed: audited as a failure
)

// stepError is a failed step's error, how it is recorded, and whether the saga's state is kept
// for the reconciler instead of undone.
type stepError struct {
	err  error
	kind kind
	keep bool
}

func (e *stepError) Error() string { return e.err.Error() }
func (e *stepError) Unwrap() error { return e.err }

func refuse(err error) error  { return &stepError{err: err, kind: refused} }
func failure(err error) error { return &stepError{err: err, kind: failed} }

// kept is a failure whose state is kept for the reconciler (the claim may have been written, or
// the device could not be removed): nothing is undone.
func kept(err error) error { return &stepError{err: err, kind: failed, keep: true} }

// classify splits a saga's error into how it is recorded, whether its state is kept, and the
// error answered.
func classify(err error) (kind, bool, error) {
	var se *stepError
	if errors.As(err, &se) {
		return se.kind, se.keep, se.err
	}
	return quiet, false, err
}

// recordClaim audits a claim a map made, and each holder it took the image over from (fenced),
// as soon as the claim is made: whatever becomes of the map after, the record stays.
func (r *mapRun) recordClaim() {
	t, res, peer := r.t, r.res, r.c.Peer
	epoch := res.Holder.Epoch
	r.s.Audit.Record(audit.Entry{Event: audit.Claim, Cluster: t.key.Cluster, Pool: t.spec.Pool, Namespace: t.spec.Namespace,
		Image: t.spec.Image, Epoch: epoch, OwnerNode: r.s.Config.NodeID, HasPeer: peer != nil, UID: peercred.UID(peer), PID: peercred.PID(peer),
		Message: fmt.Sprintf("claimed %s (%s) at epoch %d", t.spec, r.access, epoch)})
	r.s.Metrics.Takeover(t.key.Cluster, len(res.Fenced))
	for _, f := range res.Fenced {
		r.s.Audit.Record(audit.Entry{Event: audit.Takeover, Cluster: t.key.Cluster, Pool: t.spec.Pool, Namespace: t.spec.Namespace,
			Image: t.spec.Image, Epoch: epoch, OwnerNode: f.NodeID, Warning: true, HasPeer: peer != nil, UID: peercred.UID(peer), PID: peercred.PID(peer),
			Message: fmt.Sprintf("took %s over from node %s (epoch %d) after fencing %s until %s", t.spec, f.NodeID, f.Epoch, f.Described(), f.Expires.Format(time.RFC3339))})
	}
}

// recordMapped audits a map done and logs its steps' times (the benchmark's breakdown).
func (r *mapRun) recordMapped() {
	t, m, peer := r.t, r.m, r.c.Peer
	r.s.Audit.Record(audit.Entry{Event: audit.Map, Cluster: t.key.Cluster, Pool: t.spec.Pool, Namespace: t.spec.Namespace,
		Image: t.spec.Image, Device: r.dev.DevNode, Epoch: m.Epoch, OwnerNode: r.s.Config.NodeID, HasPeer: peer != nil,
		UID: peercred.UID(peer), PID: peercred.PID(peer),
		Message: mappedMessage(t.spec.String(), r.dev.DevNode, m.Epoch, r.dev.ClientAddr, r.req.Requester, r.req.VolumeID) + krbd.DescribeSources(r.sources)})
	r.s.Log.WithField("image", t.key.String()).WithField("requester", r.req.Requester).WithFields(r.steps.fields()).Info("map steps")
}

// mappedMessage is a map's audit line. The volume is named only when the caller gave one: the
// drop-in rbd cannot (ceph-csi's rbd map carries no volume id), and `volume ""` in every CSI
// map's journal line read as if something were missing.
func mappedMessage(spec, dev string, epoch uint64, client, requester, volume string) string {
	msg := fmt.Sprintf("mapped %s as %s (epoch %d, client %s, requester %q", spec, dev, epoch, client, requester)
	if volume != "" {
		msg += fmt.Sprintf(", volume %q", volume)
	}
	return msg + ")"
}

// recordMapError audits a map refused or failed (nothing for a quiet one, or a simulated crash).
func (r *mapRun) recordMapError(err error, k kind) {
	if k == quiet || errors.Is(err, ErrCrash) {
		return
	}
	req, peer := r.req, r.c.Peer
	if k == failed {
		r.s.Audit.Record(audit.Entry{Event: audit.Map, Result: audit.Failed, Cluster: req.Cluster, Pool: req.Pool, Namespace: req.Namespace,
			Image: req.Image, HasPeer: peer != nil, UID: peercred.UID(peer), PID: peercred.PID(peer), Message: "map failed: " + err.Error()})
		return
	}
	clusterID := req.Cluster
	if c, cerr := r.s.Config.Cluster(req.Cluster); cerr == nil {
		clusterID = c.ID
	}
	e := audit.Entry{Event: audit.Refuse, Result: audit.Refused, Cluster: clusterID, Pool: req.Pool, Namespace: req.Namespace,
		Image: req.Image, HasPeer: peer != nil, UID: peercred.UID(peer), PID: peercred.PID(peer), Message: "map refused: " + err.Error()}
	var held *claim.HeldError
	if errors.As(err, &held) {
		e.OwnerNode, e.Epoch = held.Owner().NodeID, held.Epoch
	}
	r.s.Audit.Record(e)
	r.s.Metrics.Refused(r.s.Agent.ClusterLabel(req.Cluster), err)
}

// recordUnmapError audits an unmap that failed.
func (s *Sagas) recordUnmapError(t target, c Caller, err error, k kind) {
	if k == quiet || errors.Is(err, ErrCrash) {
		return
	}
	s.Audit.Record(audit.Entry{Event: audit.Unmap, Result: audit.Failed, Cluster: t.key.Cluster, Pool: t.spec.Pool, Namespace: t.spec.Namespace,
		Image: t.spec.Image, HasPeer: c.Peer != nil, UID: peercred.UID(c.Peer), PID: peercred.PID(c.Peer), Message: "unmap failed: " + err.Error()})
}

// recordUnmapped audits an unmap done.
func (s *Sagas) recordUnmapped(t target, c Caller, m state.Mapping, dev, claimNote string) {
	s.Audit.Record(audit.Entry{Event: audit.Unmap, Cluster: t.key.Cluster, Pool: t.spec.Pool, Namespace: t.spec.Namespace,
		Image: t.spec.Image, Device: dev, Epoch: m.Epoch, OwnerNode: s.Config.NodeID, HasPeer: c.Peer != nil, UID: peercred.UID(c.Peer), PID: peercred.PID(c.Peer),
		Message: fmt.Sprintf("unmapped %s (%s)%s", t.spec, dev, claimNote)})
}
