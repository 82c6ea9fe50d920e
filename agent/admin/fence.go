package admin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/claimapi"
	"github.com/rbd-owner/rbd-owner/agent/fault"
	"github.com/rbd-owner/rbd-owner/agent/image"
	"github.com/rbd-owner/rbd-owner/agent/metrics"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// Fence blocklists the mappings of an image's holders, or with req.Node every hold of that
// node (FenceNode).
func (a *Admin) Fence(ctx context.Context, req api.ImageRequest, peer *peercred.Cred) (*api.FenceResponse, error) {
	if req.Node != "" {
		if req.Pool != "" || req.Image != "" {
			return nil, fmt.Errorf("%w: fence names an image or a node (--node), not both", fault.ErrInvalid)
		}
		return a.FenceNode(ctx, req, peer)
	}
	t, store, err := a.targetStore(ctx, req.Cluster, req.Ref())
	if err != nil {
		return nil, err
	}
	res, err := store.Fence(ctx, t.img)
	if err != nil {
		return nil, err
	}
	a.Agent.RememberPool(t.key)
	out := &api.FenceResponse{}
	for _, f := range res.Fences {
		out.FencedAddrs = append(out.FencedAddrs, f.Addr)
		a.Metrics.Fenced(t.cluster, metrics.CauseAdmin)
		if out.FencedAddr == "" {
			out.FencedAddr, out.Expires = f.Addr, f.Expires
		}
		a.Audit.Record(audit.Entry{Event: audit.Fence, Cluster: t.cluster, Pool: t.spec.Pool, Namespace: t.spec.Namespace, Image: t.spec.Image,
			Epoch: f.Epoch, OwnerNode: f.NodeID, HasPeer: peer != nil, UID: peercred.UID(peer), PID: peercred.PID(peer), Warning: true,
			Message: fmt.Sprintf("fenced %s, holder of %s, until %s", f.Described(), t.spec, f.Expires.Format(time.RFC3339))})
	}
	return out, nil
}

// FenceNode fences every hold of a node cluster-wide (`rbd-owner fence --node`): see
// claim.Store.FenceNode. Each hold fenced is audited, and the whole in one summary; what could
// not be found or fenced is answered as incomplete, never left out silently.
func (a *Admin) FenceNode(ctx context.Context, req api.ImageRequest, peer *peercred.Cred) (*api.FenceResponse, error) {
	cluster, store, err := a.clusterStore(ctx, req.Cluster)
	if err != nil {
		return nil, err
	}
	fenced, errs := store.FenceNode(ctx, req.Node)
	for i := range errs {
		errs[i] = withNextStep(errs[i])
	}
	out := &api.FenceResponse{Node: req.Node}
	images := map[string]bool{}
	for _, f := range fenced {
		if f.Err != nil {
			errs = append(errs, f.Err)
			continue
		}
		images[f.Image.String()] = true
		a.fencedHold(cluster, req.Node, f, out, peer)
	}
	for _, err := range errs {
		out.Incomplete = append(out.Incomplete, err.Error())
	}
	if len(out.Holds) == 0 && len(errs) == 0 {
		return a.nothingHeld(ctx, cluster, store, req.Node, peer)
	}
	summary := fmt.Sprintf("fenced node %s: %d holds on %d images blocklisted and marked fenced", req.Node, len(out.Holds), len(images))
	if len(errs) > 0 {
		summary += fmt.Sprintf("; INCOMPLETE, %d not found or not fenced: %v", len(errs), errors.Join(errs...))
	}
	a.Audit.Record(audit.Entry{Event: audit.Fence, Cluster: cluster, OwnerNode: req.Node, HasPeer: peer != nil, UID: peercred.UID(peer), PID: peercred.PID(peer),
		Warning: true, Error: len(errs) > 0, Message: summary})
	if len(out.Holds) == 0 {
		return nil, fmt.Errorf("fence --node %s: nothing fenced: %w", req.Node, errors.Join(errs...))
	}
	return out, nil
}

