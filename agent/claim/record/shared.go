package record

import (
	"strings"
	"time"
)

// HeartbeatPrefix starts the name of every heartbeat object; the node id follows it.
const HeartbeatPrefix = "rbd-owner.node."

// HeartbeatObject is the name of node's heartbeat object.
func HeartbeatObject(node string) string { return HeartbeatPrefix + node }

// LeaseView is what an observer knows of one holder's lease.
type LeaseView struct {
	// Expired: the holder's liveness has not changed for a whole lease on this node's clock,
	// watched on this very hold and looked at again at least once a lease.
	Expired bool
	// Unchanged is for how long this node has seen the same mark on this hold.
	Unchanged time.Duration
	// RetryAfter is how long until Expired, unless the holder renews (0 when expired).
	RetryAfter time.Duration
	// FirstLook is true when this look started the watch: the mark or the hold was new to this
	// node, or its last look was more than a lease ago.
	FirstLook bool
	// Changed is true when the holder's heartbeat in this place differs from the one this node
	// saw at its last look there, less than a lease ago: the holder renewed since.
	Changed bool
	// Moved is true when this node has seen the holder's heartbeat change, in any pool and
	// namespace it watches, within the last lease on its own clock (MovedAgo ago): the node
	// is alive, whatever this one hold's lease says.
	Moved    bool
	MovedAgo time.Duration
}

// PoolNS names a pool and namespace as one place ("pool" or "pool/namespace").
func PoolNS(loc Image) string {
	if loc.Namespace == "" {
		return loc.Pool
	}
	return loc.Pool + "/" + loc.Namespace
}

// Intruder is a mapping made outside rbd-owner that its node's agent fenced because the image
// was held by another node (or by another device of that node). It is kept in the image's
// claim record, so that the cluster-wide view shows it, until an admin unfences it.
type Intruder struct {
	NodeID string `json:"node_id"` // where it was mapped
	Device string `json:"device"`
	Addr   string `json:"addr"` // its kernel client's address: what was blocklisted
	// SharedClient: its kernel client served other mappings too (mapped without noshare), and
	// they were fenced with it.
	SharedClient bool      `json:"shared_client,omitempty"`
	Holders      string    `json:"holders"` // who held the image then, "node@epoch,…"
	At           time.Time `json:"at"`
	Expires      time.Time `json:"expires"`
	// BootID is its node's boot id when it was fenced, Incarnation its agent's: a reboot since
	// ends the mapping, and then its record (see KeepFences).
	BootID      string `json:"boot_id,omitempty"`
	Incarnation string `json:"incarnation,omitempty"`
}

// AddIntruder records in, replacing an entry for the same address. Intruders are never
// trimmed: each one's blocklist entry is kept alive while it is listed (KeepFences), until its
// node's agent unfences it or its node reboots.
func (r *Record) AddIntruder(in Intruder) {
	kept := r.Intruders[:0]
	for _, o := range r.Intruders {
		if o.Addr != in.Addr {
			kept = append(kept, o)
		}
	}
	r.Intruders = append(kept, in)
}

// SwapMark is the note of a claimer that is removing and adding again a fence's entry before
// its claim (see above).
type SwapMark struct {
	Node        string    `json:"node"`
	Incarnation string    `json:"incarnation,omitempty"`
	Token       string    `json:"token"` // the Acquire call's, so that its own attempts know it
	Addrs       []string  `json:"addrs"` // the entries it removes and adds again
	At          time.Time `json:"at"`    // on the marker's clock (for people; never judged)
}

// SwapFormat is the claim record's format while it carries a SwapMark (format 3 otherwise):
// agents that read only formats 1 to 3 refuse it, rather than claim beside the swap.
const SwapFormat = FormatVersion + 1

// ImageInfo is what the claim check needs to know about the image itself.
type ImageInfo struct {
	ID       string
	Watchers []string // client addresses watching the image header
}

// BareAddr drops an address's type ("v1:", "v2:", "any:"), which the blocklist may show.
func BareAddr(a string) string {
	for _, p := range []string{"any:", "v1:", "v2:"} {
		a = strings.TrimPrefix(a, p)
	}
	return a
}

// IndexObject is the name of the claim index of a pool and namespace.
const IndexObject = "rbd-owner.claims"

// NoticePrefix starts the name of every notice object: a node's id follows it (see Notice).
const NoticePrefix = "rbd-owner.notice."

// ObjectKind names what an object of rbd-owner (or of RBD) is, from its name: "claim",
// "heartbeat", "index", "notice", "image" (rbd_id, rbd_header) or "other". Ops are counted by it.
func ObjectKind(oid string) string {
	switch {
	case strings.HasPrefix(oid, ObjectPrefix):
		return "claim"
	case strings.HasPrefix(oid, HeartbeatPrefix):
		return "heartbeat"
	case oid == IndexObject:
		return "index"
	case strings.HasPrefix(oid, NoticePrefix):
		return "notice"
	case strings.HasPrefix(oid, "rbd_id.") || strings.HasPrefix(oid, "rbd_header."):
		return "image"
	}
	return "other"
}

// NoticeObject is the name of node's notice object.
func NoticeObject(node string) string { return NoticePrefix + node }
