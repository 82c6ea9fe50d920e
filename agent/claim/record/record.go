package record

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/image"
)

// FormatVersion is the version of the claim record's JSON layout. Each format is refused by the
// agents that read only older ones, so that a cluster mixing old and new agents fails closed:
//
//   - format 2: liveness by heartbeats, judged on the observer's clock (format-1 agents would
//     take an image from a new one by reading a timestamp it no longer renews);
//
//   - format 3: claims are indexed (index.go). An agent from before the index would create and
//     remove claim objects without their keys, so it may not write an indexed claim: it reads a
//     format-3 record as "format 3, this agent reads 1 and 2" and refuses the map.
//
//   - format 4 (SwapFormat): format 3 with a claimer's swap mark (swapmark.go), for the seconds
//     in which it removes and adds a fence's entry before its claim; written only then.
//
// This agent reads formats 1 to 4 and writes 3, or 4 while it marks a swap (indexing the claim
// first, I1 of index.go).
const FormatVersion = 3

// LegacyFormat is the format of agents from before heartbeats: each holder renews its claim
// record, so a new agent reads those renewals as the holder's liveness.
const LegacyFormat = 1

// HeartbeatFormat is the heartbeat record's layout (liveness.go), unchanged since format 2 of
// the claim record: agents before the index and after it read each other's heartbeats.
const HeartbeatFormat = 2

// ObjectPrefix starts the name of every claim object; the image's name follows it.
// The object lives in the image's own pool and namespace.
const ObjectPrefix = "rbd-owner.claim."

// Access is how an image is shared.
type Access string

// The access modes.
const (
	// RWO: one holder, read-write. The default.
	RWO Access = "rwo"
	// ROX: any number of holders, all read-only; no writer.
	ROX Access = "rox"
	// RWX: several read-write holders, recorded (block-mode live migration); never mixed with rwo.
	RWX Access = "rwx"
)

// ParseAccess accepts "rwo", "rox" or "rwx" ("" means rwo).
func ParseAccess(s string) (Access, error) {
	switch Access(s) {
	case "", RWO:
		return RWO, nil
	case ROX, RWX:
		return Access(s), nil
	}
	return "", fmt.Errorf("access %q: want rwo, rox or rwx", s)
}

// Image names the image a claim is for (never a snapshot): the agent's one image reference.
type Image = image.Ref

// ObjectOf is the name of the image's claim object.
func ObjectOf(i Image) string { return ObjectPrefix + i.Image }

// ValidateImage refuses what cannot name a claim: a snapshot (a claim is for the image), or a
// name image.Ref.Validate refuses. The error is ErrInvalid.
func ValidateImage(i Image) error {
	if i.Snap != "" {
		return fmt.Errorf("%w: a claim is for an image, not snapshot %q", ErrInvalid, i.Snap)
	}
	return i.Validate()
}

// Holder is one node's hold on an image.
type Holder struct {
	NodeID string `json:"node_id"`
	// Incarnation tells a node that came back without its state from the one that made the
	// claim (a new value whenever the agent's state directory is new).
	Incarnation string `json:"incarnation,omitempty"`
	Hostname    string `json:"hostname"`
	// NodeAddr is the node's source address toward the monitors (fenced as ip:0/0 when no
	// mapping address is known yet).
	NodeAddr string `json:"node_addr"`
	// ClientAddr is the mapping's own client address (from sysfs), the exact thing to fence.
	ClientAddr string `json:"client_addr"`
	Device     string `json:"device"`
	ReadOnly   bool   `json:"read_only"`
	// Epoch is the record's epoch when this holder got the image: its fencing token.
	Epoch        uint64    `json:"epoch"`
	AcquiredAt   time.Time `json:"acquired_at"`
	RenewedAt    time.Time `json:"renewed_at"`
	LeaseSeconds int64     `json:"lease_seconds"`
	AgentVersion string    `json:"agent_version"`
	// BootID is the kernel boot id of the holder's node when it last wrote this entry: a fence
	// of this hold records it, and a later heartbeat with another boot id shows that the node
	// rebooted, so that the fenced kernel client no longer exists.
	BootID string `json:"boot_id,omitempty"`
	// Fenced is set once an admin blocklisted this holder; it can no longer renew.
	Fenced bool `json:"fenced,omitempty"`
}

