package claim

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/claim/record"
)

// The blocklist as the cluster enforces it. A fence recorded in a claim is a desired fact; the
// monitors' blocklist is the actual one, and other parties change it: an operator's `osd
// blocklist rm` or `clear`, another fencer lifting what it added, librbd listing a client for an
// hour when it breaks its lock, a fence made before an upgrade with a shorter life. So every
// live fence is reconciled against the listing (`osd blocklist ls`), as kubelet reconciles
// desired against actual state:
//   - missing: added again at once (a fresh entry gets the whole fence_expiry), and reported;
//   - short (its listed expiry is earlier than the record says, or it has less than three
//     quarters of fence_expiry left): lengthened, and reported when the record said otherwise;
//   - in force: nothing sent; the record is corrected when it names another expiry.
//
// Lengthening is not a re-add. Measured on Ceph 16.2, 18.2 and 20.2 (keep_cluster_test.go):
// `osd blocklist add` of a listed address keeps the entry's old expiry, and `rm` then `add` are
// two map epochs, between which the address is off the blocklist (an OSD that has the first map
// and not the second serves the fenced client). So an entry is lengthened by removing and adding
// it again only while something else cuts the same client off:
//   - before the hold that the fence protects is written (a takeover, an admin's fence, a claim
//     of a record with live fences): nobody writes beside the fenced client yet, so the window
//     is the same as before the fence (swapBare);
//   - under a cover: an entry for the client's whole node (ip:0/0) or a range holding its ip,
//     whoever listed it; else, when the fenced node is not seen alive (its heartbeat in the
//     image's place unchanged for a lease, as this node observed it), a short-lived ip:0/0 entry
//     of this store's own, removed once the exact entry is back (swapCovered). The cover cuts the
//     node's other clients for those seconds: its watches drop and come back; a node whose agent
//     renews is never cut so.
// A short entry that cannot be lengthened so (its node is seen alive) is left in place and
// reported each round; once it lapses it is missing, and added again whole.

// enforceMode says what an entry may go through to be lengthened.
type enforceMode int

const (
	// swapBare: before the hold the fence protects is written; a remove and add is safe.
	swapBare enforceMode = iota
	// swapCovered: a hold may write beside the fenced client: remove only under a cover.
	swapCovered
	// swapNeedsMark: before the hold is written, but another claim could land meanwhile: a
	// bare remove needs the record's swap mark first (errNeedsMark; swapmark.go).
	swapNeedsMark
)

// coverLife is the life of the ip:0/0 entry that covers an exact entry while it is removed and
// added again: it lapses by itself soon if this store stops between the two.
const coverLife = 2 * time.Minute

// coverMargin is the least life a cover someone listed must have left for an entry to be removed
// and added again under it: a remove and an add are two map epochs, seconds at most.
const coverMargin = 30 * time.Second

// readdTolerance is how far a listed expiry may differ from another before they count as
// different: the monitors' clock moves between two adds, and a recorded expiry may be an
// older agent's estimate on its own clock.
const readdTolerance = time.Minute

// EntryFault is one live fence or intruder whose blocklist entry was not as its record said.
type EntryFault struct {
	Image Image
	KeptFence
	// Kind: "missing" (not listed) or "short" (listed with less life than recorded or wanted).
	Kind string
	// Listed is the entry's expiry as found listed (zero when missing); Recorded what the claim
	// record said.
	Listed, Recorded time.Time
	// Now is the entry's expiry after the repair (zero when it was not repaired), and How what
	// was done ("" when nothing could be: Why says why).
	Now time.Time
	How string
	Why string
}

// Repaired says whether the entry is as the fence needs it now (put back, or lengthened).
func (f EntryFault) Repaired() bool { return f.How != "" }

