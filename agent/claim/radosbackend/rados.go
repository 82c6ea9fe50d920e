// Package radosbackend is the claim Backend on a real cluster: librados's atomic compare-and-set
// operations, the image's header watchers and the monitors' blocklist.
package radosbackend

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"

	"github.com/rbd-owner/rbd-owner/agent/cephconn"
	"github.com/rbd-owner/rbd-owner/agent/claim/record"
	"github.com/rbd-owner/rbd-owner/agent/watchers"
)

// Rados is the Backend on a RADOS connection (owned by the caller).
type Rados struct {
	conn *rados.Conn
	fsid string
}

// New returns the Backend of conn; it reads the cluster's fsid once.
func New(conn *rados.Conn) (*Rados, error) {
	fsid, err := conn.GetFSID()
	if err != nil {
		return nil, cephconn.Classify(fmt.Errorf("claim store: read cluster fsid: %w", err), "get fsid", "mon 'profile rbd'")
	}
	return &Rados{conn: conn, fsid: fsid}, nil
}

const osdCap = "osd 'profile rbd'"

// FSID is the cluster's fsid.
func (r *Rados) FSID() string { return r.fsid }

// ioctx opens a private IOContext for one operation: GetLastVersion is per IOContext, so
// sharing one between goroutines would mix up versions.
func (r *Rados) ioctx(img record.Image) (*rados.IOContext, error) {
	io, err := r.conn.OpenIOContext(img.Pool)
	if cephconn.Code(err) == -int(syscall.ENOENT) {
		return nil, notFound("pool "+img.Pool, "rados", err)
	}
	if err != nil {
		return nil, cephconn.Classify(fmt.Errorf("open pool %s: %w", img.Pool, err), "open pool "+img.Pool, osdCap)
	}
	io.SetNamespace(img.Namespace)
	return io, nil
}

// Read returns object oid's content and version; (nil, 0, nil) when there is none.
func (r *Rados) Read(ctx context.Context, img record.Image, oid string) ([]byte, uint64, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	io, err := r.ioctx(img)
	if err != nil {
		return nil, 0, err
	}
	defer io.Destroy()
	op := rados.CreateReadOp()
	defer op.Release()
	buf := make([]byte, record.MaxRecordSize)
	step := op.Read(0, buf)
	if err := op.Operate(io, oid, rados.OperationNoFlag); err != nil {
		if cephconn.Code(err) == -int(syscall.ENOENT) {
			return nil, 0, nil
		}
		return nil, 0, cephconn.Classify(fmt.Errorf("read %s for %s: %w", oid, img, err), "read "+oid, osdCap)
	}
	ver, err := io.GetLastVersion()
	if err != nil {
		return nil, 0, fmt.Errorf("read claim of %s: version: %w", img, err)
	}
	return buf[:step.BytesRead], ver, nil
}

// CompareAndWrite writes data iff the object is at version ver (0: exclusive create), in one
// RADOS write operation (assert-version or create-exclusive, then write-full), and returns its
// new version.
func (r *Rados) CompareAndWrite(ctx context.Context, img record.Image, oid string, ver uint64, data []byte) (uint64, error) {
	return r.operate(ctx, img, oid, func(op *rados.WriteOp) {
		if ver == 0 {
			op.Create(rados.CreateExclusive)
		} else {
			op.AssertVersion(ver)
		}
		op.WriteFull(data)
	})
}

// CompareAndRemove deletes the object iff it is still at version ver.
func (r *Rados) CompareAndRemove(ctx context.Context, img record.Image, oid string, ver uint64) error {
	_, err := r.operate(ctx, img, oid, func(op *rados.WriteOp) {
		op.AssertVersion(ver)
		op.Remove()
	})
	return err
}

