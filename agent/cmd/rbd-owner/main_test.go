package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/client"
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
		Image: "rbd/img", Owner: &api.Owner{NodeID: "node-a", Hostname: "host-a", Epoch: 4, AcquiredAt: time.Now(), LeaseAge: 3}}})
	code, _, errs := cli("--socket", sock, "map", "rbd/img")
	if code != exitClaimed || !strings.HasPrefix(errs, "rbd-owner map: rbd/img is held by node node-a") || strings.Count(errs, "rbd/img is held") != 1 || strings.Contains(errs, "acquire") || !strings.Contains(errs, "epoch 4") ||
		// a fenced hold is taken over by the next map: no release --force (seen in the Kubernetes lab)
		!strings.Contains(errs, "`rbd-owner fence --node node-a`, or `rbd-owner fence rbd/img` for this image only, and map again") || strings.Contains(errs, "release --force") {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	if strings.Count(strings.TrimSpace(errs), "\n") != 0 {
		t.Fatalf("error is not one line: %q", errs)
	}
}

// TestClaimedElsewhereWhileWatchingNamesTheNodeFence: with no next step from the agent, a
// refusal while the holder's lease is watched names the node's fence, not a release --force.
func TestClaimedElsewhereWhileWatchingNamesTheNodeFence(t *testing.T) {
	sock, _ := serve(t, 409, api.ErrorBody{Error: &api.Error{Code: api.CodeClaimedElsewhere, Message: "acquire rbd/img: rbd/img is held (rwo) by node node-a ...",
		Image: "rbd/img", Owner: &api.Owner{NodeID: "node-a", Hostname: "host-a", Epoch: 4, AcquiredAt: time.Now(), LeaseAge: 3},
		RetryAfterSeconds: 20}})
	code, _, errs := cli("--socket", sock, "map", "rbd/img")
	if code != exitClaimed || !strings.Contains(errs, "a takeover is possible in 20s unless it renews; if that node is dead, retry with --takeover then, or have an admin run `rbd-owner fence --node node-a` and map again)") ||
		strings.Contains(errs, "release --force") {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
}

// TestFenceNamesTheNextMap: a fence's next step is the map where the image should run (it takes
// the fenced hold over); release --force is the way to free it instead.
func TestFenceNamesTheNextMap(t *testing.T) {
	until := time.Date(2036, 12, 6, 5, 0, 0, 0, time.UTC)
	sock, seen := serve(t, 200, api.FenceResponse{FencedAddrs: []string{"10.0.0.1:0/7"}, Expires: until})
	code, out, errs := cli("--socket", sock, "fence", "rbd/img")
	want := "fenced 10.0.0.1:0/7 until 2036-12-06T05:00:00Z; next: map rbd/img on the node that should have it (the map takes the fenced hold over), or free it with rbd-owner release --force rbd/img\n"
	if code != 0 || out != want || errs != "" || len(*seen) != 1 {
		t.Fatalf("exit %d, stdout %q, stderr %q; want %q", code, out, errs, want)
	}
}

// TestClaimedElsewhereKeepsTheAgentsNextStep: the agent's next step for this caller and policy
// (after the first "; " of its message) is printed whole, not replaced by generic advice.
func TestClaimedElsewhereKeepsTheAgentsNextStep(t *testing.T) {
	reason := "node node-a's mapping (10.0.0.1:0/7) is on no blocklist entry for its whole node (ip:0/0 or a range)"
	advice := "under takeover_policy: after-fence a map takes it over once the holder's mapping is on the cluster's blocklist"
	next := reason + "; " + advice
	sock, _ := serve(t, 409, api.ErrorBody{Error: &api.Error{Code: api.CodeClaimedElsewhere,
		Message: "acquire rbd/img: rbd/img is held (rwo) by node node-a (host host-a, addr 10.0.0.1) at epoch 4 since 2026-12-02T13:00:00Z (lease live as far as this node has seen); " + next,
		Image:   "rbd/img", Block: "not_covered", Reason: reason, Advice: advice,
		Owner: &api.Owner{NodeID: "node-a", Hostname: "host-a", Epoch: 4, AcquiredAt: time.Now(), LeaseAge: 3}}})
	code, _, errs := cli("--socket", sock, "map", "rbd/img")
	if code != exitClaimed || !strings.HasPrefix(errs, "rbd-owner map: rbd/img is held by node node-a") || !strings.Contains(errs, "(live); "+next) ||
		strings.Contains(errs, "release --force") || strings.Count(strings.TrimSpace(errs), "\n") != 0 {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
}

// TestClaimedElsewhereWhileWatchingTheLease: a refusal under takeover while the holder's lease
// is watched has a "; " inside the holder's lease note; the agent's next step is what follows
// the note, printed once (seen in the Kubernetes lab: the note's second half was printed twice).
func TestClaimedElsewhereWhileWatchingTheLease(t *testing.T) {
	next := "takeover refused while node node-a's lease is live as far as this node has seen: retry then"
	sock, _ := serve(t, 409, api.ErrorBody{Error: &api.Error{Code: api.CodeClaimedElsewhere,
		Message: "acquire rbd/k8s1: rbd/k8s1 is held (rwo) by node node-a (host node-a, addr 203.0.113.11) at epoch 7 since 2026-12-06T04:01:43Z " +
			"(live: watching node node-a's lease; a takeover is possible in 35s unless it renews); " + next,
		Image: "rbd/k8s1", Block: "lease_live", Reason: next,
		Owner:             &api.Owner{NodeID: "node-a", Hostname: "node-a", Epoch: 7, AcquiredAt: time.Now(), LeaseAge: 3},
		RetryAfterSeconds: 35}})
	code, _, errs := cli("--socket", sock, "map", "rbd/k8s1")
	want := "(live: watching node node-a's lease; a takeover is possible in 35s unless it renews); " + next + "\n"
	if code != exitClaimed || !strings.HasPrefix(errs, "rbd-owner map: rbd/k8s1 is held by node node-a") || !strings.HasSuffix(errs, want) ||
		strings.Count(errs, "a takeover is possible") != 1 || strings.Count(strings.TrimSpace(errs), "\n") != 0 {
		t.Fatalf("exit %d, stderr %q, want it to end with %q", code, errs, want)
	}
}

// TestClaimedElsewhereReadsDataNotText: the line is made from the refusal's data; a message
// worded otherwise (an agent's rewording) changes nothing in it.
func TestClaimedElsewhereReadsDataNotText(t *testing.T) {
	sock, _ := serve(t, 409, api.ErrorBody{Error: &api.Error{Code: api.CodeClaimedElsewhere, Message: "reworded; with (parentheses; and) semicolons; rbd/other is held",
		Image: "rbd/img", Owner: &api.Owner{NodeID: "node-a", Hostname: "host-a", Epoch: 4, AcquiredAt: time.Now(), LeaseAge: 3},
		NextSteps: []api.Step{{Run: "rbd-owner fence --node node-a", Why: "if node node-a is dead"}, {Why: "set takeover_policy: after-fence"}}}})
	code, _, errs := cli("--socket", sock, "map", "rbd/img")
	want := "(live); run `rbd-owner fence --node node-a` (if node node-a is dead); or set takeover_policy: after-fence\n"
	if code != exitClaimed || !strings.HasPrefix(errs, "rbd-owner map: rbd/img is held by node node-a (host host-a) at epoch 4") || !strings.HasSuffix(errs, want) ||
		strings.Contains(errs, "reworded") || strings.Contains(errs, "rbd/other") {
		t.Fatalf("exit %d, stderr %q, want it to end with %q", code, errs, want)
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
		{[]string{"map"}, exitUsage, "missing argument POOL[/NAMESPACE]/IMAGE[@SNAP]"},
		{[]string{"map", "rbd/a,b"}, exitUsage, "rbd/a,b"},
		{[]string{"map", "--bogus", "rbd/a"}, exitUsage, "bogus"},
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

// TestEveryExitCode pins the contract's exit codes, one command line each.
func TestEveryExitCode(t *testing.T) {
	mapped, _ := serve(t, 200, api.MapResponse{Device: "/dev/rbd7"})
	failed, _ := serve(t, 500, api.ErrorBody{Error: &api.Error{Code: api.CodeInternal, Message: "boom"}})
	claimed, _ := serve(t, 409, api.ErrorBody{Error: &api.Error{Code: api.CodeClaimedElsewhere, Message: "rbd/img is held (rwo) by node node-b",
		Owner: &api.Owner{NodeID: "node-b", Hostname: "host-b", Epoch: 2}}})
	problems, _ := serve(t, 200, statusWith(nil, "clock skew: node node-b's clock is 9s ahead"))
	nowhere := filepath.Join(t.TempDir(), "none")
	for _, tc := range []struct {
		code int
		args []string
	}{
		{exitOK, []string{"--socket", mapped, "map", "rbd/img"}},
		{exitFailed, []string{"--socket", failed, "map", "rbd/img"}},
		{exitUsage, []string{"--socket", mapped, "map"}},
		{exitClaimed, []string{"--socket", claimed, "map", "rbd/img"}},
		{exitUnreachable, []string{"--socket", nowhere, "map", "rbd/img"}},
		{exitProblems, []string{"--socket", problems, "status"}},
	} {
		if code, out, errs := cli(tc.args...); code != tc.code {
			t.Errorf("%q: exit %d, want %d; stdout %q stderr %q", tc.args, code, tc.code, out, errs)
		}
	}
	if exitOK != 0 || exitFailed != 1 || exitUsage != 2 || exitClaimed != 3 || exitUnreachable != 4 || exitProblems != 5 {
		t.Error("the exit codes differ from the documented 0-5")
	}
}

// commands is every command with a valid line for it, for the tests of help and usage.
var commands = map[string][]string{
	"map": {"rbd/img"}, "unmap": {"rbd/img"}, "status": nil, "claims": nil, "fence": {"rbd/img"},
	"release": {"--force", "rbd/img"}, "unfence": {"rbd/img"}, "daemon": nil, "check-config": nil,
	"version": nil, "completion": {"bash"},
}

// TestHelp: --help, -h and `help` print the help on stdout and exit 0: the root's lists the
// commands, the exit codes and the JSON contract; a command's has its usage line, examples,
// flags and the global flags.
func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}, {"--socket", "/x", "--help"}} {
		code, out, errs := cli(args...)
		if code != exitOK || errs != "" {
			t.Errorf("%q: exit %d stderr %q", args, code, errs)
		}
		for _, want := range []string{
			"Usage:\n  rbd-owner <command> [flags]\n", "\nCommands:\n  map ", "\nAdmin Commands (root or group rbd-owner-admin):\n  fence ",
			"\nAgent Commands:\n  daemon ", "Exit codes: 0 done, 1 failed, 2 usage error, 3 held by another node, 4 agent not reachable,\n5 status",
			`{"error": {"code", "message", ...}}`, "--socket PATH", "--version", `Use "rbd-owner <command> --help"`,
		} {
			if !strings.Contains(out, want) {
				t.Errorf("%q: the help has no %q:\n%s", args, want, out)
			}
		}
		for name := range commands {
			if !strings.Contains(out, "\n  "+name+" ") {
				t.Errorf("%q: the help does not list %s", args, name)
			}
		}
	}
	for name := range commands {
		code, out, errs := cli(name, "--help")
		if code != exitOK || errs != "" || !strings.HasPrefix(strings.SplitN(out, "Usage:\n  ", 2)[1], "rbd-owner "+name) ||
			!strings.Contains(out, "\nExamples:\n  ") || !strings.Contains(out, "\nFlags:\n") || !strings.Contains(out, "  -h, --help ") {
			t.Errorf("%s --help: exit %d stderr %q:\n%s", name, code, errs, out)
		}
		if _, viaHelp, _ := cli("help", name); viaHelp != out {
			t.Errorf("help %s differs from %s --help:\n%s", name, name, viaHelp)
		}
		if takes := name != "daemon" && name != "check-config" && name != "version" && name != "completion"; takes != strings.Contains(out, "      --json ") {
			t.Errorf("%s --help: --json listed %v, want %v", name, !takes, takes)
		}
	}
	_, out, _ := cli("map", "--help")
	for _, want := range []string{
		"Usage:\n  rbd-owner map POOL[/NAMESPACE]/IMAGE[@SNAP] [flags]\n\nExamples:\n  # map an image",
		"\nFlags:\n      --access MODE ", "      --cluster ID ", "      --takeover ", "      --no-udev ", "      --read-only ", "      --volume-id ID ",
		"      --json ", "\nGlobal Flags:\n      --socket PATH ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("map --help has no %q:\n%s", want, out)
		}
	}
}

