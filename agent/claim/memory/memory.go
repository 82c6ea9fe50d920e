// Package memory is a claim Backend in memory, with the version semantics of RADOS: the
// protocol's decisions are tested with it, without a cluster. It is no part of the agent.
package memory

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/claim/record"
)

// Memory is a Backend in memory with RADOS's version semantics: every successful write gives
// the object a new, higher version; CompareAndWrite at version 0 is an exclusive create;
// a compare against any other version than the current one fails with ErrConflict. It also
// plays the image side (ids, watchers) and the blocklist. Safe for concurrent use.
//
// A hook (SetHook), when set, runs at the start of every call with the call's name ("read", "write",
// "remove", "readkeys", "setkeys", "removekeys", "objects", "namespaces", "pools", "image",
// "imageid", "blocklist", "unblocklist"); an error it returns is the
// call's error. Tests use it to fail, count, or block calls (a stalled cluster).
type Memory struct {
	fsid string

	mu          sync.Mutex
	objects     map[memKey]memObject
	images      map[record.Image]memImage
	pools       map[string]bool
	namespaces  map[string][]string // pool: its RBD namespaces
	counts      map[string]int      // calls by call and object kind (Counts)
	blocklisted map[string]time.Time
	ranges      map[netip.Prefix]time.Time // `osd blocklist range add`
	version     uint64
	own         string
	onCall      func(ctx context.Context, call string, img record.Image) error
	clock       func() time.Time // the monitors' clock: blocklist entries expire on it
}

// memKey is one object: its pool and namespace, and its name.
type memKey struct {
	pool, namespace, oid string
}

func keyOf(loc record.Image, oid string) memKey { return memKey{loc.Pool, loc.Namespace, oid} }

type memObject struct {
	data []byte
	omap map[string][]byte
	ver  uint64
}

type memImage struct {
	id       string
	watchers []string
}

// New returns an empty in-memory cluster with the given fsid.
func New(fsid string) *Memory {
	return &Memory{fsid: fsid, objects: map[memKey]memObject{}, images: map[record.Image]memImage{}, pools: map[string]bool{},
		namespaces: map[string][]string{}, counts: map[string]int{}, blocklisted: map[string]time.Time{},
		ranges: map[netip.Prefix]time.Time{}}
}

// AddImage creates (or recreates, with a new id) an image.
func (m *Memory) AddImage(img record.Image, id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.images[record.Image{Pool: img.Pool, Namespace: img.Namespace, Image: img.Image}] = memImage{id: id}
	m.pools[img.Pool] = true
	if img.Namespace != "" && !slices.Contains(m.namespaces[img.Pool], img.Namespace) {
		m.namespaces[img.Pool] = append(m.namespaces[img.Pool], img.Namespace) // an image's namespace exists
		sort.Strings(m.namespaces[img.Pool])
	}
}

// AddNamespace makes an RBD namespace of pool exist (an image's is made by AddImage).
func (m *Memory) AddNamespace(pool, namespace string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !slices.Contains(m.namespaces[pool], namespace) {
		m.namespaces[pool] = append(m.namespaces[pool], namespace)
	}
}

// Counts returns how many calls were made, by call and object kind ("read claim",
// "write heartbeat", "setkeys index", "objects", ...), since the memory was made or last reset.
func (m *Memory) Counts(reset bool) map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := m.counts
	if reset {
		m.counts = map[string]int{}
	} else {
		out = maps.Clone(out)
	}
	return out
}

// Keys returns object oid's omap (nil when there is no object), as another client would read it.
func (m *Memory) Keys(loc record.Image, oid string) map[string][]byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	o, ok := m.objects[keyOf(loc, oid)]
	if !ok {
		return nil
	}
	return maps.Clone(o.omap)
}

// Remove deletes an object as another client would (a person with `rados rm`).
func (m *Memory) Remove(loc record.Image, oid string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.objects, keyOf(loc, oid))
}

// RemoveImage deletes an image (its claim object stays, as with `rbd rm`).
func (m *Memory) RemoveImage(img record.Image) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.images, img)
}

// SetWatchers sets the client addresses watching an image's header.
func (m *Memory) SetWatchers(img record.Image, addrs ...string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	im := m.images[img]
	im.watchers = append([]string(nil), addrs...)
	m.images[img] = im
}

