package saga

import (
	"context"
	"errors"

	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// ClaimingEpoch finds the epoch of a claim this node was writing when its map was
// interrupted, given devs, the image's devices on this node (found by names): with a device,
// this node's hold with no mapping recorded or with that device's (a map interrupted after its
// record step); with none, this node's hold whatever mapping it records, since that mapping is
// gone (docs/safety.md, variant af). 0 when this node holds no such claim.
func (s *Sagas) ClaimingEpoch(ctx context.Context, cl Cluster, m state.Mapping, devs []krbd.Device) (uint64, error) {
	store, err := cl.Claims(ctx)
	if err != nil {
		return 0, err
	}
	rec, err := store.Inspect(ctx, m.Ref.Head())
	if errors.Is(err, claim.ErrNoClaim) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	h := rec.Holder(s.Config.NodeID)
	if h == nil {
		return 0, nil
	}
	if h.ClientAddr == "" || len(devs) == 0 {
		return h.Epoch, nil
	}
	for _, dv := range devs {
		if dv.ClientAddr == h.ClientAddr {
			return h.Epoch, nil
		}
	}
	return 0, nil
}

// Release drops the claim of a mapping and audits it.
func (s *Sagas) Release(ctx context.Context, cl Cluster, m state.Mapping) error {
	_, unlist, err := s.releaseClaim(ctx, cl, m)
	if err != nil {
		return err
	}
	s.unlisted(unlist(ctx))
	return nil
}

// releaseAndUnlist drops this node's hold at epoch, then the image from this node's list of
// holds; a failure of the latter is logged (the next heartbeat drops it).
func (s *Sagas) releaseAndUnlist(ctx context.Context, store *claim.Store, img claim.Image, epoch uint64) error {
	res, err := store.ReleaseHold(ctx, img, epoch)
	if err != nil {
		return err
	}
	s.unlisted(res.Unlist(ctx))
	return nil
}

// unlisted logs a failed Unlist: the hold is released, the heartbeat still lists it.
func (s *Sagas) unlisted(err error) {
	if err != nil {
		s.Log.WithError(err).Warn("released, still listed among this node's holds until the next heartbeat")
	}
}

// releaseClaim is Release, saying why nothing was released when the claim was no longer this
// node's ("" when it was released): who took it, or that an admin force-released it. The
// heartbeat that unlists the image is left to the caller (unlist, never nil).
func (s *Sagas) releaseClaim(ctx context.Context, cl Cluster, m state.Mapping) (notHeld string, unlist func(context.Context) error, err error) {
	none := func(context.Context) error { return nil }
	store, err := cl.Claims(ctx)
	if err != nil {
		return "", none, err
	}
	img := m.Ref.Head()
	res, err := store.ReleaseHold(ctx, img, m.Epoch)
	if err != nil {
		return "", none, err
	}
	if !res.Released {
		// not ours any more: another node took it, fencing this mapping, which is gone now
		s.Agent.FencedMappingGone(ctx, store, m)
		return res.NotHeld, res.Unlist, nil
	}
	s.Audit.Record(audit.Entry{Event: audit.Release, Cluster: m.Cluster, Pool: m.Pool, Namespace: m.Namespace, Image: m.Image,
		Device: m.Device, Epoch: m.Epoch, OwnerNode: s.Config.NodeID})
	return "", res.Unlist, nil
}
