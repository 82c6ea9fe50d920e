package admin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/cephconn"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/claimapi"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
)

// ClaimsQuery is what a listing of claims asks for: a cluster ("" for the only one), a pool
// ("" for every pool), a node ("" for every holder), and whether only orphans (claims of
// deleted images).
type ClaimsQuery struct {
	Cluster, Pool, Node string
	OnlyOrphans         bool
	// EveryPool, when set, is asked before the claims of every pool are read (no pool, no node):
	// its error refuses the listing (a caller that may not read every claim of the cluster).
	EveryPool func() error
}

// Claims lists the claim records of a cluster's pools, each marked when its image is gone; or,
// with q.Node, the claims that name that node as a holder, cluster-wide (NodeClaims).
func (a *Admin) Claims(ctx context.Context, q ClaimsQuery) ([]api.Claim, error) {
	cluster, store, err := a.clusterStore(ctx, q.Cluster)
	if err != nil {
		return nil, err
	}
	if q.Node != "" {
		return a.NodeClaims(ctx, cluster, store, q.Node, q.Pool)
	}
	if q.Pool == "" && q.EveryPool != nil {
		if err := q.EveryPool(); err != nil {
			return nil, err
		}
	}
	pools, err := a.Agent.Pools(ctx, cluster, q.Pool)
	if err != nil {
		return nil, err
	}
	out := []api.Claim{}
	for _, p := range pools {
		recs, err := store.List(ctx, p)
		if err != nil {
			if skippable(pools, err) {
				continue // a pool the agent may not read is not one it claims in
			}
			return nil, err
		}
		for i := range recs {
			orphan, err := store.IsOrphan(ctx, recs[i])
			if err != nil {
				// the claim is still worth showing; whether its image is gone is not known
				a.Log.WithError(err).WithField("image", recs[i].Ref.String()).Warn("claims listing: could not tell whether the image is gone")
				if q.OnlyOrphans {
					return nil, err
				}
			}
			if q.OnlyOrphans && !orphan {
				continue
			}
			c := claimapi.Of(cluster, &recs[i])
			c.Orphan = orphan
			out = append(out, *c)
		}
	}
	return out, nil
}

// skippable: err, reading one of several pools, says the agent may not read that pool (or it
// is gone): not one it claims in.
func skippable(pools []string, err error) bool {
	return len(pools) > 1 && (errors.Is(err, cephconn.ErrPermission) || errors.Is(err, claim.ErrNotFound))
}

// NodeClaims lists the claims that name node as a holder, cluster-wide (only in pool when one
// is named), found through node's heartbeats: what `fence --node` would fence.
func (a *Admin) NodeClaims(ctx context.Context, cluster string, store *claim.Store, node, pool string) ([]api.Claim, error) {
	holds, errs := store.NodeHolds(ctx, node)
	if len(holds) == 0 && len(errs) > 0 {
		return nil, fmt.Errorf("claims of node %s: %w", node, errors.Join(errs...))
	}
	for _, err := range errs {
		a.Log.WithError(err).WithField("node", node).Warn("claims of a node: a place could not be read; the list may be short")
	}
	out := []api.Claim{}
	for _, h := range holds {
		if pool == "" || h.Record.Pool == pool {
			out = append(out, *claimapi.Of(cluster, &h.Record))
		}
	}
	return out, nil
}

// RemoveOrphans removes the claims of deleted images. Without req.Force it removes only what
// the automatic sweep removes (a free claim keeping no live fence: store.SweepOrphan) and
// answers the others as kept, each with why and the next step: an image gone by name may only
// have been renamed or moved to the trash, which keeps its data, and its holder or a fenced
// mapping of it could still write. With req.Force it removes those too (store.RemoveOrphan),
// each audited as forced, at warning priority.
func (a *Admin) RemoveOrphans(ctx context.Context, req api.OrphansRequest, peer *peercred.Cred) (*api.OrphansResponse, error) {
	cluster, store, err := a.clusterStore(ctx, req.Cluster)
	if err != nil {
		return nil, err
	}
	pools, err := a.Agent.Pools(ctx, cluster, req.Pool)
	if err != nil {
		return nil, err
	}
	out := &api.OrphansResponse{Removed: []string{}, Kept: []api.KeptOrphan{}}
	for _, p := range pools {
		orphans, err := store.Orphans(ctx, p)
		if err != nil {
			if skippable(pools, err) {
				continue
			}
			return nil, err
		}
		for i := range orphans {
			a.removeOrphan(ctx, cluster, store, &orphans[i], req, peer, out)
		}
	}
	return out, nil
}

