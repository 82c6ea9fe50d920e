package admin

import (
	"context"
	"errors"
	"fmt"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/fault"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
)

// Release drops a claim: with req.Force, a fenced dead owner's (the route lets only an admin
// force); without, this node's own claim on an image it no longer maps.
func (a *Admin) Release(ctx context.Context, req api.ImageRequest, peer *peercred.Cred) (bool, error) {
	t, store, err := a.targetStore(ctx, req.Cluster, req.Ref())
	if err != nil {
		return false, err
	}
	unlock, err := a.Agent.LockImage(ctx, t.key)
	if err != nil {
		return false, err
	}
	defer unlock()
	if !req.Force {
		return a.releaseOwn(ctx, t, store, peer)
	}
	// the record as it was, for the audit trail: who is being released
	rec, err := store.Inspect(ctx, t.img)
	if err != nil && !errors.Is(err, claim.ErrNoClaim) {
		return false, fmt.Errorf("release --force %s: reading the claim: %w", t.spec, err)
	}
	a.Agent.RememberPool(t.key) // the freed claim keeps its fences: this node sweeps their pool
	ok, err := store.ForceRelease(ctx, t.img)
	if err != nil {
		return false, withNextStep(err)
	}
	if ok && rec != nil {
		for _, h := range rec.Holders {
			a.Audit.Record(audit.Entry{Event: audit.Release, Cluster: t.cluster, Pool: t.spec.Pool, Namespace: t.spec.Namespace, Image: t.spec.Image,
				Epoch: h.Epoch, OwnerNode: h.NodeID, HasPeer: peer != nil, UID: peercred.UID(peer), PID: peercred.PID(peer), Warning: true,
				Message: fmt.Sprintf("force-released node %s's fenced claim on %s (epoch %d)", h.NodeID, t.spec, h.Epoch)})
		}
	}
	return ok, nil
}

// releaseOwn drops this node's own claim on an image it does not map, under the image's lock,
// and audits it with the caller.
func (a *Admin) releaseOwn(ctx context.Context, t target, store *claim.Store, peer *peercred.Cred) (bool, error) {
	if m, ok := a.State.Get(t.key); ok {
		return false, fmt.Errorf("%w: %s is mapped here as %s: unmap it instead", fault.ErrInvalid, t.spec, m.Device)
	}
	rec, err := store.Inspect(ctx, t.img)
	if err != nil {
		if errors.Is(err, claim.ErrNoClaim) {
			return false, nil
		}
		return false, err
	}
	h := rec.Holder(a.NodeID)
	if h == nil {
		return false, fmt.Errorf("%w: this node holds no claim on %s; an admin drops another node's with --force after fencing it", fault.ErrInvalid, t.spec)
	}
	// the persisted state is not the kernel: after a lost state directory, or an adoption
	// whose state write failed, a device may be mapped with no state. Never drop the claim
	// of a device that may write.
	if dev, err := a.mappedHere(t, store.FSID(), h.ClientAddr); err != nil || dev != "" {
		if err != nil {
			return false, fmt.Errorf("release %s: could not check this node's devices, so the claim is kept: %w", t.spec, err)
		}
		return false, fmt.Errorf("%w: %s is mapped on this node as %s though the agent has no record of it; unmap that device first (rbd-owner unmap %s)", fault.ErrInvalid, t.spec, dev, dev)
	}
	res, err := store.ReleaseHold(ctx, t.img, h.Epoch)
	if err != nil {
		return false, err
	}
	if res.Released {
		a.Audit.Record(audit.Entry{Event: audit.Release, Cluster: t.cluster, Pool: t.spec.Pool, Namespace: t.spec.Namespace, Image: t.spec.Image,
			Epoch: h.Epoch, OwnerNode: a.NodeID, HasPeer: peer != nil, UID: peercred.UID(peer), PID: peercred.PID(peer),
			Message: fmt.Sprintf("released this node's claim on %s (epoch %d), mapped nowhere here", t.spec, h.Epoch)})
	}
	if err := res.Unlist(ctx); err != nil {
		a.Log.WithError(err).Warn("released, still listed among this node's holds until the next heartbeat")
	}
	return res.Released, nil
}

// mappedHere names a device of this node that maps the image, or whose client is the claim's
// recorded one (clientAddr, may be ""); "" when there is none.
func (a *Admin) mappedHere(t target, fsid, clientAddr string) (string, error) {
	devs, err := a.Kernel.FindBySpec(t.spec, fsid)
	if err != nil {
		return "", err
	}
	if len(devs) > 0 {
		return devs[0].DevNode, nil
	}
	if clientAddr == "" {
		return "", nil
	}
	all, err := a.Kernel.List()
	if err != nil {
		return "", err
	}
	for _, dv := range all {
		if dv.ClientAddr == clientAddr {
			return dv.DevNode, nil
		}
	}
	return "", nil
}
