package claim

import (
	"encoding/json"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"

	"github.com/rbd-owner/rbd-owner/agent/cephconn"
	"github.com/rbd-owner/rbd-owner/agent/claim/radosbackend"
	"github.com/rbd-owner/rbd-owner/agent/internal/cephtest"
)

func TestAcquireWritesARecordRadosCanRead(t *testing.T) {
	for _, ns := range []string{"", cephtest.Namespace} {
		t.Run("ns="+ns, func(t *testing.T) {
			img := testImage(t, ns)
			a := newNode(t, "nodeA", nil)
			res, err := a.Acquire(ctx(t), Request{Image: img})
			if err != nil {
				t.Fatal(err)
			}
			if res.Again || res.Holder.Epoch != 1 || res.Record.Epoch != 1 || res.Record.Access != RWO {
				t.Fatalf("first acquire: %+v", res)
			}
			// the object, read raw from the image's own pool and namespace, is the record
			io, err := cephtest.AdminConn(t).OpenIOContext(img.Pool)
			if err != nil {
				t.Fatal(err)
			}
			defer io.Destroy()
			io.SetNamespace(ns)
			buf := make([]byte, 8192)
			n, err := io.Read(ObjectPrefix+img.Image, buf, 0)
			if err != nil {
				t.Fatalf("read %s%s: %v", ObjectPrefix, img.Image, err)
			}
			var raw map[string]any
			if err := json.Unmarshal(buf[:n], &raw); err != nil {
				t.Fatalf("record is not JSON: %v\n%s", err, buf[:n])
			}
			for _, k := range []string{"format", "cluster_fsid", "pool", "namespace", "image", "image_id", "access", "epoch", "holders"} {
				if _, ok := raw[k]; !ok {
					t.Errorf("record lacks %q: %s", k, buf[:n])
				}
			}
			h := raw["holders"].([]any)[0].(map[string]any)
			for _, k := range []string{"node_id", "hostname", "node_addr", "client_addr", "device", "acquired_at", "renewed_at", "lease_seconds", "agent_version", "epoch"} {
				if _, ok := h[k]; !ok {
					t.Errorf("holder lacks %q: %s", k, buf[:n])
				}
			}
			if raw["cluster_fsid"] != a.FSID() || raw["image"] != img.Image || raw["namespace"] != ns || h["node_id"] != "nodeA" {
				t.Errorf("record has wrong values: %s", buf[:n])
			}
			if raw["image_id"] == "" {
				t.Errorf("no image id recorded")
			}
		})
	}
}

