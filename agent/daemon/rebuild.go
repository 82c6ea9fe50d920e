package daemon

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/metrics"
	"github.com/rbd-owner/rbd-owner/agent/nodestate"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// settler finishes a rebuild of the state: it reports what the rebuild found once recovery is
// over (reportRebuild), and settles the holds this node's own heartbeats list that the rebuilt
// state does not name, at the rebuild and again at each renew round until none is left
// (resettle). It holds only what that needs; the daemon builds it (New).
type settler struct {
	clusters  map[string]*cluster // the configured clusters, by id (never changed after New)
	kernel    *krbd.Client        // the rbd devices mapped here
	state     *state.Store        // the rebuilt state: what it names, and what was set aside
	node      *nodestate.Node     // the devices not adopted back
	unsettled *unsettledHolds     // the holds not settled yet (unsettled.go)
	judging   *atomic.Int64       // judgements of the devices recovery found, still under way
	audit     *audit.Log
	log       *logrus.Logger
	metrics   *metrics.Metrics
	nodeID    string
	every     time.Duration // renew_interval: bounds one settling round
	judgeWait time.Duration // map_timeout: how long the report waits for the judgements
}

// reportRebuild says, once recovery is over, what the rebuild after a set-aside state found:
// the devices adopted back (their claims name them), those not, and this node's holds without a
// device, released or not (settleListedHolds).
func (s *settler) reportRebuild(ctx context.Context) {
	sa := s.state.SetAside()
	if sa == nil {
		return
	}
	// the judgements of the devices recovery found run beside it: wait for them (bounded)
	deadline := time.Now().Add(s.judgeWait)
	for s.judging.Load() > 0 && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	var adopted []string
	for _, m := range s.state.All() {
		if m.Phase == state.Mapped {
			adopted = append(adopted, m.Device+" ("+m.Key.String()+")")
		}
	}
	var others []string
	for _, u := range s.node.UnmanagedDevices() {
		others = append(others, u.Dev.DevNode+" ("+u.Dev.Spec().String()+"): "+u.Problem())
	}
	sort.Strings(adopted)
	sort.Strings(others)
	s.metrics.StateRebuilt(len(adopted), len(others))
	kept := "could not be kept aside"
	if sa.KeptAs != "" {
		kept = "is kept as " + sa.KeptAs
	}
	released, unsettled := s.settleListedHolds(ctx)
	holds := fmt.Sprintf("claims of this node that its heartbeats list and no device here accounts for: %d released%s", len(released), listText(released))
	if len(unsettled) > 0 {
		holds += fmt.Sprintf(", %d not settled%s: find them with `rbd-owner claims --node %s` and release each one not in use with `rbd-owner release POOL/IMAGE` on this node (without --force: it keeps a claim whose device is mapped here)",
			len(unsettled), listText(unsettled), s.nodeID)
	}
	msg := fmt.Sprintf("state rebuilt: %s could not be used (%v) and %s; from the kernel and the clusters: %d rbd device(s) adopted back%s, %d not%s; %s",
		sa.Path, sa.Reason, kept, len(adopted), listText(adopted), len(others), listText(others), holds)
	s.audit.Record(audit.Entry{Event: audit.StateRebuilt, Result: audit.OK, OwnerNode: s.nodeID, Warning: true, Message: msg})
}

// settleListedHolds finds, after a rebuild, the holds this node's own heartbeats list in every
// place of every connected cluster, and settles each that the rebuilt state does not name
// (settleHold). The ones it cannot settle stay listed and their places' heartbeats go on
// (unsettled.go) until a later round settles them: this node still holds those claims.
func (s *settler) settleListedHolds(ctx context.Context) (released, unsettled []string) {
	for _, cl := range s.clusters {
		r, u := s.settleCluster(ctx, cl)
		released, unsettled = append(released, r...), append(unsettled, u...)
	}
	sort.Strings(released)
	sort.Strings(unsettled)
	return released, unsettled
}