// SetKeys sets omap keys of oid (creating it when absent) in one write.
func (r *Rados) SetKeys(ctx context.Context, loc record.Image, oid string, kv map[string][]byte) (uint64, error) {
	return r.operate(ctx, loc, oid, func(op *rados.WriteOp) {
		op.Create(rados.CreateIdempotent)
		op.SetOmap(kv)
	})
}

// RemoveKeys removes omap keys of oid iff it is still at version ver, in one write.
func (r *Rados) RemoveKeys(ctx context.Context, loc record.Image, oid string, keys []string, ver uint64) error {
	_, err := r.operate(ctx, loc, oid, func(op *rados.WriteOp) {
		op.AssertVersion(ver)
		op.RmOmapKeys(keys)
	})
	return err
}

// omapPage is how many omap values one read returns at most (an OSD's own cap is higher).
const omapPage = 1000

// ReadKeys reads oid's omap values (for keys, or all of them, page by page, each page
// asserting the version of the first) and its version.
func (r *Rados) ReadKeys(ctx context.Context, loc record.Image, oid string, keys []string) (map[string][]byte, uint64, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	io, err := r.ioctx(loc)
	if err != nil {
		return nil, 0, err
	}
	defer io.Destroy()
	out := map[string][]byte{}
	var ver uint64
	after := ""
	for page := 0; ; page++ {
		if err := ctx.Err(); err != nil {
			return nil, 0, err
		}
		op := rados.CreateReadOp()
		if page > 0 {
			op.AssertVersion(ver)
		}
		var all *rados.GetOmapStep
		var some *rados.ReadOpOmapGetValsByKeysStep
		if keys != nil {
			some = op.GetOmapValuesByKeys(keys)
		} else {
			all = op.GetOmapValues(after, "", omapPage)
		}
		err := op.Operate(io, oid, rados.OperationNoFlag)
		if err == nil && page == 0 {
			ver, err = io.GetLastVersion()
		}
		more := false
		if err == nil && some != nil {
			for {
				kv, e := some.Next()
				if e != nil || kv == nil {
					err = e
					break
				}
				out[kv.Key] = append([]byte(nil), kv.Value...)
			}
		}
		if err == nil && all != nil {
			n := 0
			for {
				kv, e := all.Next()
				if e != nil || kv == nil {
					err = e
					break
				}
				out[kv.Key] = append([]byte(nil), kv.Value...)
				after, n = kv.Key, n+1
			}
			more = all.More()
		}
		op.Release()
		switch code := -cephconn.Code(err); {
		case code == int(syscall.ENOENT) && page == 0:
			return nil, 0, nil
		case code == int(syscall.ERANGE) || code == int(syscall.EOVERFLOW) || code == int(syscall.ENOENT):
			return nil, 0, fmt.Errorf("read %s of %s: %w (it changed while it was read; read it again)", oid, record.PoolNS(loc), record.ErrConflict)
		case err != nil:
			return nil, 0, cephconn.Classify(fmt.Errorf("read %s of %s: %w", oid, record.PoolNS(loc), err), "read "+oid, osdCap)
		}
		if !more {
			return out, ver, nil
		}
	}
}

// operate runs one write operation, built by build, on object oid and returns the object's
// new version: a failed compare is ErrConflict.
func (r *Rados) operate(ctx context.Context, img record.Image, oid string, build func(*rados.WriteOp)) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	io, err := r.ioctx(img)
	if err != nil {
		return 0, err
	}
	defer io.Destroy()
	op := rados.CreateWriteOp()
	defer op.Release()
	build(op)
	err = op.Operate(io, oid, rados.OperationNoFlag)
	switch -cephconn.Code(err) {
	case 0:
		if err != nil {
			return 0, err
		}
		ver, err := io.GetLastVersion()
		if err != nil {
			return 0, fmt.Errorf("write %s for %s: version: %w", oid, img, err)
		}
		return ver, nil
	case int(syscall.EEXIST), int(syscall.ERANGE), int(syscall.EOVERFLOW), int(syscall.ENOENT):
		// EEXIST: created meanwhile; ERANGE/EOVERFLOW: version moved on; ENOENT: removed.
		return 0, record.ErrConflict
	}
	return 0, cephconn.Classify(fmt.Errorf("write %s for %s: %w", oid, img, err), "write "+oid, osdCap)
}

