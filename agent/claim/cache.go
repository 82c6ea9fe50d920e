package claim

import "sync"

// recordCache is what this store last saw of each image, under its own lock: the claim records
// it last read to change them or wrote, with their object versions (updateKnown's first guess,
// which its compare-and-set checks), and the image ids (inspectImage: the watchers of the
// header they name are listed in the same round as the id is read). Bounded by maxKnownIDs:
// when full a map is emptied, and the next look at each image takes one round trip more.
type recordCache struct {
	mu   sync.Mutex
	recs map[Image]readResult
	ids  map[Image]string
}

func newRecordCache() *recordCache {
	return &recordCache{recs: map[Image]readResult{}, ids: map[Image]string{}}
}

// id is the image's id as last seen ("" when none).
func (c *recordCache) id(img Image) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ids[img]
}

// noteID remembers the image's id.
func (c *recordCache) noteID(img Image, id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.ids) >= maxKnownIDs {
		clear(c.ids)
	}
	c.ids[img] = id
}

// remember keeps rec, at object version ver, as the record last seen of img (nil: forget it).
func (c *recordCache) remember(img Image, rec *Record, ver uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if rec == nil {
		delete(c.recs, img)
		return
	}
	if len(c.recs) >= maxKnownIDs {
		clear(c.recs)
	}
	c.recs[img] = readResult{rec: rec.Clone(), ver: ver}
}

// lastSeen is the record last seen of img and its version (nil when none is remembered).
func (c *recordCache) lastSeen(img Image) *readResult {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.recs[img]
	if !ok {
		return nil
	}
	r.rec = r.rec.Clone()
	return &r
}

// maxKnownIDs bounds the record cache's maps and the fenced nodes' marks: when full one is emptied, and the next look at
// or change of each image takes one round trip more.
const maxKnownIDs = 4096

// readResult is one read of a claim record: the record (nil when none), its object version.
type readResult struct {
	rec *Record
	ver uint64
	err error
}
