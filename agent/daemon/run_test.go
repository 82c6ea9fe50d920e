package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ceph/go-ceph/rbd"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/client"
	"github.com/rbd-owner/rbd-owner/agent/internal/cephtest"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
	"github.com/rbd-owner/rbd-owner/agent/server"
)

func TestDeviceRemovedBehindTheAgentsBackReleasesTheClaim(t *testing.T) {
	a := newNode(t, "node-a")
	a.run()
	img := a.image("")
	resp, err := a.d.Map(bg, mapReq("", img), nil)
	if err != nil {
		t.Fatal(err)
	}
	dev, err := a.d.kernel.FindByPath(resp.Device)
	if err != nil {
		t.Fatal(err)
	}
	// someone runs `rbd unmap`: a write to remove_single_major that is not the agent's
	if err := a.kernel.WriteControl(a.kernel.Sysfs+"/bus/rbd/remove_single_major", []byte(fmt.Sprint(dev.ID))); err != nil {
		t.Fatal(err)
	}
	// the remove event (or, should its handling be skipped, the next reconciliation) releases
	// the claim; no bound on how soon is asserted
	a.eventually("device_lost", func() bool { return len(a.audited(audit.DeviceLost)) == 1 })
	cs := claimStore(t)
	a.eventually("claim released", func() bool {
		rec, err := cs.Inspect(bg, claim.Image{Pool: cephtest.Pool, Image: img})
		return err == nil && rec.Free()
	})
	if e := a.audited(audit.DeviceLost)[0]; !e.Error || e.Device != resp.Device {
		t.Fatalf("device_lost entry: %+v", e)
	}
	// (the claim is released before the mapping is dropped from the state: wait for both)
	a.eventually("the lost mapping dropped from the state", func() bool { return len(a.d.state.All()) == 0 })
}

func TestDeviceMappedBehindTheAgentsBackIsReported(t *testing.T) {
	a := newNode(t, "node-a")
	a.manualTicks("reconcile") // reconciliation runs only when the test says so
	a.run()
	img := a.image("")
	// someone runs `rbd map` on this node: a kernel map the agent did not make
	other := krbd.New(a.kernel.Config())
	dev, err := other.Map(bg, krbd.Spec{Pool: cephtest.Pool, Image: img}, krbd.MapOptions{
		Monitors: []string{cephtest.MonitorV1(t)}, User: cephtest.Options(t).User, Secret: cephtest.Secret(t)})
	if err != nil {
		t.Fatal(err)
	}
	a.eventually("unmanaged_device", func() bool { return len(a.audited(audit.UnmanagedDevice)) == 1 })
	st := a.d.Status()
	found := false
	for _, d := range st.Devices {
		if d.Device == dev.DevNode && !d.Managed {
			found = true
		}
	}
	if !found || len(st.Problems) == 0 {
		t.Fatalf("status does not show the unmanaged device: %+v", st)
	}
	// and the agent refuses to map it on top
	if _, err := a.d.Map(bg, mapReq("", img), nil); server.APIError(err).Code != api.CodeBusy {
		t.Fatalf("map over an unmanaged mapping: %v", err)
	}
	// the agent's own maps are never reported as unmanaged: not by a reconciliation...
	img2 := a.image("")
	if _, err := a.d.Map(bg, mapReq("", img2), nil); err != nil {
		t.Fatal(err)
	}
	a.reconcileRound()
	if n := len(a.audited(audit.UnmanagedDevice)); n != 1 {
		t.Fatalf("%d unmanaged_device entries after a reconciliation, want 1", n)
	}
	// ...nor when its add event is handled. Events are handled in order: once a device
	// mapped after img2 is reported, img2's event has been handled too, and stopping waits
	// for what that started.
	img3 := a.image("")
	if _, err := other.Map(bg, krbd.Spec{Pool: cephtest.Pool, Image: img3}, krbd.MapOptions{
		Monitors: []string{cephtest.MonitorV1(t)}, User: cephtest.Options(t).User, Secret: cephtest.Secret(t)}); err != nil {
		t.Fatal(err)
	}
	a.eventually("unmanaged_device for the second outside map", func() bool { return len(a.audited(audit.UnmanagedDevice)) == 2 })
	a.stop()
	for _, e := range a.audited(audit.UnmanagedDevice) {
		if e.Image == img2 {
			t.Fatalf("the agent's own mapping was reported unmanaged: %+v", e)
		}
	}
	if n := len(a.audited(audit.UnmanagedDevice)); n != 2 {
		t.Fatalf("%d unmanaged_device entries, want 2", n)
	}
}

