// Package claim is the ownership protocol: one claim record per RBD image, kept in a RADOS
// object in the image's own pool and namespace, and changed only by single atomic RADOS write
// operations that compare and set (exclusive create, or assert-version + write-full). Two
// nodes that read "free" at the same instant cannot both win: the second write fails its
// compare and the loser re-reads the record and sees the winner.
//
// A holder's epoch is its fencing token: it is unique for the life of the record and rises
// at every change of holder. Taking an image from a dead node first blocklists the exact client
// address of that node's mapping (or its host address when no mapping was recorded yet), and
// only then writes the new holder at a higher epoch. Every step is safe to repeat after a crash.
package claim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"syscall"
	"time"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"

	"github.com/rbd-owner/rbd-owner/agent/cephconn"
)

// Node is who this agent is.
type Node struct {
	ID       string // node_id: the machine-id unless configured
	Hostname string
	// Addr returns the node's current source address toward the monitors (may be nil).
	Addr func() string
	// AgentVersion is recorded in every holder entry.
	AgentVersion string
}

// Config configures a Store.
type Config struct {
	Node Node
	// Lease is how long a hold lasts without renewal (default 60 s).
	Lease time.Duration
	// FenceExpiry is how long a fenced address stays blocklisted (default 7 days: long
	// enough to outlive a node that reboots, unlike Ceph's one-hour default).
	FenceExpiry time.Duration
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
}

// Defaults.
const (
	DefaultLease       = 60 * time.Second
	DefaultFenceExpiry = 7 * 24 * time.Hour
)

// Store reads and changes the claims of one cluster through one RADOS connection.
// It is safe for concurrent use.
type Store struct {
	conn *rados.Conn
	fsid string
	cfg  Config
	// afterFence runs after each blocklisting (tests use it to interleave a holder's renewal)
	afterFence func()
}

// NewStore returns a Store on conn (owned by the caller).
func NewStore(conn *rados.Conn, cfg Config) (*Store, error) {
	if cfg.Node.ID == "" {
		return nil, errors.New("claim store: node id is empty")
	}
	if cfg.Lease <= 0 {
		cfg.Lease = DefaultLease
	}
	if cfg.Lease < time.Second {
		return nil, fmt.Errorf("claim store: lease %s is shorter than a second", cfg.Lease)
	}
	if cfg.FenceExpiry <= 0 {
		cfg.FenceExpiry = DefaultFenceExpiry
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	fsid, err := conn.GetFSID()
	if err != nil {
		return nil, cephconn.Classify(fmt.Errorf("claim store: read cluster fsid: %w", err), "get fsid", "mon 'profile rbd'")
	}
	return &Store{conn: conn, fsid: fsid, cfg: cfg}, nil
}

// FSID is the cluster's fsid.
func (s *Store) FSID() string { return s.fsid }

// NodeID is this agent's node id.
func (s *Store) NodeID() string { return s.cfg.Node.ID }

const osdCap = "osd 'profile rbd'"

// ioctx opens a private IOContext for one operation: GetLastVersion is per IOContext, so
// sharing one between goroutines would mix up versions.
func (s *Store) ioctx(img Image) (*rados.IOContext, error) {
	io, err := s.conn.OpenIOContext(img.Pool)
	if err != nil {
		return nil, cephconn.Classify(fmt.Errorf("open pool %s: %w", img.Pool, err), "open pool "+img.Pool, osdCap)
	}
	io.SetNamespace(img.Namespace)
	return io, nil
}

// read returns the record and its object version; (nil, 0, nil) when there is none.
func (s *Store) read(io *rados.IOContext, img Image) (*Record, uint64, error) {
	op := rados.CreateReadOp()
	defer op.Release()
	buf := make([]byte, maxRecordSize)
	step := op.Read(0, buf)
	if err := op.Operate(io, img.Object(), rados.OperationNoFlag); err != nil {
		if cephconn.Code(err) == -int(syscall.ENOENT) {
			return nil, 0, nil
		}
		return nil, 0, cephconn.Classify(fmt.Errorf("read claim of %s: %w", img, err), "read claim of "+img.String(), osdCap)
	}
	ver, err := io.GetLastVersion()
	if err != nil {
		return nil, 0, fmt.Errorf("read claim of %s: version: %w", img, err)
	}
	rec, err := decode(buf[:step.BytesRead])
	if err != nil {
		return nil, 0, fmt.Errorf("read claim of %s (object %s): %w", img, img.Object(), err)
	}
	return rec, ver, nil
}

// errConflict means the compare of a compare-and-set failed: someone else wrote first.
var errConflict = errors.New("claim changed concurrently")

// cas writes rec if and only if the object is still at version ver (0: does not exist yet),
// in ONE RADOS write operation. A lost race returns errConflict.
func (s *Store) cas(io *rados.IOContext, img Image, ver uint64, rec *Record) error {
	rec.UpdatedAt = s.cfg.Now().UTC()
	data, err := encode(rec)
	if err != nil {
		return fmt.Errorf("write claim of %s: %w", img, err)
	}
	op := rados.CreateWriteOp()
	defer op.Release()
	if ver == 0 {
		op.Create(rados.CreateExclusive)
	} else {
		op.AssertVersion(ver)
	}
	op.WriteFull(data)
	return s.operate(op, io, img)
}

// casRemove deletes the record if and only if it is still at version ver.
func (s *Store) casRemove(io *rados.IOContext, img Image, ver uint64) error {
	op := rados.CreateWriteOp()
	defer op.Release()
	op.AssertVersion(ver)
	op.Remove()
	return s.operate(op, io, img)
}

func (s *Store) operate(op *rados.WriteOp, io *rados.IOContext, img Image) error {
	err := op.Operate(io, img.Object(), rados.OperationNoFlag)
	switch -cephconn.Code(err) {
	case 0:
		return err
	case int(syscall.EEXIST), int(syscall.ERANGE), int(syscall.EOVERFLOW), int(syscall.ENOENT):
		// EEXIST: created meanwhile; ERANGE/EOVERFLOW: version moved on; ENOENT: removed.
		return errConflict
	}
	return cephconn.Classify(fmt.Errorf("write claim of %s: %w", img, err), "write claim of "+img.String(), osdCap)
}

// maxAttempts bounds the compare-and-set retries of one operation.
const maxAttempts = 64

// update runs read → decide → compare-and-set until the write wins. decide gets the current
// record (nil when none) and returns the record to write, or nil to write nothing; it may
// run several times and must only look at its arguments (and may fence, which is idempotent).
func (s *Store) update(ctx context.Context, img Image, decide func(cur *Record) (*Record, error)) (*Record, error) {
	if err := img.validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	io, err := s.ioctx(img)
	if err != nil {
		return nil, err
	}
	defer io.Destroy()
	for attempt := 0; attempt < maxAttempts; attempt++ {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("claim %s: %w", img, err)
		}
		cur, ver, err := s.read(io, img)
		if err != nil {
			return nil, err
		}
		var in *Record
		if cur != nil {
			in = cur.clone()
		}
		next, err := decide(in)
		if err != nil || next == nil {
			return cur, err
		}
		err = s.cas(io, img, ver, next)
		if err == nil {
			return next, nil
		}
		if !errors.Is(err, errConflict) {
			return nil, err
		}
		// lost a race: back off a little, at random, so that a crowd spreads out
		time.Sleep(time.Duration(rand.IntN(1+attempt)) * time.Millisecond)
	}
	return nil, fmt.Errorf("%w: claim of %s changed %d times in a row while writing", ErrBusy, img, maxAttempts)
}

