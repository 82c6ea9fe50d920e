package daemon

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
)

// mapOverAPI maps through the daemon's HTTP handler as a caller of role on socket, and
// returns the status and the error body a client reads.
func mapOverAPI(t *testing.T, d *Daemon, role peercred.Role, socket string, req api.MapRequest) (int, *api.Error) {
	t.Helper()
	body, _ := json.Marshal(req)
	r := httptest.NewRequest(http.MethodPost, "http://rbd-owner"+api.PathMap, bytes.NewReader(body))
	r = r.WithContext(withCaller(r.Context(), caller{cred: peercred.Cred{UID: 1000, GID: 1000, PID: 4242}, known: true, role: role, socket: socket}))
	rec := httptest.NewRecorder()
	d.Handler().ServeHTTP(rec, r)
	var eb api.ErrorBody
	_ = json.Unmarshal(rec.Body.Bytes(), &eb)
	return rec.Code, eb.Error
}

// TestMissingImageIsSaidOnce: a map of an image that does not exist reads as one line that
// says so once ("acquire rbd/x: image rbd/x not found"), not the classification's word, the
// backend's and the cluster's each in turn; and the refusal is audited with the same words.
func TestMissingImageIsSaidOnce(t *testing.T) {
	c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000041")
	c.m.AddImage(claim.Image{Pool: "rbd", Image: "other"}, "id-other") // the pool exists
	n, _, audited := nodeB(t, c, "manual")
	defer n.stop(t)
	code, e := mapOverAPI(t, n.d, peercred.RoleCSI, socketCSI, api.MapRequest{Cluster: "c1", Pool: "rbd", Image: "nosuch", Requester: "test"})
	want := "acquire rbd/nosuch: image rbd/nosuch not found"
	if code != http.StatusNotFound || e == nil || e.Code != api.CodeNotFound || e.Message != want {
		t.Fatalf("map of a missing image: %d %+v, want 404 %q", code, e, want)
	}
	var refused []string
	for _, en := range audited() {
		if en.Event == audit.Refuse {
			refused = append(refused, en.Message)
		}
	}
	if len(refused) != 1 || refused[0] != "map refused: "+want {
		t.Fatalf("audited refusals %q, want one saying %q", refused, want)
	}
}