func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"--version"}, {"version"}, {"-version"}} {
		if code, out, errs := cli(args...); code != exitOK || out != "rbd-owner dev\n" || errs != "" {
			t.Errorf("%q: exit %d stdout %q stderr %q", args, code, out, errs)
		}
	}
}

// TestUsageErrors: a missing or extra argument, an unknown flag, command or help topic: exit 2,
// nothing on stdout, the error in one line and the command's usage line on stderr.
func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args        []string
		err, usage  string
		stdoutEmpty bool
	}{
		{[]string{"map"}, "rbd-owner map: missing argument POOL[/NAMESPACE]/IMAGE[@SNAP]", "rbd-owner map POOL[/NAMESPACE]/IMAGE[@SNAP] [flags] (see rbd-owner map --help)", true},
		{[]string{"map", "rbd/a", "rbd/b"}, `rbd-owner map: unexpected argument "rbd/b"`, "rbd-owner map POOL[/NAMESPACE]/IMAGE[@SNAP] [flags]", true},
		{[]string{"unmap"}, "rbd-owner unmap: missing argument POOL[/NAMESPACE]/IMAGE[@SNAP] or /dev/rbdN", "rbd-owner unmap (POOL[/NAMESPACE]/IMAGE[@SNAP] | /dev/rbdN) [flags]", true},
		{[]string{"status", "extra"}, `rbd-owner status: unexpected argument "extra"`, "rbd-owner status [flags]", true},
		{[]string{"claims", "rbd"}, `rbd-owner claims: unexpected argument "rbd"`, "rbd-owner claims [flags]", true},
		{[]string{"fence"}, "rbd-owner fence: missing argument POOL[/NAMESPACE]/IMAGE (or --node NODE)", "rbd-owner fence (POOL[/NAMESPACE]/IMAGE | --node NODE) [flags]", true},
		{[]string{"fence", "--node", "n", "rbd/img"}, `rbd-owner fence: unexpected argument "rbd/img"`, "rbd-owner fence (", true},
		{[]string{"unfence", "--force", "rbd/img"}, "rbd-owner unfence: --force is for unfence --node NODE", "rbd-owner unfence (", true},
		{[]string{"release", "--force"}, "rbd-owner release: missing argument POOL[/NAMESPACE]/IMAGE", "rbd-owner release [--force] POOL[/NAMESPACE]/IMAGE [flags]", true},
		{[]string{"version", "x"}, `rbd-owner version: unexpected argument "x"`, "rbd-owner version [flags]", true},
		{[]string{"status", "--bogus"}, "rbd-owner status: unknown flag: --bogus", "rbd-owner status [flags]", true},
		{[]string{"--bogus", "status"}, "rbd-owner: unknown flag: --bogus", "rbd-owner <command> [flags] (see rbd-owner --help)", true},
		{[]string{"map", "--access"}, "rbd-owner map: flag needs an argument: --access", "rbd-owner map ", true},
		{[]string{"check-config", "--json"}, "rbd-owner check-config: unknown flag: --json (rbd-owner check-config prints no JSON)", "rbd-owner check-config [--config PATH] (see", true},
		{[]string{}, "rbd-owner: name a command", "rbd-owner <command> [flags] (see rbd-owner --help)", true},
		{[]string{"fense"}, `rbd-owner: unknown command "fense" (did you mean "fence"?)`, "rbd-owner <command> [flags]", true},
		{[]string{"help", "frobnicate"}, `rbd-owner help: unknown help topic "frobnicate"`, "rbd-owner help [command] [flags]", true},
		{[]string{"completion"}, "rbd-owner completion: name a shell: bash, zsh or fish", "rbd-owner completion (bash | zsh | fish) [flags]", true},
		{[]string{"completion", "powershell"}, `rbd-owner completion: unknown shell "powershell": bash, zsh or fish`, "rbd-owner completion (", true},
	} {
		code, out, errs := cli(tc.args...)
		lines := strings.Split(strings.TrimSuffix(errs, "\n"), "\n")
		if code != exitUsage || (tc.stdoutEmpty && out != "") || len(lines) != 2 || lines[0] != tc.err ||
			!strings.HasPrefix(lines[1], "usage: "+tc.usage) {
			t.Errorf("%q: exit %d stdout %q stderr:\n%s\nwant exit 2, %q then \"usage: %s…\"", tc.args, code, out, errs, tc.err, tc.usage)
		}
	}
}