// Objects lists the images with a claim object in one namespace of pool, sorted: a listing of
// every object in it (the index's one-time migration only).
func (r *Rados) Objects(ctx context.Context, pool, namespace string) ([]record.Image, error) {
	io, err := r.ioctx(record.Image{Pool: pool, Namespace: namespace})
	if err != nil {
		return nil, err
	}
	defer io.Destroy()
	where := record.PoolNS(record.Image{Pool: pool, Namespace: namespace})
	iter, err := io.Iter()
	if err != nil {
		return nil, cephconn.Classify(fmt.Errorf("list objects of %s: %w", where, err), "list objects of "+where, osdCap)
	}
	defer iter.Close()
	var imgs []record.Image
	for iter.Next() {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if name, ok := strings.CutPrefix(iter.Value(), record.ObjectPrefix); ok && name != "" {
			imgs = append(imgs, record.Image{Pool: pool, Namespace: namespace, Image: name})
		}
	}
	if err := iter.Err(); err != nil {
		return nil, cephconn.Classify(fmt.Errorf("list objects of %s: %w", where, err), "list objects of "+where, osdCap)
	}
	sort.Slice(imgs, func(i, j int) bool { return imgs[i].String() < imgs[j].String() })
	return imgs, nil
}

// Namespaces lists the pool's RBD namespaces (rbd_namespace in its default namespace).
func (r *Rados) Namespaces(_ context.Context, pool string) ([]string, error) {
	io, err := r.ioctx(record.Image{Pool: pool})
	if err != nil {
		return nil, err
	}
	defer io.Destroy()
	ns, err := rbd.NamespaceList(io)
	if cephconn.Code(err) == -int(syscall.ENOENT) {
		return nil, nil // no namespace was ever made in the pool
	}
	if err != nil {
		return nil, cephconn.Classify(fmt.Errorf("list namespaces of pool %s: %w", pool, err), "list namespaces of "+pool, osdCap)
	}
	sort.Strings(ns)
	return ns, nil
}

// Pools lists the cluster's pools.
func (r *Rados) Pools(ctx context.Context) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	pools, err := r.conn.ListPools()
	return pools, cephconn.Classify(err, "list pools", "mon 'profile rbd'")
}

// ImageInfo is the image's id and watchers (what `rbd status` shows): rbd_id.<name> read
// and the header object's watchers listed. With the id last seen (knownID), both are sent at
// once: one round trip when the id read is that one, a second listing when it is not (the
// image was recreated under its name). Without it, two round trips one after the other. An
// image without rbd_id.<name> (the old format 1) is opened read-only instead, which costs ~10.
func (r *Rados) ImageInfo(ctx context.Context, img record.Image, knownID string) (record.ImageInfo, error) {
	if err := ctx.Err(); err != nil {
		return record.ImageInfo{}, err
	}
	io, err := r.ioctx(img)
	if err != nil {
		return record.ImageInfo{}, err
	}
	defer io.Destroy()
	var early []string
	var earlyErr error
	var listed sync.WaitGroup
	if knownID != "" {
		listed.Go(func() { early, earlyErr = r.headerWatchers(img, knownID) }) // joined below, on every path
	}
	id, ok, err := readImageID(io, img)
	listed.Wait()
	if err != nil {
		return record.ImageInfo{}, err
	}
	if !ok {
		return openImageInfo(io, img)
	}
	if id == knownID && earlyErr == nil {
		return record.ImageInfo{ID: id, Watchers: early}, nil
	}
	ws, err := r.headerWatchers(img, id)
	if err != nil {
		return record.ImageInfo{}, err
	}
	return record.ImageInfo{ID: id, Watchers: ws}, nil
}

