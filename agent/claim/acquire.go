package claim

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/claim/record"
)

// Request asks for a hold on an image.
type Request struct {
	Image    Image
	Access   Access // "" means rwo
	ReadOnly bool   // forced for rox
	// Takeover allows taking the image from holders whose leases have expired, by fencing
	// them first. A holder with a live lease is never taken over here (see Fence + ForceRelease).
	Takeover bool
	// TakeFenced allows taking the image from holders an admin has fenced (`rbd-owner fence`:
	// blocklisted and marked fenced in the record), without waiting for their leases. It is
	// what a map may do whoever asks; Takeover is the admin's, or the policy's.
	TakeFenced bool
	// TakeCovered allows taking the image from holders whose mapping an entry in the cluster's
	// blocklist already cuts off, whoever added it (ceph-csi's fencing of a node Kubernetes
	// declared out of service, a NetworkFence, an admin), without waiting for their leases:
	// takeover_policy after-fence. The takeover still blocklists them with its own entries.
	TakeCovered bool
	// Durable, when set, runs beside Acquire's reads and must return before Acquire writes
	// anything but this node's heartbeat: no fence, no index key, no claim is sent until it
	// has returned nil, and its error ends Acquire with no claim made. The map saga writes its
	// intent here ("claiming", fsynced): a crash after the claim always finds the state that
	// names it (docs/safety.md, invariant 6). Acquire returns only after Durable has.
	Durable func(context.Context) error
}

// Result is the outcome of Acquire.
type Result struct {
	Record *Record
	Holder Holder // ours
	// Again is true when this node already held the image (same epoch, lease renewed).
	Again bool
	// Fenced lists the holders that were blocklisted to take the image over.
	Fenced []Fence
}

// Acquire gives this node a hold on the image, or says who has it. It is idempotent: asking
// again for an image this node holds renews the lease and keeps the epoch.
//
// Its first round sends at once what does not depend on each other: the image's id and its
// header's watchers (Backend.ImageInfo), the claim record, this node's heartbeat in the pool
// (with the image listed among its holds) and the caller's Durable. Only when all of them are
// done does it decide, fence and compare-and-set: the heartbeat and Durable come before any
// claim is written, as a sequence would have them (docs/safety.md, "Map, step by step").
func (s *Store) Acquire(ctx context.Context, req Request) (*Result, error) {
	in, first, err := s.acquireInput(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("acquire %s: %w", req.Image, err)
	}
	c := &acquireCall{s: s, img: req.Image, in: in, fences: map[string]Fence{}, renewed: map[string]time.Time{}, token: newSwapToken()}
	rec, err := c.write(ctx, first)
	if err != nil {
		c.unlistUnsent()
		return nil, fmt.Errorf("acquire %s: %w", req.Image, err)
	}
	c.res.Record = rec
	c.noticeFenced(ctx)
	res := c.res
	return &res, nil
}

// write decides, fences and compare-and-sets, from the first read on (attempt, each time the
// record changed under it); when a bare remove is due, under a swap mark written first, which
// it drops again if the claim is not written (swapmark.go).
func (c *acquireCall) write(ctx context.Context, first readResult) (*Record, error) {
	s := c.s
	decide := func(cur *Record, ver uint64) (*Record, error) {
		next, err := c.attempt(ctx, cur, ver)
		c.sent = c.sent || (next != nil && !c.marking)
		return next, err
	}
	rec, err := s.updateFrom(ctx, c.img, &first, decide)
	if err == nil && c.marking {
		// the swap mark is written: the claim on a fresh read, removing and adding under it
		c.marking, c.marked = false, true
		rec, err = s.update(ctx, c.img, decide)
		if err == nil && c.marking {
			err = fmt.Errorf("%w: a second swap mark was needed after the first (the record changed under it)", ErrConflict)
		}
	}
	if c.marked && (err != nil || c.marking) {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		s.dropMark(dctx, c.img, c.token)
		cancel()
	}
	return rec, err
}

// unlistUnsent: no claim was sent, so the image goes from this node's list of holds again,
// unless it was there before (the next heartbeat drops it).
func (c *acquireCall) unlistUnsent() {
	if !c.sent {
		c.s.unlistUnsent(c.img, c.in.listed)
	}
}

