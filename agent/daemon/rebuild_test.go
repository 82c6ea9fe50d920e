package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/image"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/nodestate"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
	"github.com/rbd-owner/rbd-owner/agent/server"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// mappedOnce maps image on a first agent with its state in stateDir and stops that agent,
// leaving the device mapped in its fake kernel (returned with the daemon, for a restart on it).
func mappedOnce(t *testing.T, c *memCluster, stateDir, bootID, image string) (*memDaemon, *api.MapResponse) {
	t.Helper()
	a := startMemDaemonWith(t, func(o *Options) { o.Config.StateDir = stateDir; o.BootID = bootID }, c)
	addImage(a, c, image) // the kernel and the cluster agree on the image's id
	resp, err := a.d.Map(context.Background(), api.MapRequest{Cluster: c.ID, Pool: c.Pool, Image: image}, nil)
	if err != nil {
		t.Fatal(err)
	}
	a.stop()
	return a, resp
}

// restarted starts an agent again on a's kernel with the state in stateDir, recording its audit.
func restarted(t *testing.T, a *memDaemon, c *memCluster, stateDir, bootID string, change func(*Options)) (*memDaemon, *auditLog) {
	t.Helper()
	b := startMemDaemonOn(t, a.kernel, func(o *Options) {
		o.Config.StateDir, o.BootID = stateDir, bootID
		if change != nil {
			change(o)
		}
	}, c)
	return b, b.env.Audit
}

