package claim

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/claim/record"
)

// Fence lifetimes. A blocklist entry expires (fence_expiry), and other parties remove or
// shorten entries (enforce.go), but the mapping a fence cut off may outlive its entry: a node
// frozen or cut off for longer writes again the moment its entry is gone. So every fence
// recorded in a claim (and every intruder) is reconciled against the cluster's blocklist until
// its mapping is known gone:
//   - the holder of record checks the fences of its claims at every renewal round (FenceCheck);
//   - the pool's sweep checks the fences of every claim it lists, free or held, so that a claim
//     released after a takeover, or one whose holder died, still has a keeper;
//   - a check reads the listing (one read per round, shared by the claims of the round) and puts
//     back what is missing, lengthens what is short (ensure), and corrects the record's expiry to
//     the listed one; a fence is checked again when this store has not checked it for half a
//     FenceCheck (on its monotonic clock and on the wall clock, which goes on through a suspend);
//   - known gone: the fenced node's agent recorded that it unmapped the device (FenceGone), or
//     the node's heartbeat shows another boot id than the fence recorded (a reboot ends every
//     kernel client; looked at every rebootLookEvery and before any repair), or an admin lifted
//     it (UnfenceNode). A gone fence is no longer checked; an entry this project listed for it
//     (Fence.Made) is removed from the blocklist, one listed by someone else expires by itself.

// checkEvery is how long a fence this store checked counts as checked: half a FenceCheck, so
// that every round of the holder (a FenceCheck apart) checks it again.
func (s *Store) checkEvery() time.Duration { return s.fenceCheck() / 2 }

// rebootLookEvery is how often a keeper reads a fenced node's heartbeat, to see whether it
// rebooted (which ends the fence) and whether it is down (which allows a cover, ensure): half a
// lease, so that its observation of the node is refreshed within every lease (else it starts
// over, and never finds the node down).
func (s *Store) rebootLookEvery() time.Duration { return s.cfg.Lease / 2 }

// KeepReport is what KeepFences did with one claim's fences.
type KeepReport struct {
	// Renewed are the fences whose entries were lengthened now as they aged (with their new
	// expiry), or whose recorded expiry was corrected to the listed one.
	Renewed []Fence
	// Faults are the entries found not as the record said: missing or short, repaired or not.
	Faults []EntryFault
	// Gone are the fences found gone now (the fenced node rebooted).
	Gone []Fence
	// Lifted are the entries of gone fences this project had listed, removed now.
	Lifted []string
	// Live is every fence and intruder still kept after the call, by address, with its expiry.
	Live []KeptFence
	// Unchecked are the fenced nodes' heartbeats that could not be read to look for a reboot
	// (their fences were kept all the same).
	Unchecked []error
}

// Unrepaired counts the faults left as found: entries missing or short that could not be put
// in force (reported at every check until they are, or until their fence ends).
func (r KeepReport) Unrepaired() int {
	n := 0
	for _, f := range r.Faults {
		if !f.Repaired() {
			n++
		}
	}
	return n
}

func liveEntries(r *Record) []entry {
	var out []entry
	for _, f := range r.Fences {
		if f.Live() {
			out = append(out, entry{node: f.NodeID, addr: f.Addr, bootID: f.BootID, inc: f.Incarnation, at: f.At, expires: f.Expires})
		}
	}
	for _, in := range r.Intruders {
		out = append(out, entry{intruder: true, node: in.NodeID, addr: in.Addr, bootID: in.BootID, inc: in.Incarnation, at: in.At, expires: in.Expires})
	}
	return out
}

// Due says whether any live fence or intruder of rec is due for a check by this store, or a
// gone fence's entry this project listed is still to be removed, without any cluster call: the
// renewal round asks it of every record it reads anyway.
func (s *Store) Due(img Image, rec *Record) bool {
	if rec == nil {
		return false
	}
	if len(rec.ToLift()) > 0 {
		return true
	}
	return len(s.book.due(img, liveEntries(rec), nil)) > 0
}

