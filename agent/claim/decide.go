package claim

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/claim/record"
)

// acquireInput is everything the acquire decision looks at. It holds no connection and no
// clock: the caller reads the record, the image and the time, and the decision is a pure
// function of them (so it is tested with any clock and any record, without a cluster).
type acquireInput struct {
	Self     string // this node's id
	FSID     string // the cluster's fsid, recorded in the record
	Image    Image
	Access   Access // parsed: rwo, rox or rwx
	ReadOnly bool
	Takeover bool
	// TakeFenced: holders an admin fenced may be taken over (see Request.TakeFenced)
	TakeFenced bool
	// TakeCovered: holders whose mapping someone's blocklist entry already cuts off may be
	// taken over without waiting for their leases (see Request.TakeCovered)
	TakeCovered bool
	// Covered holds, by fenceKey, the blocklist entry that already cuts each holder's mapping
	// off (Covering), as read once before the decision; CoverErr says why it could not be read.
	Covered  map[string]BlockEntry
	CoverErr error
	Info     record.ImageInfo // the image's id and the watchers of its header other than this client
	Now      time.Time        // this node's wall clock: only written into records, never compared
	// Leases is what this node's observer knows of each other holder's lease (by node id),
	// judged on this node's monotonic clock alone. A holder without one counts as live.
	Leases map[string]LeaseView
	// Me is this node's holder entry as it would be written now (hostname, address, version,
	// lease); refresh copies it into a holder.
	Me Holder
	// Fenced holds the holders (fenceKey) that this call already blocklisted: if a write then
	// lost a race to such a holder's own renewal, its mapping is fenced all the same, so the
	// takeover goes on rather than leave a live-looking claim whose device cannot write.
	Fenced map[string]bool
	// listed: the image was among this node's holds before Acquire listed it (Acquire drops
	// only a listing of its own when it sends no claim)
	listed bool
	// Adopt, when set, is a mapping already made on this node outside rbd-owner that this hold
	// takes charge of: its client (a watcher of the image) is explained, and its address and
	// device are recorded in the new hold at once.
	Adopt *Holder
}

// acquirePlan is what the decision wants written: Next, once every holder in Evict has been
// blocklisted (their fences are added to Next by the caller, which does the fencing).
type acquirePlan struct {
	Next   *Record
	Evict  []Holder
	Holder Holder // this node's entry in Next
	Again  bool   // this node already held the image: same epoch, lease renewed
}

// fenceKey names one holder's hold for the Fenced set.
func fenceKey(h Holder) string {
	return h.NodeID + "@" + strconv.FormatUint(h.Epoch, 10) + "@" + h.FenceAddr()
}

// refresh renews h's lease at in.Now and brings its node facts up to date.
func (in acquireInput) refresh(h *Holder) {
	h.RenewedAt = in.Now
	h.LeaseSeconds = in.Me.LeaseSeconds
	h.Incarnation = in.Me.Incarnation
	h.Hostname = in.Me.Hostname
	if in.Me.NodeAddr != "" {
		h.NodeAddr = in.Me.NodeAddr
	}
	h.AgentVersion = in.Me.AgentVersion
	h.BootID = in.Me.BootID
}

// decideAcquire is the ownership decision: who may acquire, when a takeover is allowed and
// whom it fences. cur is the record as read (nil when there is none); it is not modified.
//
//   - this node already holds it: renew (same epoch), unless an admin fenced it or the access
//     differs;
//   - free, or shared (rox/rwx) with the same access: add this node at epoch+1;
//   - held otherwise: refuse with who holds it, unless a takeover was asked for and every
//     holder's lease has expired as this node observed it (its heartbeat unchanged for a whole
//     lease on this node's own clock; no clock is compared with another node's), or this call
//     already fenced it, and it has an address to fence: then evict them all (fenced first by
//     the caller) and add this node at epoch+1;
//   - watchers that no kept holder explains (a mapping made outside rbd-owner): refuse, busy.
func decideAcquire(cur *Record, in acquireInput) (acquirePlan, error) {
	cur = in.current(cur)
	if mine := cur.Holder(in.Self); mine != nil {
		return in.again(cur, mine)
	}
	evict, err := in.evictions(cur)
	if err != nil {
		return acquirePlan{}, err
	}
	// watchers: only the holders we keep may explain them (evicted ones are fenced, and a
	// blocklisted client's watch is dropped by the OSDs)
	kept := cur.Holders
	if evict != nil {
		kept = nil
	}
	gone := evict
	if in.Adopt != nil {
		gone = append(append([]Holder(nil), evict...), *in.Adopt)
	}
	if w := unexplained(withoutAddrsOf(in.Info.Watchers, gone), kept); w != nil {
		return acquirePlan{}, fmt.Errorf("%w: %s has watchers no claim explains: %s (mapped or opened outside rbd-owner?)", ErrBusy, in.Image, strings.Join(w, ", "))
	}
	for _, h := range evict {
		cur.Without(h.NodeID)
	}
	cur.Epoch++
	h := Holder{NodeID: in.Self, ReadOnly: in.ReadOnly, Epoch: cur.Epoch, AcquiredAt: in.Now}
	if in.Adopt != nil {
		h.ClientAddr, h.Device = in.Adopt.ClientAddr, in.Adopt.Device
	}
	in.refresh(&h)
	cur.Holders = append(cur.Holders, h)
	cur.Access = in.Access
	return acquirePlan{Next: cur, Evict: evict, Holder: h}, nil
}

