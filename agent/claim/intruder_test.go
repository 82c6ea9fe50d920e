package claim

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/cephconn"
	"github.com/rbd-owner/rbd-owner/agent/claim/memory"
	"github.com/rbd-owner/rbd-owner/agent/internal/cephtest"
)

// TestDecideUnmanaged: the verdict on a mapping made outside rbd-owner, for every kind of
// record and every policy, without a cluster.
func TestDecideUnmanaged(t *testing.T) {
	img := Image{Pool: "rbd", Image: "img"}
	rec := func(access Access, hs ...Holder) *Record {
		return &Record{Format: FormatVersion, Ref: img, ImageID: "id1", Access: access, Epoch: 9, Holders: hs}
	}
	other := holder("node-a", 7, t0, "10.0.0.1:0/1")
	mineOther := holder("node-b", 8, t0, "10.0.0.2:0/5") // this node, for another device
	mineThis := holder("node-b", 8, t0, "10.0.0.2:0/9")  // this node, for this very client
	mineNone := holder("node-b", 8, t0, "")              // this node, no mapping recorded yet
	fencedThis := mineThis
	fencedThis.Fenced = true
	w := Unmanaged{Image: img, ImageID: "id1", ClientAddr: "10.0.0.2:0/9", Device: "/dev/rbd3", OwnClient: true}
	ro := w
	ro.ReadOnly = true
	shared := w
	shared.OwnClient, shared.SharedWith = false, []string{"/dev/rbd1"}
	otherImage := w
	otherImage.ImageID = "id2"
	for _, tc := range []struct {
		name   string
		cur    *Record
		u      Unmanaged
		policy UnmanagedPolicy
		want   Action
		why    string
	}{
		{"held rwo by another node: fenced", rec(RWO, other), w, FenceIfClaimed, FenceIntruder, "node-a@7"},
		{"held rwo elsewhere, adopt-or-fence: fenced", rec(RWO, other), w, AdoptOrFence, FenceIntruder, "node-a@7"},
		{"held rwo elsewhere, report policy: reported", rec(RWO, other), w, ReportOnly, Report, "policy is report"},
		{"writer against rox: fenced", rec(ROX, holder("node-a", 7, t0, "a"), holder("node-c", 9, t0, "c")), w, FenceIfClaimed, FenceIntruder, "node-a@7,node-c@9"},
		{"read-only against rwo: reported, never fenced", rec(RWO, other), ro, FenceIfClaimed, Report, "cannot write"},
		{"rwx allows several writers: reported", rec(RWX, other), w, FenceIfClaimed, Report, "several writers"},
		{"held by this node for another device: fenced", rec(RWO, mineOther), w, FenceIfClaimed, FenceIntruder, "node-b@8"},
		{"this node's own claim names this client: adopted back", rec(RWO, mineThis), w, FenceIfClaimed, AdoptOwn, "epoch 8"},
		{"own claim, even under report: adopted back", rec(RWO, mineThis), w, ReportOnly, AdoptOwn, ""},
		{"own claim fenced by an admin: reported", rec(RWO, fencedThis), w, AdoptOrFence, Report, "fenced"},
		{"own claim naming no mapping yet: adopted back", rec(RWO, mineNone), w, FenceIfClaimed, AdoptOwn, "names no mapping yet"},
		{"own claim naming no mapping, shared client: reported, it cannot be fenced alone", rec(RWO, mineNone), shared, FenceIfClaimed, Report, "node-b@8; it was mapped without noshare"},
		{"shared client held elsewhere: reported, never fenced (it would cut the node's other mappings)", rec(RWO, other), shared, FenceIfClaimed, Report, "NOT fenced, TWO WRITERS ARE POSSIBLE"},
		{"shared client held elsewhere, adopt-or-fence: reported", rec(RWO, other), shared, AdoptOrFence, Report, "add noshare to the StorageClass's mapOptions"},
		{"no record, fence-if-claimed: reported", nil, w, FenceIfClaimed, Report, "not claimed"},
		{"free record, adopt-or-fence: adopted", rec(""), w, AdoptOrFence, Adopt, ""},
		{"no record, adopt-or-fence: adopted", nil, w, AdoptOrFence, Adopt, ""},
		{"free, read-only: not adopted", nil, ro, AdoptOrFence, Report, "read-only"},
		{"free, shared client: not adopted", nil, shared, AdoptOrFence, Report, "/dev/rbd1"},
		{"record of a deleted image of the same name: free", rec(RWO, other), otherImage, AdoptOrFence, Adopt, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var before []byte
			if tc.cur != nil {
				before, _ = json.Marshal(tc.cur)
			}
			v := decideUnmanaged(tc.cur, "node-b", tc.u, tc.policy)
			if v.Action != tc.want {
				t.Fatalf("action %s, want %s (%s)", v.Action, tc.want, v.Why)
			}
			if !strings.Contains(v.Why, tc.why) {
				t.Errorf("why %q lacks %q", v.Why, tc.why)
			}
			if v.Action == FenceIntruder && len(v.Holders) == 0 {
				t.Error("a fence names no holder")
			}
			if tc.cur != nil {
				after, _ := json.Marshal(tc.cur)
				if string(after) != string(before) {
					t.Error("the decision modified the record it was given")
				}
			}
		})
	}
}

