package claim

import (
	"context"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/claim/record"
)

// Counted wraps a Backend so that every operation it sends is counted by count(op, object):
// op is the call ("read", "write", "remove", "readkeys", "setkeys", "removekeys", "objects",
// "namespaces", "pools", "image", "imageid", "blocklist", "unblocklist"), object the kind of
// the object it is on (ObjectKind; "image" for the image calls, "none" for the rest). Ceph's own
// counters give only totals: this says what each one is spent on.
func Counted(b Backend, count func(op, object string)) Backend {
	return &counted{Backend: b, count: count}
}

type counted struct {
	Backend
	count func(op, object string)
}

func (c *counted) Read(ctx context.Context, loc Image, oid string) ([]byte, uint64, error) {
	c.count("read", ObjectKind(oid))
	return c.Backend.Read(ctx, loc, oid)
}

func (c *counted) CompareAndWrite(ctx context.Context, loc Image, oid string, ver uint64, data []byte) (uint64, error) {
	c.count("write", ObjectKind(oid))
	return c.Backend.CompareAndWrite(ctx, loc, oid, ver, data)
}

func (c *counted) CompareAndRemove(ctx context.Context, loc Image, oid string, ver uint64) error {
	c.count("remove", ObjectKind(oid))
	return c.Backend.CompareAndRemove(ctx, loc, oid, ver)
}

func (c *counted) ReadKeys(ctx context.Context, loc Image, oid string, keys []string) (map[string][]byte, uint64, error) {
	c.count("readkeys", ObjectKind(oid))
	return c.Backend.ReadKeys(ctx, loc, oid, keys)
}

func (c *counted) SetKeys(ctx context.Context, loc Image, oid string, kv map[string][]byte) (uint64, error) {
	c.count("setkeys", ObjectKind(oid))
	return c.Backend.SetKeys(ctx, loc, oid, kv)
}

func (c *counted) RemoveKeys(ctx context.Context, loc Image, oid string, keys []string, ver uint64) error {
	c.count("removekeys", ObjectKind(oid))
	return c.Backend.RemoveKeys(ctx, loc, oid, keys, ver)
}

func (c *counted) Objects(ctx context.Context, pool, namespace string) ([]Image, error) {
	c.count("objects", "none")
	return c.Backend.Objects(ctx, pool, namespace)
}

func (c *counted) Namespaces(ctx context.Context, pool string) ([]string, error) {
	c.count("namespaces", "none")
	return c.Backend.Namespaces(ctx, pool)
}

func (c *counted) Pools(ctx context.Context) ([]string, error) {
	c.count("pools", "none")
	return c.Backend.Pools(ctx)
}

func (c *counted) ImageInfo(ctx context.Context, img Image, knownID string) (record.ImageInfo, error) {
	c.count("image", "image")
	return c.Backend.ImageInfo(ctx, img, knownID)
}

func (c *counted) ImageID(ctx context.Context, img Image) (string, bool, error) {
	c.count("imageid", "image")
	return c.Backend.ImageID(ctx, img)
}

func (c *counted) Blocklist(ctx context.Context, addr string, expire time.Duration) (time.Time, error) {
	c.count("blocklist", "none")
	return c.Backend.Blocklist(ctx, addr, expire)
}

// BlocklistClocked counts as Blocklist does, and tells the monitors' clock where the backend can.
func (c *counted) BlocklistClocked(ctx context.Context, addr string, expire time.Duration) (time.Time, time.Time, error) {
	c.count("blocklist", "none")
	if ca, ok := c.Backend.(record.ClockedAdder); ok {
		return ca.BlocklistClocked(ctx, addr, expire)
	}
	until, err := c.Backend.Blocklist(ctx, addr, expire)
	return until, time.Time{}, err
}

func (c *counted) BlocklistEntries(ctx context.Context) ([]BlockEntry, error) {
	c.count("blocklist-ls", "none")
	return c.Backend.BlocklistEntries(ctx)
}

func (c *counted) Unblocklist(ctx context.Context, addr string) error {
	c.count("unblocklist", "none")
	return c.Backend.Unblocklist(ctx, addr)
}

func (c *counted) AddRange(ctx context.Context, cidr string, expire time.Duration) (time.Time, error) {
	c.count("blocklist", "none")
	return c.Backend.AddRange(ctx, cidr, expire)
}

func (c *counted) RemoveRange(ctx context.Context, cidr string) error {
	c.count("unblocklist", "none")
	return c.Backend.RemoveRange(ctx, cidr)
}
