package claim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ceph/go-ceph/rados"

	"github.com/rbd-owner/rbd-owner/agent/cephconn"
)

// Request asks for a hold on an image.
type Request struct {
	Image    Image
	Access   Access // "" means rwo
	ReadOnly bool   // forced for rox
	// Takeover allows taking the image from holders whose leases have expired, by fencing
	// them first. A holder with a live lease is never taken over here (see Fence + ForceRelease).
	Takeover bool
}

// Result is the outcome of Acquire.
type Result struct {
	Record *Record
	Holder Holder // ours
	// Again is true when this node already held the image (same epoch, lease renewed).
	Again bool
	// Fenced lists the holders that were blocklisted to take the image over.
	Fenced []Fence
}

// Acquire gives this node a hold on the image, or says who has it. It is idempotent: asking
// again for an image this node holds renews the lease and keeps the epoch.
func (s *Store) Acquire(ctx context.Context, req Request) (*Result, error) {
	access, err := ParseAccess(string(req.Access))
	if err != nil {
		return nil, fmt.Errorf("acquire %s: %w: %w", req.Image, ErrInvalid, err)
	}
	if access == ROX {
		req.ReadOnly = true
	}
	if err := req.Image.validate(); err != nil {
		return nil, fmt.Errorf("acquire %s: %w: %w", req.Image, ErrInvalid, err)
	}
	info, err := s.inspectImage(req.Image)
	if err != nil {
		return nil, fmt.Errorf("acquire %s: %w", req.Image, err)
	}
	self := s.cfg.Node.ID
	var res Result
	// holders this call has already blocklisted, by node and epoch: if the write then loses a
	// race to the holder's own renewal, the holder's mapping is fenced all the same, so the
	// takeover must go through rather than leave a live-looking claim whose device cannot write
	fenced := map[string]Fence{}
	fkey := func(h Holder) string { return h.NodeID + "@" + strconv.FormatUint(h.Epoch, 10) + "@" + h.fenceAddr() }
	rec, err := s.update(ctx, req.Image, func(cur *Record) (*Record, error) {
		now := s.cfg.Now().UTC()
		res = Result{}
		if cur == nil {
			cur = &Record{Format: FormatVersion, Image: req.Image}
		}
		if cur.ImageID != "" && cur.ImageID != info.ID {
			// the claim was for an older image of the same name, since deleted (an image with
			// a mapping cannot be removed): its holders are gone with it; the epoch goes on
			cur.Holders, cur.Access = nil, ""
		}
		cur.ClusterFSID, cur.ImageID = s.fsid, info.ID
		mine := cur.Holder(self)
		if mine != nil {
			if cur.Access != access {
				return nil, fmt.Errorf("%w: this node already holds %s as %s, not %s", ErrInvalid, req.Image, cur.Access, access)
			}
			if mine.Fenced {
				return nil, &LostError{Image: req.Image, Epoch: mine.Epoch, Record: cur, Why: "this node's hold was fenced by an admin; release it (rbd-owner release --force) before mapping again"}
			}
			if w := unexplained(info.Watchers, cur.Holders); w != nil {
				return nil, fmt.Errorf("%w: %s has watchers no claim explains: %s (mapped or opened outside rbd-owner?)", ErrBusy, req.Image, strings.Join(w, ", "))
			}
			s.refresh(mine, now)
			res.Again = true
			res.Holder = *mine
			return cur, nil
		}
		var evict []Holder
		if !cur.Free() && !(cur.Access == access && access != RWO) {
			if !req.Takeover {
				return nil, &HeldError{Image: req.Image, Access: cur.Access, Epoch: cur.Epoch, Holders: cur.Holders, Now: now,
					Reason: "map with takeover only once its lease has expired, or have an admin run `rbd-owner fence` and `rbd-owner release --force`"}
			}
			for _, h := range cur.Holders {
				if _, done := fenced[fkey(h)]; done {
					continue
				}
				if !h.Expired(now) {
					return nil, &HeldError{Image: req.Image, Access: cur.Access, Epoch: cur.Epoch, Holders: cur.Holders, Now: now,
						Reason: fmt.Sprintf("takeover refused: node %s's lease is still live until %s", h.NodeID, h.LeaseExpiry().UTC().Format(time.RFC3339))}
				}
				if h.fenceAddr() == "" {
					return nil, &HeldError{Image: req.Image, Access: cur.Access, Epoch: cur.Epoch, Holders: cur.Holders, Now: now,
						Reason: fmt.Sprintf("takeover refused: node %s recorded no address to fence", h.NodeID)}
				}
			}
			evict = cur.Holders
		}
		// watchers: only the holders we keep may explain them (evicted ones are fenced below,
		// and a blocklisted client's watch is dropped by the OSDs)
		kept := cur.Holders
		if evict != nil {
			kept = nil
		}
		if w := unexplained(withoutAddrsOf(info.Watchers, evict), kept); w != nil {
			return nil, fmt.Errorf("%w: %s has watchers no claim explains: %s (mapped or opened outside rbd-owner?)", ErrBusy, req.Image, strings.Join(w, ", "))
		}
		// fence first, write after: a crash in between leaves the old holder blocklisted and
		// the record unchanged, and the next attempt blocklists again (idempotent) and writes
		for _, h := range evict {
			f, done := fenced[fkey(h)]
			if !done {
				var err error
				if f, err = s.fence(h, now); err != nil {
					return nil, fmt.Errorf("takeover of %s from node %s: %w", req.Image, h.NodeID, err)
				}
				fenced[fkey(h)] = f
			}
			cur.without(h.NodeID)
			cur.addFence(f)
			res.Fenced = append(res.Fenced, f)
		}
		cur.Epoch++
		h := Holder{NodeID: self, ReadOnly: req.ReadOnly, Epoch: cur.Epoch, AcquiredAt: now}
		s.refresh(&h, now)
		cur.Holders = append(cur.Holders, h)
		cur.Access = access
		res.Holder = h
		return cur, nil
	})
	if err != nil {
		return nil, fmt.Errorf("acquire %s: %w", req.Image, err)
	}
	res.Record = rec
	return &res, nil
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

func (s *Store) refresh(h *Holder, now time.Time) {
	h.RenewedAt = now
	h.LeaseSeconds = int64(s.cfg.Lease / time.Second)
	h.Hostname = s.cfg.Node.Hostname
	if s.cfg.Node.Addr != nil {
		if a := s.cfg.Node.Addr(); a != "" {
			h.NodeAddr = a
		}
	}
	h.AgentVersion = s.cfg.Node.AgentVersion
}

func (s *Store) fence(h Holder, now time.Time) (Fence, error) {
	addr := h.fenceAddr()
	if addr == "" {
		return Fence{}, fmt.Errorf("node %s recorded no address to fence", h.NodeID)
	}
	until, err := cephconn.Blocklist(s.conn, addr, s.cfg.FenceExpiry)
	if err != nil {
		return Fence{}, err
	}
	if s.afterFence != nil {
		s.afterFence()
	}
	return Fence{NodeID: h.NodeID, Addr: addr, Epoch: h.Epoch, At: now, Expires: until.UTC(), By: s.cfg.Node.ID}, nil
}

// mine finds this node's live holder entry at epoch, or explains why there is none.
func (s *Store) mine(img Image, cur *Record, epoch uint64) (*Holder, error) {
	if cur == nil {
		return nil, &LostError{Image: img, Epoch: epoch, Why: "the claim record is gone"}
	}
	h := cur.Holder(s.cfg.Node.ID)
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

// Renew extends this node's lease, only if it still holds the image at epoch.
func (s *Store) Renew(ctx context.Context, img Image, epoch uint64) (*Record, error) {
	rec, err := s.update(ctx, img, func(cur *Record) (*Record, error) {
		h, err := s.mine(img, cur, epoch)
		if err != nil {
			return nil, err
		}
		s.refresh(h, s.cfg.Now().UTC())
		return cur, nil
	})
	if err != nil {
		return nil, fmt.Errorf("renew %s: %w", img, err)
	}
	return rec, nil
}

// SetMapping records the mapping's client address and device in this node's holder entry
// (after the map), only if it still holds the image at epoch.
func (s *Store) SetMapping(ctx context.Context, img Image, epoch uint64, clientAddr, device string) (*Record, error) {
	rec, err := s.update(ctx, img, func(cur *Record) (*Record, error) {
		h, err := s.mine(img, cur, epoch)
		if err != nil {
			return nil, err
		}
		h.ClientAddr, h.Device = clientAddr, device
		s.refresh(h, s.cfg.Now().UTC())
		return cur, nil
	})
	if err != nil {
		return nil, fmt.Errorf("record mapping of %s: %w", img, err)
	}
	return rec, nil
}

// Release drops this node's hold, only if it holds the image at epoch. It returns false
// (and no error) when there was nothing of ours to release.
func (s *Store) Release(ctx context.Context, img Image, epoch uint64) (bool, error) {
	released := false
	_, err := s.update(ctx, img, func(cur *Record) (*Record, error) {
		released = false
		h := cur.Holder(s.cfg.Node.ID)
		if h == nil || h.Epoch != epoch {
			return nil, nil // not ours (any more): leave it alone
		}
		cur.without(s.cfg.Node.ID)
		released = true
		return cur, nil
	})
	if err != nil {
		return false, fmt.Errorf("release %s: %w", img, err)
	}
	return released, nil
}

// Inspect reads the image's claim record; ErrNoClaim when it has none.
func (s *Store) Inspect(ctx context.Context, img Image) (*Record, error) {
	if err := img.validate(); err != nil {
		return nil, fmt.Errorf("inspect %s: %w: %w", img, ErrInvalid, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	io, err := s.ioctx(img)
	if err != nil {
		return nil, fmt.Errorf("inspect %s: %w", img, err)
	}
	defer io.Destroy()
	rec, _, err := s.read(io, img)
	if err != nil {
		return nil, fmt.Errorf("inspect %s: %w", img, err)
	}
	if rec == nil {
		return nil, fmt.Errorf("inspect %s: %w", img, ErrNoClaim)
	}
	return rec, nil
}

// List returns every claim record of a pool, in all its namespaces: the cluster-wide view.
func (s *Store) List(ctx context.Context, pool string) ([]Record, error) {
	io, err := s.conn.OpenIOContext(pool)
	if err != nil {
		return nil, cephconn.Classify(fmt.Errorf("list claims of pool %s: %w", pool, err), "open pool "+pool, osdCap)
	}
	defer io.Destroy()
	io.SetNamespace(rados.AllNamespaces)
	iter, err := io.Iter()
	if err != nil {
		return nil, cephconn.Classify(fmt.Errorf("list claims of pool %s: %w", pool, err), "list objects of "+pool, osdCap)
	}
	defer iter.Close()
	var imgs []Image
	for iter.Next() {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if name, ok := strings.CutPrefix(iter.Value(), ObjectPrefix); ok && name != "" {
			imgs = append(imgs, Image{Pool: pool, Namespace: iter.Namespace(), Name: name})
		}
	}
	if err := iter.Err(); err != nil {
		return nil, cephconn.Classify(fmt.Errorf("list claims of pool %s: %w", pool, err), "list objects of "+pool, osdCap)
	}
	sort.Slice(imgs, func(i, j int) bool { return imgs[i].String() < imgs[j].String() })
	out := make([]Record, 0, len(imgs))
	for _, img := range imgs {
		rec, err := s.Inspect(ctx, img)
		if err != nil {
			if errors.Is(err, ErrNoClaim) {
				continue // released and removed meanwhile
			}
			return nil, err
		}
		out = append(out, *rec)
	}
	return out, nil
}

// FenceResult says what Fence blocklisted.
type FenceResult struct {
	Record *Record
	Fences []Fence
}

// Fence blocklists every current holder's mapping (admin action; the lease is not waited for)
// and marks them fenced in the record, so that they can no longer renew. The holders stay in
// the record until ForceRelease. Fencing again blocklists again (moving the expiry).
func (s *Store) Fence(ctx context.Context, img Image) (*FenceResult, error) {
	var res FenceResult
	rec, err := s.update(ctx, img, func(cur *Record) (*Record, error) {
		res = FenceResult{}
		if cur.Free() {
			return nil, fmt.Errorf("%w: %s has no holder to fence", ErrNoClaim, img)
		}
		now := s.cfg.Now().UTC()
		for i := range cur.Holders {
			f, err := s.fence(cur.Holders[i], now)
			if err != nil {
				return nil, err
			}
			cur.Holders[i].Fenced = true
			cur.addFence(f)
			res.Fences = append(res.Fences, f)
		}
		return cur, nil
	})
	if err != nil {
		return nil, fmt.Errorf("fence %s: %w", img, err)
	}
	res.Record = rec
	return &res, nil
}

// ForceRelease drops every holder of an image (admin action), but only holders that were
// fenced first: dropping a live writer's claim would let a second writer in.
func (s *Store) ForceRelease(ctx context.Context, img Image) (bool, error) {
	released := false
	_, err := s.update(ctx, img, func(cur *Record) (*Record, error) {
		released = false
		if cur.Free() {
			return nil, nil
		}
		for _, h := range cur.Holders {
			if !h.Fenced {
				return nil, fmt.Errorf("%w: node %s's hold on %s was not fenced; run `rbd-owner fence %s` first",
					ErrInvalid, h.NodeID, img, img)
			}
		}
		cur.Holders, cur.Access = nil, ""
		released = true
		return cur, nil
	})
	if err != nil {
		return false, fmt.Errorf("release --force %s: %w", img, err)
	}
	return released, nil
}

// Orphans lists the claims of a pool whose image no longer exists (or was recreated under the
// same name with another id).
func (s *Store) Orphans(ctx context.Context, pool string) ([]Record, error) {
	recs, err := s.List(ctx, pool)
	if err != nil {
		return nil, err
	}
	var out []Record
	for _, r := range recs {
		orphan, err := s.isOrphan(r)
		if err != nil {
			return nil, err
		}
		if orphan {
			out = append(out, r)
		}
	}
	return out, nil
}

func (s *Store) isOrphan(r Record) (bool, error) {
	io, err := s.ioctx(r.Image)
	if err != nil {
		return false, err
	}
	defer io.Destroy()
	ok, err := s.imageExists(io, r.Image, r.ImageID)
	return !ok, err
}

// RemoveOrphan deletes the claim record of a deleted image, only if the image is still gone
// and the record has not changed since it was checked (one compare-and-delete operation).
func (s *Store) RemoveOrphan(ctx context.Context, img Image) (bool, error) {
	if err := img.validate(); err != nil {
		return false, fmt.Errorf("remove orphan %s: %w: %w", img, ErrInvalid, err)
	}
	io, err := s.ioctx(img)
	if err != nil {
		return false, err
	}
	defer io.Destroy()
	for attempt := 0; attempt < maxAttempts; attempt++ {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		rec, ver, err := s.read(io, img)
		if err != nil || rec == nil {
			return false, err
		}
		exists, err := s.imageExists(io, img, rec.ImageID)
		if err != nil {
			return false, fmt.Errorf("remove orphan %s: %w", img, err)
		}
		if exists {
			return false, fmt.Errorf("remove orphan %s: %w: the image exists; its claim is not an orphan", img, ErrInvalid)
		}
		err = s.casRemove(io, img, ver)
		if err == nil {
			return true, nil
		}
		if err != errConflict {
			return false, fmt.Errorf("remove orphan %s: %w", img, err)
		}
	}
	return false, fmt.Errorf("remove orphan %s: %w", img, ErrBusy)
}

// Hostname is os.Hostname without an error ("" when unknown).
func Hostname() string {
	h, _ := os.Hostname()
	return h
}
