package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
)

// serve answers every call with status and body, on a unix socket, and records the requests.
func serve(t *testing.T, status int, body any) (string, *[]string) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "s")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b bytes.Buffer
		_, _ = b.ReadFrom(r.Body)
		seen = append(seen, r.Method+" "+r.URL.String()+" "+b.String())
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(body)
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })
	return sock, &seen
}

func cli(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestMapPrintsTheDevice(t *testing.T) {
	sock, seen := serve(t, 200, api.MapResponse{Device: "/dev/rbd7"})
	code, out, _ := cli("--socket", sock, "map", "--access", "rwo", "rbd/ns1/img@snap", "--volume-id", "vol-1")
	if code != 0 || out != "/dev/rbd7\n" {
		t.Fatalf("exit %d, stdout %q", code, out)
	}
	var req api.MapRequest
	if err := json.Unmarshal([]byte(strings.SplitN((*seen)[0], " ", 3)[2]), &req); err != nil {
		t.Fatal(err)
	}
	if req.Pool != "rbd" || req.Namespace != "ns1" || req.Image != "img" || req.Snapshot != "snap" || req.VolumeID != "vol-1" {
		t.Fatalf("request %+v", req)
	}
}

func TestClaimedElsewhereExits3AndNamesTheOwner(t *testing.T) {
	sock, _ := serve(t, 409, api.ErrorBody{Error: &api.Error{Code: api.CodeClaimedElsewhere, Message: "acquire rbd/img: rbd/img is held (rwo) by node node-a ...",
		Owner: &api.Owner{NodeID: "node-a", Hostname: "host-a", Epoch: 4, AcquiredAt: time.Now(), LeaseAge: 3}}})
	code, _, errs := cli("--socket", sock, "map", "rbd/img")
	if code != exitClaimed || !strings.HasPrefix(errs, "rbd-owner map: rbd/img is held by node node-a") || strings.Count(errs, "rbd/img") != 1 || !strings.Contains(errs, "epoch 4") || !strings.Contains(errs, "rbd-owner fence") {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	if strings.Count(strings.TrimSpace(errs), "\n") != 0 {
		t.Fatalf("error is not one line: %q", errs)
	}
}

// TestClaimedElsewhereKeepsTheAgentsNextStep: the agent's next step for this caller and policy
// (after the first "; " of its message) is printed whole, not replaced by generic advice.
func TestClaimedElsewhereKeepsTheAgentsNextStep(t *testing.T) {
	next := "node node-a's mapping (10.0.0.1:0/7) is on no blocklist entry for its whole node (ip:0/0 or a range); under takeover_policy: after-fence a map takes it over once the holder's mapping is on the cluster's blocklist"
	sock, _ := serve(t, 409, api.ErrorBody{Error: &api.Error{Code: api.CodeClaimedElsewhere,
		Message: "acquire rbd/img: rbd/img is held (rwo) by node node-a (host host-a, addr 10.0.0.1) at epoch 4 since 2026-12-02T13:00:00Z (lease live as far as this node has seen); " + next,
		Owner:   &api.Owner{NodeID: "node-a", Hostname: "host-a", Epoch: 4, AcquiredAt: time.Now(), LeaseAge: 3}}})
	code, _, errs := cli("--socket", sock, "map", "rbd/img")
	if code != exitClaimed || !strings.HasPrefix(errs, "rbd-owner map: rbd/img is held by node node-a") || !strings.Contains(errs, "(live); "+next) ||
		strings.Contains(errs, "release --force") || strings.Count(strings.TrimSpace(errs), "\n") != 0 {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
}

func TestExitCodes(t *testing.T) {
	sock, _ := serve(t, 503, api.ErrorBody{Error: &api.Error{Code: api.CodeClusterUnavailable, Message: "cluster lab: unavailable"}})
	for _, tc := range []struct {
		args []string
		code int
		err  string
	}{
		{[]string{"--socket", sock, "map", "rbd/img"}, exitFailed, "cluster_unavailable"},
		{[]string{"--socket", filepath.Join(t.TempDir(), "none"), "status"}, exitUnreachable, "systemctl status rbd-owner"},
		{[]string{"map"}, exitUsage, "want 1 argument"},
		{[]string{"map", "rbd/a,b"}, exitUsage, "rbd/a,b"},
		{[]string{"map", "--bogus", "rbd/a"}, exitUsage, "bogus"},
		{[]string{"release", "rbd/a"}, exitUsage, "--force"},
		{[]string{"fence", "rbd/a@s"}, exitUsage, "snapshot"},
		{[]string{"frobnicate"}, exitUsage, "unknown command"},
		{[]string{}, exitUsage, "usage"},
	} {
		code, _, errs := cli(tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.err) {
			t.Errorf("%q: exit %d stderr %q, want %d containing %q", tc.args, code, errs, tc.code, tc.err)
		}
	}
	if code, out, _ := cli("version"); code != 0 || !strings.HasPrefix(out, "rbd-owner ") {
		t.Errorf("version: %d %q", code, out)
	}
}

func TestUnmapByDeviceAndJSON(t *testing.T) {
	sock, seen := serve(t, 200, api.UnmapResponse{Unmapped: true})
	code, out, _ := cli("--socket", sock, "unmap", "--json", "/dev/rbd3")
	if code != 0 || !strings.Contains(out, `"unmapped": true`) || !strings.Contains((*seen)[0], `"device":"/dev/rbd3"`) {
		t.Fatalf("exit %d out %q seen %q", code, out, *seen)
	}
}

// statusWith is a status as the agent builds it: each device's problem is in the problems list
// too (a managed device's by its image, an unmanaged device's by its device).
func statusWith(devices []api.Device, problems ...string) api.Status {
	return api.Status{Node: "node-a", Version: "test", Clusters: []api.ClusterStatus{{ID: "c1", Connected: true}},
		Devices: devices, Problems: problems}
}

func TestStatusExitsFiveOnProblemsAndPrintsEachOnce(t *testing.T) {
	lost := "claim lost: fenced by node-b at epoch 4"
	fenced := "mapped outside rbd-owner and FENCED (client 10.0.0.1:0/1 blocklisted until 2026-12-02T06:00:00Z): no claim; unmap it, then `rbd-owner unfence rbd/img3`"
	renew := "lease not renewed: cluster c1 did not answer within 5s"
	skew := "clock skew: node node-b's clock is 9s ahead of this node's (cluster c1)"
	mapped := api.Device{Device: "/dev/rbd0", Cluster: "c1", Pool: "rbd", Image: "img1", Managed: true, Epoch: 3}
	withProblem := func(d api.Device, p string) api.Device { d.Problem = p; return d }
	for _, tc := range []struct {
		name    string
		st      api.Status
		code    int
		problem string // printed exactly once
	}{
		{"no problem", statusWith([]api.Device{mapped}), exitOK, ""},
		{"no device", statusWith(nil), exitOK, ""},
		{"device problem", statusWith([]api.Device{withProblem(mapped, renew)}, "c1:rbd/img1: "+renew), exitProblems, renew},
		{"lost claim", statusWith([]api.Device{withProblem(mapped, lost)}, "c1:rbd/img1: "+lost), exitProblems, lost},
		{"fenced unmanaged device", statusWith([]api.Device{mapped, {Device: "/dev/rbd1", Pool: "rbd", Image: "img3", Problem: fenced}}, "/dev/rbd1: "+fenced), exitProblems, fenced},
		{"node-level problem", statusWith([]api.Device{mapped}, skew), exitProblems, skew},
		{"device problem the list omits", statusWith([]api.Device{withProblem(mapped, renew)}), exitProblems, renew},
	} {
		sock, _ := serve(t, 200, tc.st)
		code, out, errs := cli("--socket", sock, "status")
		if code != tc.code || errs != "" {
			t.Errorf("%s: exit %d stderr %q, want %d and no stderr; stdout:\n%s", tc.name, code, errs, tc.code, out)
		}
		if tc.problem != "" {
			if n := strings.Count(out, tc.problem); n != 1 {
				t.Errorf("%s: the problem is printed %d times, want once:\n%s", tc.name, n, out)
			}
			if !strings.Contains(out, "\nproblem: ") || !strings.Contains(out, ", 1 problems\n") {
				t.Errorf("%s: want one problem line and the count in the first line:\n%s", tc.name, out)
			}
		} else if strings.Contains(out, "problem:") || !strings.Contains(out, ", 0 problems\n") {
			t.Errorf("%s: no problem expected:\n%s", tc.name, out)
		}
		code, out, errs = cli("--socket", sock, "status", "--json")
		var got api.Status
		if err := json.Unmarshal([]byte(out), &got); err != nil || code != tc.code || errs != "" || got.Node != "node-a" {
			t.Errorf("%s --json: exit %d stderr %q decode %v, want %d; stdout:\n%s", tc.name, code, errs, err, tc.code, out)
		}
	}
}

// TestStatusSaysConnecting: a cluster whose first connection is under way is "connecting",
// not "not connected" (which is for one that failed, with its error).
func TestStatusSaysConnecting(t *testing.T) {
	st := statusWith(nil)
	st.Clusters = []api.ClusterStatus{{ID: "c1", Connecting: true}, {ID: "c2", Error: "cannot reach the monitors"}}
	sock, _ := serve(t, 200, st)
	code, out, _ := cli("--socket", sock, "status")
	if code != exitOK || !strings.Contains(out, "cluster c1 (fsid -, node address -): connecting\n") ||
		!strings.Contains(out, "cluster c2 (fsid -, node address -): not connected: cannot reach the monitors\n") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
}

// oneErrorObject decodes stdout as exactly one JSON document, the API's error object.
func oneErrorObject(t *testing.T, what, out string) *api.Error {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(out))
	var eb api.ErrorBody
	if err := dec.Decode(&eb); err != nil || eb.Error == nil {
		t.Errorf("%s: stdout is not an error object (%v): %q", what, err, out)
		return &api.Error{}
	}
	var more json.RawMessage
	if err := dec.Decode(&more); err != io.EOF {
		t.Errorf("%s: more than one JSON document on stdout: %q", what, out)
	}
	return eb.Error
}

// jsonCommands is every command line that takes --json (with the arguments it needs).
var jsonCommands = [][]string{
	{"map", "rbd/img"},
	{"unmap", "rbd/img"},
	{"status"},
	{"claims"},
	{"claims", "--remove-orphans"},
	{"fence", "rbd/img"},
	{"unfence", "rbd/img"},
	{"unfence", "--node", "node-b"},
	{"release", "--force", "rbd/img"},
}

func TestJSONErrorsAreOneErrorObjectOnStdout(t *testing.T) {
	nowhere := filepath.Join(t.TempDir(), "none")
	claimed, _ := serve(t, 409, api.ErrorBody{Error: &api.Error{Code: api.CodeClaimedElsewhere, Message: "acquire rbd/img: rbd/img is held (rwo) by node node-b",
		Owner: &api.Owner{NodeID: "node-b", Hostname: "host-b", Epoch: 7}}})
	for _, cmd := range jsonCommands {
		name := strings.Join(cmd, " ")
		args := append(append([]string{"--socket", nowhere}, cmd...), "--json")
		code, out, errs := cli(args...)
		if e := oneErrorObject(t, name+" (unreachable)", out); code != exitUnreachable || errs != "" || e.Code != "unreachable" || !strings.Contains(e.Message, "systemctl status rbd-owner") {
			t.Errorf("%s, no agent: exit %d stderr %q error %+v, want exit 4, code unreachable, no stderr", name, code, errs, e)
		}
		args = append([]string{"--socket", claimed, cmd[0], "--json"}, cmd[1:]...)
		code, out, errs = cli(args...)
		if e := oneErrorObject(t, name+" (claimed)", out); code != exitClaimed || errs != "" || e.Code != api.CodeClaimedElsewhere || e.Owner == nil || e.Owner.NodeID != "node-b" || e.Owner.Epoch != 7 {
			t.Errorf("%s, claimed elsewhere: exit %d stderr %q error %+v, want exit 3, the agent's error object, no stderr", name, code, errs, e)
		}
		args = append(append([]string{"--socket", claimed}, cmd...), "--json", "--bogus")
		code, out, errs = cli(args...)
		if e := oneErrorObject(t, name+" (usage)", out); code != exitUsage || errs != "" || e.Code != api.CodeInvalidArgument || !strings.Contains(e.Message, "bogus") {
			t.Errorf("%s, usage error after --json: exit %d stderr %q error %+v, want exit 2, code invalid_argument, no stderr", name, code, errs, e)
		}
		// without --json (or with --json=false): the one line on stderr, nothing on stdout
		for _, extra := range [][]string{nil, {"--json=false"}} {
			args = append(append([]string{"--socket", nowhere}, cmd...), extra...)
			code, out, errs = cli(args...)
			if code != exitUnreachable || out != "" || !strings.HasPrefix(errs, "rbd-owner "+cmd[0]+": ") || strings.Count(errs, "\n") != 1 {
				t.Errorf("%q, no agent: exit %d stdout %q stderr %q, want exit 4 and one stderr line", args[2:], code, out, errs)
			}
		}
	}
}

func TestJSONRequested(t *testing.T) {
	for args, want := range map[string]bool{
		"": false, "--json": true, "-json": true, "--json=true": true, "--json=false": false, "--json --json=0": false,
		"--json=bogus": true, "rbd/img --json": true, "-- --json": false, "--jsonx": false, "json": false,
	} {
		if got := jsonRequested(strings.Fields(args)); got != want {
			t.Errorf("jsonRequested(%q) = %v, want %v", args, got, want)
		}
	}
}
