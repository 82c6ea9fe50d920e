package claim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/claim/record"
)

// The claim index. Every pool and namespace that has claim objects has one index object,
// rbd-owner.claims, beside them (the way rbd_directory lists images): its omap keys are the
// names of the images that have a claim object there. Nothing lists a pool to find the claims;
// the sweeps, `claims`, orphan detection and status read the index and the claim objects it
// names. The rules (model/index.pml checks them, with crashes at every step):
//   - I1: a writer sets the image's key BEFORE it first creates the claim object (or first
//     rewrites a record of an older format, which an older agent may have made unindexed).
//     A crash in between leaves at worst a key with no object.
//   - I2: the orphan removal reads the index's version, removes the claim object (compare and
//     delete), and then removes the key only if the index is still at that version: a writer
//     that set the key again meanwhile keeps it.
//   - I3: the sweep drops a key with no object, only while the image is gone by name and only
//     if the index has not changed since it read it.
// So a claim object of an image that exists is always indexed; a key with no object costs
// one read per sweep until the image is deleted.
//
// Reserved keys start with "/", which no image name has: "/built" says that the namespace's
// claim objects were listed into the index once (the migration from agents before the
// index), "/swept" is the last sweep of the namespace (who, a sequence), so that the nodes of a
// fleet sweep it about once per period between them rather than each one.

const (
	indexBuiltKey = "/built"
	indexSweptKey = "/swept"
)

// indexEntry is an index key's value: who indexed the claim, when (for people).
type indexEntry struct {
	By string    `json:"by"`
	At time.Time `json:"at"`
}

// indexMark is a reserved key's value: who wrote it, when, and (for "/swept") a sequence.
type indexMark struct {
	By    string    `json:"by"`
	At    time.Time `json:"at"`
	Seq   uint64    `json:"seq,omitempty"`
	Found int       `json:"found,omitempty"` // "/built": the claim objects the listing found
}

// Index is what a pool and namespace's index says.
type Index struct {
	Pool, Namespace string
	// Images are the indexed images, sorted.
	Images []string
	// Version is the index object's version when read (0: there is none).
	Version uint64
	// Built is false until the namespace's claim objects have been listed into the index once.
	Built bool
	// Swept is the sequence of the last sweep of the namespace (0: never).
	Swept uint64
}

// indexAdd sets img's key in its namespace's index (I1).
func (s *Store) indexAdd(ctx context.Context, img Image) error {
	v, err := json.Marshal(indexEntry{By: s.cfg.Node.ID, At: s.cfg.Now().UTC()})
	if err != nil {
		return err
	}
	if _, err := s.b.SetKeys(ctx, img, IndexObject, map[string][]byte{img.Image: v}); err != nil {
		return fmt.Errorf("index the claim of %s in %s: %w", img, record.PoolNS(img), err)
	}
	return nil
}

// ReadIndex reads the claim index of a pool and namespace.
func (s *Store) ReadIndex(ctx context.Context, pool, namespace string) (Index, error) {
	loc := Image{Pool: pool, Namespace: namespace}
	kv, ver, err := s.b.ReadKeys(ctx, loc, IndexObject, nil)
	if err != nil {
		return Index{}, fmt.Errorf("read the claim index of %s: %w", record.PoolNS(loc), err)
	}
	idx := Index{Pool: pool, Namespace: namespace, Version: ver}
	for k, v := range kv {
		switch {
		case k == indexBuiltKey:
			idx.Built = true
		case k == indexSweptKey:
			var m indexMark
			if json.Unmarshal(v, &m) == nil {
				idx.Swept = m.Seq
			}
		case !strings.HasPrefix(k, "/"):
			idx.Images = append(idx.Images, k)
		}
	}
	sort.Strings(idx.Images)
	return idx, nil
}

// MarkSwept records a sweep of the namespace (the sequence after seen), so that other nodes
// that look before the next period skip theirs.
func (s *Store) MarkSwept(ctx context.Context, pool, namespace string, seen uint64) error {
	v, err := json.Marshal(indexMark{By: s.cfg.Node.ID, At: s.cfg.Now().UTC(), Seq: seen + 1})
	if err != nil {
		return err
	}
	loc := Image{Pool: pool, Namespace: namespace}
	if _, err := s.b.SetKeys(ctx, loc, IndexObject, map[string][]byte{indexSweptKey: v}); err != nil {
		return fmt.Errorf("record the sweep of %s: %w", record.PoolNS(loc), err)
	}
	return nil
}

