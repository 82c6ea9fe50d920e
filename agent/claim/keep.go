package claim

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Fence lifetimes. A blocklist entry expires (fence_expiry), but the mapping it fenced may
// outlive it: a node frozen or cut off for longer than the entry's life writes again the moment
// the entry runs out. So every fence recorded in a claim (and every intruder) is kept alive by
// re-blocklisting it until its mapping is known gone:
//   - the holder of record keeps the fences of its claims, checked at every renewal round;
//   - the pool's sweep keeps the fences of every claim it lists, free or held, so that a claim
//     released after a takeover, or one whose holder died, still has a keeper;
//   - a fence is due when this store has not re-blocklisted it for a quarter of fence_expiry
//     (on this process's monotonic clock) or ever: no wall clock is compared with the
//     monitors', so a node whose clock is off still renews in time;
//   - known gone: the fenced node's agent recorded that it unmapped the device (FenceGone), or
//     the node's heartbeat shows another boot id than the fence recorded (a reboot ends every
//     kernel client), or an admin lifted it (UnfenceNode). A gone fence is not renewed; its
//     entry expires by itself.

// keepEvery is how often a store re-blocklists a live fence: a quarter of its life, so that
// a keeper that misses a round or two is still in time.
func (s *Store) keepEvery() time.Duration { return s.cfg.FenceExpiry / 4 }

// keptAt is when this store last re-blocklisted an entry, on both its clocks: the monotonic one
// (immune to steps of the wall clock) and the wall clock (which goes on while the machine is
// suspended, when the monotonic one stops).
type keptAt struct {
	mono time.Duration
	wall time.Time
}

// dueAt says whether an entry this store last renewed at k (ok: it did) is due again: never
// renewed by this process, or a quarter of a life ago by either clock.
func (s *Store) dueAt(k keptAt, ok bool) bool {
	return !ok || s.cfg.Mono()-k.mono >= s.keepEvery() || s.cfg.Now().Sub(k.wall) >= s.keepEvery()
}

// markKept records that this store just re-blocklisted the entry keyed k (keepMu held).
func (s *Store) markKept(k string) {
	s.kept[k] = keptAt{mono: s.cfg.Mono(), wall: s.cfg.Now()}
}

// KeepReport is what KeepFences did with one claim's fences.
type KeepReport struct {
	// Renewed are the fences re-blocklisted now (with their new expiry).
	Renewed []Fence
	// Gone are the fences found gone now (the fenced node rebooted).
	Gone []Fence
	// Live is every fence and intruder still kept after the call, by address, with its expiry.
	Live []KeptFence
	// Unchecked are the fenced nodes' heartbeats that could not be read to look for a reboot
	// (their fences were renewed all the same).
	Unchecked []error
}

// KeptFence is one live blocklist entry a record keeps: a fence or an intruder.
type KeptFence struct {
	NodeID   string
	Addr     string
	Expires  time.Time
	Intruder bool
}

// entry is one live blocklist entry of a record, fence or intruder, as KeepFences sees it.
type entry struct {
	intruder bool
	node     string
	addr     string
	bootID   string
	inc      string
	at       time.Time // when it was fenced: an entry replaced meanwhile is another fence
}

func (r *Record) liveEntries() []entry {
	var out []entry
	for _, f := range r.Fences {
		if f.Live() {
			out = append(out, entry{node: f.NodeID, addr: f.Addr, bootID: f.BootID, inc: f.Incarnation, at: f.At})
		}
	}
	for _, in := range r.Intruders {
		out = append(out, entry{intruder: true, node: in.NodeID, addr: in.Addr, bootID: in.BootID, inc: in.Incarnation, at: in.At})
	}
	return out
}

// keepKey names an entry in the store's memory of its own renewals.
func keepKey(img Image, e entry) string { return img.String() + "\x00" + e.node + "\x00" + e.addr }