func TestLostClaimIsReportedAndDeviceKept(t *testing.T) {
	a := newNode(t, "node-a")
	a.run()
	img := a.image("")
	resp, err := a.d.Map(bg, mapReq("", img), nil)
	if err != nil {
		t.Fatal(err)
	}
	// an admin fences node-a and force-releases its claim (node-b will take the image)
	admin := claimStore(t)
	ci := claim.Image{Pool: cephtest.Pool, Image: img}
	if _, err := admin.Fence(bg, ci); err != nil {
		t.Fatal(err)
	}
	a.eventually("renew failure reported", func() bool {
		for _, e := range a.audited(audit.Renew) {
			if e.Error && e.Result == audit.Failed {
				return true
			}
		}
		return false
	})
	// (the failure is audited a moment before the claim is marked lost: wait for status)
	lostShown := func(st api.Status) bool {
		return len(st.Problems) > 0 && len(st.Devices) == 1 && st.Devices[0].Problem != "" && st.ClaimsHeld == 0
	}
	a.eventually("status showing the lost claim", func() bool { return lostShown(a.d.Status()) })
	if _, err := a.d.kernel.FindByPath(resp.Device); err != nil {
		t.Fatalf("the agent unmapped a device in use: %v", err)
	}
	if _, err := a.d.Map(bg, mapReq("", img), nil); server.APIError(err).Code != api.CodeFenced {
		t.Fatalf("map of a fenced mapping: want fenced, got %v", err)
	}
	// the kept device stays fenced beyond the fence that took it: node-a re-blocklists it
	a.eventually("self-fence", func() bool { return len(a.audited(audit.Fence)) == 1 })
	out, _, err := cephtest.AdminConn(t).MonCommand([]byte(`{"prefix":"osd blocklist ls","format":"json"}`))
	if err != nil || !strings.Contains(string(out), resp.Claim.Holders[0].ClientAddr) {
		t.Fatalf("blocklist lacks %s: %v", resp.Claim.Holders[0].ClientAddr, err)
	}
	// more renewal rounds: at most one self-fence per quarter expiry. A second, healthy claim
	// counts the rounds: its renewals are one per round, and a round starts only when the one
	// before is over, so three more of them mean that a whole round ran after this point.
	img2 := a.image("")
	if _, err := a.d.Map(bg, mapReq("", img2), nil); err != nil {
		t.Fatal(err)
	}
	r0 := a.d.renewed.Load()
	a.eventually("three more renewals of the healthy claim", func() bool { return a.d.renewed.Load() >= r0+3 })
	if n := len(a.audited(audit.Fence)); n != 1 {
		t.Fatalf("%d self-fences, want 1", n)
	}
}

func TestNotifyReadyStatusAndWatchdog(t *testing.T) {
	a := newNode(t, "node-a")
	// the loops beat every Watchdog/8 and a ping needs every beat within Watchdog/2: 2 s
	// leaves a busy machine room
	a.d.opts.Watchdog = 2 * time.Second
	a.run()
	img := a.image("")
	if _, err := a.d.Map(bg, mapReq("", img), nil); err != nil {
		t.Fatal(err)
	}
	a.eventually("watchdog ping", func() bool { return a.noted("WATCHDOG=1") })
	a.eventually("status line", func() bool { return a.noted("STATUS=1 devices, 1 claims, 0 problems") })
	a.stop()
	if !a.noted("STOPPING=1") {
		t.Fatal("no STOPPING=1")
	}
	// stopping leaves the mapping and the claim in place
	if !a.consistent("", img) {
		t.Fatal("stopping the agent unmapped the device")
	}
}

// --- the API over the unix socket ---

func rawCall(t *testing.T, sock, method, path, body string) (int, api.ErrorBody) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	req, _ := http.NewRequest(method, "http://x"+path, strings.NewReader(body))
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var eb api.ErrorBody
	_ = json.Unmarshal(data, &eb)
	return resp.StatusCode, eb
}