// KeepFences checks the image's live fences and intruders that are due against the cluster's
// blocklist and repairs what is not in force (enforce.go), after a look at each fenced node's
// heartbeat in the image's pool and namespace for a new boot id when due or before a repair
// (then the fence is gone: its kernel client ended with the reboot, and it is marked so). The
// record is then updated in one compare-and-set: listed expiries, gone marks, lifted entries.
// A failed cluster call is returned (joined) after the others were tried; an entry repaired
// stays repaired even when the record could not be updated.
func (s *Store) KeepFences(ctx context.Context, img Image) (KeepReport, error) {
	var rep KeepReport
	if err := record.ValidateImage(img); err != nil {
		return rep, fmt.Errorf("keep fences of %s: %w", img, err)
	}
	cur, _, err := s.read(ctx, img)
	if err != nil || cur == nil {
		return rep, err
	}
	round, errs := s.keepDue(ctx, img, cur, &rep)
	if round.changes() || len(round.added) > 0 {
		now := s.cfg.Now().UTC()
		var latest *Record // the record as the last attempt read it
		rec, err := s.update(ctx, img, func(cur *Record, _ uint64) (*Record, error) {
			rep.Renewed, rep.Gone, latest = nil, nil, cur
			if cur == nil || !round.record(img, cur, now, s.cfg.Node.ID, &rep) {
				return nil, nil
			}
			return cur, nil
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("keep fences of %s: blocklist entries checked, but the claim could not record it: %w", img, err))
		} else {
			if rec != nil {
				cur = rec
			}
			errs = append(errs, s.unaddEnded(ctx, img, latest, round.added, &rep)...)
		}
	}
	rep.Live = cur.Kept()
	return rep, errors.Join(errs...)
}

// unaddEnded removes again the entries this round put back (they were missing) whose fences
// the record no longer keeps: their fence ended meanwhile (the fenced node's agent found its
// mapping gone and may have removed the entry already, before this round added it back), so no
// keeper would ever remove them. The entry was absent before this round: removing it changes
// nothing anyone relied on.
func (s *Store) unaddEnded(ctx context.Context, img Image, rec *Record, added map[string]bool, rep *KeepReport) []error {
	var errs []error
	for addr := range added {
		if rec == nil || keeps(rec, addr) {
			continue
		}
		if err := s.b.Unblocklist(ctx, addr); err != nil {
			errs = append(errs, fmt.Errorf("remove again the entry %s of an ended fence on %s, put back by this check: %w", addr, img, err))
			continue
		}
		s.view.changed()
		rep.Lifted = append(rep.Lifted, addr)
	}
	return errs
}

// keepRound is what one KeepFences call found and did on the blocklist, by keepKey.
type keepRound struct {
	added   map[string]bool      // addresses found missing and added again
	renewed map[string]time.Time // the entry's expiry as listed now, to record
	gone    map[string]string    // why it is gone
	judged  map[string]time.Time // the fence time of the entry judged gone
	lifted  map[string]time.Time // gone fences' entries removed (by fence time)
}

func (r keepRound) changes() bool { return len(r.renewed)+len(r.gone)+len(r.lifted) > 0 }

// keepDue checks the live fences and intruders of cur that are due against the listing and
// repairs them, each after a look at its node's heartbeat when due (a new boot id: judged gone
// instead); then removes the entries of gone fences this project listed. The heartbeats that
// could not be read go to rep.Unchecked; the cluster calls that failed are returned.
func (s *Store) keepDue(ctx context.Context, img Image, cur *Record, rep *KeepReport) (keepRound, []error) {
	round := keepRound{added: map[string]bool{}, renewed: map[string]time.Time{}, gone: map[string]string{}, judged: map[string]time.Time{}, lifted: map[string]time.Time{}}
	due := s.book.due(img, liveEntries(cur), nil)
	lift := cur.ToLift()
	if len(due)+len(lift) == 0 {
		return round, nil
	}
	entries, read, err := s.view.read(ctx)
	if err != nil {
		return round, []error{fmt.Errorf("check the fences of %s: %w", img, err)}
	}
	var errs []error
	for _, e := range due {
		if err := s.keepOne(ctx, img, e, entries, read, &round, rep); err != nil {
			errs = append(errs, err)
		}
	}
	for _, f := range lift {
		// an entry a live fence or intruder of the same client needs is theirs now: not removed
		if _, listed := exactEntry(entries, f.Addr); listed && !keeps(cur, f.Addr) {
			if err := s.b.Unblocklist(ctx, f.Addr); err != nil {
				errs = append(errs, fmt.Errorf("remove the entry of node %s's gone fence %s on %s: %w", f.NodeID, f.Addr, img, err))
				continue
			}
			s.view.changed()
			rep.Lifted = append(rep.Lifted, f.Addr)
		}
		round.lifted[f.Addr] = f.At
	}
	return round, errs
}

