package daemon

import (
	"context"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/claim"
)

// The fleet benchmark's wrapper of claim.Backend for this revision's interface (the counting
// itself is in fleet_count_test.go). tests/bench/fleet builds the revision before the claim index
// with tests/bench/fleet-backend-before.go.txt in place of this file: its interface differs.

// countingBackend is a node's claim.Backend with its cluster calls counted in c.
type countingBackend struct {
	claim.Backend
	c *fleetCounts
}

func (b countingBackend) Read(ctx context.Context, loc claim.Image, oid string) ([]byte, uint64, error) {
	t := time.Now()
	data, ver, err := b.Backend.Read(ctx, loc, oid)
	b.c.add("read "+objectClass(oid), t, err)
	return data, ver, err
}

func (b countingBackend) CompareAndWrite(ctx context.Context, loc claim.Image, oid string, ver uint64, data []byte) (uint64, error) {
	t := time.Now()
	v, err := b.Backend.CompareAndWrite(ctx, loc, oid, ver, data)
	b.c.add("cas-write "+objectClass(oid), t, err)
	return v, err
}

func (b countingBackend) ReadKeys(ctx context.Context, loc claim.Image, oid string, keys []string) (map[string][]byte, uint64, error) {
	t := time.Now()
	kv, ver, err := b.Backend.ReadKeys(ctx, loc, oid, keys)
	b.c.add("omap-read "+objectClass(oid), t, err)
	return kv, ver, err
}

func (b countingBackend) SetKeys(ctx context.Context, loc claim.Image, oid string, kv map[string][]byte) (uint64, error) {
	t := time.Now()
	v, err := b.Backend.SetKeys(ctx, loc, oid, kv)
	b.c.add("omap-write "+objectClass(oid), t, err)
	return v, err
}

func (b countingBackend) RemoveKeys(ctx context.Context, loc claim.Image, oid string, keys []string, ver uint64) error {
	t := time.Now()
	err := b.Backend.RemoveKeys(ctx, loc, oid, keys, ver)
	b.c.add("omap-remove "+objectClass(oid), t, err)
	return err
}

func (b countingBackend) Namespaces(ctx context.Context, pool string) ([]string, error) {
	t := time.Now()
	ns, err := b.Backend.Namespaces(ctx, pool)
	b.c.add("list-namespaces", t, err)
	return ns, err
}

func (b countingBackend) CompareAndRemove(ctx context.Context, loc claim.Image, oid string, ver uint64) error {
	t := time.Now()
	err := b.Backend.CompareAndRemove(ctx, loc, oid, ver)
	b.c.add("cas-remove "+objectClass(oid), t, err)
	return err
}

func (b countingBackend) Objects(ctx context.Context, pool, namespace string) ([]claim.Image, error) {
	t := time.Now()
	imgs, err := b.Backend.Objects(ctx, pool, namespace)
	b.c.add("list-objects", t, err)
	b.c.items("list-objects", len(imgs))
	return imgs, err
}

func (b countingBackend) Pools(ctx context.Context) ([]string, error) {
	t := time.Now()
	ps, err := b.Backend.Pools(ctx)
	b.c.add("list-pools", t, err)
	return ps, err
}

func (b countingBackend) ImageID(ctx context.Context, img claim.Image) (string, bool, error) {
	t := time.Now()
	id, ok, err := b.Backend.ImageID(ctx, img)
	b.c.add("image-id", t, err)
	return id, ok, err
}

func (b countingBackend) Blocklist(ctx context.Context, addr string, expire time.Duration) (time.Time, error) {
	t := time.Now()
	until, err := b.Backend.Blocklist(ctx, addr, expire)
	b.c.add("blocklist (mon)", t, err)
	return until, err
}

func (b countingBackend) Unblocklist(ctx context.Context, addr string) error {
	t := time.Now()
	err := b.Backend.Unblocklist(ctx, addr)
	b.c.add("unblocklist (mon)", t, err)
	return err
}
