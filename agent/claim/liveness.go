package claim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
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

// HeartbeatPrefix starts the name of every heartbeat object; the node id follows it.
const HeartbeatPrefix = "rbd-owner.node."

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
}

// heartbeatObject is the name of node's heartbeat object.
func heartbeatObject(node string) string { return HeartbeatPrefix + node }

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

// LeaseView is what an observer knows of one holder's lease.
type LeaseView struct {
	// Expired: the holder's liveness has not changed for a whole lease on this node's clock.
	Expired bool
	// Unchanged is for how long this node has seen the same mark.
	Unchanged time.Duration
	// RetryAfter is how long until Expired, unless the holder renews (0 when expired).
	RetryAfter time.Duration
	// FirstLook is true when this look started the watch (the mark was new to this node).
	FirstLook bool
	// Changed is true when the mark differs from the one this node saw before: the holder
	// renewed since the last look.
	Changed bool
}

// observation is one holder's mark and when this node first saw it (monotonic).
type observation struct {
	mark  Mark
	since time.Duration
}

// Observer remembers, per holder, the mark it last saw and since when (on a monotonic clock
// of this process). It is the whole lease rule; it never looks at another node's clock.
type Observer struct {
	mu   sync.Mutex
	seen map[string]observation // key: holder identity (pool, namespace, node)
}

// NewObserver returns an observer with nothing seen.
func NewObserver() *Observer { return &Observer{seen: map[string]observation{}} }

// Look records a look at a holder's mark at monotonic time now and returns the lease as this
// node sees it: expired only once the same mark has been seen for lease. A changed mark
// restarts the watch. The first look never finds a lease expired (lease > 0).
func (o *Observer) Look(key string, mark Mark, now, lease time.Duration) LeaseView {
	o.mu.Lock()
	defer o.mu.Unlock()
	ob, ok := o.seen[key]
	first := !ok || ob.mark != mark
	if first {
		ob = observation{mark: mark, since: now}
		o.seen[key] = ob
	}
	unchanged := now - ob.since
	v := LeaseView{Unchanged: unchanged, FirstLook: first, Changed: first && ok}
	if !first && unchanged >= lease {
		v.Expired = true
	} else {
		v.RetryAfter = lease - unchanged
	}
	return v
}

// Forget drops what was seen of a holder (once it no longer holds anything watched).
func (o *Observer) Forget(key string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.seen, key)
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
	if hb.Format != FormatVersion {
		return nil, fmt.Errorf("heartbeat record has format %d, this agent reads %d", hb.Format, FormatVersion)
	}
	return &hb, nil
}

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
		if cur.Format == legacyFormat {
			mark = legacyMark(recordVer, h)
		} else {
			data, ver, err := s.b.Read(ctx, img, heartbeatObject(h.NodeID))
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
		v := s.obs.Look(img.Pool+"/"+img.Namespace+"/"+h.NodeID, mark, s.cfg.Mono(), lease)
		if v.Changed && hb != nil && s.cfg.OnSkew != nil {
			if skew := hb.RenewedAt.Sub(s.cfg.Now()); skew > time.Second || -skew > lease/3 {
				s.cfg.OnSkew(h.NodeID, skew)
			}
		}
		out[h.NodeID] = v
	}
	return out, nil
}

// Heartbeat renews this node's liveness in a pool and namespace: one write, whatever the
// number of claims held there.
func (s *Store) Heartbeat(ctx context.Context, pool, namespace string) error {
	loc := Image{Pool: pool, Namespace: namespace}
	oid := heartbeatObject(s.cfg.Node.ID)
	for attempt := 0; attempt < 8; attempt++ {
		data, ver, err := s.b.Read(ctx, loc, oid)
		if err != nil {
			return fmt.Errorf("heartbeat in %s: %w", poolNS(loc), err)
		}
		hb := &Heartbeat{}
		if data != nil {
			if old, err := decodeHeartbeat(data); err == nil {
				hb = old
			} // an unreadable old record is replaced; its version still moves on
		}
		me := s.me()
		hb.Format, hb.NodeID, hb.Incarnation, hb.Hostname, hb.NodeAddr = FormatVersion, s.cfg.Node.ID, me.Incarnation, me.Hostname, me.NodeAddr
		hb.Seq++
		hb.RenewedAt, hb.LeaseSeconds, hb.AgentVersion = s.cfg.Now().UTC(), me.LeaseSeconds, me.AgentVersion
		out, err := encodeHeartbeat(hb)
		if err != nil {
			return err
		}
		err = s.b.CompareAndWrite(ctx, loc, oid, ver, out)
		if err == nil {
			return nil
		}
		if !errors.Is(err, ErrConflict) {
			return fmt.Errorf("heartbeat in %s: %w", poolNS(loc), err)
		}
	}
	return fmt.Errorf("heartbeat in %s: %w: written concurrently (is node id %s used twice?)", poolNS(loc), ErrBusy, s.cfg.Node.ID)
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

func poolNS(loc Image) string {
	if loc.Namespace == "" {
		return loc.Pool
	}
	return loc.Pool + "/" + loc.Namespace
}