func TestAPIErrorsLimitsAndIdempotency(t *testing.T) {
	a, b := newNode(t, "node-a"), newNode(t, "node-b")
	a.run()
	b.run()
	img := a.image("", b)
	ca, cb := client.New(a.cfg.Socket), client.New(b.cfg.Socket)
	r1, err := ca.Map(bg, mapReq("", img))
	if err != nil {
		t.Fatal(err)
	}
	r2, err := ca.Map(bg, mapReq("", img))
	if err != nil || !r2.AlreadyMapped || r2.Device != r1.Device {
		t.Fatalf("idempotent map over the API: %+v %v", r2, err)
	}
	_, err = cb.Map(bg, mapReq("", img))
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeClaimedElsewhere || ae.Owner == nil || ae.Owner.NodeID != "node-a" || ae.Owner.Epoch != r1.Claim.Epoch {
		t.Fatalf("claimed_elsewhere over the API: %#v", err)
	}
	for _, tc := range []struct {
		method, path, body string
		status             int
		code               string
	}{
		{"POST", api.PathMap, `{"pool":"rbd","image":"a,b"}`, 400, api.CodeInvalidArgument},
		{"POST", api.PathMap, `{"pool":"rbd","image":"x","colour":"red"}`, 400, api.CodeInvalidArgument},
		{"POST", api.PathMap, `{"pool":"rbd","image":"x"} {}`, 400, api.CodeInvalidArgument},
		{"POST", api.PathMap, `{"pool":"rbd","image":"` + strings.Repeat("x", api.MaxBodyBytes) + `"}`, 400, api.CodeInvalidArgument},
		{"POST", api.PathMap, `not json`, 400, api.CodeInvalidArgument},
		{"POST", api.PathMap, `{"pool":"rbd","image":"no-such-image"}`, 404, api.CodeNotFound},
		{"POST", api.PathMap, `{"cluster":"nope","pool":"rbd","image":"x"}`, 400, api.CodeInvalidArgument},
		{"POST", api.PathUnmap, `{}`, 400, api.CodeInvalidArgument},
		{"POST", api.PathUnmap, `{"device":"/dev/nothing-here"}`, 404, api.CodeNotFound},
		{"POST", api.PathRelease, `{"pool":"rbd","image":"` + img + `","force":true}`, 400, api.CodeInvalidArgument},
		{"GET", api.PathMap, ``, 405, ""},
	} {
		status, eb := rawCall(t, b.cfg.Socket, tc.method, tc.path, tc.body)
		if status != tc.status || (tc.code != "" && (eb.Error == nil || eb.Error.Code != tc.code)) {
			t.Errorf("%s %s %.60q: %d %+v, want %d %s", tc.method, tc.path, tc.body, status, eb.Error, tc.status, tc.code)
		}
	}
	// unmap by device path, then unmap again: idempotent
	if u, err := ca.Unmap(bg, api.UnmapRequest{Device: r1.Device}); err != nil || !u.Unmapped {
		t.Fatalf("unmap by device: %+v %v", u, err)
	}
	if u, err := ca.Unmap(bg, unmapReq("", img)); err != nil || u.Unmapped {
		t.Fatalf("second unmap: %+v %v", u, err)
	}
	st, err := ca.Status(bg)
	if err != nil || st.Node != "node-a" || len(st.Clusters) != 1 || !st.Clusters[0].Connected {
		t.Fatalf("status: %+v %v", st, err)
	}
	cl, err := cb.Claims(bg, "", cephtest.Pool)
	if err != nil {
		t.Fatal(err)
	}
	seen := false
	for _, c := range cl {
		if c.Image == img {
			seen = c.Epoch == r1.Claim.Epoch && len(c.Holders) == 0
		}
	}
	if !seen {
		t.Fatalf("claims listing lacks the released claim of %s", img)
	}
	// the image is deleted: its claim is an orphan, and removing orphans removes it. In a pool
	// of the test's own: removing orphans acts on a whole pool, and the shared pool holds the
	// claims of other tests (other packages' too, running at the same time), some of them
	// orphans for a moment by design, which this must not remove under them.
	pool := cephtest.TempPool(t)
	admin := cephtest.AdminConn(t)
	img = cephtest.ImageIn(t, admin, pool, "")
	a.kernel.AddPool(pool)
	a.kernel.AddImage(pool, "", img, 16<<20)
	if _, err := ca.Map(bg, api.MapRequest{Pool: pool, Image: img, Requester: "test"}); err != nil {
		t.Fatal(err)
	}
	if u, err := ca.Unmap(bg, api.UnmapRequest{Pool: pool, Image: img}); err != nil || !u.Unmapped {
		t.Fatalf("unmap in the test's pool: %+v %v", u, err)
	}
	io, err := admin.OpenIOContext(pool)
	if err != nil {
		t.Fatal(err)
	}
	defer io.Destroy()
	if err := rbd.RemoveImage(io, img); err != nil {
		t.Fatal(err)
	}
	cl, _ = cb.Claims(bg, "", pool)
	for _, c := range cl {
		if c.Image == img && !c.Orphan {
			t.Fatalf("claim of a deleted image not flagged orphan: %+v", c)
		}
	}
	or, err := cb.RemoveOrphans(bg, api.OrphansRequest{Pool: pool})
	if err != nil || !slices.Contains(or.Removed, pool+"/"+img) {
		t.Fatalf("remove orphans: %+v %v", or, err)
	}
	if _, err := claimStore(t).Inspect(bg, claim.Image{Pool: pool, Image: img}); !errors.Is(err, claim.ErrNoClaim) {
		t.Fatalf("orphan still there: %v", err)
	}
}