// nothingHeld answers a node's fence that found no hold of the node. When its heartbeats list
// holds, none of whose claims names it any more (taken over or released since), there is
// nothing left to fence: success, so that a script may run the fence again. Only a node whose
// heartbeats list no hold at all (or that has none) is not found: a mistyped node id, or a node
// that released everything.
func (a *Admin) nothingHeld(ctx context.Context, cluster string, store *claim.Store, node string, peer *peercred.Cred) (*api.FenceResponse, error) {
	listed, err := listedHolds(ctx, store, node)
	if len(listed) == 0 {
		if err != nil {
			return nil, fmt.Errorf("fence --node %s: no claim names it as a holder, and whether its heartbeats list holds could not be read: %w", node, err)
		}
		return nil, fmt.Errorf("fence --node %s: %w: no claim of cluster %s names it as a holder (its heartbeats list none; check the node id with `rbd-owner claims`)", node, claim.ErrNoClaim, cluster)
	}
	if err != nil {
		a.Log.WithError(err).WithField("node", node).Warn("fence --node: a place could not be read again; the images listed may be more")
	}
	out := &api.FenceResponse{Node: node, NoLongerHeld: listed,
		Note: fmt.Sprintf("nothing of node %s is held any more: its holds were taken over or released (its heartbeats list %d images, none of whose claims names it as a holder); nothing fenced", node, len(listed))}
	a.Audit.Record(audit.Entry{Event: audit.Fence, Cluster: cluster, OwnerNode: node, HasPeer: peer != nil, UID: peercred.UID(peer), PID: peercred.PID(peer),
		Message: "fence --node " + node + ": " + out.Note})
	return out, nil
}

// listedHolds are the images node's heartbeats list as its holds (claim.Store.ListedHolds),
// read again only when FenceNode found no hold.
func listedHolds(ctx context.Context, store *claim.Store, node string) ([]image.Ref, error) {
	listed, errs := store.ListedHolds(ctx, node)
	for i := range errs {
		errs[i] = withNextStep(errs[i])
	}
	return listed, errors.Join(errs...)
}

// fencedHold adds one hold fenced by FenceNode to out, and audits it.
func (a *Admin) fencedHold(cluster, node string, f claim.NodeFenceImage, out *api.FenceResponse, peer *peercred.Cred) {
	ref := image.Ref{Pool: f.Image.Pool, Namespace: f.Image.Namespace, Image: f.Image.Image}
	a.Agent.RememberPool(state.Key{Cluster: cluster, Ref: ref})
	a.Metrics.Fenced(cluster, metrics.CauseAdmin)
	out.FencedAddrs = append(out.FencedAddrs, f.Fence.Addr)
	out.Holds = append(out.Holds, api.FencedHold{Ref: ref, Epoch: f.Fence.Epoch, Addr: f.Fence.Addr, Expires: f.Fence.Expires, Again: f.Again})
	if out.FencedAddr == "" {
		out.FencedAddr, out.Expires = f.Fence.Addr, f.Fence.Expires
	}
	a.Audit.Record(audit.Entry{Event: audit.Fence, Cluster: cluster, Pool: f.Image.Pool, Namespace: f.Image.Namespace, Image: f.Image.Image,
		Epoch: f.Fence.Epoch, OwnerNode: node, HasPeer: peer != nil, UID: peercred.UID(peer), PID: peercred.PID(peer), Warning: true,
		Message: fmt.Sprintf("fenced %s, holder of %s, until %s (fence --node %s): the next map by any node takes it over", f.Fence.Described(), f.Image, f.Fence.Expires.Format(time.RFC3339), node)})
}

