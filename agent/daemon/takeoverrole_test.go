package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/fault"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
	"github.com/rbd-owner/rbd-owner/agent/server"
)

// TestTakeoverNeedsTheAdminRoleOrThePolicy maps, through the API, an image another node holds,
// as every role on every socket, with and without "takeover", under every policy, against a
// holder whose lease this node has seen expire, one an admin has fenced, and one whose mapping
// someone else blocklisted (ceph-csi's fencing, a librbd lock break):
//   - "takeover" from a CSI-role caller is refused (403, a denied audit entry), whatever the
//     policy: nothing in a CSI container may fence another node;
//   - a CSI-role map takes over an expired lease only under after-lease-expiry, and an
//     admin-fenced hold under either policy;
//   - a map takes over a hold someone else blocklisted at once, without a lease, under
//     after-fence and after-lease-expiry (and an admin's takeover under manual), fencing it
//     with its own entry;
//   - an admin's takeover takes over an expired lease under either policy; without it, the
//     admin's map is a CSI map.
func TestTakeoverNeedsTheAdminRoleOrThePolicy(t *testing.T) {
	for _, policy := range []string{config.TakeoverManual, config.TakeoverAfterFence, config.TakeoverAfterLeaseExpiry} {
		t.Run(policy, func(t *testing.T) { takeoverByRole(t, policy) })
	}
}