// Due says whether any live fence or intruder of rec is due for renewal by this store, without
// any cluster call: the renewal round asks it of every record it reads anyway.
func (s *Store) Due(img Image, rec *Record) bool {
	if rec == nil {
		return false
	}
	s.keepMu.Lock()
	defer s.keepMu.Unlock()
	for _, e := range rec.liveEntries() {
		if k, ok := s.kept[keepKey(img, e)]; s.dueAt(k, ok) {
			return true
		}
	}
	return false
}

// KeepFences re-blocklists the image's live fences and intruders that are due (see keepEvery),
// after checking each fenced node's heartbeat in the image's pool and namespace for a new boot
// id (then the fence is gone: its kernel client ended with the reboot, and it is marked so, not
// renewed). The record is then updated in one compare-and-set: new expiries, gone marks. A
// failed blocklist call is returned (joined) after the others were tried; an entry whose
// blocklisting worked stays renewed even when the record could not be updated.
func (s *Store) KeepFences(ctx context.Context, img Image) (KeepReport, error) {
	var rep KeepReport
	if err := validateImage(img); err != nil {
		return rep, fmt.Errorf("keep fences of %s: %w", img, err)
	}
	cur, _, err := s.read(ctx, img)
	if err != nil || cur == nil {
		return rep, err
	}
	round, errs := s.keepDue(ctx, img, cur, &rep)
	if len(round.renewed)+len(round.gone) > 0 {
		now := s.cfg.Now().UTC()
		rec, err := s.update(ctx, img, func(cur *Record, _ uint64) (*Record, error) {
			rep.Renewed, rep.Gone = nil, nil
			if cur == nil || !round.record(img, cur, now, s.cfg.Node.ID, &rep) {
				return nil, nil
			}
			return cur, nil
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("keep fences of %s: blocklist entries renewed, but the claim could not record it: %w", img, err))
		} else {
			cur = rec
		}
	}
	rep.Live = cur.Kept()
	return rep, errors.Join(errs...)
}

// keepRound is what one KeepFences call did on the blocklist, by keepKey.
type keepRound struct {
	renewed map[string]time.Time // the entry's new expiry
	gone    map[string]string    // why it is gone
	judged  map[string]time.Time // the fence time of the entry judged gone
}

// keepDue re-blocklists the live fences and intruders of cur that are due, each after a look
// at its node's heartbeat for a new boot id (then it is judged gone instead). The heartbeats
// that could not be read go to rep.Unchecked; the blocklist calls that failed are returned.
func (s *Store) keepDue(ctx context.Context, img Image, cur *Record, rep *KeepReport) (keepRound, []error) {
	round := keepRound{renewed: map[string]time.Time{}, gone: map[string]string{}, judged: map[string]time.Time{}}
	var errs []error
	for _, e := range cur.liveEntries() {
		k := keepKey(img, e)
		s.keepMu.Lock()
		at, ok := s.kept[k]
		s.keepMu.Unlock()
		if !s.dueAt(at, ok) {
			continue
		}
		why, err := s.rebooted(ctx, img, e)
		if err != nil {
			// not known: the entry is renewed all the same, and the read's failure reported
			rep.Unchecked = append(rep.Unchecked, err)
		}
		if why != "" {
			round.gone[k], round.judged[k] = why, e.at
			continue
		}
		until, err := s.b.Blocklist(ctx, e.addr, s.cfg.FenceExpiry)
		if err != nil {
			errs = append(errs, fmt.Errorf("keep node %s's fence %s on %s: %w", e.node, e.addr, img, err))
			continue
		}
		s.keepMu.Lock()
		s.markKept(k)
		s.pruneKept()
		s.keepMu.Unlock()
		round.renewed[k] = until.UTC()
	}
	return round, errs
}

