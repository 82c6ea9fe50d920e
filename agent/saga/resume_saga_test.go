package saga

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/image"
	"github.com/rbd-owner/rbd-owner/agent/internal/agenttest"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/krbd/fakekernel"
	"github.com/rbd-owner/rbd-owner/agent/nodestate"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

const (
	testFSID   = "a7f64266-0894-4f1e-a635-d0aeaca0e993"
	testSecret = agenttest.Secret
)

// fakeCluster is a configured cluster on an in-memory claim store.
type fakeCluster struct{ store *claim.Store }

func (c *fakeCluster) ID() string                                   { return "test" }
func (c *fakeCluster) Claims(context.Context) (*claim.Store, error) { return c.store, nil }
func (c *fakeCluster) Connected() (*claim.Store, bool)              { return c.store, true }
func (c *fakeCluster) Secret() (string, error)                      { return testSecret, nil }
func (c *fakeCluster) MapDefaults(image.Ref) (krbd.ClusterDefaults, error) {
	return krbd.ClusterDefaults{}, nil
}
func (c *fakeCluster) MapOptions() krbd.MapOptions {
	return krbd.MapOptions{Monitors: []string{agenttest.MemoryMonitor}, User: agenttest.User}
}

// fakeAgent is the agent around the sagas: one cluster, "test".
type fakeAgent struct {
	cl       Cluster
	mu       sync.Mutex
	goneSeen int // FencedMappingGone calls
}

func (a *fakeAgent) Cluster(id string) (Cluster, error) {
	if id != "test" && id != "" { // "": the only one
		return nil, errors.New("no such cluster")
	}
	return a.cl, nil
}
func (a *fakeAgent) ClusterByFSID(string) Cluster { return a.cl }
func (a *fakeAgent) DeviceGone(context.Context, state.Mapping, string) error {
	return errors.New("not called by Resume")
}
func (a *fakeAgent) FencedMappingGone(context.Context, *claim.Store, state.Mapping) {
	a.mu.Lock()
	a.goneSeen++
	a.mu.Unlock()
}
func (a *fakeAgent) WatchHeld(state.Key, bool)     {}
func (a *fakeAgent) ClusterLabel(id string) string { return id }

// resumeRig is one node's sagas on an agenttest.Env (a fake kernel, a state dir, an audit log)
// with an in-memory cluster that a second node ("other") shares.
type resumeRig struct {
	s      *Sagas
	env    *agenttest.Env
	kernel *fakekernel.Kernel
	cl     *fakeCluster
	other  *claim.Store
	spec   image.Ref
	img    claim.Image
	key    state.Key
}