// current is the record the decision works on: a copy of cur (a new one when there is none),
// of this cluster and of the image's id now.
func (in acquireInput) current(cur *Record) *Record {
	if cur == nil {
		cur = &Record{Format: FormatVersion, Ref: in.Image}
	} else {
		cur = cur.Clone()
	}
	if cur.ImageID != "" && cur.ImageID != in.Info.ID {
		// the claim was for an older image of the same name, since deleted (an image with a
		// mapping cannot be removed): its holders are gone with it; the epoch goes on
		cur.Holders, cur.Access = nil, ""
	}
	cur.ClusterFSID, cur.ImageID = in.FSID, in.Info.ID
	return cur
}

// again decides for an image this node holds already (mine, in cur): renew it at the same
// epoch, unless the access differs, an admin fenced it, or watchers remain that no holder
// explains.
func (in acquireInput) again(cur *Record, mine *Holder) (acquirePlan, error) {
	if cur.Access != in.Access {
		return acquirePlan{}, fmt.Errorf("%w: this node already holds %s as %s, not %s", ErrInvalid, in.Image, cur.Access, in.Access)
	}
	if mine.Fenced {
		return acquirePlan{}, &LostError{Image: in.Image, Epoch: mine.Epoch, Record: cur, Why: "this node's hold was fenced by an admin", OwnFenced: true}
	}
	if w := unexplained(in.Info.Watchers, cur.Holders); w != nil {
		return acquirePlan{}, fmt.Errorf("%w: %s has watchers no claim explains: %s (mapped or opened outside rbd-owner?)", ErrBusy, in.Image, strings.Join(w, ", "))
	}
	in.refresh(mine)
	// a claim asked for again is for a mapping still to be made (the agent asks only when
	// it has none of this image): an address recorded for an earlier mapping names a client
	// that is gone, and a takeover would fence that instead of what is mapped next; until
	// the new mapping is recorded, a takeover fences the whole node (found by the model
	// checker: docs/safety.md, F2)
	mine.ClientAddr, mine.Device = "", ""
	return acquirePlan{Next: cur, Holder: *mine, Again: true}, nil
}

// held refuses an image held by others (as cur records them): why as a kind (Block) and as
// facts (reason); what the reader does next is the caller's to say (saga), not this layer's.
func (in acquireInput) held(cur *Record, block Block, node, reason string) error {
	return &HeldError{Image: in.Image, Access: cur.Access, Epoch: cur.Epoch, Holders: cur.Holders, Leases: in.Leases,
		Block: block, BlockedBy: node, Reason: reason, Takeover: in.Takeover, TakeFenced: in.TakeFenced}
}

// evictions are the holders of cur that must go for this node to hold the image: none when
// it is free, or shared with the same rox/rwx access; all of them when this request may take
// each one over (takeable); otherwise the refusal.
func (in acquireInput) evictions(cur *Record) ([]Holder, error) {
	if cur.Free() || (cur.Access == in.Access && in.Access != RWO) {
		return nil, nil
	}
	if !in.Takeover && !in.TakeCovered && !(in.TakeFenced && allFenced(cur.Holders)) {
		return nil, in.held(cur, BlockNoTakeover, cur.Holders[0].NodeID, in.noTakeover())
	}
	for _, h := range cur.Holders {
		if err := in.takeable(cur, h); err != nil {
			return nil, err
		}
	}
	return append([]Holder(nil), cur.Holders...), nil
}