// record writes the round into cur (as read for its compare-and-set): the fences judged gone
// marked so, the renewed ones with their new expiry (by node by, at now), the intruders judged
// gone dropped, the renewed ones with their new expiry; rep gets the fences it changed. It
// says whether anything changed.
func (r keepRound) record(img Image, cur *Record, now time.Time, by string, rep *KeepReport) bool {
	changed := false
	for i := range cur.Fences {
		f := &cur.Fences[i]
		k := keepKey(img, entry{node: f.NodeID, addr: f.Addr})
		if !f.Live() {
			continue
		}
		if why, ok := r.gone[k]; ok && f.At.Equal(r.judged[k]) { // the very fence judged, not one made since
			f.Gone, f.GoneAt, changed = why, now, true
			rep.Gone = append(rep.Gone, *f)
		} else if until, ok := r.renewed[k]; ok {
			// the latest blocklisting sets the entry's expiry, whatever was recorded
			f.Expires, f.RenewedAt, f.RenewedBy, changed = until, now, by, true
			rep.Renewed = append(rep.Renewed, *f)
		}
	}
	kept := cur.Intruders[:0]
	for _, in := range cur.Intruders {
		k := keepKey(img, entry{intruder: true, node: in.NodeID, addr: in.Addr})
		if _, ok := r.gone[k]; ok && in.At.Equal(r.judged[k]) {
			changed = true // its node rebooted: the mapping is gone, so is its record
			continue
		}
		if until, ok := r.renewed[k]; ok {
			in.Expires, changed = until, true
		}
		kept = append(kept, in)
	}
	cur.Intruders = kept
	return changed
}

// Kept lists the record's live fences and intruders: what must be kept on the blocklist.
func (r *Record) Kept() []KeptFence {
	if r == nil {
		return nil
	}
	var out []KeptFence
	for _, f := range r.Fences {
		if f.Live() {
			out = append(out, KeptFence{NodeID: f.NodeID, Addr: f.Addr, Expires: f.Expires})
		}
	}
	for _, in := range r.Intruders {
		out = append(out, KeptFence{NodeID: in.NodeID, Addr: in.Addr, Expires: in.Expires, Intruder: true})
	}
	return out
}

// renewDue blocklists again every live fence and intruder of rec that this store has not
// renewed within keepEvery (a new process: none), and writes the new expiries into rec. A claim
// runs it before its compare-and-set (F6 of docs/safety.md): when every keeper was down for
// longer than an entry's life, the entry ran out while its mapping may still exist, and the
// claimer must not write a hold beside it. done carries what this call already renewed across
// its attempts (keepKey → the new expiry). An entry that cannot be renewed fails the call.
func (s *Store) renewDue(ctx context.Context, img Image, rec *Record, done map[string]time.Time) error {
	if rec == nil {
		return nil
	}
	for _, e := range rec.liveEntries() {
		k := keepKey(img, e)
		if _, ok := done[k]; ok {
			continue
		}
		s.keepMu.Lock()
		at, ok := s.kept[k]
		s.keepMu.Unlock()
		if !s.dueAt(at, ok) {
			continue
		}
		until, err := s.b.Blocklist(ctx, e.addr, s.cfg.FenceExpiry)
		if err != nil {
			return fmt.Errorf("node %s's fence %s, which the claim keeps, could not be renewed first: %w", e.node, e.addr, err)
		}
		s.keepMu.Lock()
		s.markKept(k)
		s.keepMu.Unlock()
		done[k] = until.UTC()
	}
	now := s.cfg.Now().UTC()
	for i := range rec.Fences {
		f := &rec.Fences[i]
		if until, ok := done[keepKey(img, entry{node: f.NodeID, addr: f.Addr})]; ok && f.Live() {
			f.Expires, f.RenewedAt, f.RenewedBy = until, now, s.cfg.Node.ID
		}
	}
	for i := range rec.Intruders {
		in := &rec.Intruders[i]
		if until, ok := done[keepKey(img, entry{intruder: true, node: in.NodeID, addr: in.Addr})]; ok {
			in.Expires = until
		}
	}
	return nil
}