// TestFlagsAnywhere: the global --socket and a command's --json before the command's name,
// between its arguments or after them; the single-dash long flags of the flag package the
// command line was first written with still work.
func TestFlagsAnywhere(t *testing.T) {
	sock, seen := serve(t, 200, api.MapResponse{Device: "/dev/rbd7", Link: "/dev/rbd-owner/f/rbd/img"})
	for _, args := range [][]string{
		{"--socket", sock, "map", "rbd/img", "--json"},
		{"map", "--socket", sock, "--json", "rbd/img"},
		{"map", "rbd/img", "--socket=" + sock, "--json"},
		{"--json", "--socket", sock, "map", "rbd/img"},
		{"-socket", sock, "map", "-json", "rbd/img"},
		{"map", "-json=true", "-socket=" + sock, "rbd/img", "-cluster", "c1"},
	} {
		code, out, errs := cli(args...)
		var resp api.MapResponse
		if err := json.Unmarshal([]byte(out), &resp); err != nil || code != exitOK || errs != "" || resp.Link != "/dev/rbd-owner/f/rbd/img" {
			t.Errorf("%q: exit %d stdout %q stderr %q (%v)", args, code, out, errs, err)
		}
	}
	if !strings.Contains((*seen)[len(*seen)-1], `"cluster":"c1"`) {
		t.Errorf("-cluster c1 did not reach the request: %q", (*seen)[len(*seen)-1])
	}
	for in, want := range map[string]string{
		"-json":                "--json",
		"-socket=/x":           "--socket=/x",
		"-h":                   "-h",
		"-help":                "--help",
		"-bogus":               "-bogus",
		"rbd/img":              "rbd/img",
		"--json":               "--json",
		"-- -json":             "-- -json",
		"map -json -- -socket": "map --json -- -socket",
	} {
		if got := strings.Join(longFlags((&app{out: &output{}}).newRoot(), strings.Fields(in)), " "); got != want {
			t.Errorf("longFlags(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestMapAndUnmapJSON(t *testing.T) {
	sock, _ := serve(t, 200, api.MapResponse{Device: "/dev/rbd7", Link: "/dev/rbd-owner/f/rbd/img", AlreadyMapped: true})
	code, out, errs := cli("--socket", sock, "map", "--json", "rbd/img")
	if code != exitOK || errs != "" || !strings.Contains(out, `"device": "/dev/rbd7"`) || !strings.Contains(out, `"already_mapped": true`) {
		t.Fatalf("map --json: exit %d stdout %q stderr %q", code, out, errs)
	}
	sock, _ = serve(t, 200, api.UnmapResponse{Unmapped: false})
	code, out, errs = cli("--socket", sock, "unmap", "rbd/img")
	if code != exitOK || errs != "" || out != "rbd/img was not mapped\n" {
		t.Fatalf("unmap: exit %d stdout %q stderr %q", code, out, errs)
	}
}

// TestCompletion: the scripts for bash, zsh and fish; the images mapped on this node (the
// agent's status) for the commands that name one, the clusters for --cluster, and nothing,
// quietly, when no agent answers.
func TestCompletion(t *testing.T) {
	for shell, want := range map[string]string{"bash": "# bash completion V2 for rbd-owner", "zsh": "#compdef rbd-owner", "fish": "complete -c rbd-owner"} {
		if code, out, errs := cli("completion", shell); code != exitOK || errs != "" || !strings.Contains(out, want) {
			t.Errorf("completion %s: exit %d stderr %q, want %q in:\n%.300s", shell, code, errs, want, out)
		}
	}
	st := statusWith([]api.Device{
		{Device: "/dev/rbd0", Cluster: "c1", Pool: "rbd", Image: "img1", Managed: true},
		{Device: "/dev/rbd1", Cluster: "c1", Pool: "rbd", Namespace: "ns", Image: "img2", Snapshot: "s1", Managed: true},
		{Device: "/dev/rbd2"}, // no image known
	})
	st.Clusters[0].FSID = "fsid-1"
	sock, _ := serve(t, 200, st)
	nowhere := filepath.Join(t.TempDir(), "none")
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--socket", sock, "__complete", "map", ""}, []string{"rbd/img1\tmapped at /dev/rbd0", "rbd/ns/img2@s1\tmapped at /dev/rbd1"}},
		{[]string{"__complete", "unmap", "--socket", sock, "rbd/n"}, []string{"rbd/ns/img2@s1\tmapped at /dev/rbd1"}},
		{[]string{"__complete", "unmap", "--socket", sock, "/dev/"}, []string{"/dev/rbd0\trbd/img1", "/dev/rbd1\trbd/ns/img2@s1"}},
		{[]string{"__complete", "fence", "--socket", sock, ""}, []string{"rbd/img1\tmapped at /dev/rbd0", "rbd/ns/img2\tmapped at /dev/rbd1"}},
		{[]string{"__complete", "release", "--socket", sock, "--force", ""}, []string{"rbd/img1\tmapped at /dev/rbd0", "rbd/ns/img2\tmapped at /dev/rbd1"}},
		{[]string{"__complete", "unfence", "--socket", sock, "--node", "n", ""}, nil},
		{[]string{"__complete", "map", "--socket", sock, "rbd/img1", ""}, nil},
		{[]string{"__complete", "map", "--socket", sock, "--cluster", ""}, []string{"c1\tfsid fsid-1"}},
		{[]string{"__complete", "map", "--access", ""}, []string{"rwo", "rox", "rwx"}},
		{[]string{"__complete", "map", "--socket", nowhere, ""}, nil},
		{[]string{"__complete", "fence", "--socket", nowhere, "--cluster", ""}, nil},
	} {
		code, out, _ := cli(tc.args...)
		want := strings.Join(append(tc.want, ":4"), "\n") + "\n" // 4: no file names
		if code != exitOK || out != want {
			t.Errorf("%q: exit %d stdout\n%s\nwant\n%s", tc.args, code, out, want)
		}
	}
	if _, out, _ := cli("__complete", ""); !strings.HasPrefix(out, "map\tClaim an image") || strings.Contains(out, "powershell") {
		t.Errorf("the commands do not complete:\n%s", out)
	}
	if _, out, _ := cli("__complete", "completion", ""); strings.Contains(out, "powershell") || !strings.Contains(out, "fish") {
		t.Errorf("completion's shells:\n%s", out)
	}
}

// release without --force asks the agent to drop this node's own claim (README: a claim left
// without a device); with --force, a dead owner's.
func TestReleaseOwnAndForced(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		force bool
	}{{[]string{"release", "rbd/a"}, false}, {[]string{"release", "--force", "rbd/a"}, true}} {
		sock, seen := serve(t, 200, api.ReleaseResponse{Released: true})
		code, out, errs := cli(append([]string{"--socket", sock}, tc.args...)...)
		if code != 0 || out != "released rbd/a\n" || errs != "" {
			t.Fatalf("%v: exit %d, stdout %q, stderr %q", tc.args, code, out, errs)
		}
		var req api.ImageRequest
		if err := json.Unmarshal([]byte(strings.SplitN((*seen)[0], " ", 3)[2]), &req); err != nil {
			t.Fatal(err)
		}
		if req.Pool != "rbd" || req.Image != "a" || req.Force != tc.force {
			t.Fatalf("%v: request %+v", tc.args, req)
		}
	}
}

// TestStatusSaysWhereEachMapOptionCameFrom: a mapping's kernel options are printed under the
// devices, each with its source.
func TestStatusSaysWhereEachMapOptionCameFrom(t *testing.T) {
	d := api.Device{Device: "/dev/rbd0", Cluster: "c1", Pool: "rbd", Image: "img1", Managed: true, Epoch: 3,
		Options: []api.MapOption{{Option: "ms_mode=secure", From: "cluster rbd_default_map_options (config)"}, {Option: "queue_depth=128", From: "caller"}}}
	sock, _ := serve(t, 200, statusWith([]api.Device{d}))
	code, out, _ := cli("--socket", sock, "status")
	want := "/dev/rbd0 options: ms_mode=secure (cluster rbd_default_map_options (config)), queue_depth=128 (caller)\n"
	if code != exitOK || !strings.Contains(out, want) {
		t.Errorf("exit %d, want %d and the line %q in:\n%s", code, exitOK, want, out)
	}
}

// TestNoAgentIsOneLineNamingTheSocketAndTheNextStep (issue 52): with no agent, every command says
// in one line which socket nothing answers on, what was found there and what to run, never Go's
// dial text: a missing socket (start the units), a socket nothing listens on (restart them).
func TestNoAgentIsOneLineNamingTheSocketAndTheNextStep(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none.sock")
	dead := filepath.Join(t.TempDir(), "dead.sock")
	l, err := net.Listen("unix", dead)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	_ = l.Close()
	for _, tc := range []struct {
		sock string
		want []string
	}{
		{missing, []string{"no rbd-owner agent answers on " + missing + ": the socket does not exist: start the agent with `systemctl start rbd-owner.socket rbd-owner`", "systemctl status rbd-owner"}},
		{dead, []string{"no rbd-owner agent answers on " + dead + ": nothing listens on the socket (connection refused): see why with `systemctl status rbd-owner rbd-owner.socket`", "`systemctl restart rbd-owner.socket rbd-owner`"}},
	} {
		for _, cmd := range jsonCommands {
			code, out, errs := cli(append([]string{"--socket", tc.sock}, cmd...)...)
			if code != exitUnreachable || out != "" || !strings.HasPrefix(errs, "rbd-owner "+cmd[0]+": ") || strings.Count(errs, "\n") != 1 {
				t.Errorf("%q on %s: exit %d stdout %q stderr %q, want exit 4 and one stderr line", cmd, tc.sock, code, out, errs)
			}
			for _, w := range tc.want {
				if !strings.Contains(errs, w) {
					t.Errorf("%q on %s: %q does not say %q", cmd, tc.sock, errs, w)
				}
			}
			for _, dial := range []string{"dial unix", "connect:", "no such file"} {
				if strings.Contains(errs, dial) {
					t.Errorf("%q on %s: %q has Go's dial text %q", cmd, tc.sock, errs, dial)
				}
			}
		}
	}
}

// TestNoPermissionOnTheSocketIsNotNoAgent (issue 52): EACCES on the socket (client.ErrNoAccess)
// says the caller lacks permission and what to do, exits 1 (not 4: an agent may be running)
// with code permission_denied, like the agent's own refusal of a caller's role. (Root may
// connect to any socket, so the client's error is classified here as the client returns it.)
func TestNoPermissionOnTheSocketIsNotNoAgent(t *testing.T) {
	err := fmt.Errorf("%w /run/rbd-owner/rbd-owner.sock", client.ErrNoAccess)
	code, obj, msg := classify(err)
	if code != exitFailed || obj.Code != api.CodePermissionDenied || obj.Message != msg {
		t.Fatalf("classify(%v) = %d %+v %q, want exit 1, permission_denied", err, code, obj, msg)
	}
	for _, want := range []string{"/run/rbd-owner/rbd-owner.sock", "run the command as root, or as a member of the socket's group"} {
		if !strings.Contains(msg, want) {
			t.Errorf("%q does not say %q", msg, want)
		}
	}
	if strings.Contains(msg, "agent running") {
		t.Errorf("%q asks whether the agent runs", msg)
	}
}

// cutOffSocket serves a socket that reads each request and closes the connection unanswered (an
// agent that restarted during the call).
func cutOffSocket(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "s")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = http.ReadRequest(bufio.NewReader(conn))
			_ = conn.Close()
		}
	}()
	return sock
}