func newResumeRig(t *testing.T) *resumeRig {
	t.Helper()
	c := agenttest.NewCluster("test", "rbd", testFSID)
	env := agenttest.NewEnv(t, agenttest.Memory(c), agenttest.Node("node-a"))
	spec := image.Ref{Pool: "rbd", Image: "img1"}
	env.AddImage(c, spec.Image)
	store := func(id string) *claim.Store {
		s, err := claim.NewStoreOn(c.M, claim.Config{Node: claim.Node{ID: id, Hostname: "host-" + id, AgentVersion: "test"},
			Lease: 15 * time.Second, FenceExpiry: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	st, err := state.Open(env.Config.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	r := &resumeRig{env: env, kernel: env.Kernel, cl: &fakeCluster{store: store("node-a")}, other: store("node-b"), spec: spec, img: spec.Head(),
		key: state.Key{Cluster: "test", Ref: spec}}
	r.s = &Sagas{Agent: &fakeAgent{cl: r.cl}, Config: env.Config,
		Kernel: krbd.New(env.KernelConfig()), State: st, Node: nodestate.New(st), Locks: &Locks{}, Log: env.Log,
		Audit: env.AuditLogger()}
	return r
}

// mapDevice makes the image's device in the fake kernel, as an interrupted map's kernel step.
func (r *resumeRig) mapDevice(t *testing.T) krbd.Device {
	t.Helper()
	o := r.cl.MapOptions()
	o.Secret, o.Timeout, o.MountTimeout = testSecret, 30*time.Second, 5*time.Second
	dev, err := r.s.Kernel.Map(context.Background(), r.spec, o)
	if err != nil {
		t.Fatal(err)
	}
	return dev
}

// claimIt takes the image's claim for store's node, as an interrupted map's claim step.
func (r *resumeRig) claimIt(t *testing.T, store *claim.Store, takeover bool) uint64 {
	t.Helper()
	res, err := store.Acquire(context.Background(), claim.Request{Image: r.img, Takeover: takeover, TakeFenced: takeover, TakeCovered: takeover})
	if err != nil {
		t.Fatal(err)
	}
	return res.Holder.Epoch
}

// resume runs Resume on the persisted mapping as the reconciler does: the devices by id.
func (r *resumeRig) resume(t *testing.T) error {
	t.Helper()
	m, ok := r.s.State.Get(r.key)
	if !ok {
		t.Fatal("no state entry")
	}
	devs, err := r.s.Kernel.List()
	if err != nil {
		t.Fatal(err)
	}
	byID := map[int]krbd.Device{}
	for _, dv := range devs {
		byID[dv.ID] = dv
	}
	return r.s.Resume(context.Background(), r.cl, m, byID)
}

func (r *resumeRig) events() []string {
	var out []string
	for _, e := range r.env.Audit.Entries() {
		out = append(out, e.Event)
	}
	return out
}

func (r *resumeRig) put(t *testing.T, m state.Mapping) {
	t.Helper()
	m.Key, m.FSID, m.Access, m.Claimed = r.key, testFSID, "rwo", true
	if err := r.s.State.Put(m); err != nil {
		t.Fatal(err)
	}
}

// TestResumeAdoptsTheDeviceOfAnInterruptedMap: a map killed after the kernel made its device
// ("claiming", this node's claim written): Resume records the device in the claim and adopts it.
func TestResumeAdoptsTheDeviceOfAnInterruptedMap(t *testing.T) {
	r := newResumeRig(t)
	r.put(t, state.Mapping{Phase: state.Claiming})
	epoch := r.claimIt(t, r.cl.store, false)
	dev := r.mapDevice(t)
	if err := r.resume(t); err != nil {
		t.Fatal(err)
	}
	m, ok := r.s.State.Get(r.key)
	if !ok || m.Phase != state.Mapped || m.Epoch != epoch || m.DeviceID != dev.ID || m.ClientAddr != dev.ClientAddr {
		t.Fatalf("state after resume: %+v (found %v), want mapped %s at epoch %d", m, ok, dev.DevNode, epoch)
	}
	rec, err := r.cl.store.Inspect(context.Background(), r.img)
	if err != nil {
		t.Fatal(err)
	}
	if !r.cl.store.Records(rec, dev.ClientAddr) {
		t.Fatalf("the claim does not record the adopted device's client %s: %+v", dev.ClientAddr, rec.Holders)
	}
	if p, _ := r.s.Node.Problem(r.key); p != "" {
		t.Errorf("problem left: %q", p)
	}
}

// TestResumeUndoesAClaimWithoutDevice: a map killed after its claim and before the kernel:
// Resume releases the claim (audited) and forgets the mapping.
func TestResumeUndoesAClaimWithoutDevice(t *testing.T) {
	r := newResumeRig(t)
	r.put(t, state.Mapping{Phase: state.Claiming})
	r.claimIt(t, r.cl.store, false)
	if err := r.resume(t); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.s.State.Get(r.key); ok {
		t.Fatal("the state entry is kept")
	}
	rec, err := r.cl.store.Inspect(context.Background(), r.img)
	if err != nil && !errors.Is(err, claim.ErrNoClaim) {
		t.Fatal(err)
	}
	if rec.Holder("node-a") != nil {
		t.Fatalf("this node still holds the image: %+v", rec.Holders)
	}
	if ev := r.events(); len(ev) != 1 || ev[0] != audit.Release {
		t.Fatalf("audited %v, want one release", ev)
	}
}

// TestResumeRemovesTheDeviceOfAMapWhoseClaimIsGone: a map killed after the kernel write
// ("claimed", a state older agents wrote) whose claim is gone meanwhile: the record step
// answers lost, and Resume removes the device nobody was handed and forgets the mapping.
func TestResumeRemovesTheDeviceOfAMapWhoseClaimIsGone(t *testing.T) {
	r := newResumeRig(t)
	epoch := r.claimIt(t, r.cl.store, false)
	r.put(t, state.Mapping{Phase: state.Claimed, Epoch: epoch})
	r.mapDevice(t)
	// the hold is gone meanwhile (an admin's forced release, say)
	if ok, err := r.cl.store.Release(context.Background(), r.img, epoch); err != nil || !ok {
		t.Fatalf("release: %v %v", ok, err)
	}
	if err := r.resume(t); err != nil {
		t.Fatal(err)
	}
	if devs, err := r.s.Kernel.List(); err != nil || len(devs) != 0 {
		t.Fatalf("devices left: %v (%v)", devs, err)
	}
	if _, ok := r.s.State.Get(r.key); ok {
		t.Fatal("the state entry is kept")
	}
}

// TestResumeFinishesAnInterruptedUnmap: an unmap killed after its intent: Resume removes the
// device, releases the claim and forgets the mapping; a second run finds nothing to do.
func TestResumeFinishesAnInterruptedUnmap(t *testing.T) {
	r := newResumeRig(t)
	epoch := r.claimIt(t, r.cl.store, false)
	dev := r.mapDevice(t)
	r.put(t, state.Mapping{Phase: state.Unmapping, Epoch: epoch, DeviceID: dev.ID, Device: dev.DevNode, ClientAddr: dev.ClientAddr})
	if err := r.resume(t); err != nil {
		t.Fatal(err)
	}
	if devs, err := r.s.Kernel.List(); err != nil || len(devs) != 0 {
		t.Fatalf("devices left: %v (%v)", devs, err)
	}
	if _, ok := r.s.State.Get(r.key); ok {
		t.Fatal("the state entry is kept")
	}
	if ev := r.events(); len(ev) != 1 || ev[0] != audit.Release {
		t.Fatalf("audited %v, want one release", ev)
	}
}

// TestResumeLeavesAMappingOfAClusterNoLongerConfigured: nothing is done, a problem is said.
func TestResumeLeavesAMappingOfAClusterNoLongerConfigured(t *testing.T) {
	r := newResumeRig(t)
	r.put(t, state.Mapping{Phase: state.Claiming})
	m, _ := r.s.State.Get(r.key)
	if err := r.s.Resume(context.Background(), nil, m, nil); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.s.State.Get(r.key); !ok {
		t.Fatal("the state entry is dropped")
	}
	if p, _ := r.s.Node.Problem(r.key); p != `cluster "test" is no longer configured; mapping left alone` {
		t.Fatalf("problem %q", p)
	}
}

// TestResumeLeavesADeviceWithoutThisNodesClaim: a map killed while claiming, a device of the
// image mapped here, the claim another node's: the device is left to the judgement of mappings
// made outside rbd-owner (not removed, not adopted) and the mapping forgotten.
func TestResumeLeavesADeviceWithoutThisNodesClaim(t *testing.T) {
	r := newResumeRig(t)
	r.put(t, state.Mapping{Phase: state.Claiming})
	r.claimIt(t, r.other, false)
	dev := r.mapDevice(t)
	if err := r.resume(t); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.s.State.Get(r.key); ok {
		t.Fatal("the state entry is kept")
	}
	if devs, err := r.s.Kernel.List(); err != nil || len(devs) != 1 || devs[0].ID != dev.ID {
		t.Fatalf("devices: %v (%v), want %s left alone", devs, err, dev.DevNode)
	}
	rec, err := r.other.Inspect(context.Background(), r.img)
	if err != nil || rec.Holder("node-b") == nil || rec.Holder("node-a") != nil {
		t.Fatalf("claim: %+v (%v), want node-b's alone", rec, err)
	}
}