// blocklisted reads the cluster's blocklist.
func blocklisted(t *testing.T, addr string) bool {
	t.Helper()
	out, _, err := cephtest.AdminConn(t).MonCommand([]byte(`{"prefix":"osd blocklist ls","format":"json"}`))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Contains(string(out), addr)
}

// TestUnmanagedMappingOfAHeldImageIsFenced: on the live cluster, a client standing in for a
// by-hand mapping on nodeB of an image nodeA holds is blocklisted (its writes fail), recorded
// in the claim, and nodeA keeps the image; the fence is lifted only once it is gone.
func TestUnmanagedMappingOfAHeldImageIsFenced(t *testing.T) {
	img := testImage(t, "")
	clk := newClock()
	a, b := newNode(t, "nodeA", clk), newNode(t, "nodeB", clk)
	res, err := a.Acquire(ctx(t), Request{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.SetMapping(ctx(t), img, res.Holder.Epoch, fakeClientAddr(1), "/dev/rbd0"); err != nil {
		t.Fatal(err)
	}
	intruder := cephtest.Conn(t)
	addr, err := intruder.GetAddrs()
	if err != nil {
		t.Fatal(err)
	}
	io, err := intruder.OpenIOContext(img.Pool)
	if err != nil {
		t.Fatal(err)
	}
	defer io.Destroy()
	obj := cephtest.UniqueName("intruder-")
	if err := io.WriteFull(obj, []byte("before")); err != nil {
		t.Fatalf("write before the fence: %v", err)
	}
	got, err := b.Unmanaged(ctx(t), Unmanaged{Image: img, ClientAddr: addr, Device: "/dev/rbd5", OwnClient: true}, FenceIfClaimed)
	if err != nil {
		t.Fatal(err)
	}
	if got.Action != FenceIntruder || got.Intruder == nil || got.Intruder.Addr != addr || got.Intruder.Holders != "nodeA@1" {
		t.Fatalf("verdict %+v intruder %+v", got.Verdict, got.Intruder)
	}
	if !blocklisted(t, addr) {
		t.Fatalf("%s is not on the blocklist", addr)
	}
	if err := io.WriteFull(obj, []byte("after")); cephconn.Code(err) != -int(syscall.ESHUTDOWN) {
		t.Fatalf("write through the fenced client: want -108, got %v", err)
	}
	rec, err := a.Inspect(ctx(t), img)
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Intruders) != 1 || rec.Intruders[0].NodeID != "nodeB" || rec.Intruders[0].Device != "/dev/rbd5" || rec.Epoch != res.Holder.Epoch {
		t.Fatalf("record after the fence: %+v", rec)
	}
	if _, err := a.Renew(ctx(t), img, res.Holder.Epoch); err != nil {
		t.Fatalf("the holder lost its claim to an intruder's fence: %v", err)
	}
	// a second look (the next reconcile) fences again and keeps one entry
	if _, err := b.Unmanaged(ctx(t), Unmanaged{Image: img, ClientAddr: addr, Device: "/dev/rbd5", OwnClient: true}, FenceIfClaimed); err != nil {
		t.Fatal(err)
	}
	if rec, _ := a.Inspect(ctx(t), img); len(rec.Intruders) != 1 {
		t.Fatalf("intruders after a second fence: %+v", rec.Intruders)
	}
	// unfence: refused while mapped, refused on another node, done once gone
	if _, err := b.Unfence(ctx(t), img, func(string) bool { return false }); !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "/dev/rbd5") {
		t.Fatalf("unfence while mapped: %v", err)
	}
	if _, err := a.Unfence(ctx(t), img, func(string) bool { return true }); err == nil || !strings.Contains(err.Error(), "nodeB") {
		t.Fatalf("unfence from another node: %v", err)
	}
	un, err := b.Unfence(ctx(t), img, func(string) bool { return true })
	if err != nil || len(un) != 1 {
		t.Fatalf("unfence: %v %+v", err, un)
	}
	if blocklisted(t, addr) {
		t.Fatalf("%s still on the blocklist after unfence", addr)
	}
	if rec, _ := a.Inspect(ctx(t), img); len(rec.Intruders) != 0 || len(rec.Holders) != 1 {
		t.Fatalf("record after unfence: %+v", rec)
	}
}

