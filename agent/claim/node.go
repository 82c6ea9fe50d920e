package claim

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/rbd-owner/rbd-owner/agent/claim/record"
)

// A node's holds, cluster-wide, without listing a pool: each node's heartbeat object in a pool
// and namespace lists the images it may hold there (Heartbeat.Holds, a superset kept by the
// holder), so that an admin who declares a node dead fences all of it in one call
// (`rbd-owner fence --node`). Finding them costs one read for the cluster's pools, one per pool
// (its namespaces), one per place (the node's heartbeat) and one per listed image (its claim).

// NodeHold is one hold of a node, found through the lists of its heartbeats.
type NodeHold struct {
	Record Record
	Holder Holder // the node's entry in Record
}

// NodeBeat is one node's heartbeat in one pool and namespace, as read: its mark changes at every
// renewal (an observer compares marks, never the writer's clock).
type NodeBeat struct {
	Place     Image // the pool and namespace (Image empty)
	Mark      Mark
	Heartbeat *Heartbeat
}

// NodeBeats reads node's heartbeat in every pool and namespace of the cluster where it has one.
// What could not be read (a pool this user may not read, a heartbeat in another format) is
// returned beside what was found, one error each: a caller judging the node's liveness from
// them must not take a place it could not read for a silent one.
func (s *Store) NodeBeats(ctx context.Context, node string) ([]NodeBeat, []error) {
	if node == "" {
		return nil, []error{fmt.Errorf("%w: no node named", ErrInvalid)}
	}
	pools, err := s.b.Pools(ctx)
	if err != nil {
		return nil, []error{fmt.Errorf("heartbeats of node %s: %w", node, err)}
	}
	var out []NodeBeat
	var errs []error
	for _, pool := range pools {
		nss, err := s.placesOf(ctx, pool)
		if err != nil {
			errs = append(errs, fmt.Errorf("heartbeats of node %s in pool %s: its namespaces: %w", node, pool, err))
		}
		for _, ns := range nss {
			loc := Image{Pool: pool, Namespace: ns}
			data, ver, err := s.b.Read(ctx, loc, record.HeartbeatObject(node))
			if err != nil {
				errs = append(errs, fmt.Errorf("heartbeat of node %s in %s: %w", node, record.PoolNS(loc), err))
				continue
			}
			if data == nil {
				continue // the node never held anything here
			}
			hb, err := decodeHeartbeat(data)
			if err != nil {
				errs = append(errs, fmt.Errorf("heartbeat of node %s in %s: %w", node, record.PoolNS(loc), err))
				continue
			}
			out = append(out, NodeBeat{Place: loc, Mark: heartbeatMark(ver, hb), Heartbeat: hb})
		}
	}
	return out, errs
}

// ListedHolds returns the images node's heartbeats list as its holds (a superset: an image is
// listed before its claim is written and dropped once released), in every pool and namespace of
// the cluster. What could not be read (a pool this agent's user may not read, a heartbeat of an
// agent that does not list its holds) is returned beside what was found, one error each.
func (s *Store) ListedHolds(ctx context.Context, node string) ([]Image, []error) {
	beats, errs := s.NodeBeats(ctx, node)
	var out []Image
	for _, b := range beats {
		if !b.Heartbeat.HoldsListed {
			errs = append(errs, &record.UnlistedHoldsError{Node: node, Place: record.PoolNS(b.Place), Pool: b.Place.Pool, AgentVersion: b.Heartbeat.AgentVersion})
			continue
		}
		for _, name := range b.Heartbeat.Holds {
			out = append(out, Image{Pool: b.Place.Pool, Namespace: b.Place.Namespace, Image: name})
		}
	}
	return out, errs
}

// NodeHolds finds node's holds in every pool and namespace of the cluster: the images its
// heartbeats list (ListedHolds) whose claim names node as a holder (an image listed but released
// or taken over since is left out). What could not be read is returned beside what was found,
// one error each: the holds found are then not all of them.
func (s *Store) NodeHolds(ctx context.Context, node string) ([]NodeHold, []error) {
	listed, errs := s.ListedHolds(ctx, node)
	var out []NodeHold
	for _, img := range listed {
		rec, err := s.Inspect(ctx, img)
		if errors.Is(err, ErrNoClaim) || errors.Is(err, ErrInvalid) {
			continue // released and removed since, or a name no claim could have
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if h := rec.Holder(node); h != nil {
			out = append(out, NodeHold{Record: *rec, Holder: *h})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Record.Ref.String() < out[j].Record.Ref.String() })
	return out, errs
}

// NodeFenceImage is what FenceNode did to one hold.
type NodeFenceImage struct {
	Image Image
	Fence Fence
	// Again: the hold was fenced already (by an admin, or an earlier fence --node); its entry
	// was added again, which moves its expiry
	Again bool
	Err   error // the hold could not be fenced
}

// FenceNode fences every hold of node cluster-wide (admin action; the lease is not waited for):
// each hold's mapping is blocklisted (its recorded client address, else the node's whole
// address, ip:0/0) and the hold is marked fenced in its claim, so that the next map by any node
// takes it over (no release --force needed), and the node is left a notice. Other holders of a
// shared image are left alone. It is idempotent: fencing again blocklists again. The holds that
// could not be found or fenced are returned as errors beside the others.
func (s *Store) FenceNode(ctx context.Context, node string) ([]NodeFenceImage, []error) {
	holds, errs := s.NodeHolds(ctx, node)
	var out []NodeFenceImage
	for _, h := range holds {
		img := h.Record.Ref
		res, err := s.fenceHolders(ctx, img, node)
		if errors.Is(err, ErrNoClaim) {
			continue // released since it was found
		}
		if err != nil {
			out = append(out, NodeFenceImage{Image: img, Err: fmt.Errorf("fence node %s's hold on %s: %w", node, img, err)})
			continue
		}
		for _, f := range res.Fences {
			out = append(out, NodeFenceImage{Image: img, Fence: f, Again: h.Holder.Fenced})
		}
	}
	return out, errs
}
