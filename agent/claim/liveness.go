package claim

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Liveness, without trusting clocks (sanlock's delta leases): each agent renews one heartbeat
// record per pool and namespace it holds claims in, a RADOS object rbd-owner.node.<node_id>
// beside the claims. A claim names its holder's node and incarnation and is written only when
// ownership or the mapping changes. A node that wants to take an image over never compares the
// holder's timestamp with its own clock: it watches the holder's heartbeat and declares the
// lease expired only after the heartbeat has stayed the same (object version, incarnation and
// counter) for a whole lease, measured on its OWN monotonic clock from its first look. A holder
// that renews in that window keeps the image, whatever either clock says. The timestamps in the
// records are for people (and for reporting skew), never for a decision.

// Heartbeat is a node's liveness record in one pool and namespace.
type Heartbeat struct {
	Format       int       `json:"format"`
	NodeID       string    `json:"node_id"`
	Incarnation  string    `json:"incarnation"`
	Hostname     string    `json:"hostname"`
	NodeAddr     string    `json:"node_addr"`
	Seq          uint64    `json:"seq"`           // raised at every renewal
	RenewedAt    time.Time `json:"renewed_at"`    // the writer's clock: for people and skew reports
	LeaseSeconds int64     `json:"lease_seconds"` // how long observers wait for a change
	AgentVersion string    `json:"agent_version"`
	// BootID is the node's kernel boot id: a fence of one of its mappings ends when its
	// heartbeat shows another one (see KeepFences).
	BootID string `json:"boot_id,omitempty"`
	// Holds are the images of this pool and namespace the node may hold (a superset: an image
	// is added before the claim that holds it is written, and dropped once the hold is
	// released), so that its holds are found without listing pools (NodeHolds: an admin's
	// `fence --node`). Agents before it ignore the field.
	Holds []string `json:"holds,omitempty"`
	// HoldsListed is set by the agents that keep Holds (an empty list is then no holds).
	HoldsListed bool `json:"holds_listed,omitempty"`
	// Places are the pools and namespaces ("pool" or "pool/namespace") where the node
	// heartbeats now, this one included: a taker about to fence the node's whole address reads
	// its heartbeats there too, so that a node alive in any place is never fenced whole
	// (seenElsewhere), without listing pools. Agents before it write none.
	Places []string `json:"places,omitempty"`
}

// Mark is what an observer compares between two looks at a holder's liveness: it changes at
// every renewal, and never comes back.
type Mark string

// heartbeatMark is the mark of a heartbeat object as read (version 0: there is none).
func heartbeatMark(ver uint64, hb *Heartbeat) Mark {
	if hb == nil {
		return Mark("v" + strconv.FormatUint(ver, 10) + "/none")
	}
	return Mark(fmt.Sprintf("v%d/%s/%d", ver, hb.Incarnation, hb.Seq))
}

// legacyMark is the mark of a format-1 holder (an agent from before heartbeats renews each
// claim record): its renewals change the record's version and the holder's renewed_at.
func legacyMark(ver uint64, h Holder) Mark {
	return Mark(fmt.Sprintf("legacy/v%d/%s", ver, h.RenewedAt.UTC().Format(time.RFC3339Nano)))
}

// Sighting is one look at a holder: which of its holds, and the mark of its heartbeat where
// that hold is.
type Sighting struct {
	Place string // the heartbeat's pool and namespace
	Image string // the image the hold is on
	Node  string // the holder
	// Hold names the hold looked at (its epoch, acquired time and incarnation): a watch holds
	// only for the hold it was started on.
	Hold string
	Mark Mark
}

// holdOf names a holder's hold for a Sighting.
func holdOf(h Holder) string {
	return fmt.Sprintf("%d/%s/%s", h.Epoch, h.AcquiredAt.UTC().Format(time.RFC3339Nano), h.Incarnation)
}

// watch is what this node saw of one hold: the mark, since when (monotonic), and when it last
// looked.
type watch struct {
	hold               string
	mark               Mark
	since, last, lease time.Duration
}

// beat is what this node saw of one node's heartbeat in one place, whatever the hold: the mark
// at its last look, when that was, and when it last saw the mark change.
type beat struct {
	mark                 Mark
	last, changed, lease time.Duration
	moved                bool // changed is set
}

// Observer remembers what this node saw of other nodes' leases, on a monotonic clock of this
// process; it is the whole lease rule and never looks at another node's clock. It trusts an
// observation only for the hold it was made against, and only while it is looked at again at
// least once a lease: a watch of a hold that ended, or one left alone for longer than a lease
// (a holder idle in a pool for an hour has an unchanged heartbeat there, which says nothing
// of its next hold), starts over. What it no longer trusts it drops.
type Observer struct {
	mu      sync.Mutex
	watches map[string]watch // key: place, image, node
	beats   map[string]beat  // key: place, node
}

// NewObserver returns an observer with nothing seen.
func NewObserver() *Observer {
	return &Observer{watches: map[string]watch{}, beats: map[string]beat{}}
}

// Look records a look at a holder at monotonic time now and returns its lease as this node
// sees it: expired only once the same mark has been seen on the same hold for lease, with no
// gap of more than a lease between looks. The first look never finds a lease expired
// (lease > 0).
func (o *Observer) Look(s Sighting, now, lease time.Duration) LeaseView {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.prune(now)
	wk, bk := s.Place+"\x00"+s.Image+"\x00"+s.Node, s.Place+"\x00"+s.Node
	var v LeaseView
	b, ok := o.beats[bk]
	if ok && b.mark != s.Mark {
		b.changed, b.moved, v.Changed = now, true, true
	}
	b.mark, b.last, b.lease = s.Mark, now, lease
	o.beats[bk] = b
	w, ok := o.watches[wk]
	if !ok || w.hold != s.Hold || w.mark != s.Mark {
		w = watch{hold: s.Hold, mark: s.Mark, since: now}
		v.FirstLook = true
	}
	w.last, w.lease = now, lease
	o.watches[wk] = w
	v.Unchanged = now - w.since
	if !v.FirstLook && v.Unchanged >= lease {
		v.Expired = true
	} else {
		v.RetryAfter = lease - v.Unchanged
	}
	for k, b := range o.beats {
		if b.moved && now-b.changed < lease && strings.HasSuffix(k, "\x00"+s.Node) && (!v.Moved || now-b.changed < v.MovedAgo) {
			v.Moved, v.MovedAgo = true, now-b.changed
		}
	}
	return v
}

// prune drops what was last looked at more than a lease ago: it is no longer trusted.
func (o *Observer) prune(now time.Duration) {
	for k, w := range o.watches {
		if now-w.last > w.lease {
			delete(o.watches, k)
		}
	}
	for k, b := range o.beats {
		if now-b.last > b.lease {
			delete(o.beats, k)
		}
	}
}

func encodeHeartbeat(hb *Heartbeat) ([]byte, error) {
	b, err := json.MarshalIndent(hb, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

func decodeHeartbeat(data []byte) (*Heartbeat, error) {
	var hb Heartbeat
	if err := json.Unmarshal(data, &hb); err != nil {
		return nil, fmt.Errorf("heartbeat record is not valid JSON: %w", err)
	}
	if hb.Format != HeartbeatFormat {
		return nil, fmt.Errorf("heartbeat record has format %d, this agent reads %d", hb.Format, HeartbeatFormat)
	}
	return &hb, nil
}

// placeOf is the pool and namespace a place key names (poolNS's inverse).
func placeOf(key string) Image {
	pool, ns, _ := strings.Cut(key, "/")
	return Image{Pool: pool, Namespace: ns}
}

// editHolds applies edits (image: add or drop) to a sorted list of images.
func editHolds(holds []string, edits map[string]bool) []string {
	if len(edits) == 0 {
		return holds
	}
	set := map[string]bool{}
	for _, h := range holds {
		set[h] = true
	}
	for img, add := range edits {
		if add {
			set[img] = true
		} else {
			delete(set, img)
		}
	}
	out := slices.Sorted(maps.Keys(set))
	return out
}

// hbWritten is this store's last heartbeat write in a place: the object's version after it,
// and what it wrote.
type hbWritten struct {
	ver uint64
	hb  Heartbeat
}