// String is the fault as one line for a person.
func (f EntryFault) String() string {
	what := f.Described()
	switch {
	case f.Kind == "missing" && f.How != "":
		return fmt.Sprintf("%s of %s was not on the cluster's blocklist (removed by someone, or lapsed): %s, listed until %s", what, f.Image, f.How, stamp(f.Now))
	case f.Kind == "missing":
		return fmt.Sprintf("%s of %s is not on the cluster's blocklist and could not be put back: %s", what, f.Image, f.Why)
	case f.How != "":
		return fmt.Sprintf("%s of %s was listed only until %s (the claim said %s): %s, listed until %s", what, f.Image, stamp(f.Listed), stamp(f.Recorded), f.How, stamp(f.Now))
	}
	return fmt.Sprintf("%s of %s is listed only until %s (the claim said %s) and was not lengthened: %s", what, f.Image, stamp(f.Listed), stamp(f.Recorded), f.Why)
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "(none)"
	}
	return t.UTC().Format(time.RFC3339)
}

// fenceCheck is how often a kept fence is compared with the listing: FenceCheck, else a third
// of the lease.
func (s *Store) fenceCheck() time.Duration {
	if s.cfg.FenceCheck > 0 {
		return s.cfg.FenceCheck
	}
	return s.cfg.Lease / 3
}

// exactEntry is addr's own entry in entries (not a wider one).
func exactEntry(entries []BlockEntry, addr string) (BlockEntry, bool) {
	a := record.BareAddr(addr)
	for _, e := range entries {
		if !e.Range.IsValid() && e.Addr == a {
			return e, true
		}
	}
	return BlockEntry{}, false
}

// entryState is how an entry stands against what its fence needs.
type entryState int

const (
	inForce entryState = iota
	missing
	aging // less than three quarters of fence_expiry left: lengthened, not a fault
	short // listed until earlier than recorded: someone shortened or replaced it
)

// judge says how addr's entry stands in entries, against the expiry recorded for it.
func (s *Store) judge(entries []BlockEntry, addr string, recorded time.Time) (BlockEntry, entryState) {
	e, ok := exactEntry(entries, addr)
	switch {
	case !ok:
		return e, missing
	case !recorded.IsZero() && e.Until.Before(recorded.Add(-readdTolerance)):
		return e, short
	case e.Until.Sub(s.view.monNow()) <= s.cfg.FenceExpiry*3/4:
		return e, aging // a quarter of its life gone: lengthened at the first check from then
	}
	return e, inForce
}

// add lists addr for the whole fence_expiry; absent tells that it was not listed just before
// (then its expiry also sets the monitors' clock estimate). It returns the expiry as listed.
func (s *Store) add(ctx context.Context, addr string, absent bool) (time.Time, error) {
	before := s.cfg.Mono()
	var until, monNow time.Time
	var err error
	if ca, ok := s.b.(record.ClockedAdder); ok {
		until, monNow, err = ca.BlocklistClocked(ctx, addr, s.cfg.FenceExpiry)
	} else {
		until, err = s.b.Blocklist(ctx, addr, s.cfg.FenceExpiry)
	}
	s.view.changed()
	if err != nil {
		return time.Time{}, err
	}
	switch {
	case !monNow.IsZero():
		// the monitors named their time: an add that changed nothing tells it too
		s.view.learnMonClock(monNow, 0, before)
	case absent:
		s.view.learnMonClock(until, s.cfg.FenceExpiry, before)
	}
	return until.UTC(), nil
}

// lengthened says whether an expiry is long enough for a fence: more than three quarters of
// fence_expiry left on the monitors' clock.
func (s *Store) lengthened(until time.Time) bool {
	return until.Sub(s.view.monNow()) > s.cfg.FenceExpiry*3/4
}

// errNotLengthened: an entry could not be lengthened without leaving its client uncut.
var errNotLengthened = errors.New("not lengthened")

