package daemon

import (
	"context"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/cephconn"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/metrics"
	"github.com/rbd-owner/rbd-owner/agent/nodestate"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// Fence lifetimes (claim.KeepFences): the fences recorded in a claim are re-blocklisted before
// they expire, for as long as their mappings may exist, by this node when it holds the claim
// (at each claim check of the renewal round) and by its pool sweeps, which keep every claim's
// fences, free or held (sweep.go). This file is the daemon's side of it, one worker
// (fenceUpkeep): when to keep, what to report, and the "known gone" report of this node's own
// fenced mappings.

// bootIDFile is where the kernel publishes its boot id.
const bootIDFile = "/proc/sys/kernel/random/boot_id"

// fenceExpiry is the configured fence_expiry, or the claim store's default.
func fenceExpiry(cfg *config.Config) time.Duration {
	if e := cfg.FenceExpiry.D(); e > 0 {
		return e
	}
	return claim.DefaultFenceExpiry
}

// fenceUpkeep keeps the fences the claims record, for the renewer (the claims this node holds)
// and the sweeper (every claim of the places it sweeps), notes them for the metrics, and records
// this node's own fenced mappings gone. It holds only what that needs; the daemon builds it
// (New).
type fenceUpkeep struct {
	state   *state.Store    // the mappings held, and the pools this node sweeps
	node    *nodestate.Node // the fences kept, as last seen
	audit   *audit.Log
	log     *logrus.Logger
	metrics *metrics.Metrics
	nodeID  string
	expiry  time.Duration        // fenceExpiry
	mono    func() time.Duration // Options.Mono
}

// keepFences renews rec's live fences that are due, if any (no cluster call otherwise): the
// renewals and the fences found gone are audited, a failure is logged at error priority,
// counted and returned (the renewal is tried again at the next check).
func (u *fenceUpkeep) keepFences(ctx context.Context, cl *cluster, store *claim.Store, img claim.Image, rec *claim.Record) error {
	u.noteKept(cl.cfg.ID, img, rec.Kept()) // as the record says now, whoever renewed them
	if !store.Due(img, rec) {
		return nil
	}
	kctx, cancel := context.WithTimeout(ctx, 2*cephconn.DefaultTimeout)
	rep, err := store.KeepFences(kctx, img)
	cancel()
	for _, f := range rep.Renewed {
		u.metrics.FenceRenewed(cl.cfg.ID, nil)
		u.log.WithField("image", img.String()).WithField("addr", f.Addr).WithField("expires", f.Expires.Format(time.RFC3339)).
			Info("fence kept: " + f.Described() + " is listed as the claim now records, while its mapping may exist")
	}
	for _, f := range rep.Faults {
		u.fenceFault(cl, f)
	}
	for _, a := range rep.Lifted {
		u.audit.Record(audit.Entry{Event: audit.Fence, Result: audit.OK, Cluster: cl.cfg.ID, Pool: img.Pool, Namespace: img.Namespace, Image: img.Image,
			Message: fmt.Sprintf("removed the blocklist entry %s of a fence on %s that has ended (this project listed it)", a, img)})
	}
	for _, f := range rep.Gone {
		u.audit.Record(audit.Entry{Event: audit.Fence, Result: audit.OK, Cluster: cl.cfg.ID, Pool: img.Pool, Namespace: img.Namespace,
			Image: img.Image, Epoch: f.Epoch, OwnerNode: f.NodeID,
			Message: fmt.Sprintf("fence of %s on %s is no longer renewed: %s; its blocklist entry expires %s", f.Addr, img, f.Gone, f.Expires.Format(time.RFC3339))})
	}
	for _, unchecked := range rep.Unchecked {
		u.log.WithError(unchecked).WithField("image", img.String()).Warn("a fenced node's liveness record could not be read to see whether it rebooted; its fence was renewed all the same")
	}
	if err == nil || len(rep.Live) > 0 { // a failed read says nothing of the fences: the note stays
		u.noteKept(cl.cfg.ID, img, rep.Live)
	}
	if n := rep.Unrepaired(); n > 0 && err == nil {
		// reported above, each; a sweep that leaves one so is not recorded (sweepPlace), so the
		// other nodes check it too at their next look
		return fmt.Errorf("%d fence(s) of %s not in force as recorded (reported above)", n, img)
	}
	if err != nil {
		u.metrics.FenceRenewed(cl.cfg.ID, err)
		u.log.WithError(err).WithField("image", img.String()).
			Error("a fence could not be renewed; retried at the next check. If it expires while its mapping exists, that mapping can write again: check that this agent's user may run `osd blocklist`")
	}
	return err
}

// fenceFault reports a live fence whose blocklist entry was not as its claim said, at error
// priority in the audit journal (the RbdOwnerFenceNotInForce alert counts it): while an entry is
// missing its mapping can write beside the image's holder.
func (u *fenceUpkeep) fenceFault(cl *cluster, f claim.EntryFault) {
	u.metrics.FenceFault(cl.cfg.ID, f.Kind, f.Repaired())
	msg := f.String()
	if !f.Repaired() {
		msg += ". Until it is in force again its mapping can write if its node resumes: keep that node stopped, or unmap the device there (or reboot it), which ends the fence"
	}
	u.audit.Record(audit.Entry{Event: audit.Fence, Result: audit.Failed, Cluster: cl.cfg.ID, Pool: f.Image.Pool, Namespace: f.Image.Namespace,
		Image: f.Image.Image, OwnerNode: f.NodeID, Error: true, Message: msg})
}

// noteKept remembers the live fences of img as last seen, for the metrics (fences near expiry).
func (u *fenceUpkeep) noteKept(cluster string, img claim.Image, live []claim.KeptFence) {
	u.node.NoteKept(cluster, img, nodestate.KeptFences{Cluster: cluster, Place: livenessPlace(img.Pool, img.Namespace), Fences: live, At: u.mono()})
}

// keepsFences says whether img's claim showed live fences at its last read: its holder reads it
// every round, to keep them.
func (u *fenceUpkeep) keepsFences(cluster string, img claim.Image) bool {
	return u.node.KeepsFences(cluster, img)
}

// forgetKeptIn drops the notes of the fences of the claims in a pool and namespace that this node
// does not hold: it keeps those only while it sweeps the place.
func (u *fenceUpkeep) forgetKeptIn(cluster, pool, ns string) {
	held := map[string]bool{}
	for _, m := range u.state.All() {
		if m.Cluster == cluster && m.Claimed {
			held[nodestate.HeldName(cluster, m.Ref.Head())] = true
		}
	}
	u.node.ForgetKeptIn(cluster, livenessPlace(pool, ns), held)
}

// keptSnapshot is the live fences this node keeps, for the metrics: those noted within half a
// fence's life (this node renews what it keeps every quarter; older notes are of claims it no
// longer sees).
func (u *fenceUpkeep) keptSnapshot() []metrics.Fence {
	now, life := u.mono(), u.expiry
	var out []metrics.Fence
	for _, kf := range u.node.Kept(now - life/2) {
		for _, f := range kf.Fences {
			out = append(out, metrics.Fence{Cluster: kf.Cluster, Expires: f.Expires})
		}
	}
	return out
}

// rememberPool makes this node a sweeper of k's pool, so that the fences of its claims are kept
// even once nothing of it is mapped here (an admin's fence or forced release); a failure to
// persist it is logged: the pool is swept until the agent restarts.
func (u *fenceUpkeep) rememberPool(k state.Key) {
	if err := u.state.RememberPool(state.Pool{Cluster: k.Cluster, Pool: k.Pool}); err != nil {
		u.log.WithError(err).WithField("pool", k.Pool).Warn("could not persist that this node sweeps this pool for the fences it made, so it does not; the holder and the other nodes that used the pool still do")
	}
}

// fencedMappingGone reports that this node's mapping m, whose claim another node took (or an
// admin fenced), no longer exists: its fences in the claim are marked gone, and nobody renews
// them from then on. A failure only means the fence is kept longer than needed; it is logged.
func (u *fenceUpkeep) fencedMappingGone(ctx context.Context, store *claim.Store, m state.Mapping) {
	if m.ClientAddr == "" {
		return
	}
	why := fmt.Sprintf("node %s's agent found its mapping %s (client %s) unmapped", u.nodeID, m.Device, m.ClientAddr)
	n, err := store.FenceGone(ctx, m.Ref.Head(), u.nodeID, m.ClientAddr, why)
	if err != nil {
		u.log.WithError(err).WithField("image", m.Key.String()).
			Warn("could not record that this node's fenced mapping is gone; its fence is kept (renewed) until it expires unrenewed or an admin lifts it")
		return
	}
	if n > 0 {
		u.audit.Record(audit.Entry{Event: audit.Fence, Result: audit.OK, Cluster: m.Cluster, Pool: m.Pool, Namespace: m.Namespace, Image: m.Image,
			Device: m.Device, Epoch: m.Epoch, OwnerNode: u.nodeID,
			Message: fmt.Sprintf("recorded in the claim of %s: %s; its fence is no longer renewed", m.Key, why)})
	}
}
