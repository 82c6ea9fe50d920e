package claim

import (
	"syscall"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/cephconn"
	"github.com/rbd-owner/rbd-owner/agent/internal/cephtest"
)

// TestKeptFenceOutlivesItsEntryOnTheRealCluster: on the live cluster, with a fence_expiry of
// 10 s, two holders' mappings (RADOS clients of their own, standing in for the kernel's) are
// fenced by takeovers; the new holder keeps one of the fences and not the other. Past their
// entries' life (and a monitor tick), the kept mapping's write still fails with ESHUTDOWN,
// while the other's entry ran out and its write goes through: the blocklist really expires,
// and the renewal is what keeps a fence.
func TestKeptFenceOutlivesItsEntryOnTheRealCluster(t *testing.T) {
	const expiry = 10 * time.Second
	clk := newClock()
	store := func(id string) *Store {
		conn, err := cephconn.Connect(cephtest.Options(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(conn.Shutdown)
		s, err := NewStore(conn, Config{Node: Node{ID: id, Hostname: "host-" + id, AgentVersion: "test"}, Lease: 30 * time.Second,
			FenceExpiry: expiry, Now: clk.Now, Mono: clk.Mono})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a, b := store("nodeA"), store("nodeB")
	type fenced struct {
		img Image
		obj string
		io  interface {
			WriteFull(string, []byte) error
		}
	}
	var fs []fenced
	for range 2 {
		img := testImage(t, "")
		mapping := cephtest.Conn(t)
		addr, err := mapping.GetAddrs()
		if err != nil {
			t.Fatal(err)
		}
		mio, err := mapping.OpenIOContext(img.Pool)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(mio.Destroy)
		obj := cephtest.UniqueName("data-")
		if err := mio.WriteFull(obj, []byte("before")); err != nil {
			t.Fatal(err)
		}
		res, err := a.Acquire(ctx(t), Request{Image: img})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.SetMapping(ctx(t), img, res.Holder.Epoch, addr, "/dev/rbd0"); err != nil {
			t.Fatal(err)
		}
		fs = append(fs, fenced{img: img, obj: obj, io: mio})
	}
	for _, f := range fs {
		if _, err := b.Acquire(ctx(t), Request{Image: f.img, Takeover: true}); err == nil {
			t.Fatal("takeover at the first look")
		}
	}
	clk.Advance(16 * time.Second)
	for _, f := range fs {
		if _, err := b.Watch(ctx(t), f.img); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(16 * time.Second) // nodeA's 30 s lease ran out, watched within every lease
	for _, f := range fs {
		if _, err := b.Acquire(ctx(t), Request{Image: f.img, Takeover: true}); err != nil {
			t.Fatalf("takeover: %v", err)
		}
	}
	// nodeB keeps the first image's fence for 2.5 entry lives (it is due every quarter of its
	// life on nodeB's clock, which moves by the real time that passed, as a process's own
	// monotonic clock does: a fixed step per round fell behind the monitors' clock on a busy
	// machine, where a round took longer than its sleep); the second's it leaves alone
	kept, left := fs[0], fs[1]
	last := time.Now()
	for end := last.Add(expiry*5/2 + 5*time.Second); time.Now().Before(end); {
		time.Sleep(expiry / 5)
		now := time.Now()
		clk.Advance(now.Sub(last))
		last = now
		if _, err := b.KeepFences(ctx(t), kept.img); err != nil {
			t.Fatal(err)
		}
	}
	if err := kept.io.WriteFull(kept.obj, []byte("after")); cephconn.Code(err) != -int(syscall.ESHUTDOWN) {
		t.Fatalf("write through the kept fence's client: want -108 (still fenced), got %v", err)
	}
	// the entry nobody renewed is gone: its client writes again (what a frozen node's mapping
	// would do on waking, were its fence not kept)
	var err error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(time.Second) {
		if err = left.io.WriteFull(left.obj, []byte("after")); err == nil {
			return
		}
	}
	t.Fatalf("the unrenewed fence's client still cannot write: %v (does this cluster expire blocklist entries?)", err)
}