func TestReacquireIsIdempotent(t *testing.T) {
	img := testImage(t, "")
	clk := newClock()
	a := newNode(t, "nodeA", clk)
	first, err := a.Acquire(ctx(t), Request{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(5 * time.Second)
	again, err := a.Acquire(ctx(t), Request{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	if !again.Again || again.Holder.Epoch != first.Holder.Epoch || again.Record.Epoch != first.Record.Epoch {
		t.Fatalf("re-acquire changed the epoch or was not seen as a repeat: first %+v again %+v", first.Holder, again.Holder)
	}
	if !again.Holder.RenewedAt.After(first.Holder.RenewedAt) || !again.Holder.AcquiredAt.Equal(first.Holder.AcquiredAt) {
		t.Fatalf("re-acquire should renew, keep acquired_at: %+v", again.Holder)
	}
	if _, err := a.Acquire(ctx(t), Request{Image: img, Access: RWX}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("re-acquire with another access mode: want ErrInvalid, got %v", err)
	}
}

func TestClaimedElsewhereNamesTheOwner(t *testing.T) {
	img := testImage(t, cephtest.Namespace)
	a, b := newNode(t, "nodeA", nil), newNode(t, "nodeB", nil)
	if _, err := a.Acquire(ctx(t), Request{Image: img}); err != nil {
		t.Fatal(err)
	}
	_, err := b.Acquire(ctx(t), Request{Image: img})
	if !errors.Is(err, ErrClaimedElsewhere) {
		t.Fatalf("want ErrClaimedElsewhere, got %v", err)
	}
	var held *HeldError
	if !errors.As(err, &held) || held.Owner().NodeID != "nodeA" || held.Epoch != 1 {
		t.Fatalf("error does not carry the owner: %#v", err)
	}
	for _, want := range []string{"node nodeA", "host-nodeA", "epoch 1", "lease live as far as this node has seen"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message %q lacks %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "a takeover is possible") || held.RetryAfter() != 0 {
		t.Errorf("a request that may not take over is told when it could: %q", err)
	}
	// asking for a takeover while the lease is live is refused too, and fences nothing
	_, err = b.Acquire(ctx(t), Request{Image: img, Takeover: true})
	if !errors.As(err, &held) || !strings.Contains(err.Error(), "lease is live") || held.RetryAfter() <= 0 {
		t.Fatalf("takeover of a live lease: want refusal, got %v", err)
	}
	rec, err := b.Inspect(ctx(t), img)
	if err != nil || len(rec.Fences) != 0 || rec.Holder("nodeA") == nil {
		t.Fatalf("refused takeover changed the record: %+v %v", rec, err)
	}
}

func TestRenewOnlyWhileOwnedAtEpoch(t *testing.T) {
	img := testImage(t, "")
	clk := newClock()
	a, b := newNode(t, "nodeA", clk), newNode(t, "nodeB", clk)
	res, err := a.Acquire(ctx(t), Request{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(10 * time.Second)
	rec, err := a.Renew(ctx(t), img, res.Holder.Epoch)
	if err != nil {
		t.Fatal(err)
	}
	if got := rec.Holder("nodeA").RenewedAt; !got.Equal(clk.Now()) {
		t.Fatalf("renewed_at = %v, want %v", got, clk.Now())
	}
	if _, err := a.Renew(ctx(t), img, res.Holder.Epoch+1); !errors.Is(err, ErrFenced) {
		t.Fatalf("renew at a wrong epoch: want ErrFenced, got %v", err)
	}
	if _, err := b.Renew(ctx(t), img, res.Holder.Epoch); !errors.Is(err, ErrFenced) {
		t.Fatalf("renew by a non-holder: want ErrFenced, got %v", err)
	}
	if _, err := b.Renew(ctx(t), testImage(t, ""), 1); !errors.Is(err, ErrFenced) {
		t.Fatalf("renew without a record: want ErrFenced, got %v", err)
	}
}

func TestSetMappingAndRelease(t *testing.T) {
	img := testImage(t, cephtest.Namespace)
	a, b := newNode(t, "nodeA", nil), newNode(t, "nodeB", nil)
	res, err := a.Acquire(ctx(t), Request{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := a.SetMapping(ctx(t), img, res.Holder.Epoch, fakeClientAddr(1), "/dev/rbd3")
	if err != nil {
		t.Fatal(err)
	}
	if h := rec.Holder("nodeA"); h.ClientAddr != fakeClientAddr(1) || h.Device != "/dev/rbd3" {
		t.Fatalf("mapping not recorded: %+v", h)
	}
	if _, err := b.SetMapping(ctx(t), img, res.Holder.Epoch, "x", "y"); !errors.Is(err, ErrFenced) {
		t.Fatalf("SetMapping by a non-holder: want ErrFenced, got %v", err)
	}
	// release by someone else or at another epoch touches nothing
	if ok, err := b.Release(ctx(t), img, res.Holder.Epoch); ok || err != nil {
		t.Fatalf("release by non-holder: %v %v", ok, err)
	}
	if ok, err := a.Release(ctx(t), img, res.Holder.Epoch+7); ok || err != nil {
		t.Fatalf("release at a wrong epoch: %v %v", ok, err)
	}
	if ok, err := a.Release(ctx(t), img, res.Holder.Epoch); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
	if ok, err := a.Release(ctx(t), img, res.Holder.Epoch); ok || err != nil {
		t.Fatalf("second release must be a no-op: %v %v", ok, err)
	}
	rec, err = a.Inspect(ctx(t), img)
	if err != nil || !rec.Free() || rec.Epoch != res.Holder.Epoch || rec.Access != "" {
		t.Fatalf("released record: %+v %v", rec, err)
	}
	// the next owner gets a higher epoch: epochs never repeat
	resB, err := b.Acquire(ctx(t), Request{Image: img})
	if err != nil || resB.Holder.Epoch != res.Holder.Epoch+1 {
		t.Fatalf("acquire after release: %+v %v", resB, err)
	}
}

func TestMissingImagePoolAndClaim(t *testing.T) {
	a := newNode(t, "nodeA", nil)
	for _, img := range []Image{
		{Pool: cephtest.Pool, Image: "no-such-image"},
		{Pool: cephtest.Pool, Namespace: "no-such-ns", Image: "x"},
		{Pool: "no-such-pool", Image: "x"},
	} {
		if _, err := a.Acquire(ctx(t), Request{Image: img}); !errors.Is(err, ErrNotFound) {
			t.Errorf("acquire %s: want ErrNotFound, got %v", img, err)
		}
	}
	// said once, with the cluster's code, not its words after the agent's
	for img, want := range map[Image]string{
		{Pool: cephtest.Pool, Image: "no-such-image"}: "acquire " + cephtest.Pool + "/no-such-image: image " + cephtest.Pool + "/no-such-image not found (rbd: ret=-2)",
		{Pool: "no-such-pool", Image: "x"}:            "acquire no-such-pool/x: pool no-such-pool not found (rados: ret=-2)",
	} {
		if _, err := a.Acquire(ctx(t), Request{Image: img}); err == nil || err.Error() != want {
			t.Errorf("acquire %s:\n got %v\nwant %s", img, err, want)
		}
	}
	img := testImage(t, "")
	if _, err := a.Inspect(ctx(t), img); !errors.Is(err, ErrNoClaim) {
		t.Errorf("inspect unclaimed: want ErrNoClaim, got %v", err)
	}
	for _, bad := range []Image{{Pool: "", Image: "x"}, {Pool: "rbd", Image: ""}, {Pool: "rbd", Image: "a/b"}, {Pool: "rbd", Image: "a@s"}} {
		if _, err := a.Acquire(ctx(t), Request{Image: bad}); !errors.Is(err, ErrInvalid) {
			t.Errorf("acquire %+v: want ErrInvalid, got %v", bad, err)
		}
	}
	if _, err := a.Acquire(ctx(t), Request{Image: img, Access: "rw"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("bad access: want ErrInvalid, got %v", err)
	}
}

func TestWatcherNotExplainedByClaimIsRefused(t *testing.T) {
	img := testImage(t, "")
	admin := cephtest.AdminConn(t)
	io, err := admin.OpenIOContext(img.Pool)
	if err != nil {
		t.Fatal(err)
	}
	defer io.Destroy()
	// a read-write open registers a watch, as `rbd map` behind the agent's back would
	im, err := rbd.OpenImage(io, img.Image, rbd.NoSnapshot)
	if err != nil {
		t.Fatal(err)
	}
	a := newNode(t, "nodeA", nil)
	_, err = a.Acquire(ctx(t), Request{Image: img})
	addr, _ := admin.GetAddrs()
	if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), addr) {
		t.Fatalf("want ErrBusy naming watcher %s, got %v", addr, err)
	}
	if _, err := a.Inspect(ctx(t), img); !errors.Is(err, ErrNoClaim) {
		t.Fatalf("refused acquire left a claim: %v", err)
	}
	im.Close()
	// once the watcher is explained by the holder's recorded mapping, re-acquire passes
	res, err := a.Acquire(ctx(t), Request{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	im, err = rbd.OpenImage(io, img.Image, rbd.NoSnapshot)
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	if _, err := a.SetMapping(ctx(t), img, res.Holder.Epoch, addr, "/dev/rbd0"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Acquire(ctx(t), Request{Image: img}); err != nil {
		t.Fatalf("watcher explained by the claim: %v", err)
	}
}

func TestTakeoverFencesTheOldHolder(t *testing.T) {
	img := testImage(t, "")
	clk := newClock()
	a, b := newNode(t, "nodeA", clk), newNode(t, "nodeB", clk)
	// nodeA's "mapping" is a RADOS client of its own, standing in for the kernel's
	mapping := cephtest.Conn(t)
	mapAddr, err := mapping.GetAddrs()
	if err != nil {
		t.Fatal(err)
	}
	mio, err := mapping.OpenIOContext(img.Pool)
	if err != nil {
		t.Fatal(err)
	}
	defer mio.Destroy()
	obj := cephtest.UniqueName("data-")
	if err := mio.WriteFull(obj, []byte("before")); err != nil {
		t.Fatalf("write before takeover: %v", err)
	}
	res, err := a.Acquire(ctx(t), Request{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.SetMapping(ctx(t), img, res.Holder.Epoch, mapAddr, "/dev/rbd0"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx(t), Request{Image: img, Takeover: true}); !errors.Is(err, ErrClaimedElsewhere) {
		t.Fatalf("takeover before expiry: want ErrClaimedElsewhere, got %v", err)
	}
	silence(t, b.Store, img, clk.Advance, 31*time.Second) // nodeA stopped renewing: its 30 s lease ran out
	if _, err := b.Acquire(ctx(t), Request{Image: img}); !errors.Is(err, ErrClaimedElsewhere) {
		t.Fatalf("expired lease without takeover asked: want ErrClaimedElsewhere, got %v", err)
	}
	got, err := b.Acquire(ctx(t), Request{Image: img, Takeover: true})
	if err != nil {
		t.Fatal(err)
	}
	if got.Holder.Epoch != res.Holder.Epoch+1 || len(got.Record.Holders) != 1 || got.Record.Holders[0].NodeID != "nodeB" {
		t.Fatalf("takeover result: %+v", got.Record)
	}
	if len(got.Fenced) != 1 || got.Fenced[0].Addr != mapAddr || got.Fenced[0].NodeID != "nodeA" || got.Fenced[0].Epoch != res.Holder.Epoch {
		t.Fatalf("fence not recorded: %+v", got.Fenced)
	}
	if d := got.Fenced[0].Expires.Sub(clk.Now()); d < 50*time.Minute {
		t.Fatalf("fence expires too soon: %s", d)
	}
	// the new holder's mapping (a fresh client, as nodeB's kernel mapping would be) writes
	// first: it knows the OSD map with the blocklist entry and the OSD catches up to that map
	// before serving it, so the order below does not depend on how fast the monitor's new map
	// reaches the OSD on its own
	newMapping := cephtest.Conn(t)
	if err := newMapping.WaitForLatestOSDMap(); err != nil {
		t.Fatal(err)
	}
	nio, err := newMapping.OpenIOContext(img.Pool)
	if err != nil {
		t.Fatal(err)
	}
	defer nio.Destroy()
	if err := nio.WriteFull(obj, []byte("new holder")); err != nil {
		t.Fatalf("write by the new holder's mapping: %v", err)
	}
	// the fenced holder really lost access: its next write fails with ESHUTDOWN (-108)
	err = mio.WriteFull(obj, []byte("after"))
	if cephconn.Code(err) != -int(syscall.ESHUTDOWN) {
		t.Fatalf("write through the fenced client: want -108, got %v", err)
	}
	// and its agent learns it has lost the claim
	if _, err := a.Renew(ctx(t), img, res.Holder.Epoch); !errors.Is(err, ErrFenced) || !strings.Contains(err.Error(), "nodeB") {
		t.Fatalf("renew by the old holder: want ErrFenced naming nodeB, got %v", err)
	}
	if ok, _ := a.Release(ctx(t), img, res.Holder.Epoch); ok {
		t.Fatal("old holder released the new holder's claim")
	}
}

func TestTakeoverByHostAddressWhenNoMappingRecorded(t *testing.T) {
	img := testImage(t, "")
	clk := newClock()
	a := newNode(t, "nodeA", clk)
	a.cfg.Node.Addr = func() string { return "127.0.0.3" } // an address no test client uses
	b := newNode(t, "nodeB", clk)
	if _, err := a.Acquire(ctx(t), Request{Image: img}); err != nil {
		t.Fatal(err)
	}
	// nodeB's first look starts its watch of nodeA's heartbeat: a takeover needs a whole
	// lease of it unchanged, on nodeB's clock
	if _, err := b.Acquire(ctx(t), Request{Image: img, Takeover: true}); !errors.Is(err, ErrClaimedElsewhere) {
		t.Fatalf("first look: %v", err)
	}
	silence(t, b.Store, img, clk.Advance, time.Minute)
	got, err := b.Acquire(ctx(t), Request{Image: img, Takeover: true})
	if err != nil {
		t.Fatal(err)
	}
	if got.Fenced[0].Addr != "127.0.0.3:0/0" {
		t.Fatalf("fenced %q, want the host address 127.0.0.3:0/0", got.Fenced[0].Addr)
	}
	out, _, err := cephtest.AdminConn(t).MonCommand([]byte(`{"prefix":"osd blocklist ls","format":"json"}`))
	if err != nil || !strings.Contains(string(out), "127.0.0.3:0/0") {
		t.Fatalf("blocklist lacks 127.0.0.3:0/0: %s %v", out, err)
	}
}

func TestAdminFenceThenForceRelease(t *testing.T) {
	img := testImage(t, cephtest.Namespace)
	a, b := newNode(t, "nodeA", nil), newNode(t, "nodeB", nil)
	res, err := a.Acquire(ctx(t), Request{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.SetMapping(ctx(t), img, res.Holder.Epoch, fakeClientAddr(7), "/dev/rbd1"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ForceRelease(ctx(t), img); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "fence") {
		t.Fatalf("force release before fence: want refusal saying to fence, got %v", err)
	}
	fr, err := b.Fence(ctx(t), img) // the admin does not wait for the lease
	if err != nil {
		t.Fatal(err)
	}
	if len(fr.Fences) != 1 || fr.Fences[0].Addr != fakeClientAddr(7) || !fr.Record.Holders[0].Fenced {
		t.Fatalf("fence result: %+v", fr)
	}
	if _, err := a.Renew(ctx(t), img, res.Holder.Epoch); !errors.Is(err, ErrFenced) {
		t.Fatalf("renew after fence: want ErrFenced, got %v", err)
	}
	if _, err := b.Acquire(ctx(t), Request{Image: img}); !errors.Is(err, ErrClaimedElsewhere) {
		t.Fatalf("fenced but not released is still held: %v", err)
	}
	if ok, err := b.ForceRelease(ctx(t), img); !ok || err != nil {
		t.Fatalf("force release: %v %v", ok, err)
	}
	got, err := b.Acquire(ctx(t), Request{Image: img})
	if err != nil || got.Holder.Epoch != res.Holder.Epoch+1 {
		t.Fatalf("acquire after force release: %+v %v", got, err)
	}
	if _, err := b.Fence(ctx(t), testImage(t, "")); !errors.Is(err, ErrNoClaim) {
		t.Fatalf("fence of an unclaimed image: want ErrNoClaim, got %v", err)
	}
}

func TestAccessModes(t *testing.T) {
	img := testImage(t, "")
	a, b, c := newNode(t, "nodeA", nil), newNode(t, "nodeB", nil), newNode(t, "nodeC", nil)
	ra, err := a.Acquire(ctx(t), Request{Image: img, Access: ROX})
	if err != nil {
		t.Fatal(err)
	}
	rb, err := b.Acquire(ctx(t), Request{Image: img, Access: ROX})
	if err != nil {
		t.Fatal(err)
	}
	if !ra.Holder.ReadOnly || !rb.Holder.ReadOnly || len(rb.Record.Holders) != 2 || rb.Holder.Epoch == ra.Holder.Epoch {
		t.Fatalf("rox holders: %+v", rb.Record)
	}
	for _, acc := range []Access{RWO, RWX} {
		if _, err := c.Acquire(ctx(t), Request{Image: img, Access: acc}); !errors.Is(err, ErrClaimedElsewhere) {
			t.Fatalf("%s while rox held: want ErrClaimedElsewhere, got %v", acc, err)
		}
	}
	// the last reader leaving frees the image for any mode
	_, _ = a.Release(ctx(t), img, ra.Holder.Epoch)
	_, _ = b.Release(ctx(t), img, rb.Holder.Epoch)
	if _, err := c.Acquire(ctx(t), Request{Image: img, Access: RWX}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Acquire(ctx(t), Request{Image: img, Access: RWX}); err != nil {
		t.Fatalf("second rwx holder: %v", err)
	}
	if _, err := b.Acquire(ctx(t), Request{Image: img, Access: RWO}); !errors.Is(err, ErrClaimedElsewhere) {
		t.Fatalf("rwo while rwx held: want ErrClaimedElsewhere, got %v", err)
	}
}

func TestListAndOrphans(t *testing.T) {
	admin := cephtest.AdminConn(t)
	a := newNode(t, "nodeA", nil)
	keep := testImage(t, cephtest.Namespace)
	gone := testImage(t, "")
	for _, img := range []Image{keep, gone} {
		if _, err := a.Acquire(ctx(t), Request{Image: img}); err != nil {
			t.Fatal(err)
		}
	}
	recs, err := a.List(ctx(t), cephtest.Pool)
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, r := range recs {
		found[r.Ref.String()] = true
	}
	if !found[keep.String()] || !found[gone.String()] {
		t.Fatalf("list lacks a claim (both namespaces): %v", found)
	}
	io, err := admin.OpenIOContext(gone.Pool)
	if err != nil {
		t.Fatal(err)
	}
	defer io.Destroy()
	if err := rbd.RemoveImage(io, gone.Image); err != nil {
		t.Fatal(err)
	}
	orphans, err := a.Orphans(ctx(t), cephtest.Pool)
	if err != nil {
		t.Fatal(err)
	}
	isOrphan := map[string]bool{}
	for _, r := range orphans {
		isOrphan[r.Ref.String()] = true
	}
	if !isOrphan[gone.String()] || isOrphan[keep.String()] {
		t.Fatalf("orphans = %v, want %s and not %s", isOrphan, gone, keep)
	}
	if _, err := a.RemoveOrphan(ctx(t), keep); !errors.Is(err, ErrInvalid) {
		t.Fatalf("remove orphan of a live image: want ErrInvalid, got %v", err)
	}
	if ok, err := a.RemoveOrphan(ctx(t), gone); !ok || err != nil {
		t.Fatalf("remove orphan: %v %v", ok, err)
	}
	if _, err := a.Inspect(ctx(t), gone); !errors.Is(err, ErrNoClaim) {
		t.Fatalf("orphan claim still there: %v", err)
	}
	if _, err := a.List(ctx(t), "no-such-pool"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("list of a missing pool: want ErrNotFound, got %v", err)
	}
}

func TestRecreatedImageStartsFreeButKeepsEpoch(t *testing.T) {
	admin := cephtest.AdminConn(t)
	img := testImage(t, "")
	a, b := newNode(t, "nodeA", nil), newNode(t, "nodeB", nil)
	res, err := a.Acquire(ctx(t), Request{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	io, err := admin.OpenIOContext(img.Pool)
	if err != nil {
		t.Fatal(err)
	}
	defer io.Destroy()
	if err := rbd.RemoveImage(io, img.Image); err != nil {
		t.Fatal(err)
	}
	opts := rbd.NewRbdImageOptions()
	defer opts.Destroy()
	if err := rbd.CreateImage(io, img.Image, 1<<20, opts); err != nil {
		t.Fatal(err)
	}
	got, err := b.Acquire(ctx(t), Request{Image: img})
	if err != nil {
		t.Fatalf("claim of a deleted image's namesake must not block: %v", err)
	}
	if got.Holder.Epoch <= res.Holder.Epoch || got.Record.ImageID == res.Record.ImageID {
		t.Fatalf("recreated image: %+v", got.Record)
	}
}

func TestPermissionDeniedNamesTheCap(t *testing.T) {
	admin := cephtest.AdminConn(t)
	user := cephtest.UniqueName("nofence")
	cmd := `{"prefix":"auth get-or-create","entity":"client.` + user + `","caps":["mon","allow r","osd","profile rbd"]}`
	keyring, _, err := admin.MonCommand([]byte(cmd))
	if err != nil {
		t.Fatal(err)
	}
	path := t.TempDir() + "/keyring"
	if err := writeFile(path, keyring); err != nil {
		t.Fatal(err)
	}
	o := cephtest.Options(t)
	o.User, o.Keyring = user, path
	img := testImage(t, "")
	clk := newClock()
	a := newNode(t, "nodeA", clk)
	weak := newNodeWith(t, "node-weak", clk, o)
	res, err := a.Acquire(ctx(t), Request{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.SetMapping(ctx(t), img, res.Holder.Epoch, fakeClientAddr(9), "/dev/rbd0"); err != nil {
		t.Fatal(err)
	}
	if _, err := weak.Acquire(ctx(t), Request{Image: img, Takeover: true}); !errors.Is(err, ErrClaimedElsewhere) {
		t.Fatalf("first look: %v", err) // starts the watch
	}
	silence(t, weak.Store, img, clk.Advance, time.Minute)
	_, err = weak.Acquire(ctx(t), Request{Image: img, Takeover: true})
	var pe *cephconn.PermissionError
	if !errors.Is(err, cephconn.ErrPermission) || !errors.As(err, &pe) || !strings.Contains(err.Error(), `allow command "osd blocklist"`) {
		t.Fatalf("takeover without the blocklist cap: want a permission error naming the cap, got %v", err)
	}
	rec, _ := a.Inspect(ctx(t), img)
	if rec.Holder("nodeA") == nil || rec.Epoch != res.Holder.Epoch {
		t.Fatalf("a failed fence must not change the claim: %+v", rec)
	}
}

func TestClusterUnavailable(t *testing.T) {
	o := cephtest.Options(t)
	o.ConfFile = ""
	o.Monitors = []string{"127.0.0.1:9"} // discard port: nothing answers there
	o.Timeout = 2 * time.Second
	start := time.Now()
	_, err := cephconn.Connect(o)
	if !errors.Is(err, cephconn.ErrUnavailable) {
		t.Fatalf("want ErrUnavailable, got %v", err)
	}
	if time.Since(start) > 30*time.Second {
		t.Fatalf("connect to a dead cluster took %s", time.Since(start))
	}
}

var _ = rados.OperationNoFlag

// A takeover blocklists the holder, then loses its write to the holder's own renewal: the
// holder's mapping is fenced all the same, so the takeover goes through (a claim that looks
// live while its device cannot write would help nobody).
func TestTakeoverCompletesWhenTheFencedHolderRenewsInBetween(t *testing.T) {
	img := testImage(t, "")
	clk := newClock()
	a, b := newNode(t, "nodeA", clk), newNode(t, "nodeB", clk)
	res, err := a.Acquire(ctx(t), Request{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.SetMapping(ctx(t), img, res.Holder.Epoch, fakeClientAddr(21), "/dev/rbd0"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx(t), Request{Image: img, Takeover: true}); !errors.Is(err, ErrClaimedElsewhere) {
		t.Fatalf("first look: %v", err) // starts nodeB's watch of nodeA's heartbeat
	}
	silence(t, b.Store, img, clk.Advance, 31*time.Second)
	renewed := false
	b.afterFence = func() {
		if !renewed { // nodeA wakes up and renews between nodeB's fence and its write
			renewed = true
			if _, err := a.Renew(ctx(t), img, res.Holder.Epoch); err != nil {
				t.Errorf("nodeA's late renewal: %v", err)
			}
		}
	}
	got, err := b.Acquire(ctx(t), Request{Image: img, Takeover: true})
	if err != nil {
		t.Fatalf("takeover after fencing must complete, got %v", err)
	}
	if !renewed || got.Record.Holder("nodeA") != nil || got.Holder.Epoch != res.Holder.Epoch+1 || len(got.Fenced) != 1 {
		t.Fatalf("takeover result: renewed=%v %+v", renewed, got.Record)
	}
	if _, err := a.Renew(ctx(t), img, res.Holder.Epoch); !errors.Is(err, ErrFenced) {
		t.Fatalf("nodeA after the takeover: %v", err)
	}
}

// The image's look with the id last seen lists that header's watchers beside the id's read;
// when the image was recreated under its name meanwhile (another id), the watchers come from
// the new header, not the old one's, and a known id of an image gone is no error.
func TestImageInfoWithTheIDLastSeen(t *testing.T) {
	img := testImage(t, "")
	admin := cephtest.AdminConn(t)
	io, err := admin.OpenIOContext(img.Pool)
	if err != nil {
		t.Fatal(err)
	}
	defer io.Destroy()
	b, err := radosbackend.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	first, err := b.ImageInfo(ctx(t), img, "")
	if err != nil {
		t.Fatal(err)
	}
	im, err := rbd.OpenImage(io, img.Image, rbd.NoSnapshot) // a watcher of the first header
	if err != nil {
		t.Fatal(err)
	}
	known, err := b.ImageInfo(ctx(t), img, first.ID)
	if err != nil {
		t.Fatal(err)
	}
	if known.ID != first.ID || len(known.Watchers) != 1 {
		t.Fatalf("with the id known: %+v, want id %s and one watcher", known, first.ID)
	}
	if err := im.Close(); err != nil {
		t.Fatal(err)
	}
	if err := rbd.RemoveImage(io, img.Image); err != nil {
		t.Fatal(err)
	}
	opts := rbd.NewRbdImageOptions()
	defer opts.Destroy()
	if err := rbd.CreateImage(io, img.Image, 1<<20, opts); err != nil {
		t.Fatal(err)
	}
	again, err := b.ImageInfo(ctx(t), img, first.ID)
	if err != nil {
		t.Fatalf("the id known is of an image removed since: %v", err)
	}
	if again.ID == first.ID || len(again.Watchers) != 0 {
		t.Fatalf("recreated image: %+v (the first id was %s)", again, first.ID)
	}
}