// keepOne checks one due entry e against entries and repairs it (see keepDue).
func (s *Store) keepOne(ctx context.Context, img Image, e entry, entries []BlockEntry, checked keptAt, round *keepRound, rep *KeepReport) error {
	k := keepKey(img, e)
	le, st := s.judge(entries, e.addr, e.expires)
	down := false
	if st != inForce || s.book.lookDue(k) {
		why, dn, err := s.fencedNode(ctx, img, e)
		if err != nil {
			// not known: the entry is kept all the same, and the read's failure reported
			rep.Unchecked = append(rep.Unchecked, err)
		}
		s.book.markLooked(k)
		if why != "" {
			round.gone[k], round.judged[k] = why, e.at
			return nil
		}
		down = dn
	}
	kf := KeptFence{NodeID: e.node, Addr: e.addr, Expires: e.expires, Intruder: e.intruder}
	until, how, err := s.ensure(ctx, e.addr, le, st, swapCovered, down)
	s.book.markAt(k, checked.mono, checked.wall)
	fault := EntryFault{Image: img, KeptFence: kf, Kind: "short", Listed: le.Until, Recorded: e.expires, Now: until, How: how}
	if st == missing {
		fault.Kind = "missing"
	}
	if err != nil {
		fault.Now, fault.How, fault.Why = time.Time{}, "", err.Error()
		rep.Faults = append(rep.Faults, fault)
		if st != missing && !le.Until.Equal(e.expires) {
			round.renewed[k] = le.Until // the record says what is listed
		}
		if errors.Is(err, errNotLengthened) {
			return nil // reported as a fault, every check, until it is lengthened or lapses
		}
		return fmt.Errorf("keep node %s's fence %s on %s: %w", e.node, e.addr, img, err)
	}
	if st == missing || st == short {
		rep.Faults = append(rep.Faults, fault)
	}
	if st == missing {
		round.added[e.addr] = true
	}
	if until.Sub(e.expires).Abs() > time.Second {
		round.renewed[k] = until
	}
	return nil
}