// noticeFenced leaves the holders this call fenced a notice of the takeover.
func (c *acquireCall) noticeFenced(ctx context.Context) {
	if len(c.res.Fenced) == 0 {
		return
	}
	holds := map[string]uint64{}
	for _, f := range c.res.Fenced {
		holds[f.NodeID] = f.Epoch
	}
	c.s.notifyAll(ctx, c.img, "taken over by node "+c.s.cfg.Node.ID+" after a fence", holds)
}

// acquireInput checks the request, then runs Acquire's first round (see Acquire): it returns
// what every attempt decides on, but for the record, the leases and the clock, and the first
// read of the record. It returns only once everything it started is done.
func (s *Store) acquireInput(ctx context.Context, req Request) (acquireInput, readResult, error) {
	access, err := ParseAccess(string(req.Access))
	if err != nil {
		return acquireInput{}, readResult{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if access == ROX {
		req.ReadOnly = true
	}
	if err := record.ValidateImage(req.Image); err != nil {
		return acquireInput{}, readResult{}, err
	}
	img := req.Image
	listed := s.hb.listedNow(img)
	var (
		round                   sync.WaitGroup
		info                    record.ImageInfo
		first                   readResult
		infoErr, hbErr, durable error
	)
	round.Go(func() { info, infoErr = s.inspectImage(ctx, img) })
	round.Go(func() { first = s.readAt(ctx, img) })
	round.Go(func() {
		// this node's liveness in the pool, before the claim becomes visible: an observer
		// that sees the new hold sees a heartbeat written for it, never one left from a time
		// this node held nothing there (and nobody watched). No heartbeat, no claim.
		s.NoteHold(img, true) // listed before the claim is written: a superset
		hbErr = s.Heartbeat(ctx, img.Pool, img.Namespace)
	})
	if req.Durable != nil {
		round.Go(func() { durable = req.Durable(ctx) })
	}
	round.Wait()
	err = nil
	switch {
	case durable != nil:
		err = fmt.Errorf("no claim made: %w", durable)
	case infoErr != nil:
		err = infoErr
	case first.err != nil:
		err = first.err
	case hbErr != nil:
		err = fmt.Errorf("no claim made, since this node's liveness could not be recorded first: %w", hbErr)
	}
	if err != nil {
		s.unlistUnsent(img, listed)
		return acquireInput{}, readResult{}, err
	}
	return acquireInput{Self: s.cfg.Node.ID, FSID: s.fsid, Image: img, Access: access, ReadOnly: req.ReadOnly,
		Takeover: req.Takeover, TakeFenced: req.TakeFenced, TakeCovered: req.TakeCovered, Info: info,
		Me: s.me(), Fenced: map[string]bool{}, listed: listed}, first, nil
}

// acquireCall is one Acquire call, across the attempts of its compare-and-set.
type acquireCall struct {
	s       *Store
	img     Image
	in      acquireInput
	res     Result
	fences  map[string]Fence     // holders this call has blocklisted (see acquireInput.Fenced)
	renewed map[string]time.Time // the record's live fences this call blocklisted again
	sent    bool                 // a claim was sent (it may have landed, even if it failed)
	// the swap mark (swapmark.go): this call's token; marking: the attempt returned the mark to
	// write, not a claim; marked: the mark was written, at markedAt (Mono, before its write)
	token           string
	marking, marked bool
	markedAt        time.Duration
}

// attempt is one read-decide-write of Acquire on the record as read (cur, at version ver):
// the other holders' leases judged, the decision, then, before the record to write is
// returned, the evicted holders fenced and the record's due fences renewed. This node's
// heartbeat was written before the first attempt (acquireInput); a lost race keeps it.
func (c *acquireCall) attempt(ctx context.Context, cur *Record, ver uint64) (*Record, error) {
	s := c.s
	c.in.Now = s.cfg.Now().UTC()
	c.res = Result{}
	c.marking = false
	var mark *SwapMark
	if cur != nil {
		mark = cur.Swap
	}
	ours := mark != nil && mark.Token == c.token
	if !ours {
		if busy, left := s.swapBusy(c.img, mark); busy {
			return nil, swapBusyError(c.img, mark, left)
		}
	}
	var before *Record // the record decided on, to carry a swap mark
	if cur != nil {
		before = cur.Clone()
	}
	leases, err := s.leases(ctx, c.img, cur, ver)
	if err != nil {
		return nil, err
	}
	c.in.Leases = leases
	if c.in.Covered == nil && c.in.CoverErr == nil && c.in.needsCoverage(cur) {
		c.in.Covered, c.in.CoverErr = s.coverage(ctx, cur)
	}
	plan, err := decideAcquire(cur, c.in)
	if err != nil {
		return nil, err
	}
	plan.Next.Swap = nil // the claim's write drops this call's mark, or one no longer honoured
	mode, err := c.swapMode(plan, ours)
	if err != nil {
		return nil, err
	}
	err = c.fenceEvicted(ctx, plan, mode)
	if err == nil {
		// the record's live fences, before the claim: their entries may have run out while every
		// keeper was down (F6 of docs/safety.md)
		if err = s.renewDue(ctx, c.img, plan.Next, c.renewed, mode); err != nil {
			err = fmt.Errorf("no claim made: %w", err)
		}
	}
	if addr, ok := needsMark(err); ok && before != nil {
		// a bare remove is due: the mark first, on the version decided on (swapmark.go)
		before.Swap = &SwapMark{Node: s.cfg.Node.ID, Incarnation: s.cfg.Node.Incarnation, Token: c.token, Addrs: []string{addr}, At: c.in.Now}
		c.marking, c.markedAt = true, s.cfg.Mono()
		return before, nil
	}
	if err != nil {
		return nil, err
	}
	c.res.Holder, c.res.Again = plan.Holder, plan.Again
	return plan.Next, nil
}

// swapMode is how this attempt may lengthen a short entry before its claim (enforce.go): only
// under a cover where the record keeps a hold that may write now (this node's own hold again,
// other holders of a shared image); else bare, under this call's swap mark written less than
// half its life ago; else not before the mark is written.
func (c *acquireCall) swapMode(plan acquirePlan, ours bool) (enforceMode, error) {
	if len(plan.Next.Holders) > 1 || plan.Again {
		return swapCovered, nil
	}
	if !ours {
		return swapNeedsMark, nil
	}
	if c.s.cfg.Mono()-c.markedAt >= swapMarkLife/2 {
		return 0, fmt.Errorf("%w: the swap mark of %s was written %s ago, too long to remove an entry under it; retry", ErrConflict, c.img, (c.s.cfg.Mono() - c.markedAt).Round(time.Second))
	}
	return swapBare, nil
}

// fenceEvicted blocklists the holders the plan evicts and adds their fences to the record to
// write. Fence first, write after: a crash in between leaves the old holder blocklisted and
// the record unchanged, and the next attempt blocklists again (idempotent) and writes; a
// holder this call fenced already is not blocklisted again.
func (c *acquireCall) fenceEvicted(ctx context.Context, plan acquirePlan, mode enforceMode) error {
	for _, h := range plan.Evict {
		f, done := c.fences[fenceKey(h)]
		if !done {
			var err error
			if f, err = c.s.fence(ctx, c.img, h, c.in.Now, mode); err != nil {
				return fmt.Errorf("takeover of %s from node %s: %w", c.img, h.NodeID, err)
			}
			c.fences[fenceKey(h)], c.in.Fenced[fenceKey(h)] = f, true
		}
		plan.Next.AddFence(f)
		c.res.Fenced = append(c.res.Fenced, f)
	}
	return nil
}

// coverage reads the cluster's blocklist and finds, for each holder of cur whose mapping's
// client is recorded, the entry for its whole node (ip:0/0 or a range) that already cuts that
// client off. A hold with no client recorded is never covered: its fence would be ip:0/0, the
// very entry a node fence uses, lifted with it (docs/safety.md, F10).
func (s *Store) coverage(ctx context.Context, cur *Record) (map[string]BlockEntry, error) {
	entries, err := s.b.BlocklistEntries(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]BlockEntry{}
	for _, h := range cur.Holders {
		if h.ClientAddr == "" {
			continue
		}
		if e, ok := record.CoveringNode(entries, h.ClientAddr); ok {
			out[fenceKey(h)] = e
		}
	}
	return out, nil
}
