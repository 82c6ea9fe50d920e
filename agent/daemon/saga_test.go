package daemon

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/internal/cephtest"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/server"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

var bg = context.Background()

func TestMapUnmapAndIdempotence(t *testing.T) {
	a := newNode(t, "node-a")
	for _, ns := range []string{"", cephtest.Namespace} {
		img := a.image(ns)
		writes := len(a.kernel.Writes())
		resp, err := a.d.Map(bg, mapReq(ns, img), nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.AlreadyMapped || resp.Claim == nil || resp.Claim.Holders[0].NodeID != "node-a" || resp.Claim.Holders[0].Device != resp.Device {
			t.Fatalf("first map: %+v", resp)
		}
		if !strings.HasSuffix(resp.Link, "/rbd/"+strings.TrimPrefix(ns+"/", "/")+img) {
			t.Fatalf("link %q", resp.Link)
		}
		if !a.consistent(ns, img) {
			t.Fatal("not mapped")
		}
		again, err := a.d.Map(bg, mapReq(ns, img), nil)
		if err != nil {
			t.Fatal(err)
		}
		if !again.AlreadyMapped || again.Device != resp.Device || again.Claim.Epoch != resp.Claim.Epoch {
			t.Fatalf("repeated map: %+v, first %+v", again, resp)
		}
		if n := len(a.kernel.Writes()) - writes; n != 1 {
			t.Fatalf("%d kernel writes for two maps, want 1", n)
		}
		if _, err := a.d.Map(bg, withAccess(mapReq(ns, img), "rwx"), nil); !errors.Is(err, errInvalid) {
			t.Fatalf("map again with another access: %v", err)
		}
		ok, err := a.d.Unmap(bg, unmapReq(ns, img), nil)
		if err != nil || !ok {
			t.Fatalf("unmap: %v %v", ok, err)
		}
		if a.consistent(ns, img) {
			t.Fatal("still mapped")
		}
		if ok, err := a.d.Unmap(bg, unmapReq(ns, img), nil); ok || err != nil {
			t.Fatalf("second unmap: %v %v", ok, err)
		}
		a.kernel.Writes()
		for _, w := range a.kernel.Writes() {
			if strings.Contains(w, cephtest.Secret(t)) || strings.Contains(w, "secret=") {
				t.Fatalf("a secret went into sysfs: %q", w)
			}
		}
	}
	if len(a.audited(audit.Map)) != 2 || len(a.audited(audit.Unmap)) != 2 || len(a.audited(audit.Release)) != 2 {
		t.Fatalf("audit: map %d unmap %d release %d", len(a.audited(audit.Map)), len(a.audited(audit.Unmap)), len(a.audited(audit.Release)))
	}
}

func TestCrossNodeRefusalNamesTheOwner(t *testing.T) {
	a, b := newNode(t, "node-a"), newNode(t, "node-b")
	img := a.image("", b)
	if _, err := a.d.Map(bg, mapReq("", img), nil); err != nil {
		t.Fatal(err)
	}
	_, err := b.d.Map(bg, mapReq("", img), nil)
	var held *claim.HeldError
	if !errors.As(err, &held) || held.Owner().NodeID != "node-a" {
		t.Fatalf("want refusal naming node-a, got %v", err)
	}
	if e := server.APIError(err); e.Code != "claimed_elsewhere" || e.Owner == nil || e.Owner.NodeID != "node-a" {
		t.Fatalf("api error %+v", e)
	}
	if len(b.kernel.Writes()) != 0 {
		t.Fatal("a refused map wrote to sysfs")
	}
	if r := b.audited(audit.Refuse); len(r) != 1 || r[0].OwnerNode != "node-a" || r[0].Result != audit.Refused {
		t.Fatalf("refuse audit: %+v", r)
	}
	if _, err := a.d.Unmap(bg, unmapReq("", img), nil); err != nil {
		t.Fatal(err)
	}
	resp, err := b.d.Map(bg, mapReq("", img), nil)
	if err != nil {
		t.Fatalf("after A unmapped, B maps: %v", err)
	}
	if resp.Claim.Epoch != 2 {
		t.Fatalf("B's epoch %d, want 2", resp.Claim.Epoch)
	}
}

func TestBadNamesRefusedBeforeAnyWrite(t *testing.T) {
	a := newNode(t, "node-a")
	for _, req := range []struct{ pool, ns, image, snap, access string }{
		{"rbd", "", "a,b", "", ""}, {"rbd", "", "a b", "", ""}, {"rbd", "", "a=b", "", ""}, {"rbd", "x/y", "a", "", ""},
		{"rbd", "", "", "", ""}, {"", "", "a", "", ""}, {"rbd", "", "a\x00", "", ""}, {"rbd", "", strings.Repeat("a", 300), "", ""},
		{"rbd", "", "a", "s@t", ""}, {"rbd", "", "a", "", "rw"},
	} {
		r := mapReq(req.ns, req.image)
		r.Pool, r.Snapshot, r.Access = req.pool, req.snap, req.access
		_, err := a.d.Map(bg, r, nil)
		if server.APIError(err).Code != "invalid_argument" {
			t.Errorf("%+v: want invalid_argument, got %v", req, err)
		}
	}
	if w := a.kernel.Writes(); len(w) != 0 {
		t.Fatalf("bad names reached sysfs: %q", w)
	}
	if _, err := a.d.Map(bg, mapReq("", "no-such-image"), nil); server.APIError(err).Code != "not_found" {
		t.Fatalf("missing image: %v", err)
	}
}

// A failure at any step of the map saga undoes the steps before it.
func TestMapFailureAtEveryStepRollsBack(t *testing.T) {
	a := newNode(t, "node-a")
	for _, step := range []string{"persist-intent", "claim", "map", "record", "persist"} {
		t.Run(step, func(t *testing.T) {
			img := a.image("")
			boom := fmt.Errorf("injected failure at %s", step)
			a.fault = func(saga, s string) error {
				if saga == "map" && s == step {
					return boom
				}
				return nil
			}
			_, err := a.d.Map(bg, mapReq("", img), nil)
			a.fault = nil
			if !errors.Is(err, boom) {
				t.Fatalf("want the injected failure, got %v", err)
			}
			if a.consistent("", img) {
				t.Fatal("a failed map left a device")
			}
			if len(a.d.state.All()) != 0 {
				t.Fatalf("a failed map left state: %+v", a.d.state.All())
			}
			// and the image can be mapped afterwards
			if _, err := a.d.Map(bg, mapReq("", img), nil); err != nil {
				t.Fatal(err)
			}
			if _, err := a.d.Unmap(bg, unmapReq("", img), nil); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A crash (kill -9) at any step of the map or unmap saga, then a restart: recovery leaves no
// claim without a device and no device without a claim.
func TestCrashAtEveryStepThenRestartIsConsistent(t *testing.T) {
	a := newNode(t, "node-a")
	cases := []struct{ saga, step string }{
		{"map", "persist-intent"}, {"map", "claim"}, {"map", "map"}, {"map", "record"}, {"map", "record-send"}, {"map", "persist"},
		{"unmap", "persist-intent"}, {"unmap", "unmap"}, {"unmap", "release"}, {"unmap", "persist"},
	}
	for _, c := range cases {
		t.Run(c.saga+"/"+c.step, func(t *testing.T) {
			img := a.image("")
			if c.saga == "unmap" {
				if _, err := a.d.Map(bg, mapReq("", img), nil); err != nil {
					t.Fatal(err)
				}
			}
			a.fault = func(saga, s string) error {
				if saga == c.saga && s == c.step {
					return ErrCrash
				}
				return nil
			}
			var err error
			if c.saga == "map" {
				_, err = a.d.Map(bg, mapReq("", img), nil)
			} else {
				_, err = a.d.Unmap(bg, unmapReq("", img), nil)
			}
			a.fault = nil
			if !errors.Is(err, ErrCrash) {
				t.Fatalf("want the simulated crash, got %v", err)
			}
			a.start() // a new process: same state dir, same kernel, same cluster
			a.d.reconciler.recover(bg)
			mapped := a.consistent("", img)
			if c.saga == "unmap" && c.step != "persist-intent" && c.step != "unmap" && mapped {
				t.Fatal("unmap crashed after the kernel unmapped, yet a device is back")
			}
			// whatever recovery decided, the node can go on: map and unmap work
			if _, err := a.d.Map(bg, mapReq("", img), nil); err != nil {
				t.Fatalf("map after recovery: %v", err)
			}
			if _, err := a.d.Unmap(bg, unmapReq("", img), nil); err != nil {
				t.Fatalf("unmap after recovery: %v", err)
			}
			a.consistent("", img)
		})
	}
}

func TestRestartReadoptsMappedDevice(t *testing.T) {
	a := newNode(t, "node-a")
	img := a.image(cephtest.Namespace)
	resp, err := a.d.Map(bg, mapReq(cephtest.Namespace, img), nil)
	if err != nil {
		t.Fatal(err)
	}
	a.start()
	a.d.reconciler.recover(bg)
	again, err := a.d.Map(bg, mapReq(cephtest.Namespace, img), nil)
	if err != nil || !again.AlreadyMapped || again.Device != resp.Device || again.Claim.Epoch != resp.Claim.Epoch {
		t.Fatalf("after restart: %+v %v (before %+v)", again, err, resp)
	}
	if len(a.audited(audit.DeviceLost)) != 0 || len(a.audited(audit.UnmanagedDevice)) != 0 {
		t.Fatal("a re-adopted device was reported lost or unmanaged")
	}
}

func TestStormOfMapsAndUnmaps(t *testing.T) {
	a, b := newNode(t, "node-a"), newNode(t, "node-b")
	const images = 8
	names := make([]string, images)
	for i := range names {
		names[i] = a.image("", b)
	}
	var wg sync.WaitGroup
	for round := 0; round < 3; round++ {
		for i := range names {
			for _, n := range []*node{a, b} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := n.d.Map(bg, mapReq("", names[i]), nil)
					if err != nil && !errors.Is(err, claim.ErrClaimedElsewhere) {
						t.Errorf("%s map %s: %v", n.id, names[i], err)
					}
				}()
			}
		}
		wg.Wait()
		for i := range names {
			am, bm := a.consistent("", names[i]), b.consistent("", names[i])
			if am == bm {
				t.Fatalf("round %d image %d: mapped on a=%v b=%v, want exactly one", round, i, am, bm)
			}
		}
		for i := range names {
			for _, n := range []*node{a, b} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if _, err := n.d.Unmap(bg, unmapReq("", names[i]), nil); err != nil {
						t.Errorf("%s unmap: %v", n.id, err)
					}
				}()
			}
		}
		wg.Wait()
		for i := range names {
			if a.consistent("", names[i]) || b.consistent("", names[i]) {
				t.Fatalf("round %d: image %d still mapped", round, i)
			}
		}
	}
}

func TestSnapshotMapNeedsNoClaim(t *testing.T) {
	a := newNode(t, "node-a")
	img := cephtest.Image(t, cephtest.AdminConn(t), "")
	a.kernel.AddImage(cephtest.Pool, "", img, 16<<20, "s1")
	r := mapReq("", img)
	r.Snapshot = "s1"
	resp, err := a.d.Map(bg, r, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Claim != nil {
		t.Fatalf("snapshot map took a claim: %+v", resp.Claim)
	}
	if _, err := claimStore(t).Inspect(bg, claim.Image{Pool: cephtest.Pool, Image: img}); !errors.Is(err, claim.ErrNoClaim) {
		t.Fatalf("claim for a snapshot map: %v", err)
	}
	ur := unmapReq("", img)
	ur.Snapshot = "s1"
	if ok, err := a.d.Unmap(bg, ur, nil); !ok || err != nil {
		t.Fatalf("unmap snapshot: %v %v", ok, err)
	}
	devs, _ := a.d.kernel.FindBySpec(krbd.Spec{Pool: cephtest.Pool, Image: img, Snap: "s1"}, "")
	if len(devs) != 0 {
		t.Fatal("snapshot still mapped")
	}
}

func withAccess(r api.MapRequest, access string) api.MapRequest { r.Access = access; return r }

var _ = state.Mapped

// TestClaimIsAuditedWhenMade: the claim a map makes (and any takeover's fences) is in the audit
// trail before the kernel step runs, so that a kill during the rest of the saga cannot lose the
// record of what it changed on the cluster.
func TestClaimIsAuditedWhenMade(t *testing.T) {
	c := newMemCluster("c1", "rbd", "fsid-audit-claim")
	al := &auditLog{}
	var atKernel atomic.Int32
	n := startMemDaemonWith(t, func(o *Options) {
		o.Audit = audit.NewWithSink(o.Log, al.Record)
		o.Fault = func(saga, step string) error {
			if saga == "map" && step == "map" {
				atKernel.Store(int32(len(al.Find(audit.Claim, ""))))
			}
			return nil
		}
	}, c)
	t.Cleanup(func() { n.stop() })
	addImage(n, c, "img")
	if _, err := n.d.Map(context.Background(), api.MapRequest{Cluster: "c1", Pool: c.Pool, Image: "img"}, nil); err != nil {
		t.Fatal(err)
	}
	if got := atKernel.Load(); got != 1 {
		t.Fatalf("claim entries in the audit trail when the kernel step began: %d, want 1", got)
	}
	if es := al.Find(audit.Claim, ""); len(es) != 1 {
		t.Fatalf("claim entries after the map: %+v, want one", es)
	}
}