// headerWatchers lists the watchers of image id's header, in an I/O context of its own (it
// may run beside another read of the image).
func (r *Rados) headerWatchers(img record.Image, id string) ([]string, error) {
	io, err := r.ioctx(img)
	if err != nil {
		return nil, err
	}
	defer io.Destroy()
	ws, err := watchers.List(io, "rbd_header."+id)
	if err != nil {
		// no header: the image is being removed (or never finished being made)
		return nil, cephconn.Classify(fmt.Errorf("image %s: watchers of rbd_header.%s: %w", img, id, err), "list watchers of "+img.String(), osdCap)
	}
	return ws, nil
}

// openImageInfo opens the image read-only for its id and watchers.
func openImageInfo(io *rados.IOContext, img record.Image) (record.ImageInfo, error) {
	im, err := rbd.OpenImageReadOnly(io, img.Image, rbd.NoSnapshot)
	if cephconn.Code(err) == -int(syscall.ENOENT) {
		return record.ImageInfo{}, notFound("image "+img.String(), "rbd", err)
	}
	if err != nil {
		return record.ImageInfo{}, cephconn.Classify(fmt.Errorf("open image %s: %w", img, err), "open image "+img.String(), osdCap)
	}
	defer func() { _ = im.Close() }() // opened read only: its close loses nothing
	id, err := im.GetId()
	if err != nil {
		return record.ImageInfo{}, cephconn.Classify(fmt.Errorf("image %s: id: %w", img, err), "read image "+img.String(), osdCap)
	}
	ws, err := im.ListWatchers()
	if err != nil {
		return record.ImageInfo{}, cephconn.Classify(fmt.Errorf("image %s: watchers: %w", img, err), "list watchers of "+img.String(), osdCap)
	}
	info := record.ImageInfo{ID: id}
	for _, w := range ws {
		info.Watchers = append(info.Watchers, w.Addr)
	}
	return info, nil
}

// notFound is the cluster's ENOENT for what, said once: "image rbd/x not found (rbd: ret=-2)".
func notFound(what, source string, err error) error {
	return &record.NotFoundError{What: what, Code: fmt.Sprintf("%s: ret=%d", source, cephconn.Code(err)), Err: err}
}

// ImageID reads rbd_id.<name>: the id of the image that has that name now.
func (r *Rados) ImageID(ctx context.Context, img record.Image) (string, bool, error) {
	if err := ctx.Err(); err != nil {
		return "", false, err
	}
	io, err := r.ioctx(img)
	if err != nil {
		return "", false, err
	}
	defer io.Destroy()
	return readImageID(io, img)
}

// readImageID reads rbd_id.<name> in io (false when there is none).
func readImageID(io *rados.IOContext, img record.Image) (string, bool, error) {
	buf := make([]byte, 256)
	n, err := io.Read("rbd_id."+img.Image, buf, 0)
	if cephconn.Code(err) == -int(syscall.ENOENT) {
		return "", false, nil
	}
	if err != nil {
		return "", false, cephconn.Classify(fmt.Errorf("image %s: read id: %w", img, err), "read image "+img.String(), osdCap)
	}
	// rbd_id.<name> holds the id as a length-prefixed string (4 bytes little endian + bytes)
	if n < 4 {
		return "", false, fmt.Errorf("image %s: id object too short", img)
	}
	l := int(binary.LittleEndian.Uint32(buf[:4]))
	if l < 0 || 4+l > n {
		return "", false, fmt.Errorf("image %s: id object malformed", img)
	}
	return string(buf[4 : 4+l]), true, nil
}

// Blocklist adds addr to the blocklist (the agent's user needs `allow command "osd blocklist"`)
// and returns when its entry ends as the monitors recorded it (`osd blocklist ls`), on their
// clock, not this node's; this node's estimate only when the list cannot be read.
func (r *Rados) Blocklist(ctx context.Context, addr string, expire time.Duration) (time.Time, error) {
	until, _, err := r.BlocklistClocked(ctx, addr, expire)
	return until, err
}

