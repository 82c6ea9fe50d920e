package claim

import (
	"context"
	"fmt"
	"time"
)

// FenceResult says what Fence blocklisted.
type FenceResult struct {
	Record *Record
	Fences []Fence
}

// Fence blocklists every current holder's mapping (admin action; the lease is not waited for)
// and marks them fenced in the record, so that they can no longer renew. The holders stay in
// the record until ForceRelease. Fencing again blocklists again (moving the expiry).
func (s *Store) Fence(ctx context.Context, img Image) (*FenceResult, error) {
	res, err := s.fenceHolders(ctx, img, "")
	if err != nil {
		return nil, fmt.Errorf("fence %s: %w", img, err)
	}
	return res, nil
}

// fenceHolders blocklists the mapping of every holder of img (node "") or of node's hold only,
// marks them fenced in one compare-and-set, and leaves each fenced node a notice. An entry
// listed already for less than a fence's life is removed and added again before the fenced
// marks are written, under the record's swap mark (swapmark.go): no taker claims meanwhile.
func (s *Store) fenceHolders(ctx context.Context, img Image, node string) (*FenceResult, error) {
	c := &fenceCall{s: s, img: img, node: node, token: newSwapToken()}
	decide := func(cur *Record, _ uint64) (*Record, error) { return c.decide(ctx, cur) }
	rec, err := s.update(ctx, img, decide)
	if err == nil && c.marking {
		c.marking, c.marked = false, true
		rec, err = s.update(ctx, img, decide)
		if err == nil && c.marking {
			err = fmt.Errorf("%w: a second swap mark was needed after the first (the record changed under it)", ErrConflict)
		}
	}
	if c.marked && (err != nil || c.marking) {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		s.dropMark(dctx, img, c.token)
		cancel()
	}
	if err != nil {
		return nil, err
	}
	res := c.res
	res.Record = rec
	holds := map[string]uint64{}
	for _, f := range res.Fences {
		holds[f.NodeID] = f.Epoch
	}
	s.notifyAll(ctx, img, "fenced by an admin on node "+s.cfg.Node.ID, holds)
	return &res, nil
}

// fenceCall is one admin fence, across its attempts and its swap mark (as acquireCall's).
type fenceCall struct {
	s               *Store
	img             Image
	node            string
	res             FenceResult
	token           string
	marking, marked bool
	markedAt        time.Duration
}

// decide fences the holders of cur (see fenceHolders), or returns cur with this call's swap
// mark when an entry must be removed and added again first.
func (c *fenceCall) decide(ctx context.Context, cur *Record) (*Record, error) {
	s, img, node := c.s, c.img, c.node
	c.res, c.marking = FenceResult{}, false
	if cur.Free() || (node != "" && cur.Holder(node) == nil) {
		who := ""
		if node != "" {
			who = " of node " + node
		}
		return nil, fmt.Errorf("%w: %s has no holder%s to fence", ErrNoClaim, img, who)
	}
	ours := cur.Swap != nil && cur.Swap.Token == c.token
	if !ours {
		if busy, left := s.swapBusy(img, cur.Swap); busy {
			return nil, swapBusyError(img, cur.Swap, left)
		}
	}
	mode := swapNeedsMark
	if ours {
		if s.cfg.Mono()-c.markedAt >= swapMarkLife/2 {
			return nil, fmt.Errorf("%w: the swap mark of %s was written too long ago to remove an entry under it; retry", ErrConflict, img)
		}
		mode = swapBare
	}
	before := cur.Clone()
	now := s.cfg.Now().UTC()
	for i := range cur.Holders {
		if node != "" && cur.Holders[i].NodeID != node {
			continue
		}
		f, err := s.fence(ctx, img, cur.Holders[i], now, mode)
		if addr, ok := needsMark(err); ok {
			// the holder writes as before until the entry is back, but no taker may claim
			// between its remove and its add: the mark first, on the version read
			before.Swap = &SwapMark{Node: s.cfg.Node.ID, Incarnation: s.cfg.Node.Incarnation, Token: c.token, Addrs: []string{addr}, At: now}
			c.marking, c.markedAt = true, s.cfg.Mono()
			return before, nil
		}
		if err != nil {
			return nil, err
		}
		cur.Holders[i].Fenced = true
		cur.AddFence(f)
		c.res.Fences = append(c.res.Fences, f)
	}
	cur.Swap = nil
	return cur, nil
}
