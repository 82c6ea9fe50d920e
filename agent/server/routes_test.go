package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
	"github.com/rbd-owner/rbd-owner/agent/server"
)

// fakeAPI is a route table of fake handlers, each recording that it ran and with which caller,
// and the audit trail Handler records its refusals in.
type fakeAPI struct {
	routes map[string]server.Route
	al     *audit.Log
	mu     sync.Mutex
	ran    map[string][]server.Caller // path: the caller of each run
}

// the routes of the table: a POST and a GET of each role
var fakeRoutes = []struct {
	path, method string
	need         peercred.Role
}{
	{api.PathMap, http.MethodPost, peercred.RoleCSI},
	{api.PathStatus, http.MethodGet, peercred.RoleCSI},
	{api.PathFence, http.MethodPost, peercred.RoleAdmin},
	{"/v1/admin-get", http.MethodGet, peercred.RoleAdmin},
}

func newFakeAPI(t *testing.T) *fakeAPI {
	t.Helper()
	log := logrus.New()
	log.SetOutput(testWriter{t})
	f := &fakeAPI{routes: map[string]server.Route{}, ran: map[string][]server.Caller{}}
	f.al = audit.NewWithSink(log, func(audit.Entry) {}) // read back with Recent
	for _, rt := range fakeRoutes {
		f.routes[rt.path] = server.Route{Method: rt.method, Need: rt.need, Serve: func(w http.ResponseWriter, r *http.Request) {
			c, _ := server.CallerFrom(r.Context())
			f.mu.Lock()
			f.ran[r.URL.Path] = append(f.ran[r.URL.Path], c)
			f.mu.Unlock()
			server.WriteJSON(w, http.StatusOK, map[string]string{"served": r.URL.Path})
		}}
	}
	return f
}

// runs takes the runs of path's handler recorded so far.
func (f *fakeAPI) runs(path string) []server.Caller {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.ran[path]
	delete(f.ran, path)
	return out
}

