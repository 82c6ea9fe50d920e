package admin

import (
	"context"
	"errors"
	"fmt"

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

// RemoveOrphans removes the claims of deleted images.
func (a *Admin) RemoveOrphans(ctx context.Context, req api.OrphansRequest, peer *peercred.Cred) (*api.OrphansResponse, error) {
	cluster, store, err := a.clusterStore(ctx, req.Cluster)
	if err != nil {
		return nil, err
	}
	pools, err := a.Agent.Pools(ctx, cluster, req.Pool)
	if err != nil {
		return nil, err
	}
	out := &api.OrphansResponse{Removed: []string{}}
	for _, p := range pools {
		orphans, err := store.Orphans(ctx, p)
		if err != nil {
			if skippable(pools, err) {
				continue
			}
			return nil, err
		}
		for _, o := range orphans {
			ok, err := store.RemoveOrphan(ctx, o.Ref)
			if err != nil {
				a.Log.WithError(err).WithField("image", o.Ref.String()).Warn("orphan claim not removed")
				continue
			}
			if ok {
				out.Removed = append(out.Removed, o.Ref.String())
				a.Audit.Record(audit.Entry{Event: audit.Release, Cluster: cluster, Pool: o.Pool, Namespace: o.Namespace, Image: o.Image,
					Epoch: o.Epoch, HasPeer: peer != nil, UID: peercred.UID(peer), PID: peercred.PID(peer),
					Message: fmt.Sprintf("removed the claim of deleted image %s", o.Ref)})
			}
		}
	}
	return out, nil
}
