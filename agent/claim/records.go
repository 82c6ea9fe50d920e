package claim

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/claim/record"
)

// Unexplained returns the watchers of img's header that no holder of rec explains: another
// client mapping or opening the image, from anywhere, outside rbd-owner (the agent's own
// connection aside). Two reads of the image (its id, its header's watchers): the slow check's.
func (s *Store) Unexplained(ctx context.Context, img Image, rec *Record) ([]string, error) {
	info, err := s.inspectImage(ctx, img)
	if err != nil {
		return nil, fmt.Errorf("watchers of %s: %w", img, err)
	}
	if rec == nil {
		return info.Watchers, nil
	}
	return unexplained(info.Watchers, rec.Holders), nil
}

// Inspect reads the image's claim record; ErrNoClaim when it has none.
func (s *Store) Inspect(ctx context.Context, img Image) (*Record, error) {
	if err := record.ValidateImage(img); err != nil {
		return nil, fmt.Errorf("inspect %s: %w", img, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rec, _, err := s.read(ctx, img)
	if err != nil {
		return nil, fmt.Errorf("inspect %s: %w", img, err)
	}
	if rec == nil {
		return nil, fmt.Errorf("inspect %s: %w", img, ErrNoClaim)
	}
	return rec, nil
}

// List returns every claim record of a pool, in all its namespaces: the cluster-wide view,
// read through the pool's claim indexes (ListPlace).
func (s *Store) List(ctx context.Context, pool string) ([]Record, error) {
	recs, errs := s.ListReadable(ctx, pool)
	if len(errs) > 0 {
		return nil, errs[0]
	}
	return recs, nil
}

// ListReadable is List for the sweeps: a record that cannot be read or decoded (corrupt, or
// of a newer format) is skipped and its error returned beside the others, so that one bad
// object never stops the keeping of every other claim's fences.
func (s *Store) ListReadable(ctx context.Context, pool string, extraNamespaces ...string) ([]Record, []error) {
	nss, err := s.placesOf(ctx, pool, extraNamespaces...)
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	var out []Record
	for _, ns := range nss {
		pl, err := s.ListPlace(ctx, pool, ns, false)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, pl.Records...)
		errs = append(errs, pl.Errors...)
	}
	return out, errs
}

// PlaceList is what ListPlace found in one pool and namespace.
type PlaceList struct {
	Index Index
	// Records are the claim records the index names, sorted by image.
	Records []Record
	// Stale are the keys that name no claim object (DropStaleKey).
	Stale []Image
	// Errors are the records that could not be read or decoded (skipped).
	Errors []error
}

// ListPlace reads a pool and namespace's claim index and every claim record it names: never a
// listing of the pool, except once, when the index was never built (BuildIndex: the migration
// from agents before the index, reported through Config.OnIndexBuilt). markEmpty (the sweeps,
// of pools this node claims in) marks the index of a namespace without claims built too, so
// that it is not listed again; an admin's listing of every pool leaves other pools alone.
func (s *Store) ListPlace(ctx context.Context, pool, namespace string, markEmpty bool) (PlaceList, error) {
	idx, err := s.ReadIndex(ctx, pool, namespace)
	if err != nil {
		return PlaceList{}, err
	}
	if !idx.Built {
		start := time.Now()
		found, err := s.BuildIndex(ctx, pool, namespace, markEmpty)
		if err != nil {
			return PlaceList{}, err
		}
		if s.cfg.OnIndexBuilt != nil && (found > 0 || idx.Version != 0 || markEmpty) {
			s.cfg.OnIndexBuilt(pool, namespace, found, time.Since(start))
		}
		if idx, err = s.ReadIndex(ctx, pool, namespace); err != nil {
			return PlaceList{}, err
		}
	}
	pl := PlaceList{Index: idx}
	for _, name := range idx.Images {
		img := Image{Pool: pool, Namespace: namespace, Image: name}
		rec, err := s.Inspect(ctx, img)
		switch {
		case errors.Is(err, ErrNoClaim):
			pl.Stale = append(pl.Stale, img)
		case errors.Is(err, ErrInvalid):
			// a key no claim could have (written by hand): not a claim
		case err != nil:
			pl.Errors = append(pl.Errors, err)
		default:
			pl.Records = append(pl.Records, *rec)
		}
	}
	return pl, nil
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
		orphan, err := s.isOrphan(ctx, r)
		if err != nil {
			return nil, err
		}
		if orphan {
			out = append(out, r)
		}
	}
	return out, nil
}

