package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/fault"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
	"github.com/rbd-owner/rbd-owner/agent/server"
)

// TestAPIErrorByKind: an error's fault kind, however deep in its wrap chain, is its answer's
// code and HTTP status, for every kind; its message is the whole error; an unclassified error is
// internal (500), and one that carries a deadline is a timeout (504).
func TestAPIErrorByKind(t *testing.T) {
	want := map[fault.Kind]struct {
		code   string
		status int
	}{
		fault.Internal:         {"internal", http.StatusInternalServerError},
		fault.Invalid:          {"invalid_argument", http.StatusBadRequest},
		fault.PermissionDenied: {"permission_denied", http.StatusForbidden},
		fault.NotFound:         {"not_found", http.StatusNotFound},
		fault.ClaimedElsewhere: {"claimed_elsewhere", http.StatusConflict},
		fault.Busy:             {"busy", http.StatusConflict},
		fault.Fenced:           {"fenced", http.StatusConflict},
		fault.Unavailable:      {"cluster_unavailable", http.StatusServiceUnavailable},
		fault.Timeout:          {"timeout", http.StatusGatewayTimeout},
		fault.Storage:          {"state_unwritable", http.StatusInsufficientStorage},
	}
	type tcase struct {
		name   string
		err    error
		code   string
		status int
	}
	var cases []tcase
	for _, k := range fault.Kinds() {
		w, ok := want[k]
		if !ok {
			t.Fatalf("kind %s has no expected code here: add it", k)
		}
		cases = append(cases, tcase{"kind " + k.String(), fmt.Errorf("map rbd/x: %w", fmt.Errorf("step: %w", fault.New(k, "boom"))), w.code, w.status})
	}
	cases = append(cases,
		tcase{"unclassified", errors.New("something odd"), api.CodeInternal, http.StatusInternalServerError},
		tcase{"a deadline", fmt.Errorf("waiting: %w", context.DeadlineExceeded), api.CodeTimeout, http.StatusGatewayTimeout},
		tcase{"unavailable past the deadline", fmt.Errorf("%w: %w", fault.ErrUnavailable, context.DeadlineExceeded), api.CodeTimeout, http.StatusGatewayTimeout})
	for _, tc := range cases {
		e := server.APIError(tc.err)
		if e.Code != tc.code || e.Message != tc.err.Error() {
			t.Errorf("%s: APIError %+v, want code %s, message %q", tc.name, e, tc.code, tc.err.Error())
		}
		rec := httptest.NewRecorder()
		server.WriteError(rec, e)
		if rec.Code != tc.status {
			t.Errorf("%s: status %d, want %d", tc.name, rec.Code, tc.status)
		}
		if got := errorOf(t, rec); got.Code != tc.code || got.Message != tc.err.Error() {
			t.Errorf("%s: the wire's error %+v", tc.name, got)
		}
	}
}

// refusal is a fake Detailer: a claimed_elsewhere refusal that names its image, holder and next
// step, as the saga's does.
type refusal struct{ image, holder string }

func (r *refusal) Error() string    { return "held by " + r.holder }
func (r *refusal) Kind() fault.Kind { return fault.ClaimedElsewhere }
func (r *refusal) Details(e *api.Error) {
	e.Image = r.image
	e.Owner = &api.Owner{NodeID: r.holder, Epoch: 3}
	e.Holders = []api.Owner{*e.Owner}
	e.Block = "lease_live"
	e.NextSteps = []api.Step{{Run: "rbd-owner fence " + r.image, Why: "fences " + r.holder}}
}

// TestAPIErrorAsksADetailerOnTheChain: an error implementing api.Detailer anywhere on the chain
// (wrapped twice, or one of a joined pair) fills in the answer's details, which reach the wire;
// the code is still the kind's and the message the whole error. Without one, no detail is set.
func TestAPIErrorAsksADetailerOnTheChain(t *testing.T) {
	r := &refusal{image: "rbd/x", holder: "node-a"}
	for name, err := range map[string]error{
		"wrapped twice": fmt.Errorf("map rbd/x: %w", fmt.Errorf("claim: %w", r)),
		"joined":        errors.Join(errors.New("first"), fmt.Errorf("claim: %w", r)),
	} {
		rec := httptest.NewRecorder()
		server.WriteError(rec, server.APIError(err))
		e := errorOf(t, rec)
		if rec.Code != http.StatusConflict || e.Code != api.CodeClaimedElsewhere || e.Message != err.Error() {
			t.Errorf("%s: status %d, %+v", name, rec.Code, e)
		}
		if e.Image != "rbd/x" || e.Owner == nil || e.Owner.NodeID != "node-a" || len(e.Holders) != 1 || e.Block != "lease_live" ||
			len(e.NextSteps) != 1 || e.NextSteps[0].Run != "rbd-owner fence rbd/x" {
			t.Errorf("%s: the details did not reach the wire: %s", name, rec.Body)
		}
	}
	e := server.APIError(fmt.Errorf("claim: %w", fault.ErrClaimedElsewhere))
	if e.Image != "" || e.Owner != nil || e.Holders != nil || e.Block != "" || e.NextSteps != nil {
		t.Errorf("details without a Detailer: %+v", e)
	}
}

type echoReq struct {
	Name string `json:"name"`
}

type echoResp struct {
	Name string `json:"name"`
	UID  int    `json:"uid"`
}