// TestUnmanagedAdoptsAFreeImage: under adopt-or-fence a free image's mapping is claimed for
// this node with its client recorded in one write; another unexplained watcher stops it; the
// report policy writes nothing.
func TestUnmanagedAdoptsAFreeImage(t *testing.T) {
	m := memory.New("fsid")
	clk := newClock()
	b := memNode(t, m, "node-b", clk)
	img := Image{Pool: "rbd", Image: "free"}
	m.AddImage(img, "id1")
	u := Unmanaged{Image: img, ImageID: "id1", ClientAddr: "10.0.0.2:0/9", Device: "/dev/rbd2", OwnClient: true}
	m.SetWatchers(img, u.ClientAddr)
	ctx := context.Background()
	for _, p := range []UnmanagedPolicy{ReportOnly, FenceIfClaimed} {
		got, err := b.Unmanaged(ctx, u, p)
		if err != nil || got.Action != Report || m.Version(img) != 0 {
			t.Fatalf("policy %s: %+v %v (object version %d)", p, got, err, m.Version(img))
		}
	}
	m.SetWatchers(img, u.ClientAddr, "10.0.0.7:0/3")
	got, err := b.Unmanaged(ctx, u, AdoptOrFence)
	if err != nil || got.Action != Report || !strings.Contains(got.Why, "10.0.0.7:0/3") || m.Version(img) != 0 {
		t.Fatalf("adopt with a foreign watcher: %+v %v", got, err)
	}
	m.SetWatchers(img, u.ClientAddr)
	got, err = b.Unmanaged(ctx, u, AdoptOrFence)
	if err != nil || got.Action != Adopt {
		t.Fatalf("adopt: %+v %v", got, err)
	}
	h := got.Record.Holder("node-b")
	if h == nil || h.ClientAddr != u.ClientAddr || h.Device != "/dev/rbd2" || h.Epoch != 1 || got.Holder.Epoch != 1 || got.Record.Access != RWO {
		t.Fatalf("adopted record: %+v", got.Record)
	}
	// the agent restarted without its state: the same mapping is its own
	got, err = b.Unmanaged(ctx, u, FenceIfClaimed)
	if err != nil || got.Action != AdoptOwn || got.Holder.Epoch != 1 {
		t.Fatalf("own mapping: %+v %v", got, err)
	}
	// a second by-hand mapping of the same image on this node is an intruder
	u2 := u
	u2.ClientAddr, u2.Device = "10.0.0.2:0/10", "/dev/rbd4"
	got, err = b.Unmanaged(ctx, u2, AdoptOrFence)
	if err != nil || got.Action != FenceIntruder || !m.Blocklisted(u2.ClientAddr) || m.Blocklisted(u.ClientAddr) {
		t.Fatalf("second mapping: %+v %v", got, err)
	}
}

// TestUnmanagedFenceRecordedEvenWhenTheWriteFails: a fence that was done is reported as done
// when the claim could not be written afterwards.
func TestUnmanagedFenceRecordedEvenWhenTheWriteFails(t *testing.T) {
	m := memory.New("fsid")
	clk := newClock()
	a, b := memNode(t, m, "node-a", clk), memNode(t, m, "node-b", clk)
	img := Image{Pool: "rbd", Image: "held"}
	m.AddImage(img, "id1")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := a.Acquire(ctx, Request{Image: img}); err != nil {
		t.Fatal(err)
	}
	m.SetHook(func(_ context.Context, call string, _ Image) error {
		if call == "write" {
			return cephconn.ErrUnavailable
		}
		return nil
	})
	got, err := b.Unmanaged(ctx, Unmanaged{Image: img, ClientAddr: "10.0.0.2:0/9", Device: "/dev/rbd1", OwnClient: true}, FenceIfClaimed)
	if err == nil || got == nil || got.Intruder == nil || !m.Blocklisted("10.0.0.2:0/9") || !errors.Is(err, cephconn.ErrUnavailable) {
		t.Fatalf("fence with a failing write: %+v %v", got, err)
	}
}