// TestCorruptStateIsSetAsideAndRebuilt: an agent whose state file was cut short starts anyway,
// keeps the bad file as mappings.json.corrupt-<time>, adopts its device back from the kernel
// and the claim, says so at warning priority with a metric, and keeps renewing.
func TestCorruptStateIsSetAsideAndRebuilt(t *testing.T) {
	c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000031")
	stateDir := t.TempDir()
	a, resp := mappedOnce(t, c, stateDir, "boot-1", "img")
	path := filepath.Join(stateDir, "mappings.json")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data[:len(data)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	b, al := restarted(t, a, c, stateDir, "boot-1", nil)

	ms := b.d.state.All()
	if len(ms) != 1 || ms[0].Phase != state.Mapped || ms[0].Device != resp.Device || ms[0].Image != "img" {
		t.Fatalf("state after the rebuild: %+v, want %s adopted back; status %+v", ms, resp.Device, b.d.Status())
	}
	kept, _ := filepath.Glob(path + ".corrupt-*")
	if len(kept) != 1 {
		t.Fatalf("kept files: %v", kept)
	}
	if got, _ := os.ReadFile(kept[0]); string(got) != string(data[:len(data)/2]) {
		t.Fatal("the kept file is not the bad state file")
	}
	es := al.Find(audit.StateRebuilt, "")
	if len(es) != 1 || !es[0].Warning {
		t.Fatalf("state_rebuilt audit entries: %+v", es)
	}
	for _, want := range []string{
		"state rebuilt: " + path + " could not be used (not valid JSON",
		"is kept as " + kept[0],
		"1 rbd device(s) adopted back: " + resp.Device + " (c1:rbd/img), 0 not;",
		"claims of this node that its heartbeats list and no device here accounts for: 0 released",
	} {
		if !strings.Contains(es[0].Message, want) {
			t.Errorf("the rebuild's report %q does not say %q", es[0].Message, want)
		}
	}
	_, fams := scrape(t, b.d, peercred.RoleAdmin)
	if v, _ := sample(fams, "rbd_owner_state_set_aside_total", nil); v != 1 {
		t.Errorf("rbd_owner_state_set_aside_total = %v, want 1", v)
	}
	if v, _ := sample(fams, "rbd_owner_state_rebuilt_devices", lbl{"outcome": "adopted"}); v != 1 {
		t.Errorf("rbd_owner_state_rebuilt_devices{adopted} = %v, want 1", v)
	}
	w := c.Writes.Load()
	waitFor(t, "heartbeats after the rebuild", func() bool { return c.Writes.Load() >= w+3 })
	waitFor(t, "claim checks without a problem", func() bool { return len(b.d.Status().Problems) == 0 })
}

// TestOwnDeviceAdoptedBackIsNotCalledAnOutsideMapping (issue 52): a device this agent mapped,
// adopted back after its state file was lost (removed) or cut short, is audited as what it is,
// mapped by this agent before its state was lost, never as a mapping made outside rbd-owner.
func TestOwnDeviceAdoptedBackIsNotCalledAnOutsideMapping(t *testing.T) {
	for _, lose := range []struct {
		name string
		do   func(path string) error
	}{
		{"removed", os.Remove},
		{"cut short", func(path string) error { return os.WriteFile(path, []byte(`{"format": 1, "mapp`), 0o600) }},
	} {
		t.Run(lose.name, func(t *testing.T) {
			c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000039")
			stateDir := t.TempDir()
			a, resp := mappedOnce(t, c, stateDir, "boot-1", "img")
			if err := lose.do(filepath.Join(stateDir, "mappings.json")); err != nil {
				t.Fatal(err)
			}
			b, al := restarted(t, a, c, stateDir, "boot-1", nil)
			waitFor(t, "the adoption audited", func() bool { return len(al.Find(audit.UnmanagedDevice, audit.Adopted)) == 1 })
			e := al.Find(audit.UnmanagedDevice, audit.Adopted)[0]
			for _, want := range []string{resp.Device + " maps rbd/img, mapped by this agent before its state was lost", "adopted back at epoch"} {
				if !strings.Contains(e.Message, want) {
					t.Errorf("the adoption's audit %q does not say %q", e.Message, want)
				}
			}
			if strings.Contains(e.Message, "outside rbd-owner") {
				t.Errorf("the adoption's audit %q calls this agent's own device a mapping made outside rbd-owner", e.Message)
			}
			if es := al.Find(audit.UnmanagedDevice, ""); len(es) != 1 {
				t.Errorf("unmanaged_device audit entries %+v, want the adoption alone", es)
			}
			waitFor(t, "no problem", func() bool { return len(b.d.Status().Problems) == 0 })
		})
	}
}

// TestCorruptStateOnAnUnwritableDiskStillRenews: the state file is cut short and its
// directory cannot be written either (a file system gone read-only often does both). The
// device is adopted back all the same, in memory, so its claim is checked and its lease
// renewed; status says the state cannot be written; once it can, the adoption is written.
func TestCorruptStateOnAnUnwritableDiskStillRenews(t *testing.T) {
	c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000035")
	stateDir := t.TempDir()
	a, resp := mappedOnce(t, c, stateDir, "boot-1", "img")
	path := filepath.Join(stateDir, "mappings.json")
	if err := os.WriteFile(path, []byte(`{"format": 1, "mapp`), 0o600); err != nil {
		t.Fatal(err)
	}
	blocker := filepath.Join(path+".tmp", "x") // every write fails at its temporary file
	if err := os.MkdirAll(blocker, 0o700); err != nil {
		t.Fatal(err)
	}
	b, _ := restarted(t, a, c, stateDir, "boot-1", nil)
	key := state.Key{Cluster: c.ID, Ref: claimRef(c, "img")}
	if m, ok := b.d.state.Get(key); !ok || m.Phase != state.Mapped || m.Device != resp.Device {
		t.Fatalf("not adopted back in memory: %+v %v; status %+v", m, ok, b.d.Status())
	}
	w := c.Writes.Load()
	waitFor(t, "heartbeats", func() bool { return c.Writes.Load() >= w+3 })
	problems := b.d.Status().Problems
	if len(problems) != 1 || !strings.Contains(problems[0], "cannot write the state file") {
		t.Fatalf("problems %q, want only the state file's (the claim is checked and fine)", problems)
	}
	if err := os.RemoveAll(filepath.Dir(blocker)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the adoption written to the state file", func() bool {
		data, err := os.ReadFile(path)
		return err == nil && strings.Contains(string(data), `"image": "img"`)
	})
	waitFor(t, "no problem left", func() bool { return len(b.d.Status().Problems) == 0 })
}