func TestAPIFenceAndForceRelease(t *testing.T) {
	a, b := newNode(t, "node-a"), newNode(t, "node-b")
	a.run()
	b.run()
	img := a.image("", b)
	ca, cb := client.New(a.cfg.Socket), client.New(b.cfg.Socket)
	r1, err := ca.Map(bg, mapReq("", img))
	if err != nil {
		t.Fatal(err)
	}
	// an admin on node-b fences node-a's mapping (the fake kernel's address is no real client)
	f, err := cb.Fence(bg, api.ImageRequest{Pool: cephtest.Pool, Image: img})
	if err != nil || f.FencedAddr != r1.Claim.Holders[0].ClientAddr || f.Expires.Before(time.Now().Add(50*time.Minute)) {
		t.Fatalf("fence: %+v %v (holder %+v)", f, err, r1.Claim.Holders[0])
	}
	if rel, err := cb.Release(bg, api.ImageRequest{Pool: cephtest.Pool, Image: img, Force: true}); err != nil || !rel.Released {
		t.Fatalf("release --force: %+v %v", rel, err)
	}
	r2, err := cb.Map(bg, mapReq("", img))
	if err != nil || r2.Claim.Epoch != r1.Claim.Epoch+1 {
		t.Fatalf("map after fence+release: %+v %v", r2, err)
	}
	if len(b.audited(audit.Fence)) != 1 || len(b.audited(audit.Release)) == 0 {
		t.Fatal("fence/release not audited")
	}
}

// A caller that is neither root nor in the agent's group gets 403 and a `denied` entry.
func TestAPIRefusesPeersOutsideTheGroup(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to run a client as another user")
	}
	if os.Getenv("RBD_OWNER_TEST_CLIENT_SOCKET") != "" {
		t.Skip("this is the child")
	}
	// the child needs to reach the socket and execute a copy of the test binary (the build
	// dir and t.TempDir are root-only)
	cdir, err := os.MkdirTemp("", "rbd-owner-child")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(cdir); err != nil {
			t.Log(err)
		}
	})
	_ = os.Chmod(cdir, 0o755)
	a := newNode(t, "node-a")
	a.d.peers = peercred.Policy{AdminGroup: 4243, CSIGroup: 4242} // groups the child is not in
	a.cfg.Socket = cdir + "/s.sock"
	a.run()
	if err := os.Chmod(a.cfg.Socket, 0o666); err != nil { // let the child connect at all
		t.Fatal(err)
	}
	bin := cdir + "/daemon.test"
	data, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^TestAPIClientChild$", "-test.v")
	cmd.Dir = "/"
	cmd.Env = append(os.Environ(), "RBD_OWNER_TEST_CLIENT_SOCKET="+a.cfg.Socket)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("child: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "status 403 permission_denied") {
		t.Fatalf("child did not see 403:\n%s", out.String())
	}
	d := a.audited(audit.Denied)
	if len(d) != 1 || d[0].UID != 65534 || !d[0].HasPeer {
		t.Fatalf("denied audit: %+v", d)
	}
	// root is let in by the same policy
	if _, err := client.New(a.cfg.Socket).Status(bg); err != nil {
		t.Fatalf("root refused: %v", err)
	}
}

// TestAPIClientChild runs as uid 65534 in a child process of the test above.
func TestAPIClientChild(t *testing.T) {
	sock := os.Getenv("RBD_OWNER_TEST_CLIENT_SOCKET")
	if sock == "" {
		t.Skip("only runs as the child of TestAPIRefusesPeersOutsideTheGroup")
	}
	_, err := client.New(sock).Map(bg, api.MapRequest{Pool: "rbd", Image: "x"})
	var ae *api.Error
	if errors.As(err, &ae) {
		fmt.Printf("status %d %s\n", api.HTTPStatus(ae.Code), ae.Code)
		return
	}
	t.Fatalf("want an API error, got %v", err)
}

func TestClusterUnavailableIs503(t *testing.T) {
	a := newNode(t, "node-a")
	a.cfg.Clusters[0].Monitors = []string{"127.0.0.1:9"}
	a.start()
	_, err := a.d.Map(bg, mapReq("", "x"), nil)
	if e := server.APIError(err); e.Code != api.CodeClusterUnavailable {
		t.Fatalf("want cluster_unavailable, got %+v", e)
	}
}

