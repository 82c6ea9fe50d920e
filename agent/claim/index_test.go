package claim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/claim/memory"
	"github.com/rbd-owner/rbd-owner/agent/claim/record"
)

// TestAClaimIsIndexedBeforeItsObjectExists: the first acquire sets the image's index key before
// it creates the claim object (I1), and an index that cannot be written leaves no claim object.
func TestAClaimIsIndexedBeforeItsObjectExists(t *testing.T) {
	ctx := context.Background()
	m := memory.New("fsid")
	img := Image{Pool: "rbd", Namespace: "ns1", Image: "vol"}
	m.AddImage(img, "id1")
	a := memNode(t, m, "node-a", newClock())
	// the hook runs concurrently: Acquire's first round sends its reads and the heartbeat at once
	var (
		mu    sync.Mutex
		order []string
	)
	fail := true
	m.SetHook(func(_ context.Context, call string, _ Image) error {
		mu.Lock()
		defer mu.Unlock()
		order = append(order, call)
		if call == "setkeys" && fail {
			return fmt.Errorf("%w: index not writable (test)", ErrConflict)
		}
		return nil
	})
	if _, err := a.Acquire(ctx, Request{Image: img}); err == nil || !strings.Contains(err.Error(), "no claim written") {
		t.Fatalf("acquire with an index that cannot be written: %v", err)
	}
	if m.Version(img) != 0 {
		t.Fatal("a claim object exists without its index key")
	}
	mu.Lock()
	fail, order = false, nil
	mu.Unlock()
	r, err := a.Acquire(ctx, Request{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	if r.Record.Format != FormatVersion {
		t.Fatalf("record format %d, want %d", r.Record.Format, FormatVersion)
	}
	if _, ok := m.Keys(img, IndexObject)["vol"]; !ok {
		t.Fatalf("no index key after the acquire: %v", m.Keys(img, IndexObject))
	}
	iKey, iWrite := slices.Index(order, "setkeys"), -1
	for i, c := range order {
		if c == "write" {
			iWrite = i // the claim's write comes last (the heartbeat's before it)
		}
	}
	if iKey < 0 || iKey > iWrite {
		t.Fatalf("calls %v: the index key must be set before the claim object is written", order)
	}
	// renewals, mapping records and releases of an indexed claim write no index
	m.Counts(true)
	if _, err := a.SetMapping(ctx, img, r.Holder.Epoch, "10.0.0.1:0/1", "/dev/rbd0"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Release(ctx, img, r.Holder.Epoch); err != nil {
		t.Fatal(err)
	}
	if n := m.Counts(false)["setkeys index"]; n != 0 {
		t.Fatalf("%d index writes after the claim existed", n)
	}
}

// TestListingReadsTheIndexNotThePool: the claims of a pool are read through its indexes; the one
// listing of a namespace is the migration of claims an agent before the index made, reported
// once, and the records it finds are listed from then on without another.
func TestListingReadsTheIndexNotThePool(t *testing.T) {
	ctx := context.Background()
	m := memory.New("fsid")
	clk := newClock()
	var built []string
	a, err := NewStoreOn(m, Config{Node: Node{ID: "node-a"}, Lease: 15 * time.Second, Now: clk.Now, Mono: clk.Mono,
		OnIndexBuilt: func(pool, ns string, found int, _ time.Duration) {
			built = append(built, fmt.Sprintf("%s/%s:%d", pool, ns, found))
		}})
	if err != nil {
		t.Fatal(err)
	}
	// two claims an older agent made (format 2, no index), one in a namespace
	old := []Image{{Pool: "rbd", Image: "old1"}, {Pool: "rbd", Namespace: "ns1", Image: "old2"}}
	for _, img := range old {
		m.AddImage(img, "id-"+img.Image)
		m.Put(img, record.ObjectOf(img), fmt.Appendf(nil, `{"format": 2, "pool": %q, "namespace": %q, "image": %q, "image_id": "id-%s", "epoch": 1}`,
			img.Pool, img.Namespace, img.Image, img.Image))
	}
	recs, err := a.List(ctx, "rbd")
	if err != nil || len(recs) != 2 {
		t.Fatalf("first listing: %d records, %v", len(recs), err)
	}
	if !slices.Equal(built, []string{"rbd/:1", "rbd/ns1:1"}) {
		t.Fatalf("migrations reported: %v, want one per namespace", built)
	}
	// a claim made since is listed through the index, and nothing lists the pool again
	img := Image{Pool: "rbd", Namespace: "ns1", Image: "new"}
	m.AddImage(img, "id-new")
	if _, err := a.Acquire(ctx, Request{Image: img}); err != nil {
		t.Fatal(err)
	}
	m.Counts(true)
	recs, err = a.List(ctx, "rbd")
	if err != nil || len(recs) != 3 {
		t.Fatalf("second listing: %d records, %v", len(recs), err)
	}
	got := m.Counts(true)
	if got["objects"] != 0 || len(built) != 2 {
		t.Fatalf("the second listing listed the pool: %v (migrations %v)", got, built)
	}
	if got["read claim"] != 3 || got["readkeys index"] != 2 {
		t.Fatalf("the second listing did %v, want an index read per namespace and a read per claim", got)
	}
	// a pool rbd-owner never used (another application's) gets no object of rbd-owner's
	m.AddImage(Image{Pool: "other", Image: "x"}, "id-x")
	if recs, err := a.List(ctx, "other"); err != nil || len(recs) != 0 {
		t.Fatalf("listing a pool without claims: %v %v", recs, err)
	}
	if kv := m.Keys(Image{Pool: "other"}, IndexObject); kv != nil {
		t.Fatalf("listing a pool without claims wrote an index there: %v", kv)
	}
}

// TestOrphanRemovalDropsItsIndexKeyAndStaleKeysGoWithTheirImage: removing a deleted image's
// free claim removes its key (I2); a key that names no object is dropped only once its image is
// gone (I3), never while an acquire may be between its two writes.
func TestOrphanRemovalDropsItsIndexKeyAndStaleKeysGoWithTheirImage(t *testing.T) {
	ctx := context.Background()
	m := memory.New("fsid")
	a := memNode(t, m, "node-a", newClock())
	img := Image{Pool: "rbd", Image: "gone"}
	m.AddImage(img, "id1")
	r, err := a.Acquire(ctx, Request{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Release(ctx, img, r.Holder.Epoch); err != nil {
		t.Fatal(err)
	}
	m.RemoveImage(img)
	if ok, err := a.RemoveOrphan(ctx, img); !ok || err != nil {
		t.Fatalf("remove orphan: %v %v", ok, err)
	}
	if _, ok := m.Keys(img, IndexObject)["gone"]; ok {
		t.Fatal("the removed claim's index key is left")
	}
	// a stale key: an acquire that crashed between its two writes
	stale := Image{Pool: "rbd", Image: "half"}
	m.AddImage(stale, "id2")
	if _, err := m.SetKeys(ctx, stale, IndexObject, map[string][]byte{"half": []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	pl, err := a.ListPlace(ctx, "rbd", "", true)
	if err != nil || len(pl.Stale) != 1 || pl.Stale[0] != stale {
		t.Fatalf("stale keys: %+v, %v", pl.Stale, err)
	}
	if dropped, err := a.DropStaleKey(ctx, stale); dropped || err != nil {
		t.Fatalf("a stale key of an image that exists was dropped: %v %v", dropped, err)
	}
	m.RemoveImage(stale)
	if dropped, err := a.DropStaleKey(ctx, stale); !dropped || err != nil {
		t.Fatalf("the stale key of a deleted image: %v %v", dropped, err)
	}
	if _, ok := m.Keys(stale, IndexObject)["half"]; ok {
		t.Fatal("the stale key is still there")
	}
}

// TestStaleKeyIsNotDroppedWhenTheIndexMoved: a key read as stale is kept when the index changed
// after it was read (another writer indexed again): the drop asserts the index's version.
func TestStaleKeyIsNotDroppedWhenTheIndexMoved(t *testing.T) {
	ctx := context.Background()
	m := memory.New("fsid")
	a := memNode(t, m, "node-a", newClock())
	img := Image{Pool: "rbd", Image: "race"}
	m.AddImage(img, "id1")
	m.RemoveImage(img) // gone by name: the key may be dropped...
	if _, err := m.SetKeys(ctx, img, IndexObject, map[string][]byte{"race": []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	// ...but a writer sets it again after the sweeper read the index, every time it looks
	m.SetHook(func(_ context.Context, call string, _ Image) error {
		if call == "imageid" {
			go func() {
				_, _ = m.SetKeys(context.Background(), img, IndexObject, map[string][]byte{"race": []byte(`{"again":true}`)})
			}()
			time.Sleep(20 * time.Millisecond)
		}
		return nil
	})
	if dropped, err := a.DropStaleKey(ctx, img); dropped || err != nil {
		t.Fatalf("a key indexed again meanwhile was dropped: %v %v", dropped, err)
	}
	if _, ok := m.Keys(img, IndexObject)["race"]; !ok {
		t.Fatal("the key is gone")
	}
}

// TestNoticesAreLeftForTheNodeWhoseHoldChanged: a takeover, an admin's fence and a
// force-release each leave the holder a notice naming the image and its epoch, after the
// claim's write; the holder reads them and clears what it handled.
func TestNoticesAreLeftForTheNodeWhoseHoldChanged(t *testing.T) {
	ctx := context.Background()
	m := memory.New("fsid")
	img := Image{Pool: "rbd", Namespace: "ns", Image: "n"}
	m.AddImage(img, "id1")
	clkA, clkB := newClock(), newClock()
	a, b := memNode(t, m, "node-a", clkA), memNode(t, m, "node-b", clkB)
	ra, err := a.Acquire(ctx, Request{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.SetMapping(ctx, img, ra.Holder.Epoch, "10.0.0.1:0/7", "/dev/rbd0"); err != nil {
		t.Fatal(err)
	}
	if ns, _, err := a.Notices(ctx, "rbd", "ns"); len(ns) != 0 || err != nil {
		t.Fatalf("notices before anything happened: %v %v", ns, err)
	}
	var claimVerAtNotice uint64
	m.SetHook(func(_ context.Context, call string, _ Image) error {
		if call == "setkeys" && claimVerAtNotice == 0 {
			claimVerAtNotice = m.Version(img)
		}
		return nil
	})
	silence(t, b, img, clkB.Advance, 21*time.Second) // the first look, then a whole lease
	rb, err := b.Acquire(ctx, Request{Image: img, Takeover: true})
	if err != nil {
		t.Fatal(err)
	}
	if claimVerAtNotice != m.Version(img) {
		t.Fatal("the notice was written before the takeover's write to the claim")
	}
	if _, err := b.SetMapping(ctx, img, rb.Holder.Epoch, "10.0.0.2:0/8", "/dev/rbd0"); err != nil {
		t.Fatal(err)
	}
	ns, ver, err := a.Notices(ctx, "rbd", "ns")
	if err != nil || len(ns) != 1 || ns[0].Image != "n" || ns[0].Epoch != ra.Holder.Epoch || ns[0].By != "node-b" || !strings.Contains(ns[0].What, "taken over") {
		t.Fatalf("node-a's notices after the takeover: %+v %v", ns, err)
	}
	if other, _, _ := b.Notices(ctx, "rbd", "ns"); len(other) != 0 {
		t.Fatalf("the taker has notices: %+v", other)
	}
	if err := a.ClearNotices(ctx, "rbd", "ns", []string{"n"}, ver); err != nil {
		t.Fatal(err)
	}
	if ns, _, _ := a.Notices(ctx, "rbd", "ns"); len(ns) != 0 {
		t.Fatalf("notices after clearing: %+v", ns)
	}
	// an admin's fence of node-b's hold, then its force-release: a notice each
	if _, err := a.Fence(ctx, img); err != nil {
		t.Fatal(err)
	}
	ns, ver, _ = b.Notices(ctx, "rbd", "ns")
	if len(ns) != 1 || ns[0].Epoch != rb.Holder.Epoch || !strings.Contains(ns[0].What, "fenced") {
		t.Fatalf("node-b's notices after the fence: %+v", ns)
	}
	if ok, err := a.ForceRelease(ctx, img); !ok || err != nil {
		t.Fatal(ok, err)
	}
	// a notice written after a read is not cleared by it
	if err := b.ClearNotices(ctx, "rbd", "ns", []string{"n"}, ver); err != nil {
		t.Fatal(err)
	}
	ns, _, _ = b.Notices(ctx, "rbd", "ns")
	if len(ns) != 1 || !strings.Contains(ns[0].What, "force-released") {
		t.Fatalf("node-b's notices after the force-release: %+v", ns)
	}
}

// TestNoticeFailureDoesNotUndoTheChange: a notice that cannot be written is reported, the
// takeover stands, and the notice is written by a later try.
func TestNoticeFailureDoesNotUndoTheChange(t *testing.T) {
	ctx := context.Background()
	m := memory.New("fsid")
	img := Image{Pool: "rbd", Image: "f"}
	m.AddImage(img, "id1")
	clkA, clkB := newClock(), newClock()
	a := memNode(t, m, "node-a", clkA)
	var failed []error
	b, err := NewStoreOn(m, Config{Node: Node{ID: "node-b"}, Lease: 15 * time.Second, Now: clkB.Now, Mono: clkB.Mono,
		OnNoticeFailed: func(err error) { failed = append(failed, err) }})
	if err != nil {
		t.Fatal(err)
	}
	ra, err := a.Acquire(ctx, Request{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.SetMapping(ctx, img, ra.Holder.Epoch, "10.0.0.1:0/7", "/dev/rbd0"); err != nil {
		t.Fatal(err)
	}
	silence(t, b, img, clkB.Advance, 21*time.Second) // the first look, then a whole lease
	m.SetHook(func(_ context.Context, call string, _ Image) error {
		if call == "setkeys" {
			return errors.New("notice object not writable (test)")
		}
		return nil
	})
	if _, err := b.Acquire(ctx, Request{Image: img, Takeover: true}); err != nil {
		t.Fatalf("takeover: %v", err)
	}
	if len(failed) != 1 || !strings.Contains(failed[0].Error(), "node node-a") {
		t.Fatalf("notice failures reported: %v", failed)
	}
	if ns, _, _ := a.Notices(ctx, "rbd", ""); len(ns) != 0 {
		t.Fatalf("a notice that failed is there: %+v", ns)
	}
	if left, errs := b.RetryNotices(ctx); left != 1 || len(errs) != 1 {
		t.Fatalf("retry while the object is not writable: %d left, %v", left, errs)
	}
	m.SetHook(nil)
	if left, errs := b.RetryNotices(ctx); left != 0 || len(errs) != 0 {
		t.Fatalf("retry: %d left, %v", left, errs)
	}
	if ns, _, _ := a.Notices(ctx, "rbd", ""); len(ns) != 1 || ns[0].Epoch != ra.Holder.Epoch {
		t.Fatalf("node-a's notices after the retry: %+v", ns)
	}
}

// TestHeartbeatWritesWithoutReading: after its first write, a store renews its heartbeat with
// one write against the version it wrote, and reads again only when another writer came between.
func TestHeartbeatWritesWithoutReading(t *testing.T) {
	ctx := context.Background()
	m := memory.New("fsid")
	m.AddImage(Image{Pool: "rbd", Image: "x"}, "id")
	a := memNode(t, m, "node-a", newClock())
	for range 3 {
		if err := a.Heartbeat(ctx, "rbd", ""); err != nil {
			t.Fatal(err)
		}
	}
	if got := m.Counts(true); got["read heartbeat"] != 1 || got["write heartbeat"] != 3 {
		t.Fatalf("three heartbeats: %v, want one read and three writes", got)
	}
	// another writer (a second agent given the same node id, or a person) moves it on
	loc := Image{Pool: "rbd"}
	data, _, _ := m.Read(ctx, loc, record.HeartbeatObject("node-a"))
	m.Put(loc, record.HeartbeatObject("node-a"), data)
	if err := a.Heartbeat(ctx, "rbd", ""); err != nil {
		t.Fatal(err)
	}
	data, _, _ = m.Read(ctx, loc, record.HeartbeatObject("node-a"))
	hb, err := decodeHeartbeat(data)
	if err != nil || hb.Seq != 4 {
		t.Fatalf("heartbeat after a foreign write: %+v %v, want seq 4", hb, err)
	}
}

// TestAClaimOfARecreatedImageIsKeyedAgain: a record left from an earlier image of the name is
// keyed again when a claim rewrites it for the new image (a removal may have taken its key),
// and an orphan removal leaves the key while an image has the name (model/index.pml, t and u).
func TestAClaimOfARecreatedImageIsKeyedAgain(t *testing.T) {
	ctx := context.Background()
	m := memory.New("fsid")
	a := memNode(t, m, "node-a", newClock())
	img := Image{Pool: "rbd", Image: "again"}
	m.AddImage(img, "id1")
	r, err := a.Acquire(ctx, Request{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Release(ctx, img, r.Holder.Epoch); err != nil {
		t.Fatal(err)
	}
	_, ver, _ := m.ReadKeys(ctx, img, IndexObject, nil)
	if err := m.RemoveKeys(ctx, img, IndexObject, []string{"again"}, ver); err != nil { // a sweep raced it away
		t.Fatal(err)
	}
	m.RemoveImage(img)
	m.AddImage(img, "id2")
	if _, err := a.Acquire(ctx, Request{Image: img}); err != nil {
		t.Fatal(err)
	}
	if _, ok := m.Keys(img, IndexObject)["again"]; !ok {
		t.Fatal("the claim rewritten for the recreated image has no index key")
	}
	// the orphan removal of an earlier image's free record, while a new image has the name
	other := Image{Pool: "rbd", Image: "renamed"}
	m.AddImage(other, "id3")
	r, err = a.Acquire(ctx, Request{Image: other})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Release(ctx, other, r.Holder.Epoch); err != nil {
		t.Fatal(err)
	}
	m.RemoveImage(other)
	m.AddImage(other, "id4") // recreated: the free id3 record is an orphan by id
	if ok, err := a.RemoveOrphan(ctx, other); !ok || err != nil {
		t.Fatalf("remove orphan: %v %v", ok, err)
	}
	if _, ok := m.Keys(other, IndexObject)["renamed"]; !ok {
		t.Fatal("the orphan removal took the key of a name an image has")
	}
}

// TestARetriedCreateIsKeyedAgain: an acquire whose create lost a race, and whose object and key
// were then removed, keys the claim again before it creates it (model/index.pml, r).
func TestARetriedCreateIsKeyedAgain(t *testing.T) {
	ctx := context.Background()
	m := memory.New("fsid")
	a := memNode(t, m, "node-a", newClock())
	img := Image{Pool: "rbd", Image: "retry"}
	m.AddImage(img, "id1")
	step := 0
	m.SetHook(func(_ context.Context, call string, im Image) error {
		switch {
		case call == "write" && im == img && step == 0: // the claim's first create...
			step++
			m.Put(img, record.ObjectOf(img), []byte(`{"format": 3}`)) // ...loses to another writer's
		case call == "read" && im == img && step == 1: // before the retry's read, a removal takes
			step++ // the object and its key
			m.Remove(img, record.ObjectOf(img))
			_, v, _ := m.ReadKeys(context.Background(), img, IndexObject, nil)
			if err := m.RemoveKeys(context.Background(), img, IndexObject, []string{"retry"}, v); err != nil {
				t.Error(err)
			}
		}
		return nil
	})
	if _, err := a.Acquire(ctx, Request{Image: img}); err != nil {
		t.Fatal(err)
	}
	if m.Version(img) == 0 {
		t.Fatal("no claim")
	}
	if _, ok := m.Keys(img, IndexObject)["retry"]; !ok {
		t.Fatal("the claim created at the second attempt has no index key")
	}
}
