package claim

import (
	"context"
	"fmt"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/claim/record"
)

// Release drops this node's hold, only if it holds the image at epoch, then drops the image
// from this node's list of holds. It returns false (and no error) when there was nothing of
// ours to release.
func (s *Store) Release(ctx context.Context, img Image, epoch uint64) (bool, error) {
	r, err := s.ReleaseHold(ctx, img, epoch)
	if err != nil {
		return false, err
	}
	return r.Released, r.Unlist(ctx)
}

// ReleaseResult says what ReleaseHold did.
type ReleaseResult struct {
	Released bool
	// NotHeld, when nothing was released, says why in words a person reads: who holds the image
	// now, or who released this node's hold before ("" when Released).
	NotHeld string
	// unlist is the heartbeat write that drops the image from this node's list of holds (nil
	// when it is still held, or none is owed)
	unlist func(ctx context.Context) error
}

// Unlist writes the heartbeat that drops the released image from the holds this node lists:
// after the release, so the list stays a superset of its holds, and at any time after it, so
// a caller may run it beside what it does next (the unmap saga's last state write). Without
// it the next heartbeat in the place drops the image. An error says the image is still listed
// (the hold is released all the same).
func (r ReleaseResult) Unlist(ctx context.Context) error {
	if r.unlist == nil {
		return nil
	}
	return r.unlist(ctx)
}

// ReleaseHold is the compare-and-set of Release, saying why there was nothing to release when
// this node no longer held the image at epoch: taken over by another node, or force-released
// by an admin. It compares against the record this store last saw first (updateKnown): one
// round trip when nothing changed it since. The heartbeat that unlists the image is left to
// the caller (ReleaseResult.Unlist).
func (s *Store) ReleaseHold(ctx context.Context, img Image, epoch uint64) (ReleaseResult, error) {
	var res ReleaseResult
	holdsNone := false
	_, err := s.updateKnown(ctx, img, func(cur *Record, _ uint64) (*Record, error) {
		res = ReleaseResult{}
		h := cur.Holder(s.cfg.Node.ID)
		holdsNone = h == nil
		if h == nil || h.Epoch != epoch {
			res.NotHeld = notHeld(cur, s.cfg.Node.ID, epoch)
			return nil, nil // not ours (any more): leave it alone
		}
		// the caller's device is gone (it releases only then): an admin's fence of this very
		// mapping need not be kept any more
		for i := range cur.Fences {
			if f := &cur.Fences[i]; f.Live() && f.NodeID == s.cfg.Node.ID && h.ClientAddr != "" && f.Addr == h.ClientAddr {
				f.Gone, f.GoneAt = fmt.Sprintf("node %s's agent unmapped %s (client %s) and released its hold", s.cfg.Node.ID, h.Device, h.ClientAddr), s.cfg.Now().UTC()
			}
		}
		cur.Without(s.cfg.Node.ID)
		res.Released, holdsNone = true, true
		return cur, nil
	})
	if err != nil {
		return ReleaseResult{}, fmt.Errorf("release %s: %w", img, err)
	}
	if holdsNone && s.hb.mayList(img) {
		// no longer listed among this node's holds: noted after the release, so the list stays
		// a superset of its holds; written by Unlist or the next heartbeat
		s.NoteHold(img, false)
		res.unlist = func(ctx context.Context) error {
			if err := s.Heartbeat(ctx, img.Pool, img.Namespace); err != nil {
				return fmt.Errorf("release %s: released, but not yet dropped from this node's list of holds (the next heartbeat drops it): %w", img, err)
			}
			return nil
		}
	}
	return res, nil
}

// notHeld says why node holds nothing to release at epoch in cur: who took the image, or that
// its hold was dropped (an admin's release --force, after a fence).
func notHeld(cur *Record, node string, epoch uint64) string {
	if cur == nil {
		return "its claim record is gone"
	}
	if h := cur.Holder(node); h != nil {
		return fmt.Sprintf("this node holds it at epoch %d now, not %d", h.Epoch, epoch)
	}
	var fence *Fence
	for i := range cur.Fences {
		if f := &cur.Fences[i]; f.NodeID == node && f.Epoch == epoch {
			fence = f
		}
	}
	fenced := func(by string) string {
		return fmt.Sprintf("node %s fenced this node's mapping %s at %s", by, fence.Addr, fence.At.UTC().Format(time.RFC3339))
	}
	switch {
	case len(cur.Holders) > 0 && fence != nil:
		return fmt.Sprintf("%s and node %s holds it now (epoch %d)", fenced(fence.By), cur.Holders[0].NodeID, cur.Holders[0].Epoch)
	case len(cur.Holders) > 0:
		return fmt.Sprintf("node %s holds it now (epoch %d)", cur.Holders[0].NodeID, cur.Holders[0].Epoch)
	case cur.Epoch == epoch && fence != nil:
		// nobody claimed it after this node: its hold was dropped as it was
		return "an admin force-released it (rbd-owner release --force) after " + fenced(fence.By)
	case cur.Epoch == epoch:
		return "an admin force-released it (rbd-owner release --force)"
	case fence != nil:
		return fenced(fence.By) + ", took it over and has released it since"
	}
	return fmt.Sprintf("another node took it over (epoch %d) and has released it since", cur.Epoch)
}

// ForceRelease drops every holder of an image (admin action), but only holders that were
// fenced first: dropping a live writer's claim would let a second writer in.
func (s *Store) ForceRelease(ctx context.Context, img Image) (bool, error) {
	released := false
	holds := map[string]uint64{}
	_, err := s.update(ctx, img, func(cur *Record, _ uint64) (*Record, error) {
		released = false
		clear(holds)
		if cur.Free() {
			return nil, nil
		}
		for _, h := range cur.Holders {
			if !h.Fenced {
				return nil, &record.NotFencedError{Image: img, Node: h.NodeID}
			}
		}
		for _, h := range cur.Holders {
			holds[h.NodeID] = h.Epoch
		}
		cur.Holders, cur.Access = nil, ""
		released = true
		return cur, nil
	})
	if err != nil {
		return false, fmt.Errorf("release --force %s: %w", img, err)
	}
	s.notifyAll(ctx, img, "force-released by an admin on node "+s.cfg.Node.ID, holds)
	return released, nil
}
