package claim

import (
	"context"
	"fmt"
	"time"
)

// notifyAll leaves notices (notify) after a change that is written, and hands the failures to
// Config.OnNoticeFailed.
func (s *Store) notifyAll(ctx context.Context, img Image, what string, holds map[string]uint64) {
	for _, err := range s.notices.leave(ctx, img, what, holds) {
		if s.cfg.OnNoticeFailed != nil {
			s.cfg.OnNoticeFailed(err)
		}
	}
}

// me is this node's holder entry as it would be written now: its node facts and lease.
func (s *Store) me() Holder {
	h := Holder{NodeID: s.cfg.Node.ID, Incarnation: s.cfg.Node.Incarnation, Hostname: s.cfg.Node.Hostname,
		AgentVersion: s.cfg.Node.AgentVersion, LeaseSeconds: int64(s.cfg.Lease / time.Second), BootID: s.cfg.Node.BootID}
	if s.cfg.Node.Addr != nil {
		h.NodeAddr = s.cfg.Node.Addr()
	}
	return h
}

func (s *Store) refresh(h *Holder, now time.Time) {
	acquireInput{Now: now, Me: s.me()}.refresh(h)
}

// fence blocklists holder h's mapping of img (its client address, else its whole node), in force
// for a whole fence_expiry before the hold it protects is written (an entry listed already for
// less is removed and added again as mode allows: fenceEntry), and returns the fence to record:
// with the expiry as listed, the boot id h recorded, and counted as kept by this store when it
// is listed for long enough (else it is due at once).
func (s *Store) fence(ctx context.Context, img Image, h Holder, now time.Time, mode enforceMode) (Fence, error) {
	addr := h.FenceAddr()
	if addr == "" {
		return Fence{}, fmt.Errorf("node %s recorded no address to fence", h.NodeID)
	}
	until, made, err := s.fenceEntry(ctx, addr, mode, false)
	if err != nil {
		return Fence{}, err
	}
	if s.lengthened(until) { // else due at once: the keepers' next check lengthens it
		s.book.markNow(keepKey(img, entry{node: h.NodeID, addr: addr}))
	}
	if s.afterFence != nil {
		s.afterFence()
	}
	return Fence{NodeID: h.NodeID, Addr: addr, Epoch: h.Epoch, At: now, Expires: until.UTC(), By: s.cfg.Node.ID,
		BootID: h.BootID, Incarnation: h.Incarnation, RenewedAt: now, RenewedBy: s.cfg.Node.ID, Made: made}, nil
}

// mine finds this node's live holder entry at epoch, or explains why there is none.
func (s *Store) mine(img Image, cur *Record, epoch uint64) (*Holder, error) {
	return decideMine(img, cur, s.cfg.Node.ID, epoch)
}

// Renew extends this node's lease, only if it still holds the image at epoch.
func (s *Store) Renew(ctx context.Context, img Image, epoch uint64) (*Record, error) {
	rec, err := s.update(ctx, img, func(cur *Record, _ uint64) (*Record, error) {
		h, err := s.mine(img, cur, epoch)
		if err != nil {
			return nil, err
		}
		s.refresh(h, s.cfg.Now().UTC())
		return cur, nil
	})
	if err != nil {
		return nil, fmt.Errorf("renew %s: %w", img, err)
	}
	return rec, nil
}

// SetMapping records the mapping's client address and device in this node's holder entry
// (after the map), only if it still holds the image at epoch. Right after the claim it is one
// compare-and-set against the record the claim wrote (updateKnown).
func (s *Store) SetMapping(ctx context.Context, img Image, epoch uint64, clientAddr, device string) (*Record, error) {
	rec, err := s.updateKnown(ctx, img, func(cur *Record, _ uint64) (*Record, error) {
		h, err := s.mine(img, cur, epoch)
		if err != nil {
			return nil, err
		}
		h.ClientAddr, h.Device = clientAddr, device
		s.refresh(h, s.cfg.Now().UTC())
		return cur, nil
	})
	if err != nil {
		return nil, fmt.Errorf("record mapping of %s: %w", img, err)
	}
	return rec, nil
}

// Records says whether rec's holder entry of this node names the mapping clientAddr. A
// "mapped" state whose claim does not (a crash between the map's persist and its record) is
// recorded with SetMapping before its device is answered again: else a takeover would fence
// the whole node (docs/safety.md, invariant 7).
func (s *Store) Records(rec *Record, clientAddr string) bool {
	h := rec.Holder(s.cfg.Node.ID)
	return h != nil && h.ClientAddr == clientAddr
}
