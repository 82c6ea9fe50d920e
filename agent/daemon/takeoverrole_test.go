package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
)

// TestTakeoverNeedsTheAdminRoleOrThePolicy maps, through the API, an image another node holds,
// as every role on every socket, with and without "takeover", under both policies, against a
// holder whose lease this node has seen expire and against one an admin has fenced:
//   - "takeover" from a CSI-role caller is refused (403, a denied audit entry), whatever the
//     policy: nothing in a CSI container may fence another node;
//   - a CSI-role map takes over an expired lease only under after-lease-expiry, and an
//     admin-fenced hold under either policy;
//   - an admin's takeover takes over an expired lease under either policy; without it, the
//     admin's map is a CSI map.
func TestTakeoverNeedsTheAdminRoleOrThePolicy(t *testing.T) {
	for _, policy := range []string{config.TakeoverManual, config.TakeoverAfterLeaseExpiry} {
		t.Run(policy, func(t *testing.T) { takeoverByRole(t, policy) })
	}
}

func takeoverByRole(t *testing.T, policy string) {
	c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000032")
	mono := &monoClock{}
	var mu sync.Mutex
	var entries []audit.Entry
	n := startMemDaemonWith(t, func(o *Options) {
		o.Config.NodeID = "node-b"
		o.Config.TakeoverPolicy = policy
		o.Mono = mono.Now
		o.Audit = audit.NewWithSink(quietLog(), func(e audit.Entry) { mu.Lock(); entries = append(entries, e); mu.Unlock() })
	}, c)
	defer n.stop(t)
	audited := func() []audit.Entry { mu.Lock(); defer mu.Unlock(); return append([]audit.Entry(nil), entries...) }
	// node-a: another agent on the same cluster, stopped after mapping (its heartbeat stays)
	a, err := claim.NewStoreOn(c.m, claim.Config{Node: claim.Node{ID: "node-a", Hostname: "host-a", Incarnation: "i-a",
		Addr: func() string { return "10.0.0.1" }}, Lease: 30 * time.Second, FenceExpiry: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	h := n.d.Handler()
	mapAs := func(role peercred.Role, socket, image string, takeover bool) (int, *api.Error) {
		body, _ := json.Marshal(api.MapRequest{Cluster: "c1", Pool: "rbd", Image: image, Takeover: takeover, Requester: "test"})
		req := httptest.NewRequest(http.MethodPost, "http://rbd-owner"+api.PathMap, bytes.NewReader(body))
		req = req.WithContext(withCaller(req.Context(), caller{cred: peercred.Cred{UID: 1000, GID: 1000, PID: 4242}, known: true, role: role, socket: socket}))
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
	}{{peercred.RoleCSI, socketCSI}, {peercred.RoleCSI, socketMain}, {peercred.RoleAdmin, socketMain}} {
		for _, takeover := range []bool{false, true} {
			for _, fenced := range []bool{false, true} {
				i++
				image := fmt.Sprintf("img%d", i)
				name := fmt.Sprintf("%s@%s takeover=%v fenced=%v", who.role, who.socket, takeover, fenced)
				img := claim.Image{Pool: "rbd", Image: image}
				c.m.AddImage(img, "id-"+image)
				n.k.AddImage("rbd", "", image, 16<<20)
				r, err := a.Acquire(context.Background(), claim.Request{Image: img})
				if err != nil {
					t.Fatal(err)
				}
				addr := fmt.Sprintf("10.0.0.1:0/%d", 100+i)
				if _, err := a.SetMapping(context.Background(), img, r.Holder.Epoch, addr, "/dev/rbd0"); err != nil {
					t.Fatal(err)
				}
				if fenced {
					if _, err := a.Fence(context.Background(), img); err != nil {
						t.Fatal(err)
					}
				}
				denied := who.role < peercred.RoleAdmin && takeover
				mayExpire := takeover || policy == config.TakeoverAfterLeaseExpiry
				before := len(audited())
				// this node watches node-a's lease for a whole lease (two looks), then asks
				var code int
				var e *api.Error
				for _, step := range []time.Duration{0, 20 * time.Second, 11 * time.Second} {
					mono.Advance(step)
					code, e = mapAs(who.role, who.socket, image, takeover)
					if code == http.StatusOK {
						break
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
					if taken || (!fenced && c.m.Blocklisted(addr)) {
						t.Errorf("%s: refused, yet taken %v / fenced %v", name, taken, c.m.Blocklisted(addr))
					}
				case fenced || mayExpire:
					if code != http.StatusOK || !taken || !c.m.Blocklisted(addr) {
						t.Errorf("%s: %d %+v, taken %v, fenced %v: want taken over", name, code, e, taken, c.m.Blocklisted(addr))
					}
				default:
					if code != http.StatusConflict || e == nil || e.Code != api.CodeClaimedElsewhere || taken || c.m.Blocklisted(addr) {
						t.Errorf("%s: %d %+v, taken %v: want refused as held elsewhere, nothing fenced", name, code, e, taken)
					}
					if e != nil && e.RetryAfterSeconds != 0 {
						t.Errorf("%s: a map that may not take over is told to retry after %ds", name, e.RetryAfterSeconds)
					}
				}
			}
		}
	}
}