// record writes the round into cur (as read for its compare-and-set): the fences judged gone
// marked so, the checked ones with their listed expiry (by node by, at now), the lifted ones
// with the time, the intruders judged gone dropped, the checked ones with their listed expiry;
// rep gets the fences it changed. It says whether anything changed.
func (r keepRound) record(img Image, cur *Record, now time.Time, by string, rep *KeepReport) bool {
	changed := false
	for i := range cur.Fences {
		f := &cur.Fences[i]
		k := keepKey(img, entry{node: f.NodeID, addr: f.Addr})
		if at, ok := r.lifted[f.Addr]; ok && !f.Live() && f.Made && f.LiftedAt.IsZero() && f.At.Equal(at) {
			f.LiftedAt, changed = now, true
			continue
		}
		if !f.Live() {
			continue
		}
		if why, ok := r.gone[k]; ok && f.At.Equal(r.judged[k]) { // the very fence judged, not one made since
			f.Gone, f.GoneAt, changed = why, now, true
			rep.Gone = append(rep.Gone, *f)
		} else if until, ok := r.renewed[k]; ok {
			// the listing sets the entry's expiry, whatever was recorded
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

// keeps says whether a live fence or intruder of r needs addr's entry.
func keeps(r *Record, addr string) bool {
	for _, e := range liveEntries(r) {
		if e.addr == addr {
			return true
		}
	}
	return false
}

// renewDue checks every live fence and intruder of rec that this store has not checked within
// checkEvery (a new process: none) against the listing, repairs what is not in force, and writes
// the listed expiries into rec. A claim runs it before its compare-and-set (F6 of
// docs/safety.md): an entry may be gone (lapsed while every keeper was down, or removed by
// someone), and the claimer must not write a hold beside it. Before that hold is written a
// short entry may be removed and added again as mode allows: bare (swapBare, under this call's
// swap mark), not before a mark is written (swapNeedsMark: errNeedsMark), or only under a cover
// where a hold of rec is kept and may write (swapCovered: an entry that cannot be lengthened so
// stays as listed, in force, and its keepers report it). done carries what this call already
// checked across its attempts (keepKey → the listed expiry). An entry that cannot be put in
// force fails the call.
func (s *Store) renewDue(ctx context.Context, img Image, rec *Record, done map[string]time.Time, mode enforceMode) error {
	if rec == nil {
		return nil
	}
	due := s.book.due(img, liveEntries(rec), done)
	if len(due) > 0 {
		entries, read, err := s.view.read(ctx)
		if err != nil {
			return fmt.Errorf("the fences the claim keeps could not be checked first: %w", err)
		}
		for _, e := range due {
			k := keepKey(img, e)
			le, st := s.judge(entries, e.addr, e.expires)
			until, _, err := s.ensure(ctx, e.addr, le, st, mode, false)
			if errors.Is(err, errNotLengthened) {
				until, err = le.Until, nil // listed, in force: short, reported by its keepers
			}
			if err != nil {
				return fmt.Errorf("node %s's fence %s, which the claim keeps, could not be put in force first: %w", e.node, e.addr, err)
			}
			s.book.markAt(k, read.mono, read.wall)
			done[k] = until
		}
	}
	now := s.cfg.Now().UTC()
	for i := range rec.Fences {
		f := &rec.Fences[i]
		if until, ok := done[keepKey(img, entry{node: f.NodeID, addr: f.Addr})]; ok && f.Live() && until.Sub(f.Expires).Abs() > time.Second {
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

// fencedNode looks at the fenced node of e in the image's pool and namespace: why its mapping is
// gone because it rebooted ("" when that is not known), and whether it is down as this store
// observes it (its heartbeat there unchanged for a lease, looked at at least once a lease, or
// none, or written by another incarnation than the fence recorded; silentFor): only then may a cover of
// its whole node be listed for a moment (ensure).
func (s *Store) fencedNode(ctx context.Context, img Image, e entry) (string, bool, error) {
	if e.node == s.cfg.Node.ID {
		why, err := s.rebooted(ctx, img, e, nil)
		return why, false, err // this node is alive
	}
	data, ver, err := s.b.Read(ctx, img, record.HeartbeatObject(e.node))
	if err != nil {
		return "", false, fmt.Errorf("liveness of fenced node %s: %w", e.node, err)
	}
	var hb *Heartbeat
	if data != nil {
		if hb, err = decodeHeartbeat(data); err != nil {
			hb = nil
		}
	}
	why, _ := s.rebooted(ctx, img, e, &heartbeatRead{hb: hb, present: data != nil})
	if why != "" {
		return why, false, nil
	}
	// another agent under that node id says nothing of the fenced kernel: the fenced agent's
	// silence goes on as first seen
	other := hb != nil && e.inc != "" && hb.Incarnation != e.inc
	return "", s.book.silentFor(record.PoolNS(img)+"\x00"+e.node, heartbeatMark(ver, hb), other) >= s.cfg.Lease, nil
}

// heartbeatRead is a fenced node's heartbeat as already read (fencedNode).
type heartbeatRead struct {
	hb      *Heartbeat
	present bool
}

// rebooted says why e's mapping is gone because its node rebooted since the fence ("" when that
// is not known): this node's own boot id, or the fenced node's heartbeat in the image's pool and
// namespace, names another boot than the one the fence recorded. A fence without a boot id
// (made against an agent that recorded none) is never judged so.
func (s *Store) rebooted(ctx context.Context, img Image, e entry, read *heartbeatRead) (string, error) {
	if e.bootID == "" {
		return "", nil
	}
	if e.node == s.cfg.Node.ID {
		if s.cfg.Node.BootID != "" && s.cfg.Node.BootID != e.bootID && (e.inc == "" || e.inc == s.cfg.Node.Incarnation) {
			return fmt.Sprintf("node %s rebooted since the fence (boot_id %s, now %s): its kernel client is gone", e.node, e.bootID, s.cfg.Node.BootID), nil
		}
		return "", nil
	}
	if read == nil {
		data, _, err := s.b.Read(ctx, img, record.HeartbeatObject(e.node))
		if err != nil {
			return "", fmt.Errorf("liveness of fenced node %s: %w", e.node, err)
		}
		read = &heartbeatRead{present: data != nil}
		if data != nil {
			read.hb, _ = decodeHeartbeat(data)
		}
	}
	hb := read.hb
	if hb == nil || hb.BootID == "" || hb.BootID == e.bootID {
		return "", nil // unreadable or no news: kept
	}
	if e.inc != "" && hb.Incarnation != e.inc {
		// another agent state under that node id (a second machine given it, or the node with
		// its state lost): its boot says nothing of the fenced kernel's
		return "", nil
	}
	return fmt.Sprintf("node %s rebooted since the fence (boot_id %s, its heartbeat now %s): its kernel client is gone", e.node, e.bootID, hb.BootID), nil
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
	fences, err := s.nodeFences(ctx, node)
	if err != nil {
		return nil, err
	}
	res := &UnfenceNodeResult{Fences: fences}
	if len(res.Fences) == 0 {
		return nil, fmt.Errorf("unfence node %s: %w: no claim of this cluster records a live whole-node fence of it, nor an ended one whose entry is still to be lifted", node, ErrNoClaim)
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
		err := s.markLifted(ctx, node, nf, reason, now)
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

// nodeFences finds node's whole-node fences in the claims of every pool of the cluster: the live
// ones, each with whether its node is seen rebooted since, and the ended ones whose entry this
// project listed and has not lifted yet.
func (s *Store) nodeFences(ctx context.Context, node string) ([]NodeFence, error) {
	pools, err := s.b.Pools(ctx)
	if err != nil {
		return nil, fmt.Errorf("unfence node %s: %w", node, err)
	}
	var out []NodeFence
	for _, p := range pools {
		recs, err := s.List(ctx, p)
		if err != nil {
			return nil, fmt.Errorf("unfence node %s: %w", node, err)
		}
		for _, r := range recs {
			for _, f := range r.Fences {
				if f.NodeID != node || !f.WholeNode() {
					continue
				}
				if !f.Live() {
					// ended (its node seen rebooted), its entry, which this project listed, still
					// there: lifted too, with no reboot to check
					if f.Made && f.LiftedAt.IsZero() {
						out = append(out, NodeFence{Image: r.Ref, Fence: f, Rebooted: "its fence ended before: " + f.Gone})
					}
					continue
				}
				nf := NodeFence{Image: r.Ref, Fence: f}
				if nf.Rebooted, err = s.rebooted(ctx, r.Ref, entry{node: f.NodeID, addr: f.Addr, bootID: f.BootID, inc: f.Incarnation}, nil); err != nil {
					return nil, fmt.Errorf("unfence node %s: %w", node, err)
				}
				out = append(out, nf)
			}
		}
	}
	return out, nil
}

// markLifted marks node's whole-node fence nf lifted in its claim with reason (ended, or, when
// it had ended already, lifted at now), and ends or unmarks the hold that carried it.
func (s *Store) markLifted(ctx context.Context, node string, nf NodeFence, reason string, now time.Time) error {
	_, err := s.update(ctx, nf.Image, func(cur *Record, _ uint64) (*Record, error) {
		if cur == nil {
			return nil, nil // removed meanwhile: nothing there to lift
		}
		changed := false
		for i := range cur.Fences {
			// the very fence judged above: one made since (same address) is not lifted
			f := &cur.Fences[i]
			switch {
			case f.NodeID != node || f.Addr != nf.Fence.Addr || !f.At.Equal(nf.Fence.At):
			case f.Live():
				f.Gone, f.GoneAt, changed = reason, now, true
			case f.LiftedAt.IsZero():
				f.LiftedAt, changed = now, true
			}
		}
		if !changed {
			return nil, nil
		}
		cur.UnmarkFenced(node, nf.Fence.Addr, nf.Rebooted != "")
		return cur, nil
	})
	return err
}
