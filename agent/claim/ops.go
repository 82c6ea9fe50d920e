package claim

import (
	"context"
	"errors"
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
	decide := func(cur *Record, ver uint64) (*Record, error) {
		next, err := c.attempt(ctx, cur, ver)
		c.sent = c.sent || (next != nil && !c.marking)
		return next, err
	}
	rec, err := s.updateFrom(ctx, req.Image, &first, decide)
	if err == nil && c.marking {
		// the swap mark is written: the claim on a fresh read, removing and adding under it
		c.marking, c.marked = false, true
		rec, err = s.update(ctx, req.Image, decide)
		if err == nil && c.marking {
			err = fmt.Errorf("%w: a second swap mark was needed after the first (the record changed under it)", ErrConflict)
		}
	}
	if c.marked && (err != nil || c.marking) {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		s.dropMark(dctx, req.Image, c.token)
		cancel()
	}
	if err != nil {
		if !c.sent {
			// no claim was sent: the image goes from this node's list of holds again, unless
			// it was there before (the next heartbeat drops it)
			s.unlistUnsent(req.Image, in.listed)
		}
		return nil, fmt.Errorf("acquire %s: %w", req.Image, err)
	}
	res := c.res
	res.Record = rec
	if len(res.Fenced) > 0 {
		holds := map[string]uint64{}
		for _, f := range res.Fenced {
			holds[f.NodeID] = f.Epoch
		}
		s.notifyAll(ctx, req.Image, "taken over by node "+s.cfg.Node.ID+" after a fence", holds)
	}
	return &res, nil
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

// withoutAddrsOf drops the watchers that belong to the given holders' mappings.
func withoutAddrsOf(watchers []string, hs []Holder) []string {
	if len(hs) == 0 {
		return watchers
	}
	var out []string
	for _, w := range watchers {
		drop := false
		for _, h := range hs {
			if h.ClientAddr == w {
				drop = true
			}
		}
		if !drop {
			out = append(out, w)
		}
	}
	return out
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

// Unexplained returns the watchers of img's header that no holder of rec explains: another
// client mapping or opening the image, from anywhere, outside rbd-owner (the agent's own
// connection aside). Two reads of the image (its id, its header's watchers): the slow check's.
func (s *Store) Unexplained(ctx context.Context, img Image, rec *Record) ([]string, error) {
	info, err := s.inspectImage(ctx, img)
	if err != nil {
		return nil, fmt.Errorf("watchers of %s: %w", img, err)
	}
	if rec == nil {
		return info.Watchers, nil
	}
	return unexplained(info.Watchers, rec.Holders), nil
}

// Inspect reads the image's claim record; ErrNoClaim when it has none.
func (s *Store) Inspect(ctx context.Context, img Image) (*Record, error) {
	if err := record.ValidateImage(img); err != nil {
		return nil, fmt.Errorf("inspect %s: %w", img, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rec, _, err := s.read(ctx, img)
	if err != nil {
		return nil, fmt.Errorf("inspect %s: %w", img, err)
	}
	if rec == nil {
		return nil, fmt.Errorf("inspect %s: %w", img, ErrNoClaim)
	}
	return rec, nil
}

// List returns every claim record of a pool, in all its namespaces: the cluster-wide view,
// read through the pool's claim indexes (ListPlace).
func (s *Store) List(ctx context.Context, pool string) ([]Record, error) {
	recs, errs := s.ListReadable(ctx, pool)
	if len(errs) > 0 {
		return nil, errs[0]
	}
	return recs, nil
}

// ListReadable is List for the sweeps: a record that cannot be read or decoded (corrupt, or
// of a newer format) is skipped and its error returned beside the others, so that one bad
// object never stops the keeping of every other claim's fences.
func (s *Store) ListReadable(ctx context.Context, pool string, extraNamespaces ...string) ([]Record, []error) {
	nss, err := s.placesOf(ctx, pool, extraNamespaces...)
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	var out []Record
	for _, ns := range nss {
		pl, err := s.ListPlace(ctx, pool, ns, false)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, pl.Records...)
		errs = append(errs, pl.Errors...)
	}
	return out, errs
}

// PlaceList is what ListPlace found in one pool and namespace.
type PlaceList struct {
	Index Index
	// Records are the claim records the index names, sorted by image.
	Records []Record
	// Stale are the keys that name no claim object (DropStaleKey).
	Stale []Image
	// Errors are the records that could not be read or decoded (skipped).
	Errors []error
}

// ListPlace reads a pool and namespace's claim index and every claim record it names: never a
// listing of the pool, except once, when the index was never built (BuildIndex: the migration
// from agents before the index, reported through Config.OnIndexBuilt). markEmpty (the sweeps,
// of pools this node claims in) marks the index of a namespace without claims built too, so
// that it is not listed again; an admin's listing of every pool leaves other pools alone.
func (s *Store) ListPlace(ctx context.Context, pool, namespace string, markEmpty bool) (PlaceList, error) {
	idx, err := s.ReadIndex(ctx, pool, namespace)
	if err != nil {
		return PlaceList{}, err
	}
	if !idx.Built {
		start := time.Now()
		found, err := s.BuildIndex(ctx, pool, namespace, markEmpty)
		if err != nil {
			return PlaceList{}, err
		}
		if s.cfg.OnIndexBuilt != nil && (found > 0 || idx.Version != 0 || markEmpty) {
			s.cfg.OnIndexBuilt(pool, namespace, found, time.Since(start))
		}
		if idx, err = s.ReadIndex(ctx, pool, namespace); err != nil {
			return PlaceList{}, err
		}
	}
	pl := PlaceList{Index: idx}
	for _, name := range idx.Images {
		img := Image{Pool: pool, Namespace: namespace, Image: name}
		rec, err := s.Inspect(ctx, img)
		switch {
		case errors.Is(err, ErrNoClaim):
			pl.Stale = append(pl.Stale, img)
		case errors.Is(err, ErrInvalid):
			// a key no claim could have (written by hand): not a claim
		case err != nil:
			pl.Errors = append(pl.Errors, err)
		default:
			pl.Records = append(pl.Records, *rec)
		}
	}
	return pl, nil
}

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
				return nil, fmt.Errorf("%w: node %s's hold on %s was not fenced; run `rbd-owner fence %s` first",
					ErrInvalid, h.NodeID, img, img)
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

// Orphans lists the claims of a pool whose image no longer exists (or was recreated under the
// same name with another id).
func (s *Store) Orphans(ctx context.Context, pool string) ([]Record, error) {
	recs, err := s.List(ctx, pool)
	if err != nil {
		return nil, err
	}
	var out []Record
	for _, r := range recs {
		orphan, err := s.isOrphan(ctx, r)
		if err != nil {
			return nil, err
		}
		if orphan {
			out = append(out, r)
		}
	}
	return out, nil
}

// IsOrphan says whether r's image no longer exists (or was recreated with another id).
func (s *Store) IsOrphan(ctx context.Context, r Record) (bool, error) { return s.isOrphan(ctx, r) }

func (s *Store) isOrphan(ctx context.Context, r Record) (bool, error) {
	ok, err := s.imageExists(ctx, r.Ref, r.ImageID)
	return !ok, err
}

// RemoveOrphan deletes the claim record of a deleted image, only if the image is still gone
// and the record has not changed since it was checked (one compare-and-delete operation).
func (s *Store) RemoveOrphan(ctx context.Context, img Image) (bool, error) {
	return s.removeOrphan(ctx, img, false)
}

// SweepOrphan is RemoveOrphan for the automatic sweep: it removes only a free record (no
// holder at all), so a claim taken or still listed meanwhile is never removed by a sweep.
func (s *Store) SweepOrphan(ctx context.Context, img Image) (bool, error) {
	return s.removeOrphan(ctx, img, true)
}

func (s *Store) removeOrphan(ctx context.Context, img Image, onlyFree bool) (bool, error) {
	if err := record.ValidateImage(img); err != nil {
		return false, fmt.Errorf("remove orphan %s: %w", img, err)
	}
	for attempt := 0; attempt < maxAttempts; attempt++ {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		rec, ver, err := s.read(ctx, img)
		if err != nil || rec == nil {
			return false, err
		}
		if onlyFree && (!rec.Free() || len(rec.Kept()) > 0) {
			return false, nil // held, or it keeps fences: the image may only have been renamed or moved to the trash
		}
		exists, err := s.imageExists(ctx, img, rec.ImageID)
		if err != nil {
			return false, fmt.Errorf("remove orphan %s: %w", img, err)
		}
		if exists {
			return false, fmt.Errorf("remove orphan %s: %w: the image exists; its claim is not an orphan", img, ErrInvalid)
		}
		// the key goes too only while no image has the name (an image recreated under it may be
		// being claimed on a stale look: model/index.pml, variant u), and only if the index is
		// still at the version read before the object goes (I2): a writer that indexes the image
		// again after this read moves it on, and keeps its key
		named, err := s.imageExists(ctx, img, "")
		if err != nil {
			return false, fmt.Errorf("remove orphan %s: %w", img, err)
		}
		_, idxVer, err := s.b.ReadKeys(ctx, img, IndexObject, []string{img.Image})
		if err != nil {
			return false, fmt.Errorf("remove orphan %s: %w", img, err)
		}
		err = s.b.CompareAndRemove(ctx, img, record.ObjectOf(img), ver)
		if err == nil {
			if idxVer != 0 && !named {
				err := s.b.RemoveKeys(ctx, img, IndexObject, []string{img.Image}, idxVer)
				if errors.Is(err, ErrConflict) {
					_, err = s.DropStaleKey(ctx, img) // the index changed meanwhile: I3 judges the key
				}
				if err != nil {
					return true, fmt.Errorf("remove orphan %s: its claim is removed, its index key is left for the next sweep: %w", img, err)
				}
			}
			return true, nil
		}
		if !errors.Is(err, ErrConflict) {
			return false, fmt.Errorf("remove orphan %s: %w", img, err)
		}
	}
	return false, fmt.Errorf("remove orphan %s: %w", img, ErrBusy)
}