// call serves body through Call with c as the caller; f answers fail when it is not nil. It
// returns the recorder and the requests f was run with.
func call(t *testing.T, body string, c server.Caller, fail error) (*httptest.ResponseRecorder, []echoReq) {
	t.Helper()
	var got []echoReq
	h := server.Call(func(ctx context.Context, req echoReq, peer *peercred.Cred) (echoResp, error) {
		got = append(got, req)
		if cl, ok := server.CallerFrom(ctx); !ok || cl.Socket != c.Socket {
			t.Errorf("f's context carries caller %+v, %v", cl, ok)
		}
		if fail != nil {
			return echoResp{}, fail
		}
		return echoResp{Name: req.Name, UID: peercred.UID(peer)}, nil
	})
	req := httptest.NewRequest(http.MethodPost, api.PathMap, strings.NewReader(body))
	req = req.WithContext(server.WithCaller(req.Context(), c))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec, got
}

// TestCallDecodesStrictly: Call runs f with the decoded body and the caller's credentials (none
// when they are unknown) and answers its result as JSON; a body with an unknown field, with
// trailing data or larger than api.MaxBodyBytes (one byte over; exactly the limit is read) is
// 400 invalid_argument and f never runs; f's error is answered with its kind's code.
func TestCallDecodesStrictly(t *testing.T) {
	known := server.Caller{Cred: peercred.Cred{UID: 1000, PID: 7}, Known: true, Role: peercred.RoleCSI, Socket: server.SocketCSI}
	rec, got := call(t, `{"name":"x"}`, known, nil)
	var resp echoResp
	if err := json.Unmarshal(rec.Body.Bytes(), &resp); rec.Code != http.StatusOK || err != nil || len(got) != 1 || resp != (echoResp{Name: "x", UID: 1000}) {
		t.Fatalf("a good call: status %d, runs %v, answer %s", rec.Code, got, rec.Body)
	}
	unknown := known
	unknown.Known = false
	rec, _ = call(t, `{"name":"x"}`, unknown, nil)
	if err := json.Unmarshal(rec.Body.Bytes(), &resp); err != nil || resp.UID != -1 {
		t.Errorf("a caller whose credentials are unknown reached f with credentials: %s", rec.Body)
	}

	// {"name":"aaa…"} of exactly n bytes
	sized := func(n int) string { return `{"name":"` + strings.Repeat("a", n-len(`{"name":""}`)) + `"}` }
	if rec, got := call(t, sized(api.MaxBodyBytes), known, nil); rec.Code != http.StatusOK || len(got) != 1 || len(got[0].Name) != api.MaxBodyBytes-11 {
		t.Errorf("a body of exactly the limit: status %d, %d runs: %.200s", rec.Code, len(got), rec.Body)
	}
	for name, tc := range map[string]struct{ body, msg string }{
		"unknown field": {`{"name":"x","force":true}`, `unknown field "force"`},
		"trailing data": {`{"name":"x"} {"name":"y"}`, "trailing data after the JSON object"},
		"one byte over": {sized(api.MaxBodyBytes + 1), fmt.Sprintf("request body larger than %d bytes", api.MaxBodyBytes)},
		"not JSON":      {`name=x`, "bad request body"},
	} {
		rec, got := call(t, tc.body, known, nil)
		if rec.Code != http.StatusBadRequest || len(got) != 0 {
			t.Errorf("%s: status %d, %d runs; want 400 and no run", name, rec.Code, len(got))
			continue
		}
		if e := errorOf(t, rec); e.Code != api.CodeInvalidArgument || !strings.HasPrefix(e.Message, "bad request body: ") || !strings.Contains(e.Message, tc.msg) {
			t.Errorf("%s: %+v, want invalid_argument saying %q", name, e, tc.msg)
		}
	}

	fail := fmt.Errorf("map rbd/x: %w", fault.New(fault.Busy, "device open"))
	rec, got = call(t, `{"name":"x"}`, known, fail)
	if e := errorOf(t, rec); rec.Code != http.StatusConflict || len(got) != 1 || e.Code != api.CodeBusy || e.Message != fail.Error() {
		t.Errorf("f's error: status %d, %+v", rec.Code, e)
	}
	rec, _ = call(t, `{"name":"x"}`, known, fmt.Errorf("map: %w", &refusal{image: "rbd/x", holder: "node-a"}))
	if e := errorOf(t, rec); rec.Code != http.StatusConflict || e.Code != api.CodeClaimedElsewhere || e.Image != "rbd/x" || len(e.NextSteps) != 1 {
		t.Errorf("f's refusal: status %d, %+v", rec.Code, e)
	}
}

// TestGetAnswersItsError: Get answers f's result with 200, and f's error as the JSON error of
// its kind.
func TestGetAnswersItsError(t *testing.T) {
	var fail error
	h := server.Get(func(r *http.Request) ([]string, error) { return []string{r.URL.Query().Get("pool")}, fail })
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, api.PathClaims+"?pool=rbd", nil))
	if rec.Code != http.StatusOK || strings.Join(strings.Fields(rec.Body.String()), "") != `["rbd"]` {
		t.Errorf("a good GET: status %d, %s", rec.Code, rec.Body)
	}
	fail = fmt.Errorf("claims: %w", fault.ErrNotFound)
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, api.PathClaims+"?pool=rbd", nil))
	if e := errorOf(t, rec); rec.Code != http.StatusNotFound || e.Code != api.CodeNotFound || e.Message != fail.Error() {
		t.Errorf("a failed GET: status %d, %+v", rec.Code, e)
	}
}