// testWriter sends the log to the test's.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// serve sends one request through h with c as its caller (nil: no caller in its context).
func serve(h http.Handler, method, path string, c *server.Caller) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader("{}"))
	if c != nil {
		req = req.WithContext(server.WithCaller(req.Context(), *c))
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// errorOf is the JSON error of an answer, failing the test when it is not one.
func errorOf(t *testing.T, rec *httptest.ResponseRecorder) *api.Error {
	t.Helper()
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	var body api.ErrorBody
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body.Error == nil {
		t.Fatalf("the answer is no JSON error (%v): %s", err, rec.Body)
	}
	return body.Error
}

// TestRouteRoleTable: for every caller role (CSI on either socket, admin) and every route's
// need, a request with the route's method runs the route's handler iff the role is at least
// the need, and the handler sees the request's caller. A refusal runs no handler, answers 403
// permission_denied naming the call and the admin role (and, on the CSI socket, that the socket
// grants the CSI role only), and records one audit.Denied entry with the caller's uid and pid;
// an allowed call records nothing.
func TestRouteRoleTable(t *testing.T) {
	callers := []server.Caller{
		{Cred: peercred.Cred{UID: 1000, GID: 1000, PID: 7}, Known: true, Role: peercred.RoleCSI, Socket: server.SocketMain},
		{Cred: peercred.Cred{UID: 1001, GID: 1001, PID: 8}, Known: true, Role: peercred.RoleCSI, Socket: server.SocketCSI},
		{Cred: peercred.Cred{UID: 1002, GID: 1002, PID: 9}, Known: true, Role: peercred.RoleAdmin, Socket: server.SocketMain},
		{Cred: peercred.Cred{UID: 0, PID: 10}, Known: true, Role: peercred.RoleAdmin, Socket: server.SocketMain},
	}
	f := newFakeAPI(t)
	h := server.Handler(f.routes, f.al)
	for _, c := range callers {
		for _, rt := range fakeRoutes {
			name := fmt.Sprintf("uid %d, %s role on the %s socket: %s %s (needs %s)", c.Cred.UID, c.Role, c.Socket, rt.method, rt.path, rt.need)
			before := len(f.al.Recent())
			rec := serve(h, rt.method, rt.path, &c)
			runs, audited := f.runs(rt.path), f.al.Recent()[before:]
			if c.Role >= rt.need {
				if rec.Code != http.StatusOK || len(runs) != 1 || len(audited) != 0 {
					t.Errorf("%s: status %d, %d runs, audited %+v; want 200, 1 run, nothing audited", name, rec.Code, len(runs), audited)
					continue
				}
				if runs[0].Role != c.Role || runs[0].Cred.UID != c.Cred.UID || runs[0].Socket != c.Socket {
					t.Errorf("%s: the handler saw caller %+v", name, runs[0])
				}
				continue
			}
			if rec.Code != http.StatusForbidden || len(runs) != 0 {
				t.Errorf("%s: status %d, %d runs; want 403 and no run", name, rec.Code, len(runs))
				continue
			}
			e := errorOf(t, rec)
			what := rt.method + " " + rt.path
			if e.Code != api.CodePermissionDenied || !strings.Contains(e.Message, what+" needs the admin role") || !strings.Contains(e.Message, "rbd-owner-admin") {
				t.Errorf("%s: refusal %+v", name, e)
			}
			if onCSI := strings.Contains(e.Message, "the CSI socket grants the CSI role only"); onCSI != (c.Socket == server.SocketCSI) {
				t.Errorf("%s: the refusal says the CSI socket grants the CSI role only: %v; want %v: %s", name, onCSI, !onCSI, e.Message)
			}
			if len(audited) != 1 {
				t.Errorf("%s: %d audit entries for the refusal, want 1: %+v", name, len(audited), audited)
				continue
			}
			a := audited[0]
			wantMsg := fmt.Sprintf("denied %s to uid %d pid %d on the %s socket (%s role)", what, c.Cred.UID, c.Cred.PID, c.Socket, c.Role)
			if a.Event != audit.Denied || a.Result != audit.Refused || !a.Warning || !a.HasPeer || a.UID != c.Cred.UID || a.PID != c.Cred.PID ||
				!strings.HasPrefix(a.Message, wantMsg) {
				t.Errorf("%s: audit entry %+v, want a warning %s/%s with the caller, message starting %q", name, a, audit.Denied, audit.Refused, wantMsg)
			}
		}
	}
}

// TestNoRoleIsRefusedBeforeRouting: a caller with RoleNone, or a request with no caller at all,
// is refused 403 permission_denied on every path, an unknown one and a wrong method included
// (no 404 or 405 tells it which calls exist), runs no handler, and is audited; the message says
// why it has no role and which groups to join.
func TestNoRoleIsRefusedBeforeRouting(t *testing.T) {
	why := errors.New("the caller's supplementary groups cannot be read")
	cases := []struct {
		name    string
		c       *server.Caller
		wantWhy string
		peer    bool
	}{
		{"no role, with why", &server.Caller{Cred: peercred.Cred{UID: 1000, PID: 7}, Known: true, Role: peercred.RoleNone, Why: why, Socket: server.SocketMain}, why.Error(), true},
		{"no role, no why", &server.Caller{Cred: peercred.Cred{UID: 1000, PID: 7}, Known: true, Role: peercred.RoleNone, Socket: server.SocketMain}, peercred.ErrDenied.Error(), true},
		{"no caller", nil, "peer credentials unknown", false},
	}
	f := newFakeAPI(t)
	h := server.Handler(f.routes, f.al)
	type call struct{ method, path string }
	var calls []call
	for _, rt := range fakeRoutes {
		calls = append(calls, call{rt.method, rt.path}, call{http.MethodDelete, rt.path})
	}
	calls = append(calls, call{http.MethodGet, "/v2/nothing"})
	for _, tc := range cases {
		for _, cl := range calls {
			name := fmt.Sprintf("%s: %s %s", tc.name, cl.method, cl.path)
			before := len(f.al.Recent())
			rec := serve(h, cl.method, cl.path, tc.c)
			audited := f.al.Recent()[before:]
			if rec.Code != http.StatusForbidden || len(f.runs(cl.path)) != 0 {
				t.Errorf("%s: status %d, or a handler ran; want 403 and no run", name, rec.Code)
				continue
			}
			e := errorOf(t, rec)
			if e.Code != api.CodePermissionDenied || !strings.Contains(e.Message, "may not use rbd-owner: "+tc.wantWhy) ||
				!strings.Contains(e.Message, "add the user to group rbd-owner, or rbd-owner-admin for admin calls") {
				t.Errorf("%s: refusal %+v", name, e)
			}
			if len(audited) != 1 || audited[0].Event != audit.Denied || audited[0].Result != audit.Refused || audited[0].HasPeer != tc.peer ||
				!strings.HasPrefix(audited[0].Message, "denied "+cl.method+" "+cl.path+" to uid ") {
				t.Errorf("%s: audited %+v", name, audited)
			}
		}
	}
}

// TestUnknownPathAndWrongMethod: for a caller with a role, an unknown path is 404 not_found and
// a known path with another method is 405 invalid_argument with an Allow header naming the
// route's method; neither runs a handler nor records a refusal.
func TestUnknownPathAndWrongMethod(t *testing.T) {
	f := newFakeAPI(t)
	h := server.Handler(f.routes, f.al)
	admin := &server.Caller{Cred: peercred.Cred{UID: 0, PID: 1}, Known: true, Role: peercred.RoleAdmin, Socket: server.SocketMain}
	csi := &server.Caller{Cred: peercred.Cred{UID: 1000, PID: 2}, Known: true, Role: peercred.RoleCSI, Socket: server.SocketCSI}
	for _, c := range []*server.Caller{admin, csi} {
		for _, path := range []string{"/v2/map", "/v1/map/", "/", "/v1/MAP"} {
			rec := serve(h, http.MethodPost, path, c)
			if rec.Code != http.StatusNotFound {
				t.Errorf("%s role, POST %s: status %d, want 404", c.Role, path, rec.Code)
				continue
			}
			if e := errorOf(t, rec); e.Code != api.CodeNotFound || !strings.Contains(e.Message, "no such call: POST "+path) {
				t.Errorf("%s role, POST %s: %+v", c.Role, path, e)
			}
		}
		for _, rt := range fakeRoutes {
			if c.Role < rt.need {
				continue // which of 405 and 403 comes first is not what this test is about
			}
			for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete} {
				if m == rt.method {
					continue
				}
				rec := serve(h, m, rt.path, c)
				name := fmt.Sprintf("%s role, %s %s (a %s route)", c.Role, m, rt.path, rt.method)
				if rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != rt.method {
					t.Errorf("%s: status %d, Allow %q; want 405, Allow %s", name, rec.Code, rec.Header().Get("Allow"), rt.method)
					continue
				}
				if e := errorOf(t, rec); e.Code != api.CodeInvalidArgument || !strings.Contains(e.Message, "method not allowed, use "+rt.method) {
					t.Errorf("%s: %+v", name, e)
				}
			}
		}
	}
	for _, rt := range fakeRoutes {
		if n := len(f.runs(rt.path)); n != 0 {
			t.Errorf("%s ran %d times", rt.path, n)
		}
	}
	if es := f.al.Recent(); len(es) != 0 {
		t.Errorf("audited: %+v", es)
	}
}