// FenceAddr is the address that cuts this holder off: its mapping's, else its whole host's.
func (h Holder) FenceAddr() string {
	if h.ClientAddr != "" {
		return h.ClientAddr
	}
	if h.NodeAddr != "" {
		if strings.Contains(h.NodeAddr, ":") && !strings.HasPrefix(h.NodeAddr, "[") && strings.Count(h.NodeAddr, ":") > 1 {
			return "[" + h.NodeAddr + "]:0/0" // IPv6
		}
		return h.NodeAddr + ":0/0"
	}
	return ""
}

// Fence is one blocklisting done to take an image from a holder. A blocklist entry expires
// (fence_expiry), and the fenced mapping may still exist then: a node hung or cut off for longer
// writes again the moment its entry runs out. So a fence stays live, and is re-blocklisted well
// before it expires (Store.KeepFences: by the holder of record, and by the pool's sweep while
// nobody holds the image), until its mapping is known gone: its node's agent unmapped it, or
// the node rebooted since (its heartbeat shows another boot id), or an admin lifted it.
type Fence struct {
	NodeID  string    `json:"node_id"`
	Addr    string    `json:"addr"`
	Epoch   uint64    `json:"epoch"`
	At      time.Time `json:"at"`
	Expires time.Time `json:"expires"`
	By      string    `json:"by"`
	// BootID is the fenced node's boot id when it last wrote its hold ("" when its agent did
	// not record one: then only an unmap report or an admin ends the fence), and Incarnation
	// its agent's incarnation then: another boot id counts only from a heartbeat of the same
	// incarnation (a second machine given the same node id, or the node with its state lost,
	// shows another one, and proves nothing about the fenced kernel).
	BootID      string `json:"boot_id,omitempty"`
	Incarnation string `json:"incarnation,omitempty"`
	// RenewedAt and RenewedBy: the last re-blocklisting (wall clock, for people).
	RenewedAt time.Time `json:"renewed_at,omitzero"`
	RenewedBy string    `json:"renewed_by,omitempty"`
	// Gone says why the fenced mapping is known gone ("" while it may still exist); from then
	// on nobody keeps the entry.
	Gone   string    `json:"gone,omitempty"`
	GoneAt time.Time `json:"gone_at,omitzero"`
	// Made says that this project listed the entry: the address was not on the blocklist just
	// before the fence. Such an entry is removed once the fence is gone (LiftedAt); one that
	// another party listed first (librbd's lock break, an operator, another fencer) is theirs
	// to lift, and expires by itself.
	Made     bool      `json:"made,omitempty"`
	LiftedAt time.Time `json:"lifted_at,omitzero"`
}

// Live says whether the fenced mapping may still exist: the entry must then be kept.
func (f Fence) Live() bool { return f.Gone == "" }

// WholeNode says whether the fence blocklisted a host's whole address (ip:0/0: the holder had
// recorded no mapping address yet): every client of that host on the cluster is cut by it, its
// agent's own included, not only one mapping.
func (f Fence) WholeNode() bool { return strings.HasSuffix(f.Addr, ":0/0") }

// Described is the fence as a person reads it: the address, and what it cuts.
func (f Fence) Described() string {
	if f.WholeNode() {
		return fmt.Sprintf("node %s's WHOLE address %s (no mapping address was recorded: every client of that host on this cluster is cut, its other mappings and its agent too)", f.NodeID, f.Addr)
	}
	return fmt.Sprintf("node %s's mapping %s", f.NodeID, f.Addr)
}

// MaxFences bounds the fences kept in a record that are known gone (history); a live fence is
// never dropped, whatever their number: dropping it would end its renewal.
const MaxFences = 8

