package saga

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/cephconn"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/fault"
	"github.com/rbd-owner/rbd-owner/agent/image"
	"github.com/rbd-owner/rbd-owner/agent/internal/agenttest"
	"github.com/rbd-owner/rbd-owner/agent/internal/cephtest"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/krbd/fakekernel"
	"github.com/rbd-owner/rbd-owner/agent/nodestate"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// The map and unmap sagas on the live test cluster (skipped without one), each node its own
// sagas, fake kernel and state on an agenttest.Env, its claims in RADOS.

// liveCluster is the live test cluster as a node's sagas use it.
type liveCluster struct {
	store   *claim.Store
	secret  string
	monitor string
	user    string
}

func (c *liveCluster) ID() string                                   { return "test" }
func (c *liveCluster) Claims(context.Context) (*claim.Store, error) { return c.store, nil }
func (c *liveCluster) Connected() (*claim.Store, bool)              { return c.store, true }
func (c *liveCluster) Secret() (string, error)                      { return c.secret, nil }
func (c *liveCluster) MapDefaults(image.Ref) (krbd.ClusterDefaults, error) {
	return krbd.ClusterDefaults{}, nil
}
func (c *liveCluster) MapOptions() krbd.MapOptions {
	return krbd.MapOptions{Monitors: []string{c.monitor}, User: c.user}
}

// sagaNode is one node's sagas on the live cluster.
type sagaNode struct {
	t      *testing.T
	id     string
	s      *Sagas
	env    *agenttest.Env
	kernel *fakekernel.Kernel
	fault  func(saga, step string) error // the next steps' fault, when set
}