// ensure makes addr's entry in force for a fence, from how it stands (e, st as judge found it
// in entries): added when missing, lengthened when aging or short (see the package comment above
// for how, by mode; down says the fenced node is not seen alive, which allows a cover of its
// own). It returns the expiry as listed afterwards and what was done; errNotLengthened (joined)
// when the entry was left as it was.
func (s *Store) ensure(ctx context.Context, addr string, e BlockEntry, st entryState, mode enforceMode, down bool) (time.Time, string, error) {
	// before the hold is written an entry's life is not judged on this node's own clock: with
	// no fresh add of this store's to read the monitors' clock from, a node minutes behind them
	// would take a short entry for a whole one (the chaos campaign, seed 20261206); the swap
	// is safe there, and its fresh add reads their clock
	preClaim := mode == swapBare || mode == swapNeedsMark
	probed := false
	if st == inForce && !s.view.monKnown() {
		// nor by a keeper: a restarted agent behind the monitors took an older agent's short
		// entry for a whole one and let it lapse (the campaign again, round 10). An add of the
		// listed entry, which changes nothing, has them name their time.
		until, err := s.add(ctx, addr, false)
		if err != nil {
			return time.Time{}, "", err
		}
		probed = true
		if s.view.monKnown() && s.lengthened(until) {
			return until, "", nil
		}
		if s.view.monKnown() || preClaim {
			st = aging
		}
	}
	blind := preClaim && !s.view.monKnown()
	if st == inForce {
		return e.Until, "", nil
	}
	if st == missing {
		until, err := s.add(ctx, addr, true)
		if err != nil {
			return time.Time{}, "", err
		}
		return until, "added again", nil
	}
	return s.lengthen(ctx, addr, e, mode, down, probed, blind)
}

// lengthen makes an aging or short entry whole again (ensure): a re-add, in case the cluster
// lengthens entries; else, one at a time in this store, removed and added again as mode allows:
// bare before the hold it protects is written, under a cover after.
func (s *Store) lengthen(ctx context.Context, addr string, e BlockEntry, mode enforceMode, down, probed, blind bool) (time.Time, string, error) {
	// a re-add, in case this cluster lengthens entries (none measured does); the probe above
	// was one
	if !probed {
		until, err := s.add(ctx, addr, false)
		if err != nil {
			return time.Time{}, "", err
		}
		if s.lengthened(until) && !blind {
			return until, "added again (the cluster lengthened the entry)", nil
		}
	}
	if mode == swapNeedsMark {
		return e.Until, "", errNeedsMark{addr: addr}
	}
	// one removal at a time in this store: two checks of one agent (the holder's round, the
	// pool sweep) lengthening one entry at once would each remove it, and one would lift its
	// cover while the other's removal is in force
	if err := s.swapTurn(ctx); err != nil {
		return time.Time{}, "", fmt.Errorf("lengthen %s: %w", addr, err)
	}
	defer func() { <-s.swapping }()
	// judged again on a listing read now, with the turn held: the round's listing may have been
	// read while another check of this store's had its cover listed, lifted since (seen in
	// e2e-prod: a bare removal under it left the client uncut for a look), and that check may
	// have lengthened this entry already
	s.view.changed()
	entries, err := s.view.entries(ctx)
	if err != nil {
		return time.Time{}, "", fmt.Errorf("lengthen %s: %w", addr, err)
	}
	if le, ok := exactEntry(entries, addr); ok && s.lengthened(le.Until) {
		return le.Until, "", nil
	}
	if mode == swapBare {
		return s.swap(ctx, addr, "removed and added again, before the hold it protects was written")
	}
	if cover, ok := record.CoveringNode(entries, addr); ok {
		if left := cover.Until.Sub(s.view.monNow()); left < coverMargin {
			return e.Until, "", fmt.Errorf("%w: the entry that covers it, %s, lapses in %s: lengthened at a check after it has", errNotLengthened, cover, left.Round(time.Second))
		}
		return s.swap(ctx, addr, "removed and added again while "+cover.String()+" cut the same client")
	}
	cover, isRange, why := s.coverFor(addr)
	if cover == "" {
		return e.Until, "", fmt.Errorf("%w: %s", errNotLengthened, why)
	}
	if !isRange && !down {
		return e.Until, "", fmt.Errorf("%w: a remove and add would leave the client uncut for a map epoch, and a cover of its whole node would cut a node seen alive (or not watched for a lease yet)", errNotLengthened)
	}
	return s.swapCovered(ctx, addr, cover, isRange)
}