// rebooted says why e's mapping is gone because its node rebooted since the fence ("" when that
// is not known): this node's own boot id, or the fenced node's heartbeat in the image's pool and
// namespace, names another boot than the one the fence recorded. A fence without a boot id
// (made against an agent that recorded none) is never judged so.
func (s *Store) rebooted(ctx context.Context, img Image, e entry) (string, error) {
	if e.bootID == "" {
		return "", nil
	}
	if e.node == s.cfg.Node.ID {
		if s.cfg.Node.BootID != "" && s.cfg.Node.BootID != e.bootID && (e.inc == "" || e.inc == s.cfg.Node.Incarnation) {
			return fmt.Sprintf("node %s rebooted since the fence (boot_id %s, now %s): its kernel client is gone", e.node, e.bootID, s.cfg.Node.BootID), nil
		}
		return "", nil
	}
	data, _, err := s.b.Read(ctx, img, heartbeatObject(e.node))
	if err != nil {
		return "", fmt.Errorf("liveness of fenced node %s: %w", e.node, err)
	}
	if data == nil {
		return "", nil
	}
	hb, err := decodeHeartbeat(data)
	if err != nil || hb.BootID == "" || hb.BootID == e.bootID {
		return "", nil // unreadable or no news: kept
	}
	if e.inc != "" && hb.Incarnation != e.inc {
		// another agent state under that node id (a second machine given it, or the node with
		// its state lost): its boot says nothing of the fenced kernel's
		return "", nil
	}
	return fmt.Sprintf("node %s rebooted since the fence (boot_id %s, its heartbeat now %s): its kernel client is gone", e.node, e.bootID, hb.BootID), nil
}

// pruneKept forgets renewals older than a fence's life (keepMu held).
func (s *Store) pruneKept() {
	now := s.cfg.Mono()
	for k, at := range s.kept {
		if now-at.mono > s.cfg.FenceExpiry {
			delete(s.kept, k)
		}
	}
}

// FenceGone records that node's mapping with client address addr no longer exists (its agent
// unmapped it, or saw its device vanish): the fences of it in the image's claim are marked gone
// with why, and are no longer renewed. It returns how many were marked; no fence of it, no write.
func (s *Store) FenceGone(ctx context.Context, img Image, node, addr, why string) (int, error) {
	if addr == "" {
		return 0, nil
	}
	n := 0
	_, err := s.update(ctx, img, func(cur *Record, _ uint64) (*Record, error) {
		n = 0
		if cur == nil {
			return nil, nil
		}
		now := s.cfg.Now().UTC()
		for i := range cur.Fences {
			if f := &cur.Fences[i]; f.Live() && f.NodeID == node && f.Addr == addr {
				f.Gone, f.GoneAt = why, now
				n++
			}
		}
		if n == 0 {
			return nil, nil
		}
		return cur, nil
	})
	if err != nil {
		return 0, fmt.Errorf("record that node %s's fenced mapping %s of %s is gone: %w", node, addr, img, err)
	}
	return n, nil
}

// NodeFence is one live whole-node fence of a node, as UnfenceNode found it.
type NodeFence struct {
	Image Image
	Fence Fence
	// Rebooted says why the node is known rebooted since this fence ("" when it is not: its
	// heartbeat in the image's place shows the boot id the fence recorded, or none).
	Rebooted string
}

// UnfenceNodeResult is what UnfenceNode found and did.
type UnfenceNodeResult struct {
	Fences []NodeFence
	// Lifted are the addresses removed from the blocklist.
	Lifted []string
	// Forced: some fence's node was not seen rebooted and force was given.
	Forced bool
}