func takeoverByRole(t *testing.T, policy string) {
	c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000032")
	n, mono, audited := nodeB(t, c, policy)
	defer n.stop()
	// node-a: another agent on the same cluster, stopped after mapping (its heartbeat stays)
	a, err := claim.NewStoreOn(c.M, claim.Config{Node: claim.Node{ID: "node-a", Hostname: "host-a", Incarnation: "i-a",
		Addr: func() string { return "10.0.0.1" }}, Lease: 30 * time.Second, FenceExpiry: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	h := n.d.Handler()
	mapAs := func(role peercred.Role, socket, image string, takeover bool) (int, *api.Error) {
		body, _ := json.Marshal(api.MapRequest{Cluster: "c1", Pool: "rbd", Image: image, Takeover: takeover, Requester: "test"})
		req := httptest.NewRequest(http.MethodPost, "http://rbd-owner"+api.PathMap, bytes.NewReader(body))
		req = req.WithContext(server.WithCaller(req.Context(), server.Caller{Cred: peercred.Cred{UID: 1000, GID: 1000, PID: 4242}, Known: true, Role: role, Socket: socket}))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		var eb api.ErrorBody
		_ = json.Unmarshal(rec.Body.Bytes(), &eb)
		return rec.Code, eb.Error
	}
	i := 0
	for _, who := range []struct {
		role   peercred.Role
		socket string
	}{{peercred.RoleCSI, server.SocketCSI}, {peercred.RoleCSI, server.SocketMain}, {peercred.RoleAdmin, server.SocketMain}} {
		for _, takeover := range []bool{false, true} {
			for _, hold := range []string{"live", "fenced", "covered"} {
				fenced, covered := hold == "fenced", hold == "covered"
				i++
				image := fmt.Sprintf("img%d", i)
				name := fmt.Sprintf("%s@%s takeover=%v %s", who.role, who.socket, takeover, hold)
				img := claim.Image{Pool: "rbd", Image: image}
				c.M.AddImage(img, "id-"+image)
				n.kernel.AddImage("rbd", "", image, 16<<20)
				r, err := a.Acquire(context.Background(), claim.Request{Image: img})
				if err != nil {
					t.Fatal(err)
				}
				addr := fmt.Sprintf("10.0.%d.1:0/%d", i, 100+i) // an ip of its own: a node entry covers it alone
				if _, err := a.SetMapping(context.Background(), img, r.Holder.Epoch, addr, "/dev/rbd0"); err != nil {
					t.Fatal(err)
				}
				if fenced {
					if _, err := a.Fence(context.Background(), img); err != nil {
						t.Fatal(err)
					}
				}
				if covered { // the holder's node blocklisted by someone else, as ceph-csi's fallback does
					if _, err := c.M.Blocklist(context.Background(), fmt.Sprintf("10.0.%d.1:0/0", i), time.Hour); err != nil {
						t.Fatal(err)
					}
				}
				mayCover := covered && (policy != config.TakeoverManual || takeover)
				denied := who.role < peercred.RoleAdmin && takeover
				mayExpire := takeover || policy == config.TakeoverAfterLeaseExpiry
				before := len(audited())
				// this node watches node-a's lease for a whole lease (two looks), then asks
				var code int
				var e *api.Error
				var refusals []string // what the caller read, the lease live, then expired
				for _, step := range []time.Duration{0, 20 * time.Second, 11 * time.Second} {
					mono.Advance(step)
					code, e = mapAs(who.role, who.socket, image, takeover)
					if code == http.StatusOK {
						break
					}
					if e != nil {
						refusals = append(refusals, e.Message)
					}
				}
				rec, err := a.Inspect(context.Background(), img)
				if err != nil {
					t.Fatal(err)
				}
				taken := rec.Holder("node-b") != nil
				switch {
				case denied:
					if code != http.StatusForbidden || e == nil || e.Code != api.CodePermissionDenied || !strings.Contains(e.Message, "admin role") {
						t.Errorf("%s: %d %+v, want 403 naming the admin role", name, code, e)
					}
					var got []audit.Entry
					for _, en := range audited()[before:] {
						if en.Event == audit.Denied && strings.Contains(en.Message, "takeover") {
							got = append(got, en)
						}
					}
					if len(got) == 0 {
						t.Errorf("%s: no denied audit entry naming the takeover", name)
					}
					if taken || (!fenced && !covered && c.M.Blocklisted(addr)) {
						t.Errorf("%s: refused, yet taken %v / fenced %v", name, taken, c.M.Blocklisted(addr))
					}
				case fenced || mayExpire || mayCover:
					if code != http.StatusOK || !taken || !c.M.Blocklisted(addr) {
						t.Errorf("%s: %d %+v, taken %v, fenced %v: want taken over", name, code, e, taken, c.M.Blocklisted(addr))
					}
					if f := rec.Fences; mayCover && !mayExpire && (len(f) != 1 || f[0].Addr != addr || f[0].By != "node-b" || len(refusals) != 0) {
						t.Errorf("%s: a blocklisted hold is not taken over at once with this node's own fence: %+v, refusals %q", name, f, refusals)
					}
				default:
					if code != http.StatusConflict || e == nil || e.Code != api.CodeClaimedElsewhere || taken || (!covered && c.M.Blocklisted(addr)) {
						t.Errorf("%s: %d %+v, taken %v: want refused as held elsewhere, nothing fenced", name, code, e, taken)
					}
					if e != nil && e.RetryAfterSeconds != 0 {
						t.Errorf("%s: a map that may not take over is told to retry after %ds", name, e.RetryAfterSeconds)
					}
					// the same next steps as data: the image, the holder, the kind, and each fence
					// to run, which the message names in the same words
					if e != nil && (e.Image != "rbd/"+image || len(e.Holders) != 1 || e.Owner == nil || e.Owner.NodeID != "node-a" ||
						len(e.NextSteps) == 0 || e.NextSteps[0].Run != "rbd-owner fence --node node-a" || e.Advice == "" || !strings.HasSuffix(e.Message, e.Advice)) {
						t.Errorf("%s: the refusal's data: %+v", name, e)
					}
					for _, st := range func() []api.Step {
						if e == nil {
							return nil
						}
						return e.NextSteps
					}() {
						if strings.HasPrefix(st.Run, "rbd-owner fence") && !strings.Contains(e.Advice, "`"+st.Run+"`") {
							t.Errorf("%s: next step %q is not in the advice %q", name, st.Run, e.Advice)
						}
					}
					// the next step is the reader's own: an admin may fence (the next map takes a
					// fenced hold over: no release --force), or take over; a CSI-role caller can
					// only ask an admin for the fence (or have the policy changed)
					fence := fmt.Sprintf("`rbd-owner fence rbd/%s`", image)
					for _, msg := range refusals {
						if strings.Contains(msg, "release --force") {
							t.Errorf("%s: a refusal asks for a release --force that a fence makes needless: %s", name, msg)
						}
						if who.role >= peercred.RoleAdmin {
							if !strings.Contains(msg, "if node node-a is dead: run `rbd-owner fence --node node-a` (every hold of that node; then map again), map with --takeover once its lease has expired, or run "+fence+" (this image only; then map again)") {
								t.Errorf("%s: the admin is not told its next step: %s", name, msg)
							}
							continue
						}
						want := "this caller (CSI role) may not take it over under takeover_policy: manual: if node node-a is dead, ask an admin to run `rbd-owner fence --node node-a` on any node (every hold of that node; " + fence + " fences this image only): the next NodeStage then maps it; or set takeover_policy: after-fence"
						if policy == config.TakeoverAfterFence {
							want = "node node-a's mapping (" + addr + ") is on no blocklist entry for its whole node (ip:0/0 or a range); under takeover_policy: after-fence a map takes it over once the holder's mapping is on the cluster's blocklist: if node node-a is dead, ask an admin to run `rbd-owner fence --node node-a` on any node"
						}
						if !strings.Contains(msg, want) ||
							strings.Contains(msg, "map with takeover") || strings.Contains(msg, "retry") || strings.Contains(msg, "possible in") {
							t.Errorf("%s: the CSI caller is not told what it can do: %s", name, msg)
						}
					}
					if len(refusals) != 3 {
						t.Errorf("%s: %d refusals, want 3 (lease live, live, expired)", name, len(refusals))
					}
				}
			}
		}
	}
}

// TestWholeNodeFenceIsNamedAsSuch: a takeover of a hold that recorded no mapping address
// fences the holder's whole address (ip:0/0); the audit entry says so, and what it cuts.
func TestWholeNodeFenceIsNamedAsSuch(t *testing.T) {
	c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000033")
	n, mono, audited := nodeB(t, c, config.TakeoverManual)
	defer n.stop()
	a, err := claim.NewStoreOn(c.M, claim.Config{Node: claim.Node{ID: "node-a", Addr: func() string { return "10.0.0.1" }},
		Lease: 30 * time.Second, FenceExpiry: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	img := claim.Image{Pool: "rbd", Image: "half"}
	c.M.AddImage(img, "id-half")
	n.kernel.AddImage("rbd", "", "half", 16<<20)
	if _, err := a.Acquire(context.Background(), claim.Request{Image: img}); err != nil { // and node-a stops before its map
		t.Fatal(err)
	}
	req := api.MapRequest{Cluster: "c1", Pool: "rbd", Image: "half", Takeover: true}
	for _, step := range []time.Duration{0, 20 * time.Second, 11 * time.Second} {
		mono.Advance(step)
		if _, err = n.d.Map(asAdmin(context.Background()), req, nil); err == nil {
			break
		}
	}
	if err != nil || !c.M.Blocklisted("10.0.0.1:0/0") {
		t.Fatalf("takeover of a hold with no mapping address: %v, whole node fenced %v", err, c.M.Blocklisted("10.0.0.1:0/0"))
	}
	for _, e := range audited() {
		if e.Event == audit.Takeover {
			if !strings.Contains(e.Message, "WHOLE address 10.0.0.1:0/0") || !strings.Contains(e.Message, "its agent too") {
				t.Fatalf("takeover entry does not name the whole-node fence: %s", e.Message)
			}
			return
		}
	}
	t.Fatal("no takeover entry")
}

// TestAgentKeepsWatchingBetweenSparseRetries: a caller that may take over (here by the policy)
// retries less often than once a lease, as kubelet does once its backoff has grown. The claim
// store drops an observation not refreshed for a lease, so the agent keeps watching the image
// itself between retries: the retry after a lease and more of silence takes the image over at
// once, from the agent's own looks.
func TestAgentKeepsWatchingBetweenSparseRetries(t *testing.T) {
	c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000034")
	var reads atomic.Int64 // of w's claim and of node-a's heartbeat beside it: looks
	c.M.SetHook(func(_ context.Context, call string, img claim.Image) error {
		if call == "read" && img.Image == "w" {
			reads.Add(1)
		}
		return nil
	})
	n, mono, _ := nodeB(t, c, config.TakeoverAfterLeaseExpiry)
	defer n.stop()
	a, err := claim.NewStoreOn(c.M, claim.Config{Node: claim.Node{ID: "node-a", Addr: func() string { return "10.0.0.1" }},
		Lease: 30 * time.Second, FenceExpiry: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	img := claim.Image{Pool: "rbd", Image: "w"}
	c.M.AddImage(img, "id-w")
	n.kernel.AddImage("rbd", "", "w", 16<<20)
	r, err := a.Acquire(context.Background(), claim.Request{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.SetMapping(context.Background(), img, r.Holder.Epoch, "10.0.0.1:0/9", "/dev/rbd0"); err != nil {
		t.Fatal(err)
	}
	req := api.MapRequest{Cluster: "c1", Pool: "rbd", Image: "w"}
	if _, err := n.d.Map(context.Background(), req, nil); err == nil {
		t.Fatal("the first look took the image")
	}
	looks := reads.Load
	for range 4 { // 40 s of the caller's silence, the agent looking on its own
		mono.Advance(10 * time.Second)
		l0 := looks()
		waitFor(t, "the agent's own look at node-a's heartbeat", func() bool { return looks() > l0 })
	}
	if _, err := n.d.Map(context.Background(), req, nil); err != nil {
		t.Fatalf("a retry after 40 s of silence from the caller, with the agent watching: %v", err)
	}
	if !c.M.Blocklisted("10.0.0.1:0/9") {
		t.Fatal("taken without fencing node-a's mapping")
	}
}

// nodeB is a running daemon "node-b" on c under policy, with its own monotonic clock and its
// audit entries collected.
func nodeB(t *testing.T, c *memCluster, policy string) (*memDaemon, *monoClock, func() []audit.Entry) {
	t.Helper()
	mono := &monoClock{}
	n := startMemDaemonWith(t, func(o *Options) {
		o.Config.NodeID = "node-b"
		o.Config.TakeoverPolicy = policy
		o.Mono = mono.Now
	}, c)
	return n, mono, n.env.Audit.Entries
}

// asAdmin is ctx as a call from an admin on the main socket (a map asking takeover needs it).
func asAdmin(ctx context.Context) context.Context {
	return server.WithCaller(ctx, server.Caller{Known: true, Role: peercred.RoleAdmin, Socket: server.SocketMain})
}

// TestTakeoverOfAnUnknownCallerIsRefused: a map whose caller is not known (no connection
// credentials in its context) is no admin's: asking takeover is refused.
func TestTakeoverOfAnUnknownCallerIsRefused(t *testing.T) {
	c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000038")
	n, _, audited := nodeB(t, c, config.TakeoverManual)
	defer n.stop()
	_, err := n.d.Map(context.Background(), api.MapRequest{Cluster: "c1", Pool: "rbd", Image: "x", Takeover: true}, nil)
	if !fault.Is(err, fault.PermissionDenied) {
		t.Fatalf("takeover from an unknown caller: %v, want permission denied", err)
	}
	for _, e := range audited() {
		if e.Event == audit.Denied {
			return
		}
	}
	t.Fatal("no denied audit entry")
}

// TestRefusalUnderAfterLeaseExpirySaysWhenOnce: a CSI caller under after-lease-expiry,
// refused while the holder's lease is live, reads when a takeover is possible once.
func TestRefusalUnderAfterLeaseExpirySaysWhenOnce(t *testing.T) {
	c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000039")
	n, _, _ := nodeB(t, c, config.TakeoverAfterLeaseExpiry)
	defer n.stop()
	a, err := claim.NewStoreOn(c.M, claim.Config{Node: claim.Node{ID: "node-a", Hostname: "host-a", Addr: func() string { return "10.0.0.1" }},
		Lease: 30 * time.Second, FenceExpiry: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	img := claim.Image{Pool: "rbd", Image: "once"}
	c.M.AddImage(img, "id-once")
	n.kernel.AddImage("rbd", "", "once", 16<<20)
	if _, err := a.Acquire(context.Background(), claim.Request{Image: img}); err != nil {
		t.Fatal(err)
	}
	ctx := server.WithCaller(context.Background(), server.Caller{Known: true, Role: peercred.RoleCSI, Socket: server.SocketCSI})
	_, err = n.d.Map(ctx, api.MapRequest{Cluster: "c1", Pool: "rbd", Image: "once"}, nil)
	e := server.APIError(err)
	if e.RetryAfterSeconds != 30 {
		t.Fatalf("refusal: retry after %ds, want 30: %v", e.RetryAfterSeconds, err)
	}
	if !strings.HasSuffix(e.Message, "(live: watching node node-a's lease; a takeover is possible in 30s unless it renews); takeover refused while node node-a's lease is live as far as this node has seen: retry then") ||
		strings.Count(e.Message, "30s") != 1 || strings.Contains(e.Message, "retry after") {
		t.Fatalf("the time is not said once: %s", e.Message)
	}
}