// TestStateUnwritableIsNotInternal (issue 52): a map refused because the node's storage cannot
// take the state file (a full disk, a quota, a read-only file system) answers code
// state_unwritable (HTTP 507), not internal, with the same words; any other write failure stays
// internal.
func TestStateUnwritableIsNotInternal(t *testing.T) {
	c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-00000000003a")
	n := startMemDaemon(t, c)
	defer n.stop()
	for i, tc := range []struct {
		errno  syscall.Errno
		code   string
		status int
		next   string
	}{
		{syscall.ENOSPC, "state_unwritable", 507, "free space in "},
		{syscall.EDQUOT, "state_unwritable", 507, "free space in "},
		{syscall.EROFS, "state_unwritable", 507, "its file system is read-only: remount "},
		{syscall.EIO, api.CodeInternal, 500, "check that "},
	} {
		n.d.state.FailWrites(func() error { return tc.errno })
		name := fmt.Sprintf("img%d", i)
		c.M.AddImage(claimRef(c, name), "id-"+name)
		n.kernel.AddImage(c.Pool, "", name, 16<<20)
		_, err := n.d.Map(context.Background(), api.MapRequest{Cluster: c.ID, Pool: c.Pool, Image: name}, nil)
		if !errors.Is(err, tc.errno) {
			t.Fatalf("%v: map: %v", tc.errno, err)
		}
		e := server.APIError(err)
		if e.Code != tc.code || api.HTTPStatus(e.Code) != tc.status {
			t.Errorf("%v: code %s (HTTP %d), want %s (HTTP %d); %q", tc.errno, e.Code, api.HTTPStatus(e.Code), tc.code, tc.status, e.Message)
		}
		if want := "cannot write the state file " + n.d.state.Path() + ": " + tc.errno.Error(); !strings.Contains(e.Message, want) || !strings.Contains(e.Message, tc.next) {
			t.Errorf("%v: message %q, want %q and %q", tc.errno, e.Message, want, tc.next)
		}
	}
	n.d.state.FailWrites(nil)
}

// TestFailingStateWriteKeepsTheAgentRenewing: with the state file unwritable (a full disk),
// maps are refused with the reason, status says since when, the heartbeats go on, and all of
// it ends once the disk has room again. (That a failed write leaves no temporary file is
// state's TestFailedWriteLeavesNoTemporaryFile, on a real failure.)
func TestFailingStateWriteKeepsTheAgentRenewing(t *testing.T) {
	c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000032")
	n := startMemDaemon(t, c)
	defer n.stop()
	n.mapImage(t, c, "kept")
	n.d.state.FailWrites(func() error { return syscall.ENOSPC })

	c.M.AddImage(claimRef(c, "new"), "id-new")
	n.kernel.AddImage(c.Pool, "", "new", 16<<20)
	_, err := n.d.Map(context.Background(), api.MapRequest{Cluster: c.ID, Pool: c.Pool, Image: "new"}, nil)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("map with the disk full: %v", err)
	}
	stateProblem := func() string {
		for _, p := range n.d.Status().Problems {
			if strings.Contains(p, "cannot write the state file") {
				return p
			}
		}
		return ""
	}
	p := stateProblem()
	for _, want := range []string{"cannot write the state file " + n.d.state.Path() + ": no space left on device",
		"maps and unmaps are refused until it can be written: free space in " + filepath.Dir(n.d.state.Path()) + ", then retry; leases are kept", "(since "} {
		if !strings.Contains(p, want) {
			t.Errorf("status's problem %q does not say %q", p, want)
		}
	}
	w := c.Writes.Load()
	waitFor(t, "heartbeats while the state cannot be written", func() bool { return c.Writes.Load() >= w+3 })
	_, fams := scrape(t, n.d, peercred.RoleAdmin)
	if v, _ := sample(fams, "rbd_owner_state_write_failures_total", nil); v < 1 {
		t.Errorf("rbd_owner_state_write_failures_total = %v", v)
	}
	if v, ok := sample(fams, "rbd_owner_state_write_failing", nil); v != 1 || !ok {
		t.Errorf("rbd_owner_state_write_failing = %v (%v) while writes fail", v, ok)
	}

	n.d.state.FailWrites(nil)
	if _, err := n.d.Map(context.Background(), api.MapRequest{Cluster: c.ID, Pool: c.Pool, Image: "new"}, nil); err != nil {
		t.Fatalf("map once the disk has room: %v", err)
	}
	if p := stateProblem(); p != "" {
		t.Errorf("the state problem stays after a good write: %q", p)
	}
	_, fams = scrape(t, n.d, peercred.RoleAdmin)
	if v, ok := sample(fams, "rbd_owner_state_write_failing", nil); v != 0 || !ok {
		t.Errorf("rbd_owner_state_write_failing = %v (%v) after a good write", v, ok)
	}
}