// fenceEntry lists addr for a new fence and returns its expiry as listed and whether this
// project made the entry (the address was not listed just before). An address listed already
// with less life than a fence needs (librbd's lock break lists a client for an hour; an
// operator's or an older agent's entry) is lengthened as mode allows: a fence written before the
// hold it protects (swapBare) is then in force for its whole life from the start.
func (s *Store) fenceEntry(ctx context.Context, addr string, mode enforceMode, down bool) (time.Time, bool, error) {
	entries, err := s.view.entries(ctx)
	if err != nil {
		// not known whether it is listed: added, then judged by the expiry it is listed with
		until, aerr := s.add(ctx, addr, false)
		if aerr != nil {
			return time.Time{}, false, aerr
		}
		if s.lengthened(until) && s.view.monKnown() {
			return until, false, nil
		}
		entries = []BlockEntry{{Addr: record.BareAddr(addr), Until: until}}
	}
	le, st := s.judge(entries, addr, time.Time{})
	until, _, err := s.ensure(ctx, addr, le, st, mode, down)
	if errors.Is(err, errNotLengthened) {
		return le.Until, false, nil // listed, for less than a fence's life: its keepers report it
	}
	if err != nil {
		return time.Time{}, false, err
	}
	return until, st == missing, nil
}

// swapTurn waits for this store's turn to remove an entry and add it again (ensure); the caller
// gives the turn back (<-s.swapping).
func (s *Store) swapTurn(ctx context.Context) error {
	select {
	case s.swapping <- struct{}{}:
		return nil
	default:
	}
	if s.swapWait != nil {
		s.swapWait()
	}
	select {
	case s.swapping <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for another lengthening of this agent's: %w", ctx.Err())
	}
}

// swap removes addr's entry and adds it again whole (two map epochs).
func (s *Store) swap(ctx context.Context, addr, how string) (time.Time, string, error) {
	if err := s.b.Unblocklist(ctx, addr); err != nil {
		s.view.changed()
		return time.Time{}, "", fmt.Errorf("remove %s to add it again for longer: %w", addr, err)
	}
	until, err := s.add(ctx, addr, true)
	if err != nil {
		// off the blocklist now: tried once more at once, else the next check finds it missing
		if until, err = s.add(ctx, addr, true); err != nil {
			return time.Time{}, "", fmt.Errorf("%s was removed to be added again for longer, and the add failed (it is added again at the next check): %w", addr, err)
		}
	}
	return until, how, nil
}

// coverFor is the entry that cuts every client of addr's ip, which this store may list for a
// moment while addr is removed and added again: for a mapping's address its node's ip:0/0; for
// a whole node's ip:0/0 (Ceph keeps one entry per address) the range of that one ip, which
// cuts exactly the same clients (isRange). Never for this node's own ip (its agent's client
// would be cut). "" and why not otherwise.
func (s *Store) coverFor(addr string) (cover string, isRange bool, why string) {
	ip, ok := record.AddrIP(record.BareAddr(addr))
	if !ok {
		return "", false, "its address has no ip a cover could name"
	}
	for _, own := range []string{s.b.OwnAddr(), s.ownNodeAddr()} {
		oip, ok := record.AddrIP(record.BareAddr(own))
		if !ok {
			oip, _ = netip.ParseAddr(own)
		}
		if oip.IsValid() && oip == ip {
			return "", false, "its node's ip is this node's own"
		}
	}
	if record.BareAddr(addr) == record.WholeIP(ip) {
		return netip.PrefixFrom(ip, ip.BitLen()).String(), true, ""
	}
	return record.WholeIP(ip), false, ""
}

