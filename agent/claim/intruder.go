package claim

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/claim/record"
)

// Unmanaged is a krbd mapping this node's agent did not make, as the kernel describes it.
type Unmanaged struct {
	Image      Image  // the head image (a snapshot mapping's image)
	ImageID    string // the kernel's image_id ("" when unknown)
	ClientAddr string // its kernel client's address
	Device     string
	ReadOnly   bool // the kernel refuses its writes (read_only, or a snapshot)
	// OwnClient: the mapping has a kernel client of its own (mapped with noshare and shared
	// by no other device), so it can be fenced, and later taken over, alone.
	OwnClient bool
	// SharedWith names the other devices on this node that use the same kernel client.
	SharedWith []string
}

// UnmanagedPolicy is what may be done with an unmanaged mapping (config key `unmanaged`).
type UnmanagedPolicy string

// The policies.
const (
	FenceIfClaimed UnmanagedPolicy = "fence-if-claimed"
	AdoptOrFence   UnmanagedPolicy = "adopt-or-fence"
	ReportOnly     UnmanagedPolicy = "report"
)

// Action is the verdict on an unmanaged mapping.
type Action int

// The actions.
const (
	// Report: leave it mapped and say why (free image, read-only, rwx, policy).
	Report Action = iota
	// FenceIntruder: blocklist its client: someone else holds the image.
	FenceIntruder
	// AdoptOwn: it is the mapping this node's own claim records (an agent that lost its
	// state); manage it again under that claim.
	AdoptOwn
	// Adopt: claim the free image for this node with this mapping.
	Adopt
)

func (a Action) String() string {
	switch a {
	case FenceIntruder:
		return "fence"
	case AdoptOwn:
		return "adopt-own"
	case Adopt:
		return "adopt"
	}
	return "report"
}

// Verdict is what decideUnmanaged found.
type Verdict struct {
	Action Action
	Why    string
	// Holders are the holds the mapping collides with (FenceIntruder, and Report when held).
	Holders []Holder
	// Mine is this node's own holder entry (AdoptOwn).
	Mine Holder
	// Unfenceable (with Report): the mapping can write to an image held elsewhere, but its
	// kernel client is not its own (no noshare), so a fence would cut every other mapping that
	// client serves on a live node: reported at error priority, never fenced automatically.
	Unfenceable bool
}

// unfenceableRemedy is what to do about a writable mapping without noshare of an image held
// elsewhere.
const unfenceableRemedy = "it was mapped without noshare, so its kernel client may serve every mapping of this node with the same options, and a fence would cut them all: NOT fenced, TWO WRITERS ARE POSSIBLE. Unmap it now; map through rbd-owner (the drop-in rbd first on ceph-csi's PATH), or add noshare to the StorageClass's mapOptions so that such a mapping is fenced alone; an admin who accepts cutting that client's every mapping may blocklist its address"

// holdersText names holders as "node-a@7,node-b@8".
func holdersText(hs []Holder) string {
	parts := make([]string, len(hs))
	for i, h := range hs {
		parts[i] = fmt.Sprintf("%s@%d", h.NodeID, h.Epoch)
	}
	return strings.Join(parts, ",")
}