// TestMapCutOffByARestartSaysSo (issue 52): a map whose connection closed after it was sent
// exits 1 with code interrupted and one line saying that the agent went away during the map,
// that its recovery may have finished or undone it, and that it can be repeated; not Go's EOF.
func TestMapCutOffByARestartSaysSo(t *testing.T) {
	sock := cutOffSocket(t)
	code, out, errs := cli("--socket", sock, "map", "rbd/img")
	if code != exitFailed || out != "" || strings.Count(errs, "\n") != 1 || strings.Contains(errs, "EOF") {
		t.Fatalf("exit %d stdout %q stderr %q, want exit 1 and one line without Go's EOF", code, out, errs)
	}
	for _, want := range []string{"rbd-owner map: the rbd-owner agent went away during POST /v1/map", "its recovery may have finished the map or undone it: repeat the map"} {
		if !strings.Contains(errs, want) {
			t.Errorf("%q does not say %q", errs, want)
		}
	}
	code, out, _ = cli("--socket", sock, "map", "rbd/img", "--json")
	if e := oneErrorObject(t, "map cut off", out); code != exitFailed || e.Code != client.CodeInterrupted || !strings.Contains(e.Message, "repeat the map") {
		t.Errorf("--json: exit %d error %+v, want exit 1, code interrupted", code, e)
	}
}