// ownNodeAddr is this node's source address toward the monitors ("" when unknown).
func (s *Store) ownNodeAddr() string {
	if s.cfg.Node.Addr == nil {
		return ""
	}
	return s.cfg.Node.Addr()
}

// swapCovered lists cover (see coverFor; not listed before) for coverLife, then removes and
// adds addr again, then removes cover: addr's client is cut all along.
func (s *Store) swapCovered(ctx context.Context, addr, cover string, isRange bool) (time.Time, string, error) {
	// read anew: a cover someone else listed since the round's listing is theirs, and would be
	// removed below with this store's own
	s.view.changed()
	entries, err := s.view.entries(ctx)
	if err != nil {
		return time.Time{}, "", fmt.Errorf("cover %s with %s to add it again for longer: %w", addr, cover, err)
	}
	if c, ok := record.CoveringNode(entries, addr); ok {
		return s.swap(ctx, addr, "removed and added again while "+c.String()+" cut the same client")
	}
	var cu time.Time
	if isRange {
		cu, err = s.b.AddRange(ctx, cover, coverLife)
	} else {
		cu, err = s.b.Blocklist(ctx, cover, coverLife)
	}
	s.view.changed()
	if err != nil {
		return time.Time{}, "", fmt.Errorf("cover %s with %s to add it again for longer: %w", addr, cover, err)
	}
	// the cover must be listed before the entry goes: read back, not judged by clocks
	if entries, err = s.view.entries(ctx); err != nil {
		return time.Time{}, "", fmt.Errorf("cover %s with %s to add it again for longer: %w", addr, cover, err)
	}
	if _, ok := record.CoveringNode(entries, addr); !ok {
		return time.Time{}, "", fmt.Errorf("cover %s with %s to add it again for longer: the cover is not listed (until %s)", addr, cover, stamp(cu))
	}
	how := "removed and added again under a " + coverLife.String() + " entry for its whole node, " + cover + " (the node is not seen alive)"
	if isRange {
		how = "removed and added again under a " + coverLife.String() + " range entry for the same ip, " + cover
	}
	until, how, err := s.swap(ctx, addr, how)
	if err != nil {
		return until, how, err // the cover stays until it lapses: the next check adds addr again under it
	}
	if isRange {
		err = s.b.RemoveRange(ctx, cover)
	} else {
		err = s.b.Unblocklist(ctx, cover)
	}
	s.view.changed() // a listing read meanwhile shows the cover, gone now
	if err != nil {
		return until, how, fmt.Errorf("%s lengthened, but its cover %s could not be removed (it lapses by itself within %s): %w", addr, cover, coverLife, err)
	}
	return until, how, nil
}

// swapBusy says whether m, another call's mark read in img's record, is still honoured, and
// for how long. nil: no mark (what was remembered of img is forgotten).
func (s *Store) swapBusy(img Image, m *SwapMark) (bool, time.Duration) {
	s.swapMu.Lock()
	defer s.swapMu.Unlock()
	if m == nil {
		delete(s.swapSeen, img)
		return false, 0
	}
	now := s.cfg.Mono()
	seen, ok := s.swapSeen[img]
	if !ok || seen.token != m.Token {
		seen = swapSighting{token: m.Token, first: now}
		s.swapSeen[img] = seen
	}
	left := swapMarkLife - (now - seen.first)
	return left > 0, left
}

// dropMark removes this call's mark from img's record if it is still there (best effort: a
// mark left behind lapses after swapMarkLife).
func (s *Store) dropMark(ctx context.Context, img Image, token string) {
	_, _ = s.update(ctx, img, func(cur *Record, _ uint64) (*Record, error) {
		if cur == nil || cur.Swap == nil || cur.Swap.Token != token {
			return nil, nil
		}
		cur.Swap = nil
		return cur, nil
	})
}