// decideUnmanaged judges a mapping this node's agent did not make by the image's claim: a pure
// function of the record as read (nil: none), so that every case is tested without a cluster.
//
//   - this node's own hold records this very client: adopt it back (unless an admin fenced it);
//   - anyone else holds the image, or this node holds it for another device: fence it, unless
//     it cannot write (read-only), the image is shared rwx (several writers are allowed), the
//     policy only reports, or its kernel client is not its own (no noshare: a fence would cut
//     every mapping that client serves, on a live node; reported at error priority);
//   - free: adopt it under adopt-or-fence if it can write and has a client of its own;
//     otherwise report it.
func decideUnmanaged(cur *Record, self string, u Unmanaged, policy UnmanagedPolicy) Verdict {
	if cur != nil && cur.ImageID != "" && u.ImageID != "" && cur.ImageID != u.ImageID {
		cur = nil // the claim was for an older image of the same name: nobody holds this one
	}
	if h := cur.Holder(self); h != nil && h.ClientAddr != "" && h.ClientAddr == u.ClientAddr {
		if h.Fenced {
			return Verdict{Action: Report, Holders: []Holder{*h}, Why: "it is this node's own mapping, but an admin fenced it; unmap it"}
		}
		return Verdict{Action: AdoptOwn, Mine: *h, Why: fmt.Sprintf("this node's own claim (epoch %d) records this mapping", h.Epoch)}
	}
	if h := cur.Holder(self); h != nil && h.ClientAddr == "" && !h.Fenced && u.OwnClient && !u.ReadOnly {
		// this node's hold records no mapping yet: a map interrupted after the kernel made the
		// device and before the claim named its client, whose state was then lost. It is this
		// node's: adopted back, and its client recorded (so that a takeover fences it alone)
		return Verdict{Action: AdoptOwn, Mine: *h, Why: fmt.Sprintf("this node's own claim (epoch %d), which names no mapping yet, is this one's (a map interrupted before it recorded its device)", h.Epoch)}
	}
	var others []Holder
	if cur != nil {
		for _, h := range cur.Holders {
			if h.NodeID != self || h.ClientAddr != u.ClientAddr {
				others = append(others, h)
			}
		}
	}
	if len(others) > 0 {
		held := fmt.Sprintf("%s is held %s by %s", u.Image, cur.Access, holdersText(others))
		switch {
		case u.ReadOnly:
			return Verdict{Action: Report, Holders: others, Why: held + "; this mapping is read-only, so it cannot write: left alone"}
		case cur.Access == RWX:
			return Verdict{Action: Report, Holders: others, Why: held + ", which allows several writers: not fenced"}
		case policy == ReportOnly:
			return Verdict{Action: Report, Holders: others, Why: held + "; the unmanaged policy is report: not fenced"}
		case !u.OwnClient:
			return Verdict{Action: Report, Holders: others, Unfenceable: true, Why: held + "; " + unfenceableRemedy}
		}
		return Verdict{Action: FenceIntruder, Holders: others, Why: held}
	}
	switch {
	case policy != AdoptOrFence:
		return Verdict{Action: Report, Why: fmt.Sprintf("%s is not claimed by any node; not adopted (unmanaged policy %s)", u.Image, policy)}
	case u.ReadOnly:
		return Verdict{Action: Report, Why: fmt.Sprintf("%s is not claimed; this mapping is read-only: not adopted", u.Image)}
	case !u.OwnClient:
		why := "it was mapped without noshare"
		if len(u.SharedWith) > 0 {
			why = "its kernel client also serves " + strings.Join(u.SharedWith, ", ")
		}
		return Verdict{Action: Report, Why: fmt.Sprintf("%s is not claimed, but %s: it could not be fenced alone, so it is not adopted (map with -o noshare, or through rbd-owner)", u.Image, why)}
	}
	return Verdict{Action: Adopt, Why: fmt.Sprintf("%s is not claimed by any node", u.Image)}
}

// UnmanagedResult is the outcome of Store.Unmanaged. With an error it is nil when the claim
// could not be read, and holds the verdict when acting on it failed (Intruder set when the
// fence stands but could not be recorded).
type UnmanagedResult struct {
	Verdict
	Record   *Record   // the record after the call (nil when there is none)
	Intruder *Intruder // set when it was fenced
	Holder   Holder    // this node's entry when adopted (Adopt, AdoptOwn)
}