// TestStateUnwritableExitsFailedNamingItsCode (issue 52): the agent's state_unwritable refusal
// (a full disk) exits 1 with its line and its code, under --json its error object.
func TestStateUnwritableExitsFailedNamingItsCode(t *testing.T) {
	msg := "cannot write the state file /var/lib/rbd-owner/mappings.json: no space left on device; free space in /var/lib/rbd-owner, then retry"
	sock, _ := serve(t, 507, api.ErrorBody{Error: &api.Error{Code: "state_unwritable", Message: msg}})
	if code, _, errs := cli("--socket", sock, "map", "rbd/img"); code != exitFailed || errs != "rbd-owner map: "+msg+" (state_unwritable)\n" {
		t.Errorf("exit %d stderr %q, want exit 1 and the agent's line with its code", code, errs)
	}
	code, out, _ := cli("--socket", sock, "map", "rbd/img", "--json")
	if e := oneErrorObject(t, "state_unwritable", out); code != exitFailed || e.Code != "state_unwritable" || e.Message != msg {
		t.Errorf("--json: exit %d error %+v", code, e)
	}
}

// TestClaimedElsewhereRendersTheStepsNotTheAdvice: an agent's refusal carries its next steps as
// a list and the same steps as one phrase (advice, for the message); the CLI renders the list.
func TestClaimedElsewhereRendersTheStepsNotTheAdvice(t *testing.T) {
	sock, _ := serve(t, 409, api.ErrorBody{Error: &api.Error{Code: api.CodeClaimedElsewhere, Message: "acquire rbd/img: …",
		Image: "rbd/img", Owner: &api.Owner{NodeID: "node-a", Hostname: "host-a", Epoch: 4, AcquiredAt: time.Now(), LeaseAge: 3},
		Reason:    "node node-a's mapping (10.0.0.1:0/7) is on no blocklist entry for its whole node (ip:0/0 or a range)",
		NextSteps: []api.Step{{Run: "rbd-owner fence --node node-a", Why: "if node node-a is dead, by an admin on any node"}},
		Advice:    "a phrase of the same steps"}})
	code, _, errs := cli("--socket", sock, "map", "rbd/img")
	want := "(live); node node-a's mapping (10.0.0.1:0/7) is on no blocklist entry for its whole node (ip:0/0 or a range); run `rbd-owner fence --node node-a` (if node node-a is dead, by an admin on any node)\n"
	if code != exitClaimed || !strings.HasSuffix(errs, want) || strings.Contains(errs, "a phrase") {
		t.Fatalf("exit %d, stderr %q, want it to end with %q", code, errs, want)
	}
}

// TestStatusFindsADevicesProblemByItsData: a device's problem is found in the agent's list by the
// line its data makes (api.Device.ProblemLine), not by text search: the same problem of another
// image whose name starts with this one's is another line.
func TestStatusFindsADevicesProblemByItsData(t *testing.T) {
	renew := "lease not renewed: cluster c1 did not answer within 5s"
	dev := api.Device{Device: "/dev/rbd0", Cluster: "c1", Pool: "rbd", Image: "img1", Managed: true, Epoch: 3, Problem: renew}
	sock, _ := serve(t, 200, statusWith([]api.Device{dev}, "c1:rbd/img12: "+renew))
	code, out, _ := cli("--socket", sock, "status")
	if code != exitProblems || !strings.Contains(out, "\nproblem: c1:rbd/img1: "+renew+"\n") || !strings.Contains(out, "\nproblem: c1:rbd/img12: "+renew+"\n") ||
		!strings.Contains(out, ", 2 problems\n") {
		t.Fatalf("exit %d, stdout:\n%s", code, out)
	}
}
