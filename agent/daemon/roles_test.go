package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/client"
	"github.com/rbd-owner/rbd-owner/agent/internal/agenttest"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
	"github.com/rbd-owner/rbd-owner/agent/server"
)

// offlineDaemon is a daemon whose one cluster is never reached: enough for the API's routing
// and roles, which are decided before any handler touches a cluster. Its audit entries are
// collected in the returned function's answer.
func offlineDaemon(t *testing.T) (*Daemon, func() []audit.Entry) {
	t.Helper()
	n := envNode(agenttest.NewEnv(t, agenttest.Offline()), func(o *Options) {
		o.Config.CSISocket = filepath.Join(filepath.Dir(o.Config.Socket), "csi", "csi.sock")
	})
	n.start()
	return n.d, n.env.Audit.Entries
}

// TestRoutesByRole asks every route as each role and checks who is refused (403 + a denied
// audit entry naming the call) and that every other answer is the contract's JSON error or a
// result, never a permission error. Bodies name an invalid image, so an allowed call ends in its
// own validation (400) without reaching a cluster.
func TestRoutesByRole(t *testing.T) {
	d, audited := offlineDaemon(t)
	h := d.Handler()
	bad := `{"pool":"rbd","image":"a,b"}`
	calls := []struct {
		method, path, body string
		admin              bool // needs the admin role
	}{
		{"POST", api.PathMap, bad, false},
		{"POST", api.PathMap, `{"pool":"rbd","image":"a,b","takeover":true}`, true}, // a takeover fences another node
		{"POST", api.PathUnmap, bad, false},
		{"POST", api.PathRelease, bad, false},
		{"POST", api.PathRelease, `{"pool":"rbd","image":"a,b","force":true}`, true},
		{"GET", api.PathStatus, "", false},
		{"GET", api.PathClaims + "?cluster=nope", "", false},
		{"GET", api.PathOrphanList + "?cluster=nope", "", false},
		{"POST", api.PathFence, bad, true},
		{"POST", api.PathOrphans, `{"cluster":"nope"}`, true},
	}
	for _, role := range []peercred.Role{peercred.RoleNone, peercred.RoleCSI, peercred.RoleAdmin} {
		for _, socket := range []string{server.SocketMain, server.SocketCSI} {
			if socket == server.SocketCSI && role != peercred.RoleCSI {
				continue // the CSI socket grants the CSI role only
			}
			c := server.Caller{Cred: peercred.Cred{UID: 1000, GID: 1000, PID: 4242}, Known: true, Role: role, Socket: socket}
			for _, tc := range calls {
				before := len(audited())
				req := httptest.NewRequest(tc.method, "http://rbd-owner"+tc.path, strings.NewReader(tc.body))
				req = req.WithContext(server.WithCaller(req.Context(), c))
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				var eb api.ErrorBody
				_ = json.Unmarshal(rec.Body.Bytes(), &eb)
				refused := role == peercred.RoleNone || (tc.admin && role < peercred.RoleAdmin)
				name := role.String() + "@" + socket + " " + tc.method + " " + tc.path + " " + tc.body
				newEntries := audited()[before:]
				if refused {
					if rec.Code != http.StatusForbidden || eb.Error == nil || eb.Error.Code != api.CodePermissionDenied {
						t.Errorf("%s: %d %s, want 403 permission_denied", name, rec.Code, rec.Body.String())
					}
					if len(newEntries) != 1 || newEntries[0].Event != audit.Denied || newEntries[0].UID != 1000 || !strings.Contains(newEntries[0].Message, strings.Split(tc.path, "?")[0]) {
						t.Errorf("%s: audit %+v, want one denied entry naming the call", name, newEntries)
					}
					if role == peercred.RoleNone && strings.Contains(eb.Error.Message, "<nil>") {
						t.Errorf("%s: refusal %q has no reason", name, eb.Error.Message)
					}
					if tc.admin && role == peercred.RoleCSI && !strings.Contains(eb.Error.Message, "admin role") {
						t.Errorf("%s: refusal %q does not say the admin role is needed", name, eb.Error.Message)
					}
					continue
				}
				if rec.Code == http.StatusForbidden {
					t.Errorf("%s: refused: %s", name, rec.Body.String())
				}
				for _, e := range newEntries {
					if e.Event == audit.Denied {
						t.Errorf("%s: denied entry for an allowed call: %+v", name, e)
					}
				}
			}
		}
	}
}

