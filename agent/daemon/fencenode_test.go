package daemon

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/fault"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
	"github.com/rbd-owner/rbd-owner/agent/server"
)

// TestFenceNodeFencesEveryHoldAndMapsFollow: `claims --node` lists a dead node's holds (found
// through its heartbeat), `fence --node` blocklists each hold's mapping and marks it fenced,
// audited once per image and once as a whole, and a plain map by this node then takes an
// image over with no release --force and no lease; a node with no hold, or a request naming an
// image and a node, is refused.
func TestFenceNodeFencesEveryHoldAndMapsFollow(t *testing.T) {
	c := newMemCluster("c1", "rbd", "fsid-fencenode")
	n, al := startIntrusionDaemon(t, c, config.UnmanagedFenceIfClaimed)
	ctx := context.Background()
	for i, im := range []string{"dead1", "dead2"} {
		addImage(n, c, im)
		holdElsewhere(t, c, im, "10.9.9.9:0/"+string(rune('1'+i)))
	}
	req := httptest.NewRequest(http.MethodGet, "http://rbd-owner"+api.PathClaims+"?cluster=c1&node=node-a", nil)
	req = req.WithContext(server.WithCaller(req.Context(), server.Caller{Known: true, Role: peercred.RoleCSI, Socket: server.SocketCSI}))
	rec := httptest.NewRecorder()
	n.d.Handler().ServeHTTP(rec, req)
	var listed []api.Claim
	if err := json.Unmarshal(rec.Body.Bytes(), &listed); err != nil || rec.Code != http.StatusOK || len(listed) != 2 || listed[0].Image != "dead1" || listed[1].Image != "dead2" {
		t.Fatalf("claims --node node-a: %d %s", rec.Code, rec.Body)
	}
	if _, err := n.d.Map(ctx, api.MapRequest{Cluster: "c1", Pool: "rbd", Image: "dead1"}, nil); !fault.Is(err, fault.ClaimedElsewhere) {
		t.Fatalf("a map before the node fence: %v", err)
	}
	resp, err := n.d.admin.Fence(asAdmin(ctx), api.ImageRequest{Cluster: "c1", Node: "node-a"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Holds) != 2 || len(resp.Incomplete) != 0 || !c.M.Blocklisted("10.9.9.9:0/1") || !c.M.Blocklisted("10.9.9.9:0/2") {
		t.Fatalf("fence --node: %+v", resp)
	}
	fences := al.Find(audit.Fence, "")
	if len(fences) != 3 || fences[0].Image != "dead1" || fences[1].Image != "dead2" || fences[2].Image != "" ||
		!strings.Contains(fences[2].Message, "fenced node node-a: 2 holds on 2 images") {
		t.Fatalf("audit: %+v", fences)
	}
	r, err := n.d.Map(ctx, api.MapRequest{Cluster: "c1", Pool: "rbd", Image: "dead1"}, nil)
	if err != nil || r.Claim == nil || len(r.Claim.Holders) != 1 || r.Claim.Holders[0].NodeID != n.d.cfg.NodeID {
		t.Fatalf("a map after the node fence: %+v %v", r, err)
	}
	again, err := n.d.admin.Fence(asAdmin(ctx), api.ImageRequest{Cluster: "c1", Node: "node-a"}, nil)
	if err != nil || len(again.Holds) != 1 || again.Holds[0].Image != "dead2" || !again.Holds[0].Again {
		t.Fatalf("fence --node again: %+v %v", again, err)
	}
	if _, err := n.d.admin.Fence(asAdmin(ctx), api.ImageRequest{Cluster: "c1", Node: "nobody"}, nil); !fault.Is(err, fault.NotFound) || !strings.Contains(err.Error(), "no claim of cluster c1 names it") {
		t.Fatalf("fence --node of a node with no hold: %v", err)
	}
	if _, err := n.d.admin.Fence(asAdmin(ctx), api.ImageRequest{Cluster: "c1", Node: "node-a", Pool: "rbd", Image: "dead2"}, nil); !fault.Is(err, fault.Invalid) {
		t.Fatalf("fence naming an image and a node: %v", err)
	}
}