// BlocklistClocked is Blocklist, with the monitors' clock as their answer named it.
func (r *Rados) BlocklistClocked(ctx context.Context, addr string, expire time.Duration) (time.Time, time.Time, error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, time.Time{}, err
	}
	until, monNow, err := cephconn.BlocklistAdd(r.conn, addr, expire)
	if err != nil {
		return time.Time{}, time.Time{}, err
	}
	if mon, ok, err := r.ListedUntil(addr); err == nil && ok {
		return mon, monNow, nil
	}
	return until, monNow, nil
}

// ListedUntil reads addr's entry from the monitors' blocklist (false when it has none).
func (r *Rados) ListedUntil(addr string) (time.Time, bool, error) {
	entries, err := r.blocklistLs()
	if err != nil {
		return time.Time{}, false, err
	}
	return blocklistExpiry(entries, addr)
}

// blocklistLs reads the monitors' blocklist (`osd blocklist ls`; the agent's user needs
// `mon 'allow r'`, which `profile rbd` grants).
func (r *Rados) blocklistLs() ([]record.BlockEntry, error) {
	out, _, err := r.conn.MonCommand([]byte(`{"prefix":"osd blocklist ls","format":"json"}`))
	if err != nil {
		return nil, cephconn.Classify(fmt.Errorf("osd blocklist ls: %w", err), "osd blocklist ls", cephconn.BlocklistCap)
	}
	return record.ParseBlocklist(out)
}

// BlocklistEntries reads every entry of the cluster's blocklist, addresses and ranges.
func (r *Rados) BlocklistEntries(ctx context.Context) ([]record.BlockEntry, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return r.blocklistLs()
}

// parseBlocklistExpiry finds addr's own expiry in the JSON of `osd blocklist ls`.
func parseBlocklistExpiry(out []byte, addr string) (time.Time, bool, error) {
	entries, err := record.ParseBlocklist(out)
	if err != nil {
		return time.Time{}, false, err
	}
	return blocklistExpiry(entries, addr)
}

// blocklistExpiry finds addr's own entry (not a wider one) among entries.
func blocklistExpiry(entries []record.BlockEntry, addr string) (time.Time, bool, error) {
	for _, e := range entries {
		if e.Addr == "" || e.Addr != record.BareAddr(addr) {
			continue
		}
		if e.Until.IsZero() {
			return time.Time{}, false, fmt.Errorf("osd blocklist ls: %s: expiry not understood", e.Addr)
		}
		return e.Until, true, nil
	}
	return time.Time{}, false, nil
}

// Unblocklist removes addr from the blocklist.
func (r *Rados) Unblocklist(ctx context.Context, addr string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return cephconn.Unblocklist(r.conn, addr)
}

// AddRange adds a range of ips to the blocklist and returns when its entry ends as the monitors
// list it (this node's estimate only when the list cannot be read).
func (r *Rados) AddRange(ctx context.Context, cidr string, expire time.Duration) (time.Time, error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, err
	}
	until, err := cephconn.BlocklistRange(r.conn, cidr, expire)
	if err != nil {
		return time.Time{}, err
	}
	p, perr := netip.ParsePrefix(cidr)
	entries, lerr := r.blocklistLs()
	if perr == nil && lerr == nil {
		for _, e := range entries {
			if e.Range == p && !e.Until.IsZero() {
				return e.Until, nil
			}
		}
	}
	return until, nil
}

// RemoveRange removes a range of ips from the blocklist.
func (r *Rados) RemoveRange(ctx context.Context, cidr string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return cephconn.UnblocklistRange(r.conn, cidr)
}

// OwnAddr is this connection's client address ("" when unknown).
func (r *Rados) OwnAddr() string {
	a, err := r.conn.GetAddrs()
	if err != nil {
		return ""
	}
	return a
}