// `rbd-owner unmap /dev/rbdN` of a second mapping made behind the agent's back unmaps that
// device alone: the claim protects the recorded device, which stays mapped.
func TestUnmapByPathOfASecondMappingKeepsTheClaim(t *testing.T) {
	a := newNode(t, "node-a")
	img := a.image("")
	resp, err := a.d.Map(bg, mapReq("", img), nil)
	if err != nil {
		t.Fatal(err)
	}
	other, err := krbd.New(a.kernel.Config()).Map(bg, krbd.Spec{Pool: cephtest.Pool, Image: img}, krbd.MapOptions{
		Monitors: []string{cephtest.MonitorV1(t)}, User: cephtest.Options(t).User, Secret: cephtest.Secret(t)})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := a.d.Unmap(bg, api.UnmapRequest{Device: other.DevNode}, nil); !ok || err != nil {
		t.Fatalf("unmap %s: %v %v", other.DevNode, ok, err)
	}
	if !a.consistent("", img) {
		t.Fatal("the recorded device went away")
	}
	if again, err := a.d.Map(bg, mapReq("", img), nil); err != nil || !again.AlreadyMapped || again.Device != resp.Device {
		t.Fatalf("the agent's own mapping: %+v %v", again, err)
	}
}

// A map interrupted after the kernel write (state "claimed", device not recorded), then an
// unmap before any reconciliation: the device is found by its names, unmapped, and the claim
// released.
func TestUnmapOfAnInterruptedMap(t *testing.T) {
	a := newNode(t, "node-a")
	img := a.image("")
	a.mapCrashingAtRecord(img)
	a.fault = nil
	a.start() // restarted, but asked to unmap before it reconciles
	if ok, err := a.d.Unmap(bg, unmapReq("", img), nil); !ok || err != nil {
		t.Fatalf("unmap: %v %v", ok, err)
	}
	if a.consistent("", img) {
		t.Fatal("still mapped")
	}
	rec, err := claimStore(t).Inspect(bg, claim.Image{Pool: cephtest.Pool, Image: img})
	if err != nil || !rec.Free() {
		t.Fatalf("claim not released: %+v %v", rec, err)
	}
}

// A map interrupted after the kernel write (phase "claimed", device not recorded), then an unmap
// of it interrupted before the kernel unmap, then a restart: the recovery must remove the
// device and then free the claim, never free the claim of a device it lost track of. (The
// model checker's F1, docs/safety.md: the unmap persisted "unmapping" without the device it had
// found by names, and the recovery, finding no device by id, released the claim of a live
// mapping.)
func TestUnmapOfAnInterruptedMapInterruptedAgain(t *testing.T) {
	a := newNode(t, "node-a")
	img := a.image("")
	a.mapCrashingAtRecord(img)
	a.fault = func(saga, step string) error {
		if saga == "unmap" && step == "unmap" {
			return ErrCrash
		}
		return nil
	}
	a.start() // restarted, asked to unmap before it reconciles, and killed again mid-unmap
	if _, err := a.d.Unmap(bg, unmapReq("", img), nil); !errors.Is(err, ErrCrash) {
		t.Fatalf("unmap: %v", err)
	}
	a.fault = nil
	a.start()
	a.run() // recovery settles the interrupted unmap before READY
	devs, err := a.d.kernel.FindBySpec(krbd.Spec{Pool: cephtest.Pool, Image: img}, "")
	if err != nil {
		t.Fatal(err)
	}
	rec, err := claimStore(t).Inspect(bg, claim.Image{Pool: cephtest.Pool, Image: img})
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) > 0 && rec.Free() {
		t.Fatalf("%s is still mapped but its claim was released: a live mapping without a claim", devs[0].DevNode)
	}
	if len(devs) != 0 || !rec.Free() {
		t.Fatalf("the interrupted unmap was not finished: devices %v, claim %+v", devs, rec.Holders)
	}
}

// mapCrashingAtRecord maps img and kills the saga after the kernel write, before the mapping is
// recorded in the claim: state "claimed", the device there but not recorded.
func (n *node) mapCrashingAtRecord(img string) {
	n.t.Helper()
	n.fault = func(saga, step string) error {
		if saga == "map" && step == "record" {
			return ErrCrash
		}
		return nil
	}
	if _, err := n.d.Map(bg, mapReq("", img), nil); !errors.Is(err, ErrCrash) {
		n.t.Fatal(err)
	}
}