// TestNoJudgementBeforeTheClaimIsRead: an agent that lost its state starts while its cluster
// is still connecting. Its healthy device is shown as not checked yet (no verdict, no audit,
// no advice to unmap it) and the cluster as connecting; once connected, the device is adopted
// back and was never reported.
func TestNoJudgementBeforeTheClaimIsRead(t *testing.T) {
	c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000033")
	stateDir := t.TempDir()
	a, resp := mappedOnce(t, c, stateDir, "boot-1", "img")
	if err := os.Remove(filepath.Join(stateDir, "mappings.json")); err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	b, al := restarted(t, a, c, stateDir, "boot-1", func(o *Options) {
		o.Connect = func(ctx context.Context, _ config.Cluster) (Connection, error) {
			select {
			case <-gate:
				return Connection{Backend: c.M, Secret: memSecret}, nil
			case <-ctx.Done():
				return Connection{}, ctx.Err()
			}
		}
	})
	st := b.d.Status()
	if len(st.Clusters) != 1 || !st.Clusters[0].Connecting || st.Clusters[0].Connected || st.Clusters[0].Error != "" {
		t.Fatalf("cluster status while connecting: %+v", st.Clusters)
	}
	var dev *api.Device
	for i := range st.Devices {
		if st.Devices[i].Device == resp.Device {
			dev = &st.Devices[i]
		}
	}
	if dev == nil || dev.Managed || !strings.HasPrefix(dev.Problem, "not checked yet: ") || strings.Contains(dev.Problem, "unmap") {
		t.Fatalf("device while its claim is unread: %+v", dev)
	}
	if es := al.Find(audit.UnmanagedDevice, ""); len(es) != 0 {
		t.Fatalf("judged before its claim was read: %+v", es)
	}
	close(gate)
	waitFor(t, "the device adopted back", func() bool {
		m, ok := b.d.state.Get(state.Key{Cluster: c.ID, Ref: claimRef(c, "img")})
		return ok && m.Phase == state.Mapped && m.Device == resp.Device
	})
	if es := al.Find(audit.UnmanagedDevice, audit.Reported); len(es) != 0 {
		t.Fatalf("a healthy device was reported: %+v", es)
	}
	if es := al.Find(audit.UnmanagedDevice, audit.Adopted); len(es) != 1 {
		t.Fatalf("adoptions: %+v", es)
	}
	waitFor(t, "no problem left", func() bool { return len(b.d.Status().Problems) == 0 })
}

// TestDeviceGoneAfterARebootIsSaidSo: a mapping whose device is gone because the node
// rebooted (the state was written in another boot) is released with a warning that says so,
// not as a device unmapped behind the agent's back.
func TestDeviceGoneAfterARebootIsSaidSo(t *testing.T) {
	for _, tc := range []struct {
		boot, want, not string
		warning         bool
	}{
		{"boot-2", "is gone: this node rebooted since it was mapped; releasing its claim", "outside rbd-owner", true},
		{"boot-1", "was unmapped outside rbd-owner (not present at reconciliation); releasing its claim", "rebooted", false},
	} {
		t.Run(tc.boot, func(t *testing.T) {
			c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000034")
			stateDir := t.TempDir()
			a, resp := mappedOnce(t, c, stateDir, "boot-1", "img")
			id, err := strconv.Atoi(resp.Device[strings.LastIndex(resp.Device, "rbd")+3:])
			if err != nil {
				t.Fatal(err)
			}
			handUnmap(t, a, krbd.Device{ID: id})
			b, al := restarted(t, a, c, stateDir, tc.boot, nil)
			es := al.Find(audit.DeviceLost, "")
			if len(es) != 1 || !strings.Contains(es[0].Message, tc.want) || strings.Contains(es[0].Message, tc.not) ||
				es[0].Warning != tc.warning || es[0].Error == tc.warning {
				t.Fatalf("device_lost entries: %+v, want one saying %q", es, tc.want)
			}
			if len(b.d.state.All()) != 0 {
				t.Fatalf("state: %+v", b.d.state.All())
			}
		})
	}
}