// imageInfo is what the claim check needs to know about the image itself.
type imageInfo struct {
	ID       string
	Watchers []string // client addresses watching the image header
}

// inspectImage checks that the image exists and lists its watchers.
func (s *Store) inspectImage(img Image) (imageInfo, error) {
	io, err := s.ioctx(img)
	if err != nil {
		return imageInfo{}, err
	}
	defer io.Destroy()
	im, err := rbd.OpenImageReadOnly(io, img.Name, rbd.NoSnapshot)
	if err != nil {
		return imageInfo{}, cephconn.Classify(fmt.Errorf("open image %s: %w", img, err), "open image "+img.String(), osdCap)
	}
	defer im.Close()
	id, err := im.GetId()
	if err != nil {
		return imageInfo{}, cephconn.Classify(fmt.Errorf("image %s: id: %w", img, err), "read image "+img.String(), osdCap)
	}
	ws, err := im.ListWatchers()
	if err != nil {
		return imageInfo{}, cephconn.Classify(fmt.Errorf("image %s: watchers: %w", img, err), "list watchers of "+img.String(), osdCap)
	}
	own, _ := s.conn.GetAddrs()
	info := imageInfo{ID: id}
	for _, w := range ws {
		if w.Addr != own { // a read-only open may watch too; that is us
			info.Watchers = append(info.Watchers, w.Addr)
		}
	}
	return info, nil
}

// unexplained returns the watchers that no holder's mapping accounts for. A holder that has
// not recorded its mapping address yet (between claim and map) may account for one watcher.
func unexplained(watchers []string, holders []Holder) []string {
	known := map[string]bool{}
	pending := 0
	for _, h := range holders {
		if h.ClientAddr != "" {
			known[h.ClientAddr] = true
		} else {
			pending++
		}
	}
	var out []string
	for _, w := range watchers {
		if !known[w] {
			out = append(out, w)
		}
	}
	if len(out) <= pending {
		return nil
	}
	return out
}

// imageExists says whether img still exists with the given id ("" accepts any id).
func (s *Store) imageExists(io *rados.IOContext, img Image, id string) (bool, error) {
	buf := make([]byte, 256)
	n, err := io.Read("rbd_id."+img.Name, buf, 0)
	if cephconn.Code(err) == -int(syscall.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, cephconn.Classify(fmt.Errorf("image %s: read id: %w", img, err), "read image "+img.String(), osdCap)
	}
	// rbd_id.<name> holds the id as a length-prefixed string (4 bytes little endian + bytes)
	if n < 4 {
		return false, fmt.Errorf("image %s: id object too short", img)
	}
	l := int(buf[0]) | int(buf[1])<<8 | int(buf[2])<<16 | int(buf[3])<<24
	if l < 0 || 4+l > n {
		return false, fmt.Errorf("image %s: id object malformed", img)
	}
	return id == "" || string(buf[4:4+l]) == id, nil
}