// TestEveryErrorIsJSON: unknown paths and wrong methods answer the contract's error body.
func TestEveryErrorIsJSON(t *testing.T) {
	d, _ := offlineDaemon(t)
	h := d.Handler()
	admin := server.Caller{Known: true, Role: peercred.RoleAdmin, Socket: server.SocketMain}
	for _, tc := range []struct {
		method, path string
		status       int
		code, allow  string
	}{
		{"GET", "/v1/nothing", 404, api.CodeNotFound, ""},
		{"GET", "/", 404, api.CodeNotFound, ""},
		{"GET", api.PathMap, 405, api.CodeInvalidArgument, "POST"},
		{"DELETE", api.PathStatus, 405, api.CodeInvalidArgument, "GET"},
		{"POST", api.PathClaims, 405, api.CodeInvalidArgument, "GET"},
	} {
		req := httptest.NewRequest(tc.method, "http://rbd-owner"+tc.path, nil)
		req = req.WithContext(server.WithCaller(req.Context(), admin))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		var eb api.ErrorBody
		if err := json.Unmarshal(rec.Body.Bytes(), &eb); err != nil || eb.Error == nil {
			t.Errorf("%s %s: body %q is not a JSON error: %v", tc.method, tc.path, rec.Body.String(), err)
			continue
		}
		if rec.Code != tc.status || eb.Error.Code != tc.code || rec.Header().Get("Allow") != tc.allow ||
			rec.Header().Get("Content-Type") != "application/json" {
			t.Errorf("%s %s: %d %+v Allow=%q, want %d %s Allow=%q", tc.method, tc.path, rec.Code, eb.Error, rec.Header().Get("Allow"), tc.status, tc.code, tc.allow)
		}
	}
	// a request with no caller in its context (no connection info) is refused
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "http://rbd-owner"+api.PathStatus, nil))
	if rec.Code != http.StatusForbidden {
		t.Errorf("no caller: %d, want 403", rec.Code)
	}
}

// TestCSISocketGrantsCSIOnly serves both sockets as the daemon does and calls them as this
// (root) process: the main socket makes it an admin, the CSI socket a CSI caller that may read
// and map but not fence.
func TestCSISocketGrantsCSIOnly(t *testing.T) {
	d, audited := offlineDaemon(t)
	mainL, csiL, err := d.listeners()
	if err != nil {
		t.Fatal(err)
	}
	if csiL == nil || csiL.Addr().String() != d.cfg.CSISocket {
		t.Fatalf("CSI listener %v, want one at %s", csiL, d.cfg.CSISocket)
	}
	mainSrv, csiSrv := d.servers()
	for _, p := range []struct {
		s *http.Server
		l net.Listener
	}{{mainSrv, mainL}, {csiSrv, csiL}} {
		go func() { _ = p.s.Serve(p.l) }()
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = p.s.Shutdown(ctx)
		})
	}
	ctx := context.Background()
	fence := api.ImageRequest{Pool: "rbd", Image: "a,b"}
	var ae *api.Error
	_, err = client.New(d.cfg.CSISocket).Fence(ctx, fence)
	if !errors.As(err, &ae) || ae.Code != api.CodePermissionDenied || !strings.Contains(ae.Message, "CSI socket") {
		t.Fatalf("fence on the CSI socket as root: %v, want permission_denied naming the CSI socket", err)
	}
	if st, err := client.New(d.cfg.CSISocket).Status(ctx); err != nil || st.Node != "node-r" {
		t.Fatalf("status on the CSI socket: %+v %v", st, err)
	}
	_, err = client.New(d.cfg.Socket).Fence(ctx, fence)
	if !errors.As(err, &ae) || ae.Code != api.CodeInvalidArgument {
		t.Fatalf("fence on the main socket as root: %v, want the call's own invalid_argument", err)
	}
	var denied []audit.Entry
	for _, e := range audited() {
		if e.Event == audit.Denied {
			denied = append(denied, e)
		}
	}
	if len(denied) != 1 || !denied[0].HasPeer || !strings.Contains(denied[0].Message, "csi socket") || !strings.Contains(denied[0].Message, api.PathFence) {
		t.Fatalf("denied entries %+v, want one for the fence on the csi socket", denied)
	}
}
