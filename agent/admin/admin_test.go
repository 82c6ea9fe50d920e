package admin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/claim/memory"
	"github.com/rbd-owner/rbd-owner/agent/claim/record"
	"github.com/rbd-owner/rbd-owner/agent/fault"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// agent is the running agent as the admin calls see it: one cluster, "lab", on the in-memory
// cluster, whose claims this node's store reads.
type agent struct{ store *claim.Store }

func (g agent) Cluster(id string) (string, error) {
	if id != "" && id != "lab" {
		return "", fmt.Errorf("%w: no cluster %s", fault.ErrInvalid, id)
	}
	return "lab", nil
}

func (g agent) Claims(context.Context, string) (*claim.Store, error) { return g.store, nil }

func (g agent) Pools(ctx context.Context, _, pool string) ([]string, error) {
	if pool != "" {
		return []string{pool}, nil
	}
	return g.store.Backend().Pools(ctx)
}

func (g agent) LockImage(context.Context, state.Key) (func(), error) { return func() {}, nil }

func (g agent) RememberPool(state.Key) {}

// rig is the in-memory cluster, a node holding images (node-a, at 10.0.0.1) and the admin
// calls of another node (node-b), with what they audited.
type rig struct {
	m       *memory.Memory
	a, b    *claim.Store
	admin   *Admin
	mu      sync.Mutex
	audited []audit.Entry
}

