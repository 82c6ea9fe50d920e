package record

import (
	"fmt"
	"strings"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/fault"
)

// Errors callers branch on with errors.Is; each has its kind in the agent's one classification
// (package fault). cephconn.ErrUnavailable and cephconn.ErrPermission (a
// *cephconn.PermissionError naming the missing cap) come through as well.
var (
	// ErrClaimedElsewhere: another node holds the image (a *HeldError says who).
	ErrClaimedElsewhere = fault.ErrClaimedElsewhere
	// ErrFenced: this node's hold is gone or was fenced (taken over, force-released, blocklisted).
	ErrFenced = fault.New(fault.Fenced, "claim lost")
	// ErrNotFound: the image (or pool, or namespace) does not exist.
	ErrNotFound = fault.ErrNotFound
	// ErrNoClaim: the image has no claim record.
	ErrNoClaim = fault.New(fault.NotFound, "no claim")
	// ErrBusy: the image has watchers that no claim explains (mapped or opened behind the
	// agent's back), or a change could not be written after many concurrent retries.
	ErrBusy = fault.ErrBusy
	// ErrInvalid: the request is malformed or conflicts with what this node already holds.
	ErrInvalid = fault.ErrInvalid
)

// HeldError says who holds an image that was asked for.
type HeldError struct {
	Image   Image
	Access  Access
	Epoch   uint64
	Holders []Holder
	// Leases is what this node knows of each holder's lease (by node id), judged on this
	// node's own clock.
	Leases map[string]LeaseView
	// Block is why the request may not have the image, as a kind a caller branches on (the
	// next step is the caller's to say: it knows who asked, and under which policy);
	// BlockedBy is the holder it is about.
	Block     Block
	BlockedBy string
	// Reason is Block in facts, for people (Error says it, but for BlockNoTakeover, where the
	// holders are the whole story).
	Reason string
	// Takeover is set when the request could take the image over once the leases expire (it
	// asked for a takeover, or its policy allows one): only then is a retry time given.
	Takeover bool
	// TakeFenced: the request would have taken over holds an admin fenced.
	TakeFenced bool
}

// Block is why a request may not have an image others hold.
type Block int

const (
	// BlockNoTakeover means the request takes no live hold over (only fenced ones, or none).
	BlockNoTakeover Block = iota
	// BlockNotCovered means it takes over holds the blocklist cuts off, and this one's mapping is
	// on no entry for its whole node.
	BlockNotCovered
	// BlockNoMappingAddr means it takes over holds the blocklist cuts off, and this one recorded no
	// mapping address (its fence would be the node's whole address).
	BlockNoMappingAddr
	// BlockNoLeaseLook means a takeover, and this node has not watched the holder's lease yet.
	BlockNoLeaseLook
	// BlockLeaseLive means a takeover, and the holder's lease is live as this node saw it.
	BlockLeaseLive
	// BlockNoFenceAddr means a takeover, and the holder recorded no address to fence.
	BlockNoFenceAddr
	// BlockAlive means a takeover, the holder recorded no mapping address and its heartbeat moved
	// within a lease (a whole-node fence of a node seen alive is never made).
	BlockAlive
)

// String names the kind for programs (the API's refusal.block).
func (b Block) String() string {
	switch b {
	case BlockNoTakeover:
		return "no_takeover"
	case BlockNotCovered:
		return "not_covered"
	case BlockNoMappingAddr:
		return "no_mapping_addr"
	case BlockNoLeaseLook:
		return "no_lease_look"
	case BlockLeaseLive:
		return "lease_live"
	case BlockNoFenceAddr:
		return "no_fence_addr"
	case BlockAlive:
		return "alive"
	}
	return "unknown"
}

// RetryAfter is when a takeover could be tried again: once every live holder's watch has run
// a whole lease without a renewal (0 when no holder is being watched).
func (e *HeldError) RetryAfter() time.Duration {
	var d time.Duration
	if !e.Takeover {
		return 0
	}
	for _, h := range e.Holders {
		if v, ok := e.Leases[h.NodeID]; ok && !v.Expired {
			d = max(d, v.RetryAfter)
		}
	}
	return d
}

// Details fills in the API's error with the refusal's facts: the image, every holder as this
// node sees its lease (the first as owner), why (Block, and Reason where Error says it) and when
// a retry may take it over. What to do next is the caller's to add (saga.Refusal).
func (e *HeldError) Details(out *api.Error) {
	out.Image = e.Image.String()
	out.Holders = nil
	for _, o := range e.Holders {
		lv := e.Leases[o.NodeID]
		out.Holders = append(out.Holders, api.Owner{NodeID: o.NodeID, Hostname: o.Hostname, NodeAddr: o.NodeAddr, ClientAddr: o.ClientAddr,
			Epoch: o.Epoch, AcquiredAt: o.AcquiredAt, RenewedAt: o.RenewedAt, LeaseAge: lv.Unchanged.Seconds(), Expired: lv.Expired})
	}
	if len(out.Holders) > 0 {
		out.Owner = &out.Holders[0]
	}
	out.Block = e.Block.String()
	if e.Block != BlockNoTakeover {
		out.Reason = e.Reason
	}
	if d := e.RetryAfter(); d > 0 {
		out.RetryAfterSeconds = int64((d + time.Second - 1) / time.Second)
	}
}