// SetOwnAddr sets this client's address (OwnAddr).
func (m *Memory) SetOwnAddr(a string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.own = a
}

// SetClock sets the monitors' clock, on which blocklist entries expire (default time.Now).
func (m *Memory) SetClock(now func() time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.clock = now
}

func (m *Memory) now() time.Time {
	if m.clock != nil {
		return m.clock()
	}
	return time.Now()
}

// BlocklistedUntil returns when addr's blocklist entry expires, and whether it is listed (an
// entry is listed until the monitors' clock reaches its expiry, as Ceph's are).
func (m *Memory) BlocklistedUntil(addr string) (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	until, ok := m.blocklisted[addr]
	if !ok || !m.now().Before(until) {
		return time.Time{}, false
	}
	return until, true
}

// Blocklisted says whether addr is cut off as the OSDs judge it: its own entry, its ip's
// (ip:0/0) or a range holding its ip, none expired.
func (m *Memory) Blocklisted(addr string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := record.Covering(m.entries(), addr)
	return ok
}

// entries is the blocklist as `osd blocklist ls` shows it (mu held): the entries not expired.
func (m *Memory) entries() []record.BlockEntry {
	var out []record.BlockEntry
	now := m.now()
	for a, until := range m.blocklisted {
		if now.Before(until) {
			out = append(out, record.BlockEntry{Addr: a, Until: until})
		}
	}
	for p, until := range m.ranges {
		if now.Before(until) {
			out = append(out, record.BlockEntry{Range: p, Until: until})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// BlocklistRange adds a range entry for expire, as `osd blocklist range add CIDR` does (what
// ceph-csi's fencing of a node Kubernetes declared out of service adds, or a NetworkFence).
func (m *Memory) BlocklistRange(cidr string, expire time.Duration) error {
	p, err := record.ParseRange(cidr)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ranges[p] = m.now().Add(expire)
	m.dropWatchers()
	return nil
}

// UnblocklistRange removes a range entry (`osd blocklist range rm`).
func (m *Memory) UnblocklistRange(cidr string) error {
	p, err := record.ParseRange(cidr)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.ranges, p)
	return nil
}

// dropWatchers drops the watches of blocklisted clients, as the OSDs do (mu held).
func (m *Memory) dropWatchers() {
	entries := m.entries()
	for k, im := range m.images {
		var kept []string
		for _, w := range im.watchers {
			if _, cut := record.Covering(entries, w); !cut {
				kept = append(kept, w)
			}
		}
		im.watchers = kept
		m.images[k] = im
	}
}

// Version is the claim object's current version (0: none).
func (m *Memory) Version(img record.Image) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.objects[keyOf(img, record.ObjectOf(img))].ver
}

// Put writes an object's data as another client would (a new version, its omap kept), e.g.
// a record of an older format.
func (m *Memory) Put(loc record.Image, oid string, data []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.version++
	k := keyOf(loc, oid)
	m.objects[k] = memObject{data: append([]byte(nil), data...), omap: m.objects[k].omap, ver: m.version}
}

func (m *Memory) hook(ctx context.Context, call string, img record.Image, oid ...string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	h := m.onCall
	name := call
	if len(oid) > 0 {
		name += " " + record.ObjectKind(oid[0])
	}
	m.counts[name]++
	m.mu.Unlock()
	if h != nil {
		return h(ctx, call, img)
	}
	return nil
}

// SetHook sets the hook (safe while calls run; nil removes it).
func (m *Memory) SetHook(h func(ctx context.Context, call string, img record.Image) error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.onCall = h
}

// FSID is the cluster's fsid.
func (m *Memory) FSID() string { return m.fsid }

// Read returns the object's content and version.
func (m *Memory) Read(ctx context.Context, img record.Image, oid string) ([]byte, uint64, error) {
	if err := m.hook(ctx, "read", img, oid); err != nil {
		return nil, 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.pools[img.Pool] {
		return nil, 0, &record.NotFoundError{What: "pool " + img.Pool}
	}
	o, ok := m.objects[keyOf(img, oid)]
	if !ok {
		return nil, 0, nil
	}
	return append([]byte(nil), o.data...), o.ver, nil
}

// CompareAndWrite writes iff the object is at ver (0: does not exist); the omap is kept.
func (m *Memory) CompareAndWrite(ctx context.Context, img record.Image, oid string, ver uint64, data []byte) (uint64, error) {
	if err := m.hook(ctx, "write", img, oid); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.pools[img.Pool] {
		return 0, &record.NotFoundError{What: "pool " + img.Pool}
	}
	k := keyOf(img, oid)
	o, ok := m.objects[k]
	if (ver == 0 && ok) || (ver != 0 && (!ok || o.ver != ver)) {
		return 0, record.ErrConflict
	}
	m.version++
	m.objects[k] = memObject{data: append([]byte(nil), data...), omap: o.omap, ver: m.version}
	return m.version, nil
}

// CompareAndRemove deletes iff the object is at ver.
func (m *Memory) CompareAndRemove(ctx context.Context, img record.Image, oid string, ver uint64) error {
	if err := m.hook(ctx, "remove", img, oid); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	k := keyOf(img, oid)
	o, ok := m.objects[k]
	if !ok || o.ver != ver {
		return record.ErrConflict
	}
	delete(m.objects, k)
	return nil
}

// ReadKeys returns the object's omap values for keys (all when nil) and its version.
func (m *Memory) ReadKeys(ctx context.Context, loc record.Image, oid string, keys []string) (map[string][]byte, uint64, error) {
	if err := m.hook(ctx, "readkeys", loc, oid); err != nil {
		return nil, 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.pools[loc.Pool] {
		return nil, 0, &record.NotFoundError{What: "pool " + loc.Pool}
	}
	o, ok := m.objects[keyOf(loc, oid)]
	if !ok {
		return nil, 0, nil
	}
	out := map[string][]byte{}
	for k, v := range o.omap {
		if keys == nil || slices.Contains(keys, k) {
			out[k] = append([]byte(nil), v...)
		}
	}
	return out, o.ver, nil
}

// SetKeys sets omap keys, creating the object when there is none.
func (m *Memory) SetKeys(ctx context.Context, loc record.Image, oid string, kv map[string][]byte) (uint64, error) {
	if err := m.hook(ctx, "setkeys", loc, oid); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.pools[loc.Pool] {
		return 0, &record.NotFoundError{What: "pool " + loc.Pool}
	}
	k := keyOf(loc, oid)
	o := m.objects[k]
	om := maps.Clone(o.omap)
	if om == nil {
		om = map[string][]byte{}
	}
	for key, v := range kv {
		om[key] = append([]byte(nil), v...)
	}
	m.version++
	m.objects[k] = memObject{data: o.data, omap: om, ver: m.version}
	return m.version, nil
}

// RemoveKeys removes omap keys iff the object is at ver.
func (m *Memory) RemoveKeys(ctx context.Context, loc record.Image, oid string, keys []string, ver uint64) error {
	if err := m.hook(ctx, "removekeys", loc, oid); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	k := keyOf(loc, oid)
	o, ok := m.objects[k]
	if !ok || o.ver != ver {
		return record.ErrConflict
	}
	om := maps.Clone(o.omap)
	for _, key := range keys {
		delete(om, key)
	}
	m.version++
	m.objects[k] = memObject{data: o.data, omap: om, ver: m.version}
	return nil
}

// Objects lists the images with a claim object in one namespace of pool, sorted.
func (m *Memory) Objects(ctx context.Context, pool, namespace string) ([]record.Image, error) {
	if err := m.hook(ctx, "objects", record.Image{Pool: pool, Namespace: namespace}); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.pools[pool] {
		return nil, fmt.Errorf("list claims of pool %s: %w", pool, record.ErrNotFound)
	}
	var out []record.Image
	for k := range m.objects {
		if name, ok := strings.CutPrefix(k.oid, record.ObjectPrefix); ok && k.pool == pool && k.namespace == namespace && name != "" {
			out = append(out, record.Image{Pool: k.pool, Namespace: k.namespace, Image: name})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out, nil
}

// Namespaces lists the pool's RBD namespaces (AddNamespace).
func (m *Memory) Namespaces(ctx context.Context, pool string) ([]string, error) {
	if err := m.hook(ctx, "namespaces", record.Image{Pool: pool}); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.pools[pool] {
		return nil, &record.NotFoundError{What: "pool " + pool}
	}
	return slices.Clone(m.namespaces[pool]), nil
}

// Pools lists the pools that have images.
func (m *Memory) Pools(ctx context.Context) ([]string, error) {
	if err := m.hook(ctx, "pools", record.Image{}); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for p := range m.pools {
		out = append(out, p)
	}
	sort.Strings(out)
	return out, nil
}

// ImageInfo returns the image's id and watchers; ErrNotFound when it does not exist. The id
// last seen changes nothing here: one call reads both at once.
func (m *Memory) ImageInfo(ctx context.Context, img record.Image, _ string) (record.ImageInfo, error) {
	if err := m.hook(ctx, "image", img); err != nil {
		return record.ImageInfo{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	im, ok := m.images[img]
	if !ok {
		return record.ImageInfo{}, &record.NotFoundError{What: "image " + img.String()}
	}
	return record.ImageInfo{ID: im.id, Watchers: append([]string(nil), im.watchers...)}, nil
}

// ImageID returns the id of the image named img now.
func (m *Memory) ImageID(ctx context.Context, img record.Image) (string, bool, error) {
	if err := m.hook(ctx, "imageid", img); err != nil {
		return "", false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	im, ok := m.images[img]
	return im.id, ok, nil
}

// Blocklist adds addr until expire from now, as the monitors do: an address that is listed
// already (not expired) keeps its entry and that entry's expiry, whatever expire asks (Ceph
// 16.2, 18.2 and 20.2: OSDMap::apply_incremental inserts new entries without replacing one
// that is there). It returns the expiry as listed afterwards.
func (m *Memory) Blocklist(ctx context.Context, addr string, expire time.Duration) (time.Time, error) {
	until, _, err := m.BlocklistClocked(ctx, addr, expire)
	return until, err
}

// BlocklistClocked is Blocklist, with the monitors' clock (this cluster's) at the add, which
// their answer names whether or not the add changed the entry.
func (m *Memory) BlocklistClocked(ctx context.Context, addr string, expire time.Duration) (time.Time, time.Time, error) {
	if err := m.hook(ctx, "blocklist", record.Image{}); err != nil {
		return time.Time{}, time.Time{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	if until, ok := m.blocklisted[addr]; ok && now.Before(until) {
		return until, now, nil
	}
	until := now.Add(expire)
	m.blocklisted[addr] = until
	m.dropWatchers()
	return until, now, nil
}

// AddRange adds a range entry for expire, as `osd blocklist range add CIDR EXPIRE` does: a range
// listed already keeps its expiry. It returns the expiry as listed.
func (m *Memory) AddRange(ctx context.Context, cidr string, expire time.Duration) (time.Time, error) {
	if err := m.hook(ctx, "blocklist", record.Image{}); err != nil {
		return time.Time{}, err
	}
	p, err := record.ParseRange(cidr)
	if err != nil {
		return time.Time{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if until, ok := m.ranges[p]; ok && m.now().Before(until) {
		return until, nil
	}
	until := m.now().Add(expire)
	m.ranges[p] = until
	m.dropWatchers()
	return until, nil
}

// RemoveRange removes a range entry (`osd blocklist range rm`).
func (m *Memory) RemoveRange(ctx context.Context, cidr string) error {
	if err := m.hook(ctx, "unblocklist", record.Image{}); err != nil {
		return err
	}
	return m.UnblocklistRange(cidr)
}

// ClearBlocklist removes every entry, addresses and ranges, as `ceph osd blocklist clear` does.
func (m *Memory) ClearBlocklist() {
	m.mu.Lock()
	defer m.mu.Unlock()
	clear(m.blocklisted)
	clear(m.ranges)
}

// BlocklistEntries lists the entries not expired, addresses and ranges.
func (m *Memory) BlocklistEntries(ctx context.Context) ([]record.BlockEntry, error) {
	if err := m.hook(ctx, "blocklist-ls", record.Image{}); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.entries(), nil
}

// Unblocklist removes addr from the blocklist.
func (m *Memory) Unblocklist(ctx context.Context, addr string) error {
	if err := m.hook(ctx, "unblocklist", record.Image{}); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.blocklisted, addr)
	return nil
}

// OwnAddr is this client's address.
func (m *Memory) OwnAddr() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.own
}