// UnfenceNode lifts the whole-node fences (ip:0/0) of node recorded in the claims of every
// pool of the cluster: a node fenced so cannot write anything to the cluster, so neither its
// unmap reports nor a heartbeat with a new boot id can end its fences, and only an admin can.
// It is refused (ErrBusy) unless, for every such fence, the node's heartbeat in the image's
// pool and namespace shows a boot id other than the one the fence recorded (the node rebooted,
// so its fenced kernel clients are gone), or force is set. Each fence is first marked gone in
// its claim (one compare-and-set each), then its blocklist entry is removed: a keeper that read
// the record before could only put the entry back, never keep one the record still needs.
func (s *Store) UnfenceNode(ctx context.Context, node, why string, force bool) (*UnfenceNodeResult, error) {
	if node == "" {
		return nil, fmt.Errorf("unfence node: %w: no node named", ErrInvalid)
	}
	pools, err := s.b.Pools(ctx)
	if err != nil {
		return nil, fmt.Errorf("unfence node %s: %w", node, err)
	}
	res := &UnfenceNodeResult{}
	for _, p := range pools {
		recs, err := s.List(ctx, p)
		if err != nil {
			return nil, fmt.Errorf("unfence node %s: %w", node, err)
		}
		for _, r := range recs {
			for _, f := range r.Fences {
				if !f.Live() || f.NodeID != node || !f.WholeNode() {
					continue
				}
				nf := NodeFence{Image: r.Ref, Fence: f}
				if nf.Rebooted, err = s.rebooted(ctx, r.Ref, entry{node: f.NodeID, addr: f.Addr, bootID: f.BootID, inc: f.Incarnation}); err != nil {
					return nil, fmt.Errorf("unfence node %s: %w", node, err)
				}
				res.Fences = append(res.Fences, nf)
			}
		}
	}
	if len(res.Fences) == 0 {
		return nil, fmt.Errorf("unfence node %s: %w: no claim of this cluster records a live whole-node fence of it", node, ErrNoClaim)
	}
	for _, nf := range res.Fences {
		if nf.Rebooted != "" {
			continue
		}
		if !force {
			return nil, fmt.Errorf("unfence node %s: %w: its fence %s (on %s, %s) may still cut live mappings: its heartbeat there shows no reboot since (boot_id %q). Lift it only once the node is known rebooted or powered off: then run again with --force",
				node, ErrBusy, nf.Fence.Addr, nf.Image, nf.Fence.At.UTC().Format(time.RFC3339), nf.Fence.BootID)
		}
		res.Forced = true
	}
	now := s.cfg.Now().UTC()
	for _, nf := range res.Fences {
		reason := why
		if nf.Rebooted != "" {
			reason += ": " + nf.Rebooted
		}
		_, err := s.update(ctx, nf.Image, func(cur *Record, _ uint64) (*Record, error) {
			if cur == nil {
				return nil, nil // removed meanwhile: nothing there to lift
			}
			changed := false
			for i := range cur.Fences {
				// the very fence judged above: one made since (same address) is not lifted
				if f := &cur.Fences[i]; f.Live() && f.NodeID == node && f.Addr == nf.Fence.Addr && f.At.Equal(nf.Fence.At) {
					f.Gone, f.GoneAt, changed = reason, now, true
				}
			}
			if !changed {
				return nil, nil
			}
			return cur, nil
		})
		if err != nil {
			return nil, fmt.Errorf("unfence node %s: its fence on %s could not be marked lifted, so no blocklist entry was removed (fences marked before it are no longer renewed; their entries expire by themselves, or remove them with `ceph osd blocklist rm`): %w", node, nf.Image, err)
		}
	}
	seen := map[string]bool{}
	for _, nf := range res.Fences {
		if seen[nf.Fence.Addr] {
			continue
		}
		seen[nf.Fence.Addr] = true
		if err := s.b.Unblocklist(ctx, nf.Fence.Addr); err != nil {
			return res, fmt.Errorf("unfence node %s: its fences are marked lifted in their claims, but removing the blocklist entry %s failed (no longer renewed, it expires by itself; or remove it with `ceph osd blocklist rm %s`): %w", node, nf.Fence.Addr, nf.Fence.Addr, err)
		}
		res.Lifted = append(res.Lifted, nf.Fence.Addr)
	}
	return res, nil
}
