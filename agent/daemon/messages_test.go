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
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
	"github.com/rbd-owner/rbd-owner/agent/server"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// mapOverAPI maps through the daemon's HTTP handler as a caller of role on socket, and
// returns the status and the error body a client reads.
func mapOverAPI(t *testing.T, d *Daemon, role peercred.Role, socket string, req api.MapRequest) (int, *api.Error) {
	t.Helper()
	body, _ := json.Marshal(req)
	r := httptest.NewRequest(http.MethodPost, "http://rbd-owner"+api.PathMap, bytes.NewReader(body))
	r = r.WithContext(server.WithCaller(r.Context(), server.Caller{Cred: peercred.Cred{UID: 1000, GID: 1000, PID: 4242}, Known: true, Role: role, Socket: socket}))
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
	c.M.AddImage(claim.Image{Pool: "rbd", Image: "other"}, "id-other") // the pool exists
	n, _, audited := nodeB(t, c, "manual")
	defer n.stop()
	code, e := mapOverAPI(t, n.d, peercred.RoleCSI, server.SocketCSI, api.MapRequest{Cluster: "c1", Pool: "rbd", Image: "nosuch", Requester: "test"})
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

// TestUnmapOfALostClaimSaysWhatHappened: unmapping a device whose claim an admin fenced and
// force-released, or another node took over, says so and that nothing was released: never
// "claim released".
func TestUnmapOfALostClaimSaysWhatHappened(t *testing.T) {
	for _, how := range []string{"force-released", "taken over"} {
		t.Run(how, func(t *testing.T) {
			c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000042")
			n, _, audited := nodeB(t, c, "manual")
			defer n.stop()
			admin, err := claim.NewStoreOn(c.M, claim.Config{Node: claim.Node{ID: "node-a", Addr: func() string { return "10.0.0.1" }},
				Lease: 30 * time.Second, FenceExpiry: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			img := claim.Image{Pool: "rbd", Image: "lost"}
			c.M.AddImage(img, "id-lost")
			n.kernel.AddImage("rbd", "", "lost", 16<<20)
			resp, err := n.d.Map(context.Background(), api.MapRequest{Cluster: "c1", Pool: "rbd", Image: "lost"}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := admin.Fence(context.Background(), img); err != nil {
				t.Fatal(err)
			}
			// the fence as the record keeps it (a takeover blocklists again, and records when)
			fence := func() (addr, at string) {
				rec, err := admin.Inspect(context.Background(), img)
				if err != nil || len(rec.Fences) != 1 {
					t.Fatalf("record after the fence: %+v %v", rec, err)
				}
				return rec.Fences[0].Addr, rec.Fences[0].At.UTC().Format(time.RFC3339)
			}
			var want string
			switch how {
			case "force-released":
				if _, err := admin.ForceRelease(context.Background(), img); err != nil {
					t.Fatal(err)
				}
				addr, at := fence()
				want = fmt.Sprintf("unmapped rbd/lost (%s); its claim was already lost: an admin force-released it (rbd-owner release --force) after node node-a fenced this node's mapping %s at %s; nothing to release", resp.Device, addr, at)
			default:
				r, err := admin.Acquire(context.Background(), claim.Request{Image: img, TakeFenced: true})
				if err != nil {
					t.Fatal(err)
				}
				addr, at := fence()
				want = fmt.Sprintf("unmapped rbd/lost (%s); its claim was already lost: node node-a fenced this node's mapping %s at %s and node node-a holds it now (epoch %d); nothing to release", resp.Device, addr, at, r.Holder.Epoch)
			}
			if _, err := n.d.Unmap(context.Background(), api.UnmapRequest{Cluster: "c1", Pool: "rbd", Image: "lost"}, nil); err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range audited() {
				if e.Event == audit.Unmap {
					got = append(got, e.Message)
				}
				if e.Event == audit.Release {
					t.Errorf("a release was audited though nothing was released: %+v", e)
				}
			}
			if len(got) != 1 || got[0] != want {
				t.Fatalf("unmap audited as %q, want %q", got, want)
			}
		})
	}
}

// TestLostMappingShowsTheMonitorsFenceExpiry: a node whose claim was taken over keeps its own
// mapping blocklisted, and its audit entry and status problem say until when as the monitors
// recorded it, on their clock, not this node's (here years apart).
func TestLostMappingShowsTheMonitorsFenceExpiry(t *testing.T) {
	c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000043")
	monitors := time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)
	c.M.SetClock(func() time.Time { return monitors })
	n, _, audited := nodeB(t, c, "manual")
	defer n.stop()
	other, err := claim.NewStoreOn(c.M, claim.Config{Node: claim.Node{ID: "node-a", Addr: func() string { return "10.0.0.1" }},
		Lease: 30 * time.Second, FenceExpiry: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	img := claim.Image{Pool: "rbd", Image: "kept"}
	c.M.AddImage(img, "id-kept")
	n.kernel.AddImage("rbd", "", "kept", 16<<20)
	resp, err := n.d.Map(context.Background(), api.MapRequest{Cluster: "c1", Pool: "rbd", Image: "kept"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Fence(context.Background(), img); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Acquire(context.Background(), claim.Request{Image: img, TakeFenced: true}); err != nil {
		t.Fatal(err)
	}
	var addr string
	for _, m := range n.d.state.All() {
		addr = m.ClientAddr
	}
	// the fence expiry is an hour (testConfig) from the monitors' clock
	want := fmt.Sprintf("its client %s is kept blocklisted until 2031-01-02T04:04:05Z (the monitors' expiry); unmap %s", addr, resp.Device)
	var entry string
	waitFor(t, "node-b's own fence of its lost mapping", func() bool {
		for _, e := range audited() {
			if e.Event == audit.Fence && e.OwnerNode == "node-b" {
				entry = e.Message
				return true
			}
		}
		return false
	})
	if entry != resp.Device+" lost its claim and stays mapped: "+want {
		t.Fatalf("audit entry %q, want it to end %q", entry, want)
	}
	waitFor(t, "the status problem naming the monitors' expiry", func() bool {
		for _, p := range n.d.Status().Problems {
			if strings.Contains(p, "; "+want+" (since ") && strings.Contains(p, "is lost: ") {
				return true
			}
		}
		return false
	})
}

// lockedBuffer is a log output safe for the daemon's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}
func (l *lockedBuffer) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

// TestMapRefusedForAFullDiskIsAuditedCountedAndLogged: a map whose state cannot be written
// (no space left on the state file's disk) is refused with the next step (free space in the
// state directory), audited, counted and logged at error priority, at every state write of
// the saga; and nothing is left claimed or mapped.
func TestMapRefusedForAFullDiskIsAuditedCountedAndLogged(t *testing.T) {
	for _, step := range []string{"persist-intent", "persist"} {
		t.Run(step, func(t *testing.T) {
			c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000044")
			al := &auditLog{}
			logs := &lockedBuffer{}
			var stateDir string
			var st atomic.Pointer[state.Store]
			n := startMemDaemonWith(t, func(o *Options) {
				o.Log = logrus.New()
				o.Log.SetOutput(logs)
				o.Audit = audit.NewWithSink(quietLog(), al.Record)
				stateDir = o.Config.StateDir
				o.Fault = func(saga, s string) error {
					if saga == "map" && s == step { // from this step on, the disk is full
						st.Load().FailWrites(func() error { return syscall.ENOSPC })
					}
					return nil
				}
			}, c)
			st.Store(n.d.state)
			defer n.stop()
			img := claim.Image{Pool: "rbd", Image: "full"}
			c.M.AddImage(img, "id-full")
			n.kernel.AddImage("rbd", "", "full", 16<<20)
			code, e := mapOverAPI(t, n.d, peercred.RoleCSI, server.SocketCSI, api.MapRequest{Cluster: "c1", Pool: "rbd", Image: "full", Requester: "test"})
			want := fmt.Sprintf("cannot write the state file %s/mappings.json: no space left on device; free space in %s, then retry", stateDir, stateDir)
			if code != http.StatusInsufficientStorage || e == nil || e.Code != api.CodeStateUnwritable || e.Message != want {
				t.Fatalf("map on a full disk: %d %+v, want 507 state_unwritable %q", code, e, want)
			}
			var audited []string
			for _, en := range al.Entries() {
				if en.Image == "full" && en.Result != audit.OK {
					audited = append(audited, en.Message)
				}
			}
			verb := "map refused: "
			if step == "persist" { // the device was made, then undone
				verb = "map failed: "
			}
			if len(audited) != 1 || audited[0] != verb+want {
				t.Errorf("audited %q, want one entry %q", audited, verb+want)
			}
			if !strings.Contains(logs.String(), "level=error msg=\"cannot write the state file: free space in "+stateDir+", then retry (maps and unmaps are refused until it can be written; leases are kept)\"") ||
				!strings.Contains(logs.String(), "no space left on device") {
				t.Errorf("no error line in the log naming the state file and the next step:\n%s", logs)
			}
			_, fams := scrape(t, n.d, peercred.RoleCSI)
			if v, _ := sample(fams, "rbd_owner_maps_total", lbl{"cluster": "c1", "result": "state_unwritable"}); v != 1 {
				t.Errorf("maps_total{result=state_unwritable} = %v, want 1", v)
			}
			refusals, _ := sample(fams, "rbd_owner_map_refusals_total", lbl{"cluster": "c1", "reason": "state_unwritable"})
			if want := map[bool]float64{true: 0, false: 1}[step == "persist"]; refusals != want {
				t.Errorf("map_refusals_total{reason=state_unwritable} = %v, want %v", refusals, want)
			}
			if rec, err := claim.NewStoreOn(c.M, claim.Config{Node: claim.Node{ID: "observer"}}); err != nil {
				t.Fatal(err)
			} else if r, err := rec.Inspect(context.Background(), img); err == nil && !r.Free() {
				t.Errorf("a refused map left a claim: %+v", r.Holders)
			}
			if devs, _ := n.d.kernel.List(); len(devs) != 0 {
				t.Errorf("a refused map left a device: %+v", devs)
			}
		})
	}
}

// TestUnmapOfAMountedDeviceNamesTheMountPoint: an unmap the kernel refuses because the device
// is mounted names where, in one line, as the caller reads it and as it is audited.
func TestUnmapOfAMountedDeviceNamesTheMountPoint(t *testing.T) {
	c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000045")
	n, _, audited := nodeB(t, c, "manual")
	defer n.stop()
	c.M.AddImage(claim.Image{Pool: "rbd", Image: "mounted"}, "id-mounted")
	n.kernel.AddImage("rbd", "", "mounted", 16<<20)
	resp, err := n.d.Map(context.Background(), api.MapRequest{Cluster: "c1", Pool: "rbd", Image: "mounted"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	dev, err := n.d.kernel.FindByPath(resp.Device)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.kernel.Mount(dev.ID, 0, "/mnt/x"); err != nil {
		t.Fatal(err)
	}
	_, err = n.d.Unmap(context.Background(), api.UnmapRequest{Cluster: "c1", Pool: "rbd", Image: "mounted"}, nil)
	want := fmt.Sprintf("unmap rbd/mounted (rbd%d): %s is mounted at /mnt/x: unmount it first (or unmap --force)", dev.ID, resp.Device)
	if e := server.APIError(err); e.Code != api.CodeBusy || e.Message != want {
		t.Fatalf("unmap of a mounted device: %+v, want busy %q", e, want)
	}
	var got []string
	for _, e := range audited() {
		if e.Event == audit.Unmap {
			got = append(got, e.Message)
		}
	}
	if len(got) != 1 || got[0] != "unmap failed: "+want {
		t.Fatalf("audited %q, want one %q", got, "unmap failed: "+want)
	}
}