// TestSkewReportEndsWhenTheClockAgrees: a clock skew is shown with since when, and goes from
// status as soon as that node's heartbeat is seen within bounds again.
func TestSkewReportEndsWhenTheClockAgrees(t *testing.T) {
	d := &Daemon{log: quietLog(), node: nodestate.New(nil)}
	d.noteSkew("c1", "node-a", 90*time.Second)
	d.noteSkew("c1", "node-a", 91*time.Second)
	ps := d.skewProblems()
	if len(ps) != 1 || !strings.HasPrefix(ps[0], "clock skew: node node-a's clock is 1m31s ahead of this node's (cluster c1) (since ") {
		t.Fatalf("skew problems: %q", ps)
	}
	d.noteSkew("c1", "node-a", 0)
	if ps := d.skewProblems(); len(ps) != 0 {
		t.Fatalf("the skew is gone but status still says %q", ps)
	}
}

func claimRef(c *memCluster, name string) image.Ref { return image.Ref{Pool: c.Pool, Image: name} }

// TestCorruptStateAfterAnInterruptedMapAdoptsItsDevice: a map stopped dead after the kernel
// made the device and before the claim named its client, then the state file cut short: the
// rebuild finds this node's own hold naming no mapping, adopts the device back and records
// its client in the claim, instead of fencing this node's own device.
func TestCorruptStateAfterAnInterruptedMapAdoptsItsDevice(t *testing.T) {
	c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000036")
	stateDir := t.TempDir()
	a := startMemDaemonWith(t, func(o *Options) {
		o.Config.StateDir = stateDir
		o.Fault = func(saga, step string) error {
			if saga == "map" && step == "record" {
				return ErrCrash
			}
			return nil
		}
	}, c)
	addImage(a, c, "img")
	if _, err := a.d.Map(context.Background(), api.MapRequest{Cluster: c.ID, Pool: c.Pool, Image: "img"}, nil); !errors.Is(err, ErrCrash) {
		t.Fatalf("map: %v, want the simulated crash", err)
	}
	a.stop()
	devs, err := a.d.kernel.List()
	if err != nil || len(devs) != 1 {
		t.Fatalf("devices after the crash: %+v %v", devs, err)
	}
	if err := os.WriteFile(filepath.Join(stateDir, "mappings.json"), []byte(`{"format": 1, "mappings": [{"clus`), 0o600); err != nil {
		t.Fatal(err)
	}
	b, al := restarted(t, a, c, stateDir, "", nil)
	m, ok := b.d.state.Get(state.Key{Cluster: c.ID, Ref: claimRef(c, "img")})
	if !ok || m.Phase != state.Mapped || m.DeviceID != devs[0].ID {
		t.Fatalf("not adopted back: %+v %v; status %+v", m, ok, b.d.Status())
	}
	if c.M.Blocklisted(devs[0].ClientAddr) || len(al.Find(audit.UnmanagedDevice, audit.Fenced)) != 0 {
		t.Fatal("this node's own device was fenced")
	}
	rec := inspectMem(t, c, claimRef(c, "img"))
	if len(rec.Holders) != 1 || rec.Holders[0].NodeID != "node-m" || rec.Holders[0].ClientAddr != devs[0].ClientAddr {
		t.Fatalf("holders %+v, want node-m's naming %s", rec.Holders, devs[0].ClientAddr)
	}
}

