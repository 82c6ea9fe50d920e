package claim

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/claim/record"
)

// heartbeats is the liveness sub-protocol's writer: this node's heartbeat object in each pool
// and namespace where it holds an image (the mark other nodes watch, and the list of its
// holds), written one at a time per place, under its own lock. last is the last write in each
// place, edits the changes to the holds it lists not written yet (image: added, or dropped),
// gates let one write at a time run in each place and answer the callers a later write has
// covered.
type heartbeats struct {
	b    Backend
	self string
	now  func() time.Time
	me   func() Holder // this node's holder entry as it would be written now

	mu    sync.Mutex
	last  map[string]hbWritten
	edits map[string]map[string]bool
	gates map[string]*hbGate
}

func newHeartbeats(b Backend, self string, now func() time.Time, me func() Holder) *heartbeats {
	return &heartbeats{b: b, self: self, now: now, me: me, last: map[string]hbWritten{}, edits: map[string]map[string]bool{}, gates: map[string]*hbGate{}}
}

// beat renews this node's liveness in a pool and namespace: one write, whatever the
// number of claims held there. The write compares against the version this store wrote last
// (no read first); a read comes only when that fails (the first write, another writer).
// Callers at once share writes: one runs at a time in a place, and a caller that a write
// started after its call has covered (its holds' edits included, its time as fresh) returns
// when that write succeeded (else it writes again itself), so that many maps at once do not
// race each other's compare.
func (h *heartbeats) beat(ctx context.Context, pool, namespace string) error {
	key := record.PoolNS(Image{Pool: pool, Namespace: namespace})
	h.mu.Lock()
	g := h.gates[key]
	if g == nil {
		g = &hbGate{turn: make(chan struct{}, 1)}
		h.gates[key] = g
	}
	g.asked++
	mine := g.asked
	h.mu.Unlock()
	select {
	case g.turn <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("heartbeat in %s: waiting for the write before it: %w", key, ctx.Err())
	}
	defer func() { <-g.turn }()
	h.mu.Lock()
	if g.covered >= mine && g.err == nil {
		h.mu.Unlock()
		return nil
	}
	cover := g.asked // every caller counted so far noted its edits already
	h.mu.Unlock()
	err := h.write(ctx, pool, namespace)
	h.mu.Lock()
	g.covered, g.err = cover, err
	h.mu.Unlock()
	return err
}

// hbGate is one place's heartbeat writer: turn is held by the write under way; asked counts
// the calls, covered the last call the last write's edits included, and err is that write's
// outcome.
type hbGate struct {
	turn    chan struct{}
	asked   uint64
	covered uint64
	err     error
}

// write is one heartbeat write in a place (beat), with its compare's retries.
func (h *heartbeats) write(ctx context.Context, pool, namespace string) error {
	loc := Image{Pool: pool, Namespace: namespace}
	oid := record.HeartbeatObject(h.self)
	key := record.PoolNS(loc)
	for attempt := 0; attempt < 8; attempt++ {
		h.mu.Lock()
		last, cached := h.last[key]
		edits := maps.Clone(h.edits[key])
		h.mu.Unlock()
		hb, ver := &Heartbeat{}, last.ver
		if cached {
			c := last.hb
			hb = &c
		} else {
			data, v, err := h.b.Read(ctx, loc, oid)
			if err != nil {
				return fmt.Errorf("heartbeat in %s: %w", key, err)
			}
			ver = v
			if data != nil {
				if old, err := decodeHeartbeat(data); err == nil {
					hb = old
				} // an unreadable old record is replaced; its version still moves on
			}
		}
		me := h.me()
		hb.Format, hb.NodeID, hb.Incarnation, hb.Hostname, hb.NodeAddr = HeartbeatFormat, h.self, me.Incarnation, me.Hostname, me.NodeAddr
		hb.Seq++
		hb.RenewedAt, hb.LeaseSeconds, hb.AgentVersion, hb.BootID = h.now().UTC(), me.LeaseSeconds, me.AgentVersion, me.BootID
		hb.Holds, hb.HoldsListed = editHolds(hb.Holds, edits), true
		hb.Places = h.placesHeld(key, len(hb.Holds) > 0)
		out, err := encodeHeartbeat(hb)
		if err != nil {
			return err
		}
		nv, err := h.b.CompareAndWrite(ctx, loc, oid, ver, out)
		h.mu.Lock()
		if err == nil {
			h.last[key] = hbWritten{ver: nv, hb: *hb}
			for img, add := range edits {
				if cur, ok := h.edits[key][img]; ok && cur == add {
					delete(h.edits[key], img) // written; an edit made since stays
				}
			}
		} else if h.last[key].ver == ver {
			delete(h.last, key) // read it again: another write came between, or this one's fate is unknown
		}
		h.mu.Unlock()
		if err == nil {
			return nil
		}
		if !errors.Is(err, ErrConflict) {
			return fmt.Errorf("heartbeat in %s: %w", key, err)
		}
	}
	return fmt.Errorf("heartbeat in %s: %w: written concurrently (is node id %s used twice?)", key, ErrBusy, h.self)
}

// placesHeld lists the places where this store heartbeats for holds: those whose last written
// heartbeat or pending edits list a hold, and here (the place key being written) when here
// holds one.
func (h *heartbeats) placesHeld(here string, holdsHere bool) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for key, last := range h.last {
		if key != here && len(editHolds(slices.Clone(last.hb.Holds), h.edits[key])) > 0 {
			out = append(out, key)
		}
	}
	for key, edits := range h.edits {
		if _, written := h.last[key]; !written && key != here && len(editHolds(nil, edits)) > 0 {
			out = append(out, key)
		}
	}
	if holdsHere {
		out = append(out, here)
	}
	sort.Strings(out)
	return out
}

// note has img listed among this node's holds (add) or no longer (drop) by the next
// heartbeat in its place. Acquire adds the image itself, before its claim; the agent adds the
// holds it finds at its start (those of an agent before the list), and a release drops them.
func (h *heartbeats) note(img Image, add bool) {
	key := record.PoolNS(img)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.edits[key] == nil {
		h.edits[key] = map[string]bool{}
	}
	h.edits[key][img.Image] = add
}

// holds are the images this node's last heartbeat in img's place listed, and the edits not
// written yet (for tests and status).
func (h *heartbeats) holds(pool, namespace string) []string {
	key := record.PoolNS(Image{Pool: pool, Namespace: namespace})
	h.mu.Lock()
	defer h.mu.Unlock()
	return editHolds(slices.Clone(h.last[key].hb.Holds), h.edits[key])
}

// listedNow says whether img may be listed among this node's holds in its place now: written,
// an edit to add it not written yet, or this store has not read or written its heartbeat
// there yet (what an agent before it wrote may list it).
func (h *heartbeats) listedNow(img Image) bool {
	key := record.PoolNS(img)
	h.mu.Lock()
	defer h.mu.Unlock()
	if add, edited := h.edits[key][img.Image]; edited {
		return add
	}
	last, ok := h.last[key]
	return !ok || slices.Contains(last.hb.Holds, img.Image)
}

// mayList says whether this node's heartbeat in img's place may list img: it does, or it has
// not been read or written by this store yet.
func (h *heartbeats) mayList(img Image) bool {
	key := record.PoolNS(img)
	h.mu.Lock()
	defer h.mu.Unlock()
	last, ok := h.last[key]
	if _, edited := h.edits[key][img.Image]; edited || !ok {
		return true
	}
	return slices.Contains(last.hb.Holds, img.Image)
}
