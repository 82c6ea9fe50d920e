package claim

import (
	"context"
	"fmt"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/claim/record"
)

// Heartbeat renews this node's heartbeat in a pool and namespace (see heartbeats.beat).
func (s *Store) Heartbeat(ctx context.Context, pool, namespace string) error {
	return s.hb.beat(ctx, pool, namespace)
}

// NoteHold has img listed among this node's holds (add) or no longer (drop) by the next
// heartbeat in its place. Acquire adds the image itself, before its claim; the agent adds the
// holds it finds at its start (those of an agent before the list), and a release drops them.
func (s *Store) NoteHold(img Image, add bool) { s.hb.note(img, add) }

// Holds are the images this node's last heartbeat in img's place listed, and the edits not
// written yet (for tests and status).
func (s *Store) Holds(pool, namespace string) []string { return s.hb.holds(pool, namespace) }

// leases looks at the liveness of every holder of cur other than this node (recordVer is the
// claim record's object version, the liveness of a legacy holder) and returns each one's lease
// as this node sees it.
func (s *Store) leases(ctx context.Context, img Image, cur *Record, recordVer uint64) (map[string]LeaseView, error) {
	out := map[string]LeaseView{}
	if cur == nil {
		return out, nil
	}
	for _, h := range cur.Holders {
		if h.NodeID == s.cfg.Node.ID {
			continue
		}
		lease := time.Duration(h.LeaseSeconds) * time.Second
		var mark Mark
		var hb *Heartbeat
		if cur.Format == record.LegacyFormat {
			mark = legacyMark(recordVer, h)
		} else {
			data, ver, err := s.b.Read(ctx, img, record.HeartbeatObject(h.NodeID))
			if err != nil {
				return nil, fmt.Errorf("liveness of node %s: %w", h.NodeID, err)
			}
			if data != nil {
				if hb, err = decodeHeartbeat(data); err != nil {
					return nil, fmt.Errorf("liveness of node %s: %w", h.NodeID, err)
				}
				lease = max(lease, time.Duration(hb.LeaseSeconds)*time.Second)
			}
			mark = heartbeatMark(ver, hb)
		}
		// never wait less than this node's own lease: a holder that says less is not trusted
		lease = max(lease, s.cfg.Lease)
		if h.ClientAddr == "" && hb != nil {
			// its fence would be its whole address: its heartbeats in the other places it lists
			// are looked at too, so that Moved says whether it renews anywhere
			s.seenElsewhere(ctx, img, h, hb, lease)
		}
		v := s.obs.Look(Sighting{Place: record.PoolNS(img), Image: img.Image, Node: h.NodeID, Hold: holdOf(h), Mark: mark}, s.cfg.Mono(), lease)
		// the same look tells a keeper of this holder's fence, should it be fenced, for how long
		// its heartbeat has been silent (fencedNode)
		s.book.silentFor(record.PoolNS(img)+"\x00"+h.NodeID, mark, hb != nil && h.Incarnation != "" && hb.Incarnation != h.Incarnation)
		if v.Changed && hb != nil && s.cfg.OnSkew != nil {
			skew := hb.RenewedAt.Sub(s.cfg.Now())
			if skew <= time.Second && -skew <= lease/3 {
				skew = 0 // within bounds: whatever skew was reported before is gone
			}
			s.cfg.OnSkew(h.NodeID, skew)
		}
		out[h.NodeID] = v
	}
	return out, nil
}

// seenElsewhere looks at holder h's heartbeats in the places its heartbeat hb in img's place
// lists, other than that one, so that the observer's Moved covers them (a heartbeat that cannot
// be read there is skipped: the look proves nothing either way).
func (s *Store) seenElsewhere(ctx context.Context, img Image, h Holder, hb *Heartbeat, lease time.Duration) {
	here := record.PoolNS(img)
	for _, p := range hb.Places {
		if p == here || p == "" {
			continue
		}
		loc := placeOf(p)
		data, ver, err := s.b.Read(ctx, loc, record.HeartbeatObject(h.NodeID))
		if err != nil || data == nil {
			continue
		}
		other, err := decodeHeartbeat(data)
		if err != nil || (h.Incarnation != "" && other.Incarnation != h.Incarnation) {
			continue // another agent under that node id says nothing of this one
		}
		s.obs.Look(Sighting{Place: p, Image: img.Image, Node: h.NodeID, Hold: "places/" + holdOf(h), Mark: heartbeatMark(ver, other)}, s.cfg.Mono(), lease)
	}
}

// Watch looks at the leases of the image's holders, as a takeover would, and writes nothing: a
// node waiting to take an image over keeps its watch of the holders' leases refreshed this way
// (an observation not refreshed for a lease is dropped). It returns each other holder's lease
// as this node sees it (none when the image is free or this node's alone).
func (s *Store) Watch(ctx context.Context, img Image) (map[string]LeaseView, error) {
	if err := record.ValidateImage(img); err != nil {
		return nil, fmt.Errorf("watch %s: %w", img, err)
	}
	cur, ver, err := s.read(ctx, img)
	if err != nil {
		return nil, fmt.Errorf("watch %s: %w", img, err)
	}
	leases, err := s.leases(ctx, img, cur, ver)
	if err != nil {
		return nil, fmt.Errorf("watch %s: %w", img, err)
	}
	return leases, nil
}

// unlistUnsent drops img from this node's holds again after an Acquire that sent no claim,
// unless it was listed before that Acquire (wasListed): the next heartbeat drops it.
func (s *Store) unlistUnsent(img Image, wasListed bool) {
	if !wasListed {
		s.NoteHold(img, false)
	}
}

// Check reads the claim and says whether this node still holds it at epoch (no write: the
// lease is kept by the heartbeat). A taken or fenced claim is a *LostError.
func (s *Store) Check(ctx context.Context, img Image, epoch uint64) (*Record, error) {
	cur, _, err := s.read(ctx, img)
	if err != nil {
		return nil, fmt.Errorf("check %s: %w", img, err)
	}
	if _, err := s.mine(img, cur, epoch); err != nil {
		return cur, fmt.Errorf("check %s: %w", img, err)
	}
	return cur, nil
}
