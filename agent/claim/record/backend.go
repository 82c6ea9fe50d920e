// Package record is the claim protocol's bottom floor: the shared types (the claim record, its
// holders and fences, the blocklist entry, the heartbeat's and the index's object names), the
// errors, and the Backend a store runs on. It does no I/O.
package record

import (
	"context"
	"errors"
	"time"
)

// Backend is everything the claim protocol needs from a cluster, and nothing more: versioned
// reads and compare-and-set writes of one small object per image, two facts about the image,
// and the blocklist. Rados is the real one; Memory keeps the same version semantics in memory
// so that the protocol's decisions are tested without a cluster.
//
// Every method takes a context and must return when it ends (a cluster call that cannot be
// cancelled is bounded by the connection's own timeouts).
type Backend interface {
	// FSID is the cluster's fsid.
	FSID() string
	// Read returns object oid's content and version, in the pool and namespace of loc;
	// (nil, 0, nil) when there is none.
	Read(ctx context.Context, loc Image, oid string) ([]byte, uint64, error)
	// CompareAndWrite replaces the object's content with data if and only if it is still at
	// version ver (0: it must not exist yet), in ONE atomic operation, and returns the object's
	// new version; ErrConflict when the compare fails. Every successful write gives the object a
	// new, higher version (its omap is kept).
	CompareAndWrite(ctx context.Context, loc Image, oid string, ver uint64, data []byte) (uint64, error)
	// CompareAndRemove deletes the object if and only if it is still at version ver;
	// ErrConflict when the compare fails.
	CompareAndRemove(ctx context.Context, loc Image, oid string, ver uint64) error
	// ReadKeys returns object oid's omap values for keys (every key when keys is nil) and the
	// object's version, in one consistent view; (nil, 0, nil) when there is no object.
	ReadKeys(ctx context.Context, loc Image, oid string, keys []string) (map[string][]byte, uint64, error)
	// SetKeys sets omap keys of object oid, creating the object when there is none: one write,
	// whatever the object's version. It returns the object's new version.
	SetKeys(ctx context.Context, loc Image, oid string, kv map[string][]byte) (uint64, error)
	// RemoveKeys removes omap keys of object oid if and only if it is still at version ver, in
	// one operation; ErrConflict when the compare fails (or the object is gone).
	RemoveKeys(ctx context.Context, loc Image, oid string, keys []string, ver uint64) error
	// Objects lists the images that have a claim object in one namespace of a pool: a listing
	// of every object there, which only the one-time index migration does.
	Objects(ctx context.Context, pool, namespace string) ([]Image, error)
	// Namespaces lists the RBD namespaces of a pool (not the default one, "").
	Namespaces(ctx context.Context, pool string) ([]string, error)
	// Pools lists the cluster's pools.
	Pools(ctx context.Context) ([]string, error)
	// ImageInfo returns the image's id and the client addresses watching its header;
	// ErrNotFound when the image does not exist. knownID, when not "", is the id the image had
	// when last seen: its header's watchers may be listed in the same round as the id is read,
	// and are kept only when the id read is that one.
	ImageInfo(ctx context.Context, img Image, knownID string) (ImageInfo, error)
	// ImageID returns the id of the image named img now ("", false when there is none).
	ImageID(ctx context.Context, img Image) (string, bool, error)
	// Blocklist adds a client address to the cluster's blocklist for expire, and returns when
	// it ends as the monitors recorded it, on their clock (what `osd blocklist ls` shows).
	Blocklist(ctx context.Context, addr string, expire time.Duration) (time.Time, error)
	// BlocklistEntries reads every entry of the cluster's blocklist (`osd blocklist ls`),
	// whoever added it: addresses and ranges.
	BlocklistEntries(ctx context.Context) ([]BlockEntry, error)
	// Unblocklist removes a client address from the blocklist (no error when it is not listed).
	Unblocklist(ctx context.Context, addr string) error
	// AddRange adds a range of ips (a CIDR) to the blocklist for expire (`osd blocklist range
	// add`), and returns when it ends as the monitors list it; RemoveRange removes it.
	AddRange(ctx context.Context, cidr string, expire time.Duration) (time.Time, error)
	RemoveRange(ctx context.Context, cidr string) error
	// OwnAddr is this client's own address ("" when unknown): its read-only opens of an
	// image watch it too and are not counted as foreign watchers.
	OwnAddr() string
}

// ErrConflict means the compare of a compare-and-set failed: someone else wrote first.
var ErrConflict = errors.New("claim changed concurrently")

// ClockedAdder is a backend whose blocklist add also tells the monitors' clock as they
// answered it (zero when they did not say): a store learns their time from its first add, even
// one that changes nothing.
type ClockedAdder interface {
	BlocklistClocked(ctx context.Context, addr string, expire time.Duration) (until, monNow time.Time, err error)
}