func newSagaNode(t *testing.T, id string) *sagaNode {
	t.Helper()
	env := agenttest.NewEnv(t, agenttest.Live(), agenttest.Node(id)) // skips without a cluster
	n := &sagaNode{t: t, id: id, env: env, kernel: env.Kernel}
	st, err := state.Open(env.Config.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	cl := &liveCluster{store: liveStore(t, id), secret: env.Secret, monitor: cephtest.MonitorV1(t), user: env.Config.Clusters[0].User}
	n.s = &Sagas{Agent: &fakeAgent{cl: cl}, Config: env.Config, Kernel: krbd.New(env.KernelConfig()), State: st,
		Node: nodestate.New(st), Locks: &Locks{}, Log: env.Log, Audit: env.AuditLogger(),
		Fault: func(saga, step string) error {
			if n.fault != nil {
				return n.fault(saga, step)
			}
			return nil
		}}
	return n
}

// liveStore is node id's view of the claims in the live cluster.
func liveStore(t *testing.T, id string) *claim.Store {
	t.Helper()
	conn, err := cephconn.Connect(cephtest.Options(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Shutdown)
	s, err := claim.NewStore(conn, claim.Config{Node: claim.Node{ID: id, Hostname: "host-" + id, AgentVersion: "test"},
		Lease: 30 * time.Second, FenceExpiry: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// image makes a fresh image in namespace ns, known to the kernels of n and also.
func (n *sagaNode) image(ns string, also ...*sagaNode) string {
	n.t.Helper()
	name := cephtest.Image(n.t, cephtest.AdminConn(n.t), ns)
	for _, m := range append([]*sagaNode{n}, also...) {
		m.kernel.AddImage(cephtest.Pool, ns, name, 16<<20)
	}
	return name
}

func (n *sagaNode) mapIt(r api.MapRequest) (*api.MapResponse, error) {
	return n.s.Map(context.Background(), r, Caller{})
}

func (n *sagaNode) unmapIt(r api.UnmapRequest) (bool, error) {
	return n.s.Unmap(context.Background(), r, Caller{})
}

func (n *sagaNode) audited(event string) []audit.Entry {
	var out []audit.Entry
	for _, e := range n.env.Audit.Entries() {
		if e.Event == event {
			out = append(out, e)
		}
	}
	return out
}

func sagaMapReq(ns, image string) api.MapRequest {
	return api.MapRequest{Pool: cephtest.Pool, Namespace: ns, Image: image, Requester: "test"}
}

func sagaUnmapReq(ns, image string) api.UnmapRequest {
	return api.UnmapRequest{Pool: cephtest.Pool, Namespace: ns, Image: image}
}

// consistent fails the test unless the node's kernel, the claim and the state agree on the
// image, and says whether it is mapped here.
func (n *sagaNode) consistent(ns, image string) (mapped bool) {
	n.t.Helper()
	spec := krbd.Spec{Pool: cephtest.Pool, Namespace: ns, Image: image}
	devs, err := n.s.Kernel.FindBySpec(spec, "")
	if err != nil {
		n.t.Fatal(err)
	}
	rec, err := liveStore(n.t, "observer").Inspect(context.Background(), claim.Image{Pool: cephtest.Pool, Namespace: ns, Image: image})
	var h *claim.Holder
	if err == nil {
		h = rec.Holder(n.id)
	}
	switch {
	case len(devs) > 1:
		n.t.Fatalf("%s: %d devices for %s", n.id, len(devs), spec)
	case len(devs) == 1 && h == nil:
		n.t.Fatalf("%s: device %s without a claim (%v)", n.id, devs[0].DevNode, err)
	case len(devs) == 0 && h != nil:
		n.t.Fatalf("%s: claim (epoch %d) without a device", n.id, h.Epoch)
	case len(devs) == 1 && h.ClientAddr != devs[0].ClientAddr:
		n.t.Fatalf("%s: claim names client %q, device is %q", n.id, h.ClientAddr, devs[0].ClientAddr)
	}
	for _, m := range n.s.State.All() {
		if m.Image == image && len(devs) == 0 {
			n.t.Fatalf("%s: state keeps %+v with no device", n.id, m)
		}
	}
	return len(devs) == 1
}

func TestMapUnmapAndIdempotence(t *testing.T) {
	a := newSagaNode(t, "node-a")
	for _, ns := range []string{"", cephtest.Namespace} {
		img := a.image(ns)
		writes := len(a.kernel.Writes())
		resp, err := a.mapIt(sagaMapReq(ns, img))
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
		again, err := a.mapIt(sagaMapReq(ns, img))
		if err != nil {
			t.Fatal(err)
		}
		if !again.AlreadyMapped || again.Device != resp.Device || again.Claim.Epoch != resp.Claim.Epoch {
			t.Fatalf("repeated map: %+v, first %+v", again, resp)
		}
		if n := len(a.kernel.Writes()) - writes; n != 1 {
			t.Fatalf("%d kernel writes for two maps, want 1", n)
		}
		if _, err := a.mapIt(withAccess(sagaMapReq(ns, img), "rwx")); !errors.Is(err, fault.ErrInvalid) {
			t.Fatalf("map again with another access: %v", err)
		}
		ok, err := a.unmapIt(sagaUnmapReq(ns, img))
		if err != nil || !ok {
			t.Fatalf("unmap: %v %v", ok, err)
		}
		if a.consistent(ns, img) {
			t.Fatal("still mapped")
		}
		if ok, err := a.unmapIt(sagaUnmapReq(ns, img)); ok || err != nil {
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
	a, b := newSagaNode(t, "node-a"), newSagaNode(t, "node-b")
	img := a.image("", b)
	if _, err := a.mapIt(sagaMapReq("", img)); err != nil {
		t.Fatal(err)
	}
	_, err := b.mapIt(sagaMapReq("", img))
	var held *claim.HeldError
	if !errors.As(err, &held) || held.Owner().NodeID != "node-a" {
		t.Fatalf("want refusal naming node-a, got %v", err)
	}
	var d api.Detailer
	var e api.Error
	if errors.As(err, &d) {
		d.Details(&e)
	}
	if !fault.Is(err, fault.ClaimedElsewhere) || e.Owner == nil || e.Owner.NodeID != "node-a" {
		t.Fatalf("api error %+v", e)
	}
	if len(b.kernel.Writes()) != 0 {
		t.Fatal("a refused map wrote to sysfs")
	}
	if r := b.audited(audit.Refuse); len(r) != 1 || r[0].OwnerNode != "node-a" || r[0].Result != audit.Refused {
		t.Fatalf("refuse audit: %+v", r)
	}
	if _, err := a.unmapIt(sagaUnmapReq("", img)); err != nil {
		t.Fatal(err)
	}
	resp, err := b.mapIt(sagaMapReq("", img))
	if err != nil {
		t.Fatalf("after A unmapped, B maps: %v", err)
	}
	if resp.Claim.Epoch != 2 {
		t.Fatalf("B's epoch %d, want 2", resp.Claim.Epoch)
	}
}

func TestBadNamesRefusedBeforeAnyWrite(t *testing.T) {
	a := newSagaNode(t, "node-a")
	for _, req := range []struct{ pool, ns, image, snap, access string }{
		{"rbd", "", "a,b", "", ""}, {"rbd", "", "a b", "", ""}, {"rbd", "", "a=b", "", ""}, {"rbd", "x/y", "a", "", ""},
		{"rbd", "", "", "", ""}, {"", "", "a", "", ""}, {"rbd", "", "a\x00", "", ""}, {"rbd", "", strings.Repeat("a", 300), "", ""},
		{"rbd", "", "a", "s@t", ""}, {"rbd", "", "a", "", "rw"},
	} {
		r := sagaMapReq(req.ns, req.image)
		r.Pool, r.Snapshot, r.Access = req.pool, req.snap, req.access
		_, err := a.mapIt(r)
		if !fault.Is(err, fault.Invalid) {
			t.Errorf("%+v: want invalid_argument, got %v", req, err)
		}
	}
	if w := a.kernel.Writes(); len(w) != 0 {
		t.Fatalf("bad names reached sysfs: %q", w)
	}
	if _, err := a.mapIt(sagaMapReq("", "no-such-image")); !fault.Is(err, fault.NotFound) {
		t.Fatalf("missing image: %v", err)
	}
}

// A failure at any step of the map saga undoes the steps before it.
func TestMapFailureAtEveryStepRollsBack(t *testing.T) {
	a := newSagaNode(t, "node-a")
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
			_, err := a.mapIt(sagaMapReq("", img))
			a.fault = nil
			if !errors.Is(err, boom) {
				t.Fatalf("want the injected failure, got %v", err)
			}
			if a.consistent("", img) {
				t.Fatal("a failed map left a device")
			}
			if len(a.s.State.All()) != 0 {
				t.Fatalf("a failed map left state: %+v", a.s.State.All())
			}
			// and the image can be mapped afterwards
			if _, err := a.mapIt(sagaMapReq("", img)); err != nil {
				t.Fatal(err)
			}
			if _, err := a.unmapIt(sagaUnmapReq("", img)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestStormOfMapsAndUnmaps(t *testing.T) {
	a, b := newSagaNode(t, "node-a"), newSagaNode(t, "node-b")
	const images = 8
	names := make([]string, images)
	for i := range names {
		names[i] = a.image("", b)
	}
	var wg sync.WaitGroup
	for round := 0; round < 3; round++ {
		for i := range names {
			for _, n := range []*sagaNode{a, b} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := n.mapIt(sagaMapReq("", names[i]))
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
			for _, n := range []*sagaNode{a, b} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if _, err := n.unmapIt(sagaUnmapReq("", names[i])); err != nil {
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
	a := newSagaNode(t, "node-a")
	img := cephtest.Image(t, cephtest.AdminConn(t), "")
	a.kernel.AddImage(cephtest.Pool, "", img, 16<<20, "s1")
	r := sagaMapReq("", img)
	r.Snapshot = "s1"
	resp, err := a.mapIt(r)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Claim != nil {
		t.Fatalf("snapshot map took a claim: %+v", resp.Claim)
	}
	if _, err := liveStore(t, "observer").Inspect(context.Background(), claim.Image{Pool: cephtest.Pool, Image: img}); !errors.Is(err, claim.ErrNoClaim) {
		t.Fatalf("claim for a snapshot map: %v", err)
	}
	ur := sagaUnmapReq("", img)
	ur.Snapshot = "s1"
	if ok, err := a.unmapIt(ur); !ok || err != nil {
		t.Fatalf("unmap snapshot: %v %v", ok, err)
	}
	devs, _ := a.s.Kernel.FindBySpec(krbd.Spec{Pool: cephtest.Pool, Image: img, Snap: "s1"}, "")
	if len(devs) != 0 {
		t.Fatal("snapshot still mapped")
	}
}

// TestClaimIsAuditedWhenMade: the claim a map makes (and any takeover's fences) is in the audit
// trail before the kernel step runs, so that a kill during the rest of the saga cannot lose the
// record of what it changed on the cluster.
func TestClaimIsAuditedWhenMade(t *testing.T) {
	r := newResumeRig(t) // an in-memory cluster: runs without the live one
	var atKernel atomic.Int32
	r.s.Fault = func(saga, step string) error {
		if saga == "map" && step == "map" {
			atKernel.Store(int32(len(r.env.Audit.Find(audit.Claim, ""))))
		}
		return nil
	}
	if _, err := r.s.Map(context.Background(), api.MapRequest{Pool: r.spec.Pool, Image: r.spec.Image}, Caller{}); err != nil {
		t.Fatal(err)
	}
	if got := atKernel.Load(); got != 1 {
		t.Fatalf("claim entries in the audit trail when the kernel step began: %d, want 1", got)
	}
	if es := r.env.Audit.Find(audit.Claim, ""); len(es) != 1 {
		t.Fatalf("claim entries after the map: %+v, want one", es)
	}
}

func withAccess(r api.MapRequest, access string) api.MapRequest { r.Access = access; return r }