// BuildIndex is the one-time migration of a namespace from agents before the index: it lists
// every object in it (the only listing rbd-owner ever does), indexes every claim object it
// finds, and marks the index built. It returns how many claim objects it found. A namespace
// with neither claims nor an index is left untouched (and listed again the next time) unless
// markEmpty.
func (s *Store) BuildIndex(ctx context.Context, pool, namespace string, markEmpty bool) (int, error) {
	loc := Image{Pool: pool, Namespace: namespace}
	imgs, err := s.b.Objects(ctx, pool, namespace)
	if err != nil {
		return 0, fmt.Errorf("build the claim index of %s: %w", record.PoolNS(loc), err)
	}
	if len(imgs) == 0 && !markEmpty {
		// no claim here: a pool or namespace rbd-owner never used (another application's, say)
		// is left without an object of rbd-owner's; its next listing lists it again
		if _, ver, err := s.b.ReadKeys(ctx, loc, IndexObject, []string{indexBuiltKey}); err != nil || ver == 0 {
			return 0, err
		}
	}
	now := s.cfg.Now().UTC()
	entry, err := json.Marshal(indexEntry{By: s.cfg.Node.ID, At: now})
	if err != nil {
		return 0, err
	}
	// in pages, so that no write is large; the "/built" mark comes with the last one
	for start := 0; ; start += omapWritePage {
		kv := map[string][]byte{}
		for _, img := range imgs[start:min(start+omapWritePage, len(imgs))] {
			kv[img.Image] = entry
		}
		last := start+omapWritePage >= len(imgs)
		if last {
			mark, err := json.Marshal(indexMark{By: s.cfg.Node.ID, At: now, Found: len(imgs)})
			if err != nil {
				return 0, err
			}
			kv[indexBuiltKey] = mark
		}
		if _, err := s.b.SetKeys(ctx, loc, IndexObject, kv); err != nil {
			return 0, fmt.Errorf("build the claim index of %s: %w", record.PoolNS(loc), err)
		}
		if last {
			return len(imgs), nil
		}
	}
}

// omapWritePage bounds the keys one index write sets.
const omapWritePage = 500

// DropStaleKey removes img's index key when it names no claim object and the image is gone by
// name (I3): it reads the index's version, then the claim object (none), then the image (gone),
// and removes the key only if the index is still at that version; a few times over when the
// index changes meanwhile. It returns true when it removed the key.
func (s *Store) DropStaleKey(ctx context.Context, img Image) (bool, error) {
	for attempt := 0; attempt < 4; attempt++ {
		kv, idxVer, err := s.b.ReadKeys(ctx, img, IndexObject, []string{img.Image})
		if err != nil {
			return false, fmt.Errorf("drop the index key of %s: %w", img, err)
		}
		if _, ok := kv[img.Image]; !ok {
			return false, nil
		}
		if _, ver, err := s.read(ctx, img); err != nil || ver != 0 {
			return false, err
		}
		exists, err := s.imageExists(ctx, img, "")
		if err != nil || exists {
			return false, err // an acquire may be on its way between its two writes: leave it
		}
		err = s.b.RemoveKeys(ctx, img, IndexObject, []string{img.Image}, idxVer)
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, ErrConflict) {
			return false, fmt.Errorf("drop the index key of %s: %w", img, err)
		}
	}
	return false, nil // the index keeps changing: judged again at the next sweep
}

// SweptMark reads the sequence of the last sweep of a pool and namespace (0: never swept, or
// no index): one small read, so that a node that finds it moved since its last look need not
// sweep.
func (s *Store) SweptMark(ctx context.Context, pool, namespace string) (uint64, error) {
	loc := Image{Pool: pool, Namespace: namespace}
	kv, _, err := s.b.ReadKeys(ctx, loc, IndexObject, []string{indexSweptKey})
	if err != nil {
		return 0, fmt.Errorf("read the claim index of %s: %w", record.PoolNS(loc), err)
	}
	var m indexMark
	if v, ok := kv[indexSweptKey]; ok && json.Unmarshal(v, &m) == nil {
		return m.Seq, nil
	}
	return 0, nil
}

// Namespaces returns the namespaces of a pool whose claims a pool-wide operation covers: the
// default one, the pool's RBD namespaces, and the extra ones given (all of them, with the
// error, when the pool's namespaces cannot be listed: a user limited to one namespace).
func (s *Store) Namespaces(ctx context.Context, pool string, extra ...string) ([]string, error) {
	return s.placesOf(ctx, pool, extra...)
}

func (s *Store) placesOf(ctx context.Context, pool string, extra ...string) ([]string, error) {
	ns, err := s.b.Namespaces(ctx, pool)
	out := append([]string{""}, ns...)
	for _, e := range extra {
		if !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	return out, err
}

// Notices. Whoever changes another node's hold (a takeover that fenced it, an admin's fence, a
// force-release) leaves a notice in that node's notice object in the claim's pool and
// namespace, after its write to the claim: the key is the image, the value the hold's epoch.
// A holder reads its notice object in each place it holds claims in once per renew interval,
// and re-reads at once the claims named with its epoch, so that it learns of a lost claim
// within one interval without reading every claim every interval. The notice is NOT in the
// heartbeat object: observers judge a node's liveness by that object's version, and a notice
// written there would look like a renewal. A notice lost to a crash between the two writes is
// made up for by the slow check of every claim (the daemon's claim_check_interval).

// RetryNotices tries again to write the notices that could not be written, and returns how
// many are still pending and the errors of this try.
func (s *Store) RetryNotices(ctx context.Context) (int, []error) { return s.notices.retry(ctx) }

// Notices reads this node's notices in a pool and namespace, and the notice object's version
// (for ClearNotices); none when there is no notice object.
func (s *Store) Notices(ctx context.Context, pool, namespace string) ([]Notice, uint64, error) {
	return s.notices.read(ctx, pool, namespace)
}

// ClearNotices removes handled notices, only if the notice object is still at version ver (a
// notice written since is read at the next round).
func (s *Store) ClearNotices(ctx context.Context, pool, namespace string, images []string, ver uint64) error {
	return s.notices.clear(ctx, pool, namespace, images, ver)
}