// TestARebuildReleasesTheHoldsItsHeartbeatListsWithoutADevice is case 4 of issue 50: the agent
// mapped two images, img2's device was then unmapped behind its back while it was down, and its
// state file was lost. The rebuild adopts img's device back; img2's hold, which the node's own
// heartbeat lists and no device here accounts for, is released (before, it stayed held by
// nobody's agent: neither renewed nor released, its place's heartbeat stopped).
func TestARebuildReleasesTheHoldsItsHeartbeatListsWithoutADevice(t *testing.T) {
	c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000037")
	stateDir := t.TempDir()
	a := startMemDaemonWith(t, func(o *Options) { o.Config.StateDir = stateDir; o.BootID = "boot-1" }, c)
	addImage(a, c, "img")
	addImage(a, c, "img2")
	if _, err := a.d.Map(context.Background(), api.MapRequest{Cluster: c.ID, Pool: c.Pool, Image: "img"}, nil); err != nil {
		t.Fatal(err)
	}
	r2, err := a.d.Map(context.Background(), api.MapRequest{Cluster: c.ID, Pool: c.Pool, Image: "img2"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	a.stop()
	id := strings.TrimPrefix(filepath.Base(r2.Device), "rbd")
	if err := a.kernel.WriteControl(a.kernel.Sysfs+"/bus/rbd/remove_single_major", []byte(id)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stateDir, "mappings.json"), []byte(`{"format": 1, "mapp`), 0o600); err != nil {
		t.Fatal(err)
	}
	b, al := restarted(t, a, c, stateDir, "boot-1", nil)
	if rec := inspectMem(t, c, claimRef(c, "img2")); !rec.Free() {
		t.Fatalf("img2's holders after the rebuild: %+v; want it released", rec.Holders)
	}
	if rec := inspectMem(t, c, claimRef(c, "img")); rec.Holder(b.d.cfg.NodeID) == nil {
		t.Fatalf("img's holders after the rebuild: %+v; want it still held", rec.Holders)
	}
	es := al.Find(audit.StateRebuilt, "")
	if len(es) != 1 || !strings.Contains(es[0].Message, "1 released: c1:rbd/img2") {
		t.Fatalf("state_rebuilt audit entries: %+v", es)
	}
}

// TestAHoldTheRebuildCannotSettleKeepsItsPlaceBeating is case 4's other half (issue 50: the
// rebuild "never stops heartbeating a place where it still holds a claim"): img's device was
// unmapped behind the agent's back while it was down and its state lost, and the release of
// img's hold fails at the restart. The hold is still this node's: its place's heartbeat goes on
// (before, it stopped with the state's last mapping there, and a watcher would take the image
// over from a live node), and the renew round settles it once the cluster lets it.
func TestAHoldTheRebuildCannotSettleKeepsItsPlaceBeating(t *testing.T) {
	c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000038")
	stateDir := t.TempDir()
	a := startMemDaemonWith(t, func(o *Options) { o.Config.StateDir = stateDir; o.BootID = "boot-1" }, c)
	addImage(a, c, "img")
	r, err := a.d.Map(context.Background(), api.MapRequest{Cluster: c.ID, Pool: c.Pool, Image: "img"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	a.stop()
	id := strings.TrimPrefix(filepath.Base(r.Device), "rbd")
	if err := a.kernel.WriteControl(a.kernel.Sysfs+"/bus/rbd/remove_single_major", []byte(id)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stateDir, "mappings.json"), []byte(`{"format": 1, "mapp`), 0o600); err != nil {
		t.Fatal(err)
	}
	var refuse atomic.Bool
	refuse.Store(true)
	c.M.SetHook(func(_ context.Context, call string, img claim.Image) error {
		if call == "write" && img.Image == "img" && refuse.Load() {
			return errors.New("claim write refused (test)")
		}
		return nil
	})
	b, al := restarted(t, a, c, stateDir, "boot-1", nil)
	if rec := inspectMem(t, c, claimRef(c, "img")); rec.Holder(b.d.cfg.NodeID) == nil {
		t.Fatalf("img's holders after the failed release: %+v; want still this node's", rec.Holders)
	}
	es := al.Find(audit.StateRebuilt, "")
	if len(es) != 1 || !strings.Contains(es[0].Message, "1 not settled: c1:rbd/img (release failed") {
		t.Fatalf("state_rebuilt audit entries: %+v", es)
	}
	beat := func() uint64 {
		_, v, err := c.M.Read(context.Background(), claim.Image{Pool: c.Pool}, claim.HeartbeatPrefix+b.d.cfg.NodeID)
		if err != nil {
			return 0
		}
		return v
	}
	for range 3 {
		prev := beat()
		waitFor(t, "this node's heartbeat in rbd, written again while it holds img", func() bool { return beat() > prev })
	}
	refuse.Store(false)
	waitFor(t, "img's hold released by a renew round", func() bool { return inspectMem(t, c, claimRef(c, "img")).Free() })
	waitFor(t, "the place's heartbeat stopped", func() bool {
		prev := beat()
		time.Sleep(5 * b.d.cfg.RenewInterval.D())
		return beat() == prev
	})
}