// settleCluster is settleListedHolds on one cluster, connecting to it if need be (a rebuilt state
// with no mapping of it has not connected yet). When its holds cannot be listed, the renew round
// tries again (unsettledHolds.unread).
func (s *settler) settleCluster(ctx context.Context, cl *cluster) (released, unsettled []string) {
	lctx, cancel := context.WithTimeout(ctx, 2*s.every)
	defer cancel()
	devs, err := s.kernel.List()
	if err != nil {
		s.unsettled.unlisted(cl.cfg.ID, true)
		return nil, []string{"(the rbd devices could not be listed: " + err.Error() + ")"}
	}
	store, err := cl.Claims(lctx)
	if err != nil {
		s.unsettled.unlisted(cl.cfg.ID, true)
		return nil, []string{"(cluster " + cl.cfg.ID + " not reached: " + err.Error() + ")"}
	}
	listed, errs := store.ListedHolds(lctx, s.nodeID)
	for _, err := range errs {
		unsettled = append(unsettled, "("+err.Error()+")")
	}
	s.unsettled.unlisted(cl.cfg.ID, len(errs) > 0)
	for _, img := range listed {
		key := state.Key{Cluster: cl.cfg.ID, Ref: img}
		if rel, why := s.settleHold(lctx, cl, store, devs, img); rel {
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
func (s *settler) settleHold(ctx context.Context, cl *cluster, store *claim.Store, devs []krbd.Device, img claim.Image) (released bool, why string) {
	defer func() { s.unsettled.note(cl.cfg.ID, img, why, store) }()
	if s.names(cl.cfg.ID, img) {
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
	h := rec.Holder(s.nodeID)
	if h == nil {
		return false, "" // listed, not held: the next heartbeat drops it
	}
	ok, err := store.Release(ctx, img, h.Epoch)
	if err != nil {
		return false, "release failed: " + err.Error()
	}
	if ok {
		key := state.Key{Cluster: cl.cfg.ID, Ref: img}
		s.audit.Record(audit.Entry{Event: audit.Release, Result: audit.OK, Cluster: cl.cfg.ID, Pool: img.Pool, Namespace: img.Namespace,
			Image: img.Image, Epoch: h.Epoch, OwnerNode: s.nodeID,
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
func (s *settler) names(cluster string, img claim.Image) bool {
	for _, m := range s.state.All() {
		if m.Cluster == cluster && m.Ref.Head() == img {
			return true
		}
	}
	return false
}

// resettle tries again to settle the holds of cl not settled at the rebuild (settleHold), and
// reads its listed holds if the rebuild could not (settleCluster); those still not settled keep
// their places' heartbeats going.
func (s *settler) resettle(ctx context.Context, cl *cluster, store *claim.Store) {
	if s.unsettled.isUnread(cl.cfg.ID) {
		released, unsettled := s.settleCluster(ctx, cl)
		if len(released)+len(unsettled) > 0 {
			s.log.WithField("cluster", cl.cfg.ID).Warn(fmt.Sprintf("after the state's rebuild, this node's holds its heartbeats list and no device here accounts for: %d released%s, %d not settled%s", len(released), listText(released), len(unsettled), listText(unsettled)))
		}
		return
	}
	imgs := s.unsettled.images(cl.cfg.ID)
	if len(imgs) == 0 {
		return
	}
	devs, err := s.kernel.List()
	if err != nil {
		return // tried again next round
	}
	sctx, cancel := context.WithTimeout(ctx, s.every)
	defer cancel()
	for _, img := range imgs {
		before := s.unsettled.why(cl.cfg.ID, img)
		if _, why := s.settleHold(sctx, cl, store, devs, img); why != "" && why != before {
			s.log.WithField("image", img.String()).WithField("cluster", cl.cfg.ID).
				Warn("a hold of this node that its heartbeat lists and its state does not name is not settled (" + why + "): its place's heartbeat goes on; tried again next round")
		}
	}
}