// UnfenceNode lifts the whole-node fences of a node: see claim.Store.UnfenceNode. The audit
// entry says whether the node was seen rebooted or the lift was forced.
func (a *Admin) UnfenceNode(ctx context.Context, req api.UnfenceNodeRequest, peer *peercred.Cred) (*api.UnfenceNodeResponse, error) {
	cluster, err := a.Agent.Cluster(req.Cluster)
	if err != nil {
		return nil, err
	}
	if req.Node == "" {
		return nil, fmt.Errorf("%w: unfence --node: name the node (its node_id, as `rbd-owner claims` shows it)", fault.ErrInvalid)
	}
	store, err := a.Agent.Claims(ctx, cluster)
	if err != nil {
		return nil, err
	}
	by := fmt.Sprintf("lifted by an admin (uid %d) on node %s", peercred.UID(peer), a.NodeID)
	if req.Force {
		by += " with --force"
	}
	res, err := store.UnfenceNode(ctx, req.Node, by, req.Force)
	if res == nil {
		return nil, err
	}
	out := &api.UnfenceNodeResponse{Node: req.Node, Fences: []api.NodeFence{}, Lifted: res.Lifted, Forced: res.Forced}
	if out.Lifted == nil {
		out.Lifted = []string{}
	}
	for _, nf := range res.Fences {
		out.Fences = append(out.Fences, api.NodeFence{Ref: nf.Image, Addr: nf.Fence.Addr, FencedAt: nf.Fence.At, FencedBy: nf.Fence.By, Rebooted: nf.Rebooted})
		how := "FORCED: the node was not seen rebooted since"
		if nf.Rebooted != "" {
			how = nf.Rebooted
		}
		a.Audit.Record(audit.Entry{Event: audit.Fence, Result: audit.OK, Cluster: cluster, Pool: nf.Image.Pool, Namespace: nf.Image.Namespace,
			Image: nf.Image.Image, OwnerNode: req.Node, HasPeer: peer != nil, UID: peercred.UID(peer), PID: peercred.PID(peer), Warning: nf.Rebooted == "",
			Message: fmt.Sprintf("whole-node fence %s of node %s on %s (made %s by %s) lifted: %s", nf.Fence.Addr, req.Node, nf.Image,
				nf.Fence.At.UTC().Format(time.RFC3339), nf.Fence.By, how)})
	}
	return out, err
}

// Unfence lifts the fences this node's agent put on mappings made outside rbd-owner of an
// image, once they are unmapped.
func (a *Admin) Unfence(ctx context.Context, req api.ImageRequest, peer *peercred.Cred) (*api.UnfenceResponse, error) {
	t, err := a.target(req.Cluster, req.Ref())
	if err != nil {
		return nil, err
	}
	if t.spec.Snap != "" {
		return nil, fmt.Errorf("%w: unfence %s: name the image, not a snapshot", fault.ErrInvalid, t.spec)
	}
	store, err := a.Agent.Claims(ctx, t.cluster)
	if err != nil {
		return nil, err
	}
	devs, err := a.Kernel.List()
	if err != nil {
		return nil, fmt.Errorf("unfence %s: listing devices: %w", t.spec, err)
	}
	gone := func(addr string) bool {
		for _, dv := range devs {
			if dv.ClientAddr == addr {
				return false
			}
		}
		return true
	}
	un, err := store.Unfence(ctx, t.img, gone)
	if err != nil {
		return nil, withNextStep(err)
	}
	out := &api.UnfenceResponse{Unfenced: []api.Intruder{}}
	for _, in := range un {
		out.Unfenced = append(out.Unfenced, claimapi.Intruder(in))
		a.Audit.Record(audit.Entry{Event: audit.Fence, Result: audit.OK, Cluster: t.cluster, Pool: t.spec.Pool, Namespace: t.spec.Namespace,
			Image: t.spec.Image, Device: in.Device, OwnerNode: a.NodeID, HasPeer: peer != nil, UID: peercred.UID(peer), PID: peercred.PID(peer),
			Message: fmt.Sprintf("unfenced %s's former client %s (mapped outside rbd-owner, fenced %s, now unmapped): its blocklist entry is removed",
				in.Device, in.Addr, in.At.UTC().Format(time.RFC3339))})
	}
	return out, nil
}