// Unmanaged judges a mapping this node's agent did not make and acts on it, in one
// read-decide-write of the image's claim: it fences it (blocklists its client, then records
// the intruder in the claim) when the image is held elsewhere, or claims a free image for this
// node with this mapping already recorded (adopt-or-fence). Nothing is written for a report or
// for this node's own mapping.
func (s *Store) Unmanaged(ctx context.Context, u Unmanaged, policy UnmanagedPolicy) (*UnmanagedResult, error) {
	if err := record.ValidateImage(u.Image); err != nil {
		return nil, fmt.Errorf("unmanaged mapping of %s: %w", u.Image, err)
	}
	if u.ClientAddr == "" {
		return nil, fmt.Errorf("unmanaged mapping of %s: %w: its client address is unknown (the kernel has no client_addr)", u.Image, ErrInvalid)
	}
	c := &unmanagedCall{s: s, u: u, policy: policy, renewed: map[string]time.Time{}}
	rec, err := s.update(ctx, u.Image, func(cur *Record, _ uint64) (*Record, error) {
		return c.decide(ctx, cur)
	})
	if err != nil {
		if c.fenced != nil {
			// the blocklist stands even though the record could not say so: report the fence
			return &UnmanagedResult{Verdict: c.res.Verdict, Intruder: c.fenced},
				fmt.Errorf("unmanaged mapping %s of %s: fenced, but recording it in the claim failed: %w", u.Device, u.Image, err)
		}
		err = fmt.Errorf("unmanaged mapping %s of %s: %w", u.Device, u.Image, err)
		if c.decided {
			// the claim was read and judged, acting on it failed (a fence that could not be
			// made): the verdict says what the mapping is, the error what is not done
			return &UnmanagedResult{Verdict: c.res.Verdict}, err
		}
		return nil, err
	}
	c.res.Record = rec
	return &c.res, nil
}

// unmanagedCall is one Unmanaged call, across the attempts of its compare-and-set.
type unmanagedCall struct {
	s       *Store
	u       Unmanaged
	policy  UnmanagedPolicy
	res     UnmanagedResult
	decided bool                 // the claim was read and judged
	fenced  *Intruder            // set once its client is blocklisted
	info    *record.ImageInfo    // read once, only if an adoption is considered
	renewed map[string]time.Time // the record's live fences blocklisted again before an adoption
}

// decide judges the mapping by the claim as read (cur) and acts on the verdict: the record to
// write, or nil when nothing is written (a report, this node's own mapping recorded already).
func (c *unmanagedCall) decide(ctx context.Context, cur *Record) (*Record, error) {
	c.res = UnmanagedResult{Verdict: decideUnmanaged(cur, c.s.cfg.Node.ID, c.u, c.policy)}
	c.decided = true
	switch c.res.Action {
	case FenceIntruder:
		return c.fence(ctx, cur)
	case Adopt:
		return c.adopt(ctx, cur)
	case AdoptOwn:
		return c.adoptOwn(cur), nil
	}
	return nil, nil
}

// fence blocklists the mapping's client (once, whatever the attempts) and records it in cur
// as an intruder.
func (c *unmanagedCall) fence(ctx context.Context, cur *Record) (*Record, error) {
	s, u := c.s, c.u
	if c.fenced == nil { // blocklisting is idempotent, but once is enough
		// a holder may write now: a short entry is not removed to lengthen it (its keepers
		// report it), and this node is alive, so no cover of its own is listed
		until, _, err := s.fenceEntry(ctx, u.ClientAddr, swapCovered, false)
		if err != nil {
			return nil, fmt.Errorf("fence %s (%s): %w", u.Device, u.ClientAddr, err)
		}
		c.fenced = &Intruder{NodeID: s.cfg.Node.ID, Device: u.Device, Addr: u.ClientAddr, SharedClient: !u.OwnClient,
			At: s.cfg.Now().UTC(), Expires: until.UTC(), BootID: s.cfg.Node.BootID, Incarnation: s.cfg.Node.Incarnation}
		s.book.markNow(keepKey(u.Image, entry{intruder: true, node: s.cfg.Node.ID, addr: u.ClientAddr}))
	}
	in := *c.fenced
	in.Holders = holdersText(c.res.Holders)
	c.res.Intruder = &in
	cur.AddIntruder(in)
	return cur, nil
}