func newRig(t *testing.T) *rig {
	t.Helper()
	r := &rig{m: memory.New("fsid")}
	store := func(id, addr string) *claim.Store {
		s, err := claim.NewStoreOn(r.m, claim.Config{Node: claim.Node{ID: id, Hostname: "host-" + id, AgentVersion: "test",
			Addr: func() string { return addr }}, Lease: 15 * time.Second, FenceExpiry: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	r.a, r.b = store("node-a", "10.0.0.1"), store("node-b", "10.0.0.2")
	log := logrus.New()
	log.SetOutput(testWriter{t})
	r.admin = &Admin{Agent: agent{r.b}, NodeID: "node-b", Log: log, Audit: audit.NewWithSink(log, func(e audit.Entry) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.audited = append(r.audited, e)
	})}
	return r
}

// testWriter sends the log to the test's.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// entries are the audit entries recorded since the last call.
func (r *rig) entries() []audit.Entry {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.audited
	r.audited = nil
	return out
}

// hold has node-a claim img (created first), with a mapping at client when not "".
func (r *rig) hold(t *testing.T, img claim.Image, client string) *claim.Result {
	t.Helper()
	r.m.AddImage(img, "id-"+img.Image)
	res, err := r.a.Acquire(context.Background(), claim.Request{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	if client != "" {
		if _, err := r.a.SetMapping(context.Background(), img, res.Holder.Epoch, client, "/dev/rbd0"); err != nil {
			t.Fatal(err)
		}
	}
	return res
}

var root = &peercred.Cred{UID: 0, PID: 42}

// TestRemoveOrphansIsAsStrictAsTheSweep: without --force, claims --remove-orphans removes only
// what the automatic sweep removes (a free claim keeping no live fence); an orphan still held,
// or keeping a live fence of a mapping that could still write (its image maybe only renamed or
// in the trash), is kept and answered with why and the next step. With --force they go too,
// each audited as forced at warning priority.
func TestRemoveOrphansIsAsStrictAsTheSweep(t *testing.T) {
	ctx := context.Background()
	r := newRig(t)
	free, held, fenced := claim.Image{Pool: "rbd", Image: "free"}, claim.Image{Pool: "rbd", Image: "held"}, claim.Image{Pool: "rbd", Namespace: "ns1", Image: "fenced"}
	alive := claim.Image{Pool: "rbd", Image: "alive"}
	res := r.hold(t, free, "")
	if ok, err := r.a.Release(ctx, free, res.Holder.Epoch); !ok || err != nil {
		t.Fatal(ok, err)
	}
	r.hold(t, held, "10.0.0.1:0/5")
	// fenced by an admin, then force-released: free, but its fence stays live while node-a's
	// mapping may exist
	r.hold(t, fenced, "10.0.0.1:0/7")
	if _, err := r.b.Fence(ctx, fenced); err != nil {
		t.Fatal(err)
	}
	if ok, err := r.b.ForceRelease(ctx, fenced); !ok || err != nil {
		t.Fatal(ok, err)
	}
	r.hold(t, alive, "10.0.0.1:0/9")
	for _, img := range []claim.Image{free, held, fenced} {
		r.m.RemoveImage(img)
	}
	if rec, err := r.b.Inspect(ctx, fenced); err != nil || !rec.Free() || len(rec.Kept()) != 1 {
		t.Fatalf("the fenced orphan should be free with one live fence: %+v %v", rec, err)
	}
	r.entries()

	out, err := r.admin.RemoveOrphans(ctx, api.OrphansRequest{}, root)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(out.Removed, []string{"rbd/free"}) {
		t.Fatalf("removed without --force: %v, want only rbd/free", out.Removed)
	}
	kept := map[string]api.KeptOrphan{}
	for _, k := range out.Kept {
		kept[k.Image] = k
	}
	if len(kept) != 2 {
		t.Fatalf("kept: %+v, want rbd/held and rbd/ns1/fenced", out.Kept)
	}
	h, f := kept["rbd/held"], kept["rbd/ns1/fenced"]
	if !slices.Equal(h.HeldBy, []string{"node-a"}) || len(h.FencesOf) != 0 || !strings.Contains(h.Why, "is still held by node node-a (epoch 1)") {
		t.Errorf("the held orphan: %+v", h)
	}
	if len(f.HeldBy) != 0 || !slices.Equal(f.FencesOf, []string{"node-a"}) || !strings.Contains(f.Why, "keeps live fences of node node-a (10.0.0.1:0/7)") {
		t.Errorf("the fenced orphan: %+v", f)
	}
	for _, k := range []api.KeptOrphan{h, f} {
		if !strings.Contains(k.Why, "renamed or moved to the trash") || !strings.Contains(k.NextStep, "`rbd-owner claims --remove-orphans --force --pool rbd`") ||
			!strings.Contains(k.NextStep, "rbd trash ls --pool rbd") || !strings.Contains(k.NextStep, "rbd ls --pool rbd") {
			t.Errorf("%s: why %q, next step %q", k.Image, k.Why, k.NextStep)
		}
	}
	if !strings.Contains(f.NextStep, "rbd trash ls --pool rbd --namespace ns1") {
		t.Errorf("the next step does not name the namespace: %q", f.NextStep)
	}
	for _, img := range []claim.Image{held, fenced, alive} {
		if _, err := r.b.Inspect(ctx, img); err != nil {
			t.Errorf("%s: its claim is gone without --force: %v", img, err)
		}
	}
	if es := r.entries(); len(es) != 1 || es[0].Image != "free" || es[0].Warning {
		t.Errorf("audited without --force: %+v", es)
	}

	// named by cluster: the next step names it too
	out, err = r.admin.RemoveOrphans(ctx, api.OrphansRequest{Cluster: "lab", Pool: "rbd"}, root)
	if err != nil || len(out.Removed) != 0 || len(out.Kept) != 2 || !strings.HasSuffix(out.Kept[0].NextStep, "--force --pool rbd --cluster lab`") {
		t.Fatalf("again, in cluster lab: %+v %v", out, err)
	}

	out, err = r.admin.RemoveOrphans(ctx, api.OrphansRequest{Force: true}, root)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out.Removed)
	if !slices.Equal(out.Removed, []string{"rbd/held", "rbd/ns1/fenced"}) || len(out.Kept) != 0 {
		t.Fatalf("with --force: %+v", out)
	}
	for _, img := range []claim.Image{held, fenced} {
		if _, err := r.b.Inspect(ctx, img); !errors.Is(err, claim.ErrNoClaim) {
			t.Errorf("%s: its claim is still there after --force: %v", img, err)
		}
	}
	if _, err := r.b.Inspect(ctx, alive); err != nil {
		t.Errorf("the claim of an image that exists was removed: %v", err)
	}
	es := r.entries()
	if len(es) != 2 {
		t.Fatalf("audited with --force: %+v", es)
	}
	for _, e := range es {
		if !e.Warning || e.Event != audit.Release || !e.HasPeer || !strings.HasPrefix(e.Message, "FORCED (claims --remove-orphans --force): removed the claim of deleted image") ||
			!strings.Contains(e.Message, "node node-a") {
			t.Errorf("a forced removal's audit entry: %+v", e)
		}
	}
}

// TestRemoveOrphansJudgesAClaimChangedMeanwhile: a free orphan held again between the listing
// and its removal (the sweep's compare refuses it) is judged as it is then: kept, naming its
// holder, and not left out of the answer.
func TestRemoveOrphansJudgesAClaimChangedMeanwhile(t *testing.T) {
	ctx := context.Background()
	r := newRig(t)
	img := claim.Image{Pool: "rbd", Image: "retaken"}
	res := r.hold(t, img, "")
	if ok, err := r.a.Release(ctx, img, res.Holder.Epoch); !ok || err != nil {
		t.Fatal(ok, err)
	}
	r.m.RemoveImage(img)
	var done atomic.Bool
	r.m.SetHook(func(_ context.Context, call string, i claim.Image) error {
		// the listing's look at the image: node-a claims it again (the image back for a moment)
		if call == "imageid" && i == img && done.CompareAndSwap(false, true) {
			r.m.AddImage(img, "id-"+img.Image)
			if _, err := r.a.Acquire(ctx, claim.Request{Image: img}); err != nil {
				t.Error(err)
			}
			r.m.RemoveImage(img)
		}
		return nil
	})
	out, err := r.admin.RemoveOrphans(ctx, api.OrphansRequest{Pool: "rbd"}, root)
	if err != nil || !done.Load() {
		t.Fatal(err, done.Load())
	}
	if len(out.Removed) != 0 || len(out.Kept) != 1 || !slices.Equal(out.Kept[0].HeldBy, []string{"node-a"}) {
		t.Fatalf("a claim held again meanwhile: %+v", out)
	}
}

// TestFenceNodeIsIdempotent: a node's fence run again once each of its holds was taken over or
// released answers success with a note and fences nothing, so that a script may run it twice;
// only a node whose heartbeats list no hold (or that has none) is not found.
func TestFenceNodeIsIdempotent(t *testing.T) {
	ctx := context.Background()
	r := newRig(t)
	one, two := claim.Image{Pool: "rbd", Image: "one"}, claim.Image{Pool: "rbd", Namespace: "ns1", Image: "two"}
	r.hold(t, one, "10.0.0.1:0/5")
	r.hold(t, two, "10.0.0.1:0/6")
	first, err := r.admin.Fence(ctx, api.ImageRequest{Node: "node-a"}, root)
	if err != nil || len(first.Holds) != 2 || first.Note != "" {
		t.Fatalf("the first fence --node: %+v %v", first, err)
	}
	again, err := r.admin.Fence(ctx, api.ImageRequest{Node: "node-a"}, root)
	if err != nil || len(again.Holds) != 2 || !again.Holds[0].Again {
		t.Fatalf("fence --node again, its holds still there: %+v %v", again, err)
	}
	// node-b takes one over, and frees the other by force
	if _, err := r.b.Acquire(ctx, claim.Request{Image: one, TakeFenced: true}); err != nil {
		t.Fatal(err)
	}
	if ok, err := r.b.ForceRelease(ctx, two); !ok || err != nil {
		t.Fatal(ok, err)
	}
	r.entries()
	bl := r.m.Counts(false)["blocklist"]
	out, err := r.admin.Fence(ctx, api.ImageRequest{Node: "node-a"}, root)
	if err != nil {
		t.Fatalf("fence --node of a node none of whose holds is left: %v", err)
	}
	want := "nothing of node node-a is held any more: its holds were taken over or released"
	if len(out.Holds) != 0 || len(out.FencedAddrs) != 0 || out.Node != "node-a" || !strings.HasPrefix(out.Note, want) || len(out.NoLongerHeld) != 2 {
		t.Fatalf("answer: %+v", out)
	}
	if n := r.m.Counts(false)["blocklist"]; n != bl {
		t.Errorf("%d blocklist calls for nothing to fence", n-bl)
	}
	if es := r.entries(); len(es) != 1 || es[0].Warning || !strings.Contains(es[0].Message, want) {
		t.Errorf("audited: %+v", es)
	}

	// a node that released all it held: its heartbeat lists none
	three := claim.Image{Pool: "rbd", Image: "three"}
	c := newRig(t)
	res := c.hold(t, three, "")
	if ok, err := c.a.Release(ctx, three, res.Holder.Epoch); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if err := c.a.Heartbeat(ctx, "rbd", ""); err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{"node-a", "node-x"} { // released all; never ran
		if _, err := c.admin.Fence(ctx, api.ImageRequest{Node: node}, root); !errors.Is(err, claim.ErrNoClaim) || !strings.Contains(err.Error(), "its heartbeats list none") {
			t.Errorf("fence --node %s: %v, want not found", node, err)
		}
	}
}

// TestFenceCutsTheWholeAddressOnlyWithoutAMapping: an admin's fence of an image blocklists its
// holder's mapping address when the holder recorded one, and nothing else of that host (its
// other mappings and its agent keep working); only a hold that recorded no mapping address is
// fenced by the host's whole address (ip:0/0), and then the answer and the audit entry say so.
// Either way the hold is marked fenced, so that a forced release may follow.
func TestFenceCutsTheWholeAddressOnlyWithoutAMapping(t *testing.T) {
	ctx := context.Background()
	r := newRig(t)
	mapped, bare := claim.Image{Pool: "rbd", Image: "mapped"}, claim.Image{Pool: "rbd", Image: "bare"}
	r.hold(t, mapped, "10.0.0.1:0/5")
	r.hold(t, bare, "") // node-a stopped between its claim and its map
	r.entries()
	for _, tc := range []struct {
		img             claim.Image
		addr, described string
		wholeNode       bool
	}{
		{mapped, "10.0.0.1:0/5", "fenced node node-a's mapping 10.0.0.1:0/5, holder of rbd/mapped", false},
		{bare, "10.0.0.1:0/0", "fenced node node-a's WHOLE address 10.0.0.1:0/0 (no mapping address was recorded: every client of that host on this cluster is cut, its other mappings and its agent too), holder of rbd/bare", true},
	} {
		out, err := r.admin.Fence(ctx, api.ImageRequest{Pool: tc.img.Pool, Image: tc.img.Image}, root)
		if err != nil || out.FencedAddr != tc.addr || !slices.Equal(out.FencedAddrs, []string{tc.addr}) {
			t.Fatalf("fence %s: %+v %v, want %s fenced", tc.img, out, err, tc.addr)
		}
		if _, ok := r.m.BlocklistedUntil(tc.addr); !ok {
			t.Errorf("fence %s: %s is not on the blocklist", tc.img, tc.addr)
		}
		// the host's whole address, and so another client of it, is cut only by the bare hold's fence
		if _, whole := r.m.BlocklistedUntil("10.0.0.1:0/0"); whole != tc.wholeNode {
			t.Errorf("fence %s: 10.0.0.1:0/0 listed %v, want %v", tc.img, whole, tc.wholeNode)
		}
		if cut := r.m.Blocklisted("10.0.0.1:0/99"); cut != tc.wholeNode {
			t.Errorf("fence %s: another client of node-a's host cut off %v, want %v", tc.img, cut, tc.wholeNode)
		}
		rec, err := r.b.Inspect(ctx, tc.img)
		if err != nil || len(rec.Holders) != 1 || !rec.Holders[0].Fenced || len(rec.Kept()) != 1 || rec.Kept()[0].Addr != tc.addr {
			t.Errorf("fence %s: the record %+v %v, want node-a's hold marked fenced and one live fence of %s", tc.img, rec, err, tc.addr)
		}
		es := r.entries()
		if len(es) != 1 {
			t.Fatalf("fence %s: audited %+v, want one entry", tc.img, es)
		}
		if e := es[0]; e.Event != audit.Fence || !e.Warning || e.OwnerNode != "node-a" || e.Image != tc.img.Image || !e.HasPeer || e.PID != root.PID ||
			!strings.HasPrefix(e.Message, tc.described+", until ") {
			t.Errorf("fence %s: audit entry %+v, want its message to start %q", tc.img, e, tc.described)
		}
	}
}

// TestForcedReleaseOfAnUnfencedHoldNamesTheFenceAsData: the claim layer refuses with facts (whose
// hold is not fenced); the next step, the fence, is data in the API's error (next_steps) and
// the same step ends the message.
func TestForcedReleaseOfAnUnfencedHoldNamesTheFenceAsData(t *testing.T) {
	r := newRig(t)
	img := claim.Image{Pool: "rbd", Image: "img"}
	r.hold(t, img, "10.0.0.1:0/1")
	_, err := r.admin.Release(context.Background(), api.ImageRequest{Pool: "rbd", Image: "img", Force: true}, root)
	var d api.Detailer
	if !errors.Is(err, claim.ErrInvalid) || !errors.As(err, &d) {
		t.Fatalf("want an invalid request with details, got %v", err)
	}
	var e api.Error
	d.Details(&e)
	const run = "rbd-owner fence rbd/img"
	if e.Image != "rbd/img" || len(e.NextSteps) != 1 || e.NextSteps[0].Run != run || !strings.Contains(e.NextSteps[0].Why, "node node-a") ||
		!strings.HasSuffix(err.Error(), "node node-a's hold on rbd/img was not fenced; run `"+run+"` first") {
		t.Fatalf("details %+v, message %q", e, err)
	}
}

// TestFenceNodeOfAnOldAgentSaysTheWayAround: a node whose heartbeat was written by an agent that
// does not list its holds cannot be fenced as a whole; the claim layer says so as facts, and the
// answer says the way around it: list the pool's claims and fence each image.
func TestFenceNodeOfAnOldAgentSaysTheWayAround(t *testing.T) {
	r := newRig(t)
	r.m.AddImage(claim.Image{Pool: "rbd", Image: "x"}, "idx")
	r.m.Put(claim.Image{Pool: "rbd"}, record.HeartbeatObject("node-old"), []byte(`{"format":2,"node_id":"node-old","seq":4,"agent_version":"0.9"}`))
	_, err := r.admin.Fence(context.Background(), api.ImageRequest{Node: "node-old"}, root)
	var d api.Detailer
	if err == nil || !errors.As(err, &d) ||
		!strings.Contains(err.Error(), "written by an agent (0.9) that does not list its holds; fence them one at a time (`rbd-owner fence IMAGE`, `rbd-owner claims --pool rbd`)") {
		t.Fatalf("fence --node of an old agent's node: %v", err)
	}
	var e api.Error
	d.Details(&e)
	if len(e.NextSteps) != 2 || e.NextSteps[0].Run != "rbd-owner claims --pool rbd" || e.NextSteps[1].Run != "rbd-owner fence IMAGE" {
		t.Fatalf("next steps %+v", e.NextSteps)
	}
}