// removeOrphan removes the claim of one deleted image as RemoveOrphans says, or adds it to
// out.Kept; a claim that could not be removed is logged and left for the next run.
func (a *Admin) removeOrphan(ctx context.Context, cluster string, store *claim.Store, o *claim.Record, req api.OrphansRequest, peer *peercred.Cred, out *api.OrphansResponse) {
	log := a.Log.WithField("image", o.Ref.String())
	rec := o
	if sweepable(o) {
		ok, err := store.SweepOrphan(ctx, o.Ref)
		if err != nil {
			log.WithError(err).Warn("orphan claim not removed")
			return
		}
		if ok {
			a.removed(cluster, o, peer, false, fmt.Sprintf("removed the claim of deleted image %s", o.Ref), out)
			return
		}
		// the claim changed since it was listed (taken, fenced, or removed): judge it as it is now
		if rec = a.orphanNow(ctx, store, o.Ref); rec == nil || sweepable(rec) {
			return // gone, back, or free again: the next run sees it
		}
	}
	held, fences, what := keptBy(rec)
	if !req.Force {
		out.Kept = append(out.Kept, api.KeptOrphan{Image: rec.Ref.String(), HeldBy: held, FencesOf: fences,
			Why:      fmt.Sprintf("its image is gone by name, but its claim %s: an image only renamed or moved to the trash keeps its data, which a holder or a fenced mapping could still write", what),
			NextStep: forceStep(cluster, req.Cluster, rec.Ref)})
		return
	}
	ok, err := store.RemoveOrphan(ctx, rec.Ref)
	if err != nil {
		log.WithError(err).Warn("orphan claim not removed")
		return
	}
	if ok {
		a.removed(cluster, rec, peer, true, fmt.Sprintf("FORCED (claims --remove-orphans --force): removed the claim of deleted image %s, which %s; "+
			"its holds and fence records are dropped: a holder's agent finds its claim gone, and the blocklist entries of its fences "+
			"stay until they expire, no longer kept or lifted by rbd-owner (`ceph osd blocklist ls`; `ceph osd blocklist rm ADDR` once "+
			"that mapping is gone)", rec.Ref, what), out)
	}
}

// removed lists rec's claim as removed in out and audits it (forced: at warning priority).
func (a *Admin) removed(cluster string, rec *claim.Record, peer *peercred.Cred, forced bool, msg string, out *api.OrphansResponse) {
	out.Removed = append(out.Removed, rec.Ref.String())
	a.Audit.Record(audit.Entry{Event: audit.Release, Cluster: cluster, Pool: rec.Pool, Namespace: rec.Namespace, Image: rec.Image,
		Epoch: rec.Epoch, HasPeer: peer != nil, UID: peercred.UID(peer), PID: peercred.PID(peer), Warning: forced, Message: msg})
}

// sweepable says whether the automatic sweep would remove r's claim, its image gone: no holder,
// no live fence.
func sweepable(r *claim.Record) bool { return r.Free() && len(r.Kept()) == 0 }

// orphanNow is the claim of img read again, when it is still an orphan's (nil otherwise, or
// when it cannot be read: logged).
func (a *Admin) orphanNow(ctx context.Context, store *claim.Store, img claim.Image) *claim.Record {
	rec, err := store.Inspect(ctx, img)
	if errors.Is(err, claim.ErrNoClaim) {
		return nil
	}
	orphan := false
	if err == nil {
		orphan, err = store.IsOrphan(ctx, *rec)
	}
	if err != nil {
		a.Log.WithError(err).WithField("image", img.String()).Warn("orphan claim not removed: it changed, and could not be read again")
		return nil
	}
	if !orphan {
		return nil
	}
	return rec
}

// keptBy is what keeps an orphan's claim from the sweep: the nodes that hold it, the nodes whose
// live fences it keeps, and both as a person reads them ("is still held by …").
func keptBy(r *claim.Record) (held, fences []string, what string) {
	var parts, holds, kept []string
	for _, h := range r.Holders {
		held = append(held, h.NodeID)
		fenced := ""
		if h.Fenced {
			fenced = ", fenced"
		}
		holds = append(holds, fmt.Sprintf("node %s (epoch %d%s)", h.NodeID, h.Epoch, fenced))
	}
	for _, k := range r.Kept() {
		if !slices.Contains(fences, k.NodeID) {
			fences = append(fences, k.NodeID)
		}
		if k.Intruder {
			kept = append(kept, fmt.Sprintf("node %s's mapping made outside rbd-owner (%s)", k.NodeID, k.Addr))
		} else {
			kept = append(kept, fmt.Sprintf("node %s (%s)", k.NodeID, k.Addr))
		}
	}
	if len(holds) > 0 {
		parts = append(parts, "is still held by "+strings.Join(holds, ", "))
	}
	if len(kept) > 0 {
		parts = append(parts, "keeps live fences of "+strings.Join(kept, ", "))
	}
	return held, fences, strings.Join(parts, " and ")
}

// forceStep is the next step for an orphan kept: make sure its image is really deleted, then
// remove it with --force (named by the cluster the request named, and by the orphan's pool).
func forceStep(cluster, asked string, img claim.Image) string {
	where := "--pool " + img.Pool
	if img.Namespace != "" {
		where += " --namespace " + img.Namespace
	}
	cmd := "rbd-owner claims --remove-orphans --force --pool " + img.Pool
	if asked != "" {
		cmd += " --cluster " + cluster
	}
	return fmt.Sprintf("check that %s is really deleted, not renamed or in the trash (`rbd trash ls %s`, `rbd ls %s` on cluster %s), then `%s`",
		img, where, where, cluster, cmd)
}