// adopt claims the free image for this node with the mapping recorded in its hold, as
// Acquire would (the record's due fences renewed, this node's heartbeat first); a decision
// that refuses it (busy, or claimed meanwhile) turns the verdict into a report.
func (c *unmanagedCall) adopt(ctx context.Context, cur *Record) (*Record, error) {
	s, u := c.s, c.u
	if c.info == nil {
		i, err := s.inspectImage(ctx, u.Image)
		if err != nil {
			return nil, err
		}
		c.info = &i
	}
	plan, err := decideAcquire(cur, acquireInput{Self: s.cfg.Node.ID, FSID: s.fsid, Image: u.Image, Access: RWO,
		Info: *c.info, Now: s.cfg.Now().UTC(), Me: s.me(), Adopt: &Holder{ClientAddr: u.ClientAddr, Device: u.Device}})
	if err != nil {
		if errors.Is(err, ErrBusy) || errors.Is(err, ErrClaimedElsewhere) {
			c.res.Action, c.res.Why = Report, "not adopted: "+err.Error()
			return nil, nil
		}
		return nil, err
	}
	// the mapping exists and may write: a short entry is lengthened only under a cover
	if err := s.renewDue(ctx, u.Image, plan.Next, c.renewed, swapCovered); err != nil {
		return nil, fmt.Errorf("not adopted: %w", err)
	}
	// as in Acquire: this node's liveness, listing the image among its holds, before the
	// claim becomes visible
	s.NoteHold(u.Image, true)
	if err := s.Heartbeat(ctx, u.Image.Pool, u.Image.Namespace); err != nil {
		return nil, fmt.Errorf("not adopted, since this node's liveness could not be recorded first: %w", err)
	}
	c.res.Holder = plan.Holder
	return plan.Next, nil
}

// adoptOwn takes this node's own hold back with the mapping: when the hold records no mapping
// yet, it records this one (the record to write); nil when there is nothing to write.
func (c *unmanagedCall) adoptOwn(cur *Record) *Record {
	c.res.Holder = c.res.Mine
	if c.res.Mine.ClientAddr != "" {
		return nil
	}
	for i := range cur.Holders {
		if cur.Holders[i].NodeID == c.s.cfg.Node.ID && cur.Holders[i].Epoch == c.res.Mine.Epoch {
			cur.Holders[i].ClientAddr, cur.Holders[i].Device = c.u.ClientAddr, c.u.Device
			c.res.Holder = cur.Holders[i]
			return cur
		}
	}
	return nil
}

// Unfence lifts the fences of this node's intruders on an image whose client address gone
// says is no longer mapped here: each one's blocklist entry is removed, then it is dropped
// from the record. An intruder still mapped is refused (ErrBusy), naming its device; intruders
// of other nodes are left for those nodes' agents. It returns the intruders unfenced.
func (s *Store) Unfence(ctx context.Context, img Image, gone func(addr string) bool) ([]Intruder, error) {
	rec, _, err := s.read(ctx, img)
	if err != nil {
		return nil, fmt.Errorf("unfence %s: %w", img, err)
	}
	var mine, elsewhere []Intruder
	if rec != nil {
		for _, in := range rec.Intruders {
			if in.NodeID == s.cfg.Node.ID {
				mine = append(mine, in)
			} else {
				elsewhere = append(elsewhere, in)
			}
		}
	}
	if len(mine) == 0 {
		if len(elsewhere) > 0 {
			return nil, fmt.Errorf("unfence %s: %w", img, &record.FencedElsewhereError{Image: img, Node: elsewhere[0].NodeID})
		}
		return nil, fmt.Errorf("unfence %s: %w: no fenced mapping is recorded for it", img, ErrNoClaim)
	}
	for _, in := range mine {
		if !gone(in.Addr) {
			return nil, fmt.Errorf("unfence %s: %w", img, &record.StillMappedError{Image: img, Device: in.Device, Addr: in.Addr})
		}
	}
	// the record first, the blocklist after: a keeper that read the record before would only
	// put an entry back for a client that no longer exists; the other order would let it
	// renew an entry the record still lists after its removal
	_, err = s.update(ctx, img, func(cur *Record, _ uint64) (*Record, error) {
		if cur == nil {
			return nil, nil
		}
		kept := cur.Intruders[:0]
		for _, in := range cur.Intruders {
			if !(in.NodeID == s.cfg.Node.ID && gone(in.Addr)) {
				kept = append(kept, in)
			}
		}
		cur.Intruders = kept
		return cur, nil
	})
	if err != nil {
		return nil, fmt.Errorf("unfence %s: %w", img, err)
	}
	for _, in := range mine {
		if err := s.b.Unblocklist(ctx, in.Addr); err != nil {
			return nil, fmt.Errorf("unfence %s: its record no longer lists the fenced mappings, but removing the blocklist entry of %s failed (it expires by itself; run unfence again to remove it now): %w", img, in.Addr, err)
		}
	}
	return mine, nil
}