// TestConnectionsGetTheirCallerFromTheSocket: over real unix sockets served by New, each
// connection's caller is read from the kernel (SO_PEERCRED: this process's pid) and given its
// role as it connects: on the main socket by the policy (this process's group is the admin
// group), on the CSI socket the CSI role whoever calls, so that an admin route is refused there
// even to a caller the main socket makes an admin.
func TestConnectionsGetTheirCallerFromTheSocket(t *testing.T) {
	f := newFakeAPI(t)
	h := server.Handler(f.routes, f.al)
	peers := peercred.Policy{AdminGroup: os.Getgid(), CSIGroup: -1}
	dir := t.TempDir()
	get := func(socket string, rt string) int {
		t.Helper()
		path := filepath.Join(dir, socket+".sock")
		l, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		srv := server.New(h, socket, peers)
		done := make(chan error, 1)
		go func() { done <- srv.Serve(l) }()
		defer func() {
			if err := srv.Close(); err != nil {
				t.Error(err)
			}
			if err := <-done; !errors.Is(err, http.ErrServerClosed) {
				t.Error(err)
			}
		}()
		client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}}}
		defer client.CloseIdleConnections()
		resp, err := client.Post("http://agent"+rt, "application/json", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return resp.StatusCode
	}
	if code := get(server.SocketMain, api.PathFence); code != http.StatusOK {
		t.Fatalf("an admin route on the main socket, this process's group being the admin group: status %d", code)
	}
	runs := f.runs(api.PathFence)
	if len(runs) != 1 || runs[0].Role != peercred.RoleAdmin || !runs[0].Known || runs[0].Cred.PID != os.Getpid() || runs[0].Cred.UID != os.Getuid() ||
		runs[0].Socket != server.SocketMain {
		t.Fatalf("the main socket's caller: %+v, want this process (pid %d), admin, known", runs, os.Getpid())
	}
	if code := get(server.SocketCSI, api.PathMap); code != http.StatusOK {
		t.Fatalf("a CSI route on the CSI socket: status %d", code)
	}
	if runs := f.runs(api.PathMap); len(runs) != 1 || runs[0].Role != peercred.RoleCSI || runs[0].Cred.PID != os.Getpid() || runs[0].Socket != server.SocketCSI {
		t.Fatalf("the CSI socket's caller: %+v, want this process with the CSI role", runs)
	}
	if code := get(server.SocketCSI, api.PathFence); code != http.StatusForbidden || len(f.runs(api.PathFence)) != 0 {
		t.Fatalf("an admin route on the CSI socket: status %d, want 403 and no run", code)
	}
}
