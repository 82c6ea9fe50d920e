package main

import (
	"bytes"
	"encoding/json"
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