// Record is the claim object's content (JSON). Epoch only ever grows: it is raised every time
// a holder is added, so that every holder's Epoch is unique for the life of the record.
type Record struct {
	Format      int    `json:"format"`
	ClusterFSID string `json:"cluster_fsid"`
	image.Ref
	ImageID string `json:"image_id"`
	// Access is the mode of the current holders; empty when free.
	Access  Access   `json:"access"`
	Epoch   uint64   `json:"epoch"`
	Holders []Holder `json:"holders"`
	Fences  []Fence  `json:"fences,omitempty"`
	// Intruders are mappings made outside rbd-owner that were fenced (see Intruder).
	Intruders []Intruder `json:"intruders,omitempty"`
	// Swap is a claimer's mark while it removes and adds a fence's entry before its claim
	// (swapmark.go); nil otherwise.
	Swap      *SwapMark `json:"swap,omitempty"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Holder returns node's holder entry, or nil.
func (r *Record) Holder(node string) *Holder {
	if r == nil {
		return nil
	}
	for i := range r.Holders {
		if r.Holders[i].NodeID == node {
			return &r.Holders[i]
		}
	}
	return nil
}

// Free says whether no node holds the image.
func (r *Record) Free() bool { return r == nil || len(r.Holders) == 0 }

// Without drops node's holder entry.
func (r *Record) Without(node string) {
	kept := r.Holders[:0]
	for _, h := range r.Holders {
		if h.NodeID != node {
			kept = append(kept, h)
		}
	}
	r.Holders = kept
	if len(r.Holders) == 0 {
		r.Access = ""
	}
}

// AddFence records f: it replaces an entry for the same node and address (blocklisted again),
// and drops the oldest fences known gone while there are more than MaxFences; live ones stay.
func (r *Record) AddFence(f Fence) {
	kept := r.Fences[:0]
	for _, o := range r.Fences {
		if o.NodeID != f.NodeID || o.Addr != f.Addr {
			kept = append(kept, o)
		}
	}
	r.Fences = append(kept, f)
	for extra := len(r.Fences) - MaxFences; extra > 0; extra-- {
		i := slices.IndexFunc(r.Fences, func(f Fence) bool { return !f.Live() })
		if i < 0 {
			break
		}
		r.Fences = slices.Delete(r.Fences, i, i+1)
	}
}

// LiveFences returns the fences whose mappings may still exist.
func (r *Record) LiveFences() []Fence {
	if r == nil {
		return nil
	}
	var out []Fence
	for _, f := range r.Fences {
		if f.Live() {
			out = append(out, f)
		}
	}
	return out
}

// Clone is a deep copy of r.
func (r *Record) Clone() *Record {
	c := *r
	c.Holders = append([]Holder(nil), r.Holders...)
	c.Fences = append([]Fence(nil), r.Fences...)
	c.Intruders = append([]Intruder(nil), r.Intruders...)
	if r.Swap != nil {
		m := *r.Swap
		m.Addrs = append([]string(nil), r.Swap.Addrs...)
		c.Swap = &m
	}
	return &c
}

// MaxRecordSize bounds what is read from a claim object; records are far smaller.
const MaxRecordSize = 64 << 10

// Decode reads a record as stored (at most MaxRecordSize).
func Decode(data []byte) (*Record, error) {
	var r Record
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("claim record is not valid JSON: %w", err)
	}
	if r.Format < LegacyFormat || r.Format > SwapFormat {
		return nil, fmt.Errorf("claim record has format %d, this agent reads %d to %d (upgrade the agent that reads it)", r.Format, LegacyFormat, SwapFormat)
	}
	return &r, nil
}

// Encode is a record as stored.
func Encode(r *Record) ([]byte, error) {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, err
	}
	if len(b) >= MaxRecordSize {
		return nil, fmt.Errorf("claim record too large (%d bytes)", len(b))
	}
	return append(b, '\n'), nil
}