// IsOrphan says whether r's image no longer exists (or was recreated with another id).
func (s *Store) IsOrphan(ctx context.Context, r Record) (bool, error) { return s.isOrphan(ctx, r) }

func (s *Store) isOrphan(ctx context.Context, r Record) (bool, error) {
	ok, err := s.imageExists(ctx, r.Ref, r.ImageID)
	return !ok, err
}

// RemoveOrphan deletes the claim record of a deleted image, only if the image is still gone
// and the record has not changed since it was checked (one compare-and-delete operation).
func (s *Store) RemoveOrphan(ctx context.Context, img Image) (bool, error) {
	return s.removeOrphan(ctx, img, false)
}

// SweepOrphan is RemoveOrphan for the automatic sweep: it removes only a free record (no
// holder at all), so a claim taken or still listed meanwhile is never removed by a sweep.
func (s *Store) SweepOrphan(ctx context.Context, img Image) (bool, error) {
	return s.removeOrphan(ctx, img, true)
}

func (s *Store) removeOrphan(ctx context.Context, img Image, onlyFree bool) (bool, error) {
	if err := record.ValidateImage(img); err != nil {
		return false, fmt.Errorf("remove orphan %s: %w", img, err)
	}
	for attempt := 0; attempt < maxAttempts; attempt++ {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		rec, ver, err := s.read(ctx, img)
		if err != nil || rec == nil {
			return false, err
		}
		if onlyFree && (!rec.Free() || len(rec.Kept()) > 0) {
			return false, nil // held, or it keeps fences: the image may only have been renamed or moved to the trash
		}
		exists, err := s.imageExists(ctx, img, rec.ImageID)
		if err != nil {
			return false, fmt.Errorf("remove orphan %s: %w", img, err)
		}
		if exists {
			return false, fmt.Errorf("remove orphan %s: %w: the image exists; its claim is not an orphan", img, ErrInvalid)
		}
		// the key goes too only while no image has the name (an image recreated under it may be
		// being claimed on a stale look: model/index.pml, variant u), and only if the index is
		// still at the version read before the object goes (I2): a writer that indexes the image
		// again after this read moves it on, and keeps its key
		named, err := s.imageExists(ctx, img, "")
		if err != nil {
			return false, fmt.Errorf("remove orphan %s: %w", img, err)
		}
		_, idxVer, err := s.b.ReadKeys(ctx, img, IndexObject, []string{img.Image})
		if err != nil {
			return false, fmt.Errorf("remove orphan %s: %w", img, err)
		}
		err = s.b.CompareAndRemove(ctx, img, record.ObjectOf(img), ver)
		if err == nil {
			if idxVer != 0 && !named {
				err := s.b.RemoveKeys(ctx, img, IndexObject, []string{img.Image}, idxVer)
				if errors.Is(err, ErrConflict) {
					_, err = s.DropStaleKey(ctx, img) // the index changed meanwhile: I3 judges the key
				}
				if err != nil {
					return true, fmt.Errorf("remove orphan %s: its claim is removed, its index key is left for the next sweep: %w", img, err)
				}
			}
			return true, nil
		}
		if !errors.Is(err, ErrConflict) {
			return false, fmt.Errorf("remove orphan %s: %w", img, err)
		}
	}
	return false, fmt.Errorf("remove orphan %s: %w", img, ErrBusy)
}