// takeable says whether this request may take holder h's hold over, and if not why: a hold
// blocklisted already (by this call, or by an admin) may go; so may one whose mapping someone's
// entry for its whole node cuts off (the waiver); any other only for a takeover, once its
// lease expired as this node saw it, and with an address to fence that is not that of a node
// seen alive.
func (in acquireInput) takeable(cur *Record, h Holder) error {
	if in.Fenced[fenceKey(h)] || (h.Fenced && (in.TakeFenced || in.Takeover)) {
		return nil // blocklisted already, by this call or by an admin (fenced again by the caller)
	}
	if _, ok := in.Covered[fenceKey(h)]; ok && (in.TakeCovered || in.Takeover) && h.ClientAddr != "" {
		// an entry for its whole node cuts its mapping off already: no lease to wait for;
		// it is fenced again by the caller with this node's own entry for the exact client,
		// which is renewed, since theirs may be lifted at any time (docs/safety.md, F10)
		return nil
	}
	if !in.Takeover {
		switch {
		case in.TakeCovered && h.ClientAddr == "":
			return in.held(cur, BlockNoMappingAddr, h.NodeID, fmt.Sprintf("node %s recorded no mapping address, so its fence would be its whole address, the very entry a node fence uses and lifts: it is not taken over before its lease expires, whatever the blocklist shows%s", h.NodeID, in.coverNote()))
		case in.TakeCovered:
			return in.held(cur, BlockNotCovered, h.NodeID, fmt.Sprintf("node %s's mapping (%s) is on no blocklist entry for its whole node (ip:0/0 or a range)%s", h.NodeID, h.ClientAddr, in.coverNote()))
		}
		return in.held(cur, BlockNoTakeover, h.NodeID, in.noTakeover())
	}
	lv, ok := in.Leases[h.NodeID]
	if !ok {
		return in.held(cur, BlockNoLeaseLook, h.NodeID, fmt.Sprintf("takeover refused: this node has no look at node %s's lease yet (a takeover needs a whole lease of it unchanged on this node's clock): retry", h.NodeID))
	}
	if !lv.Expired {
		// the holder's entry says when a takeover is possible (HeldError.Error): once
		return in.held(cur, BlockLeaseLive, h.NodeID, fmt.Sprintf("takeover refused while node %s's lease is live as far as this node has seen: retry then", h.NodeID))
	}
	if h.FenceAddr() == "" {
		return in.held(cur, BlockNoFenceAddr, h.NodeID, fmt.Sprintf("takeover refused: node %s recorded no address to fence", h.NodeID))
	}
	if h.ClientAddr == "" && lv.Moved {
		// no mapping address yet: the fence would be the holder's whole address, every
		// client of that host on this cluster, its agent's too; never that of a node
		// seen alive within a lease, whatever this one hold's lease says
		return in.held(cur, BlockAlive, h.NodeID, fmt.Sprintf("takeover refused: node %s recorded no mapping address, so its fence would be its whole address %s, and its heartbeat changed %s ago on this node's clock: it is alive; retry once its mapping is recorded or it stops",
			h.NodeID, h.FenceAddr(), record.CeilSeconds(lv.MovedAgo)))
	}
	return nil
}

// needsCoverage says whether the decision on cur may turn on the blocklist: the request may take
// covered holds over, and some holder of a conflicting hold is neither fenced already nor
// (for a takeover) past its lease.
func (in acquireInput) needsCoverage(cur *Record) bool {
	if cur.Free() || !(in.TakeCovered || in.Takeover) || (cur.Access == in.Access && in.Access != RWO) || cur.Holder(in.Self) != nil {
		return false
	}
	if cur.ImageID != "" && cur.ImageID != in.Info.ID {
		return false
	}
	for _, h := range cur.Holders {
		if h.Fenced || in.Fenced[fenceKey(h)] {
			continue
		}
		if lv, ok := in.Leases[h.NodeID]; in.Takeover && ok && lv.Expired {
			continue
		}
		return true
	}
	return false
}

// noTakeover is the fact behind BlockNoTakeover: what this request may take over (not said
// in HeldError.Error: the caller says what to do instead).
func (in acquireInput) noTakeover() string {
	if in.TakeFenced {
		return "the request takes over only holds an admin fenced"
	}
	return "the request takes no hold over"
}

// coverNote says why the blocklist could not be read, when it could not.
func (in acquireInput) coverNote() string {
	if in.CoverErr == nil {
		return ""
	}
	return " (the blocklist could not be read: " + in.CoverErr.Error() + ")"
}

// allFenced says whether every holder was fenced by an admin.
func allFenced(hs []Holder) bool {
	for _, h := range hs {
		if !h.Fenced {
			return false
		}
	}
	return len(hs) > 0
}

// decideMine finds node's live holder entry at epoch in cur, or explains why there is none
// (the decision behind Renew and SetMapping: only the holder at that epoch may write).
func decideMine(img Image, cur *Record, node string, epoch uint64) (*Holder, error) {
	if cur == nil {
		return nil, &LostError{Image: img, Epoch: epoch, Why: "the claim record is gone"}
	}
	h := cur.Holder(node)
	switch {
	case h == nil:
		why := "this node no longer holds it"
		if len(cur.Holders) > 0 {
			why = fmt.Sprintf("node %s holds it now at epoch %d", cur.Holders[0].NodeID, cur.Holders[0].Epoch)
		}
		return nil, &LostError{Image: img, Epoch: epoch, Record: cur, Why: why}
	case h.Epoch != epoch:
		return nil, &LostError{Image: img, Epoch: epoch, Record: cur, Why: fmt.Sprintf("this node holds it at epoch %d now", h.Epoch)}
	case h.Fenced:
		return nil, &LostError{Image: img, Epoch: epoch, Record: cur, Why: "an admin fenced this node's mapping"}
	}
	return h, nil
}

// unexplained returns the watchers that no holder's mapping accounts for. A holder that has
// not recorded its mapping address yet (between claim and map) may account for one watcher.
func unexplained(watchers []string, holders []Holder) []string {
	known := map[string]bool{}
	pending := 0
	for _, h := range holders {
		if h.ClientAddr != "" {
			known[h.ClientAddr] = true
		} else {
			pending++
		}
	}
	var out []string
	for _, w := range watchers {
		if !known[w] {
			out = append(out, w)
		}
	}
	if len(out) <= pending {
		return nil
	}
	return out
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