// Is makes errors.Is(err, ErrClaimedElsewhere) true.
func (e *HeldError) Is(target error) bool { return target == ErrClaimedElsewhere }

// Kind is the fault class the API answers with.
func (e *HeldError) Kind() fault.Kind { return fault.ClaimedElsewhere }

// Owner is the first holder (the only one for rwo).
func (e *HeldError) Owner() Holder {
	if len(e.Holders) == 0 {
		return Holder{}
	}
	return e.Holders[0]
}

func (e *HeldError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s is held (%s) by ", e.Image, e.Access)
	for i, h := range e.Holders {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "node %s (host %s, addr %s) at epoch %d since %s",
			h.NodeID, OrDash(h.Hostname), OrDash(h.NodeAddr), h.Epoch, h.AcquiredAt.UTC().Format(time.RFC3339))
		switch v, ok := e.Leases[h.NodeID]; {
		case !ok:
		case v.Expired:
			fmt.Fprintf(&b, " (lease expired: its heartbeat has not changed for %s on this node's clock)", v.Unchanged.Round(time.Second))
		case !e.Takeover:
			b.WriteString(" (lease live as far as this node has seen)")
		default:
			fmt.Fprintf(&b, " (live: watching node %s's lease; a takeover is possible in %s unless it renews)", h.NodeID, CeilSeconds(v.RetryAfter))
		}
	}
	if e.Reason != "" && e.Block != BlockNoTakeover {
		b.WriteString("; ")
		b.WriteString(e.Reason)
	}
	return b.String()
}

// NotFoundError says once that an image (or its pool) does not exist: "image rbd/x not found
// (rbd: ret=-2)", the cluster's code in brackets, not its whole text after the agent's.
type NotFoundError struct {
	What string // "image rbd/x", "pool rbd"
	Code string // the cluster's answer in short ("rbd: ret=-2"); "" when there is none
	Err  error  // the cluster's error (nil in memory)
}

func (e *NotFoundError) Error() string {
	if e.Code == "" {
		return e.What + " not found"
	}
	return e.What + " not found (" + e.Code + ")"
}
func (e *NotFoundError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrNotFound) true.
func (e *NotFoundError) Is(target error) bool { return target == ErrNotFound }

// Kind is the fault class the API answers with.
func (e *NotFoundError) Kind() fault.Kind { return fault.NotFound }

// LostError says that this node no longer holds an image at the epoch it had.
type LostError struct {
	Image  Image
	Epoch  uint64
	Record *Record // the record as found (nil if it is gone)
	Why    string
	// OwnFenced: a map found this node's own hold fenced by an admin (it is released before
	// the image is mapped here again: the caller says how).
	OwnFenced bool
}

// Is makes errors.Is(err, ErrFenced) true.
func (e *LostError) Is(target error) bool { return target == ErrFenced }

// Kind is the fault class the API answers with.
func (e *LostError) Kind() fault.Kind { return fault.Fenced }

func (e *LostError) Error() string {
	return fmt.Sprintf("claim on %s at epoch %d is lost: %s", e.Image, e.Epoch, e.Why)
}

// OrDash is s, or "-" for nothing.
func OrDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// CeilSeconds rounds d up to whole seconds (a retry sooner than that would be refused again).
func CeilSeconds(d time.Duration) time.Duration {
	return ((d + time.Second - 1) / time.Second) * time.Second
}

// The admin calls' refusals, as facts: what a caller does next is said by the admin layer
// (agent/admin, nextStep), not here.

// NotFencedError is a forced release refused because a holder's hold is not fenced (ErrInvalid).
type NotFencedError struct {
	Image Image
	Node  string
}

func (e *NotFencedError) Error() string {
	return fmt.Sprintf("%v: node %s's hold on %s was not fenced", ErrInvalid, e.Node, e.Image)
}

func (e *NotFencedError) Unwrap() error { return ErrInvalid }

// FencedElsewhereError is an unfence asked of a node whose agent fenced none of the image's
// mappings made outside rbd-owner; Node's did (ErrNoClaim).
type FencedElsewhereError struct {
	Image Image
	Node  string
}

func (e *FencedElsewhereError) Error() string {
	return fmt.Sprintf("%v: its fenced mappings are on node %s", ErrNoClaim, e.Node)
}

func (e *FencedElsewhereError) Unwrap() error { return ErrNoClaim }

// StillMappedError is an unfence refused because a fenced mapping made outside rbd-owner is still
// mapped on this node (ErrBusy).
type StillMappedError struct {
	Image  Image
	Device string
	Addr   string
}

func (e *StillMappedError) Error() string {
	return fmt.Sprintf("%v: %s (client %s) is still mapped on this node", ErrBusy, e.Device, e.Addr)
}

func (e *StillMappedError) Unwrap() error { return ErrBusy }

// UnlistedHoldsError is a place where a node's heartbeat does not list its holds (written by an
// agent from before the list), so they cannot be found through it.
type UnlistedHoldsError struct {
	Node         string
	Place        string // POOL[/NAMESPACE]
	Pool         string
	AgentVersion string
}

func (e *UnlistedHoldsError) Error() string {
	return fmt.Sprintf("holds of node %s in %s: its heartbeat was written by an agent (%s) that does not list its holds", e.Node, e.Place, e.AgentVersion)
}
