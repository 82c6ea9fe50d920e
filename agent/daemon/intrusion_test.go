package daemon

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/internal/agenttest"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/nodestate"
	"github.com/rbd-owner/rbd-owner/agent/server"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// auditLog collects a test daemon's audit entries.
type auditLog = agenttest.AuditLog

// startIntrusionDaemon starts node-m on c with the given unmanaged policy, recording its audit.
func startIntrusionDaemon(t *testing.T, c *memCluster, policy string) (*memDaemon, *auditLog) {
	t.Helper()
	n := startMemDaemonWith(t, func(o *Options) { o.Config.Unmanaged = policy }, c)
	return n, n.env.Audit
}

// handMap maps an image on the fake kernel the way Ceph's `rbd map` would, outside the agent,
// and returns the device as the kernel describes it.
func handMap(t *testing.T, n *memDaemon, c *memCluster, image string, opts ...string) krbd.Device {
	t.Helper()
	raw, err := base64.StdEncoding.DecodeString(memSecret)
	if err != nil {
		t.Fatal(err)
	}
	o := append([]string{"name=u", "secret=" + base64.StdEncoding.EncodeToString(raw)}, opts...)
	before, _ := n.d.kernel.List()
	add := filepath.Join(n.kernel.Sysfs, "bus", "rbd", "add_single_major")
	if err := n.kernel.WriteControl(add, []byte("203.0.113.1:6789 "+strings.Join(o, ",")+" "+c.Pool+" "+image)); err != nil {
		t.Fatalf("rbd map by hand: %v", err)
	}
	after, _ := n.d.kernel.List()
	for _, d := range after {
		if !containsDevice(before, d.ID) {
			return d
		}
	}
	t.Fatal("the hand map made no device")
	return krbd.Device{}
}

func containsDevice(ds []krbd.Device, id int) bool {
	for _, d := range ds {
		if d.ID == id {
			return true
		}
	}
	return false
}

func handUnmap(t *testing.T, n *memDaemon, dv krbd.Device) {
	t.Helper()
	rm := filepath.Join(n.kernel.Sysfs, "bus", "rbd", "remove_single_major")
	if err := n.kernel.WriteControl(rm, []byte(strconv.Itoa(dv.ID))); err != nil {
		t.Fatalf("rbd unmap by hand: %v", err)
	}
}

// holdElsewhere makes node-a hold image on c with a mapping of its own.
func holdElsewhere(t *testing.T, c *memCluster, image, addr string) (*claim.Store, uint64) {
	t.Helper()
	img := claim.Image{Pool: c.Pool, Image: image}
	a, err := claim.NewStoreOn(c.M, claim.Config{Node: claim.Node{ID: "node-a", Hostname: "host-a"}, Lease: time.Minute, FenceExpiry: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	res, err := a.Acquire(context.Background(), claim.Request{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.SetMapping(context.Background(), img, res.Holder.Epoch, addr, "/dev/rbd7"); err != nil {
		t.Fatal(err)
	}
	return a, res.Holder.Epoch
}

func addImage(n *memDaemon, c *memCluster, image string) { n.env.AddImage(c, image) }

// TestIntruderOfAHeldImageIsFencedAtOnce: a plain `rbd map` on this node of an image node-a
// holds is blocklisted from its add uevent alone (no reconciliation runs meanwhile), recorded
// in the claim and shown in status; node-a keeps the image; the fence is lifted by an admin
// only once the device is gone.
func TestIntruderOfAHeldImageIsFencedAtOnce(t *testing.T) {
	c := newMemCluster("c1", "rbd", "fsid-intr")
	n, al := startIntrusionDaemon(t, c, config.UnmanagedFenceIfClaimed)
	addImage(n, c, "held")
	a, epoch := holdElsewhere(t, c, "held", "10.9.9.9:0/1")
	dv := handMap(t, n, c, "held", "noshare")
	waitFor(t, "the intruder's client blocklisted", func() bool { return c.M.Blocklisted(dv.ClientAddr) })
	if c.M.Blocklisted("10.9.9.9:0/1") {
		t.Fatal("the holder's mapping was fenced")
	}
	waitFor(t, "the fence audited", func() bool { return len(al.Find(audit.UnmanagedDevice, audit.Fenced)) == 1 })
	e := al.Find(audit.UnmanagedDevice, audit.Fenced)[0]
	if !e.Error || e.OwnerNode != "node-a" || e.Device != dv.DevNode || !strings.Contains(e.Message, "node-a") || !strings.Contains(e.Message, dv.ClientAddr) {
		t.Fatalf("audit entry: %+v", e)
	}
	img := claim.Image{Pool: c.Pool, Image: "held"}
	if _, err := a.Renew(context.Background(), img, epoch); err != nil {
		t.Fatalf("node-a lost its claim: %v", err)
	}
	rec, err := a.Inspect(context.Background(), img)
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Intruders) != 1 || rec.Intruders[0].NodeID != "node-m" || rec.Intruders[0].Addr != dv.ClientAddr || rec.Intruders[0].Holders != "node-a@1" {
		t.Fatalf("intruders in the claim: %+v", rec.Intruders)
	}
	waitFor(t, "status shows the fenced device", func() bool {
		for _, d := range n.d.Status().Devices {
			if d.Device == dv.DevNode && d.FencedUntil != nil && strings.Contains(d.Problem, "FENCED") && !d.Managed {
				return true
			}
		}
		return false
	})
	rr := httptest.NewRecorder()
	server.Get(n.d.claimsCall(false))(rr, httptest.NewRequest(http.MethodGet, api.PathClaims+"?cluster=c1&pool=rbd", nil))
	var claims []api.Claim
	if err := json.Unmarshal(rr.Body.Bytes(), &claims); err != nil || len(claims) != 1 || len(claims[0].Intruders) != 1 ||
		claims[0].Intruders[0].NodeID != "node-m" {
		t.Fatalf("claims view: %s %v", rr.Body.String(), err)
	}
	req := api.ImageRequest{Cluster: "c1", Pool: c.Pool, Image: "held"}
	if _, err := n.d.admin.Unfence(context.Background(), req, nil); !errors.Is(err, claim.ErrBusy) {
		t.Fatalf("unfence while the intruder is mapped: %v", err)
	}
	handUnmap(t, n, dv)
	resp, err := n.d.admin.Unfence(context.Background(), req, nil)
	if err != nil || len(resp.Unfenced) != 1 || resp.Unfenced[0].ClientAddr != dv.ClientAddr {
		t.Fatalf("unfence: %+v %v", resp, err)
	}
	if c.M.Blocklisted(dv.ClientAddr) {
		t.Fatal("still blocklisted after unfence")
	}
	if rec, _ := a.Inspect(context.Background(), img); len(rec.Intruders) != 0 || len(rec.Holders) != 1 {
		t.Fatalf("record after unfence: %+v", rec)
	}
}

// TestSharedClientIntruderIsReportedNotFenced: a mapping without noshare (as stock ceph-csi
// makes them) of an image another node holds shares its kernel client with this node's other
// mappings, so a fence would cut them all on a live node: it is never fenced automatically, and
// reported at error priority naming the remedy (the drop-in, or noshare in mapOptions).
func TestSharedClientIntruderIsReportedNotFenced(t *testing.T) {
	c := newMemCluster("c1", "rbd", "fsid-shared")
	n, al := startIntrusionDaemon(t, c, config.UnmanagedFenceIfClaimed)
	addImage(n, c, "free1")
	addImage(n, c, "held2")
	holdElsewhere(t, c, "held2", "10.9.9.9:0/2")
	d1 := handMap(t, n, c, "free1")
	waitFor(t, "the free image's mapping reported", func() bool { return len(al.Find(audit.UnmanagedDevice, audit.Reported)) == 1 })
	d2 := handMap(t, n, c, "held2")
	if d2.ClientAddr != d1.ClientAddr {
		t.Fatalf("the fake kernel did not share the client: %s vs %s", d1.ClientAddr, d2.ClientAddr)
	}
	waitFor(t, "the held image's mapping reported", func() bool { return len(al.Find(audit.UnmanagedDevice, audit.Reported)) == 2 })
	e := al.Find(audit.UnmanagedDevice, audit.Reported)[1]
	if !e.Error || e.OwnerNode != "node-a" || e.Device != d2.DevNode || !strings.Contains(e.Message, "TWO WRITERS ARE POSSIBLE") ||
		!strings.Contains(e.Message, "drop-in rbd") || !strings.Contains(e.Message, "noshare to the StorageClass's mapOptions") {
		t.Fatalf("audit: %+v", e)
	}
	if c.M.Blocklisted(d1.ClientAddr) || len(al.Find(audit.UnmanagedDevice, audit.Fenced)) != 0 {
		t.Fatal("a shared kernel client was fenced: every mapping of this node that it serves is cut")
	}
}

// TestReadOnlyIntruderIsNeverFenced: a read-only mapping cannot write: reported only.
func TestReadOnlyIntruderIsNeverFenced(t *testing.T) {
	c := newMemCluster("c1", "rbd", "fsid-ro")
	n, al := startIntrusionDaemon(t, c, config.UnmanagedFenceIfClaimed)
	addImage(n, c, "held")
	holdElsewhere(t, c, "held", "10.9.9.9:0/3")
	dv := handMap(t, n, c, "held", "noshare", "read_only")
	if !dv.ReadOnly {
		t.Fatal("the kernel did not show the mapping read-only")
	}
	waitFor(t, "the read-only mapping reported", func() bool { return len(al.Find(audit.UnmanagedDevice, audit.Reported)) == 1 })
	if c.M.Blocklisted(dv.ClientAddr) || len(al.Find(audit.UnmanagedDevice, audit.Fenced)) != 0 {
		t.Fatal("a read-only mapping was fenced")
	}
	if e := al.Find(audit.UnmanagedDevice, audit.Reported)[0]; !strings.Contains(e.Message, "node-a") || !strings.Contains(e.Message, "read-only") {
		t.Fatalf("report: %s", e.Message)
	}
}

// TestReportPolicyOnlyReports: under `report` an intruder of a held image is only reported.
func TestReportPolicyOnlyReports(t *testing.T) {
	c := newMemCluster("c1", "rbd", "fsid-report")
	n, al := startIntrusionDaemon(t, c, config.UnmanagedReport)
	addImage(n, c, "held")
	holdElsewhere(t, c, "held", "10.9.9.9:0/4")
	dv := handMap(t, n, c, "held", "noshare")
	waitFor(t, "reported", func() bool { return len(al.Find(audit.UnmanagedDevice, audit.Reported)) == 1 })
	if e := al.Find(audit.UnmanagedDevice, audit.Reported)[0]; e.OwnerNode != "node-a" {
		t.Fatalf("the report does not name the holder: %+v", e)
	}
	n.d.reconciler.reconcile(context.Background())
	if !n.d.ops.waitIdle(10 * time.Second) {
		t.Fatal("reconcile did not settle")
	}
	if c.M.Blocklisted(dv.ClientAddr) || len(al.Find(audit.UnmanagedDevice, audit.Fenced)) != 0 {
		t.Fatal("the report policy fenced")
	}
}

// TestAdoptOrFenceAdoptsAFreeMapping: under adopt-or-fence a by-hand noshare mapping of a free
// image is claimed for this node and managed: unmapped through the agent, its claim released.
// Without noshare it is only reported.
func TestAdoptOrFenceAdoptsAFreeMapping(t *testing.T) {
	c := newMemCluster("c1", "rbd", "fsid-adopt")
	n, al := startIntrusionDaemon(t, c, config.UnmanagedAdoptOrFence)
	addImage(n, c, "free")
	addImage(n, c, "shared")
	dv := handMap(t, n, c, "free", "noshare")
	key := state.Key{Cluster: "c1", Ref: krbd.Spec{Pool: c.Pool, Image: "free"}}
	waitFor(t, "adopted", func() bool { m, ok := n.d.state.Get(key); return ok && m.Phase == state.Mapped })
	m, _ := n.d.state.Get(key)
	if m.DeviceID != dv.ID || m.ClientAddr != dv.ClientAddr || m.Epoch != 1 {
		t.Fatalf("adopted state: %+v", m)
	}
	rec, err := n.d.clusters["c1"].store.Inspect(context.Background(), claim.Image{Pool: c.Pool, Image: "free"})
	if err != nil || rec.Holder("node-m") == nil || rec.Holder("node-m").ClientAddr != dv.ClientAddr {
		t.Fatalf("claim after adoption: %+v %v", rec, err)
	}
	// the adoption is audited once its state is written: wait for the entry, then look at it
	waitFor(t, "the adoption audited", func() bool { return len(al.Find(audit.UnmanagedDevice, audit.Adopted)) > 0 })
	if e := al.Find(audit.UnmanagedDevice, audit.Adopted); len(e) != 1 || e[0].Epoch != 1 {
		t.Fatalf("adoption audit: %+v", e)
	}
	ok, err := n.d.Unmap(context.Background(), api.UnmapRequest{Cluster: "c1", Pool: c.Pool, Image: "free"}, nil)
	if err != nil || !ok {
		t.Fatalf("unmap of the adopted device: %v %v", ok, err)
	}
	if rec, _ := n.d.clusters["c1"].store.Inspect(context.Background(), claim.Image{Pool: c.Pool, Image: "free"}); !rec.Free() {
		t.Fatalf("claim not released: %+v", rec)
	}
	sh := handMap(t, n, c, "shared")
	waitFor(t, "the shareable mapping reported", func() bool {
		for _, e := range al.Find(audit.UnmanagedDevice, audit.Reported) {
			if e.Device == sh.DevNode && strings.Contains(e.Message, "noshare") {
				return true
			}
		}
		return false
	})
	if _, ok := n.d.state.Get(state.Key{Cluster: "c1", Ref: krbd.Spec{Pool: c.Pool, Image: "shared"}}); ok {
		t.Fatal("a mapping without a client of its own was adopted")
	}
}

// TestOwnMapIsNeverMistakenForAnIntruder: the add uevent of the agent's own map arrives while
// the saga still runs (its claim does not name the device yet); its judgement waits for the
// saga and then finds the device the agent's own. Without the image lock the claim would show
// this node holding the image for another client, and the device would be fenced.
func TestOwnMapIsNeverMistakenForAnIntruder(t *testing.T) {
	c := newMemCluster("c1", "rbd", "fsid-own")
	var n *memDaemon
	al := &auditLog{}
	key := state.Key{Cluster: "c1", Ref: krbd.Spec{Pool: "rbd", Image: "mine"}}
	n = startMemDaemonWith(t, func(o *Options) {
		o.Audit = audit.NewWithSink(o.Log, al.Record)
		// no reconciliation round on its own: only the uevent's judgement can wait for the saga
		o.Ticker = func(loop string, every time.Duration) (<-chan time.Time, func()) {
			if loop == "reconcile" {
				return make(chan time.Time), func() {}
			}
			t := time.NewTicker(every)
			return t.C, t.Stop
		}
		o.Fault = func(saga, step string) error {
			if saga == "map" && step == "record" {
				// the device exists now; hold the saga until its uevent's judgement waits
				waitFor(t, "the judgement to wait for the saga", func() bool { return n.d.locks.Refs(key) >= 2 })
			}
			return nil
		}
	}, c)
	t.Cleanup(func() { n.stop() })
	resp := n.mapImage(t, c, "mine")
	n.d.reconciler.reconcile(context.Background())
	if !n.d.ops.waitIdle(10 * time.Second) {
		t.Fatal("reconcile did not settle")
	}
	waitFor(t, "the judgement to end", func() bool { return n.d.locks.Refs(key) == 0 })
	devs, _ := n.d.kernel.List()
	if len(devs) != 1 || devs[0].DevNode != resp.Device {
		t.Fatalf("devices: %+v", devs)
	}
	if c.M.Blocklisted(devs[0].ClientAddr) || len(al.Find(audit.UnmanagedDevice, "")) != 0 {
		t.Fatalf("the agent's own mapping was judged unmanaged: %+v", al.Find(audit.UnmanagedDevice, ""))
	}
	for _, d := range n.d.Status().Devices {
		if !d.Managed {
			t.Fatalf("status: %+v", d)
		}
	}
}

// TestMapByMonitorsWithOptions: a CSI plugin names the cluster by its monitors and passes map
// options: the cluster is found, the options reach the kernel, the forbidden ones are refused.
func TestMapByMonitorsWithOptions(t *testing.T) {
	c1, c2 := newMemCluster("c1", "rbd", "fsid-mon"), newMemCluster("c2", "rbd2", "fsid-mon")
	n := startMemDaemonWith(t, func(o *Options) {
		o.Config.Clusters[0].Monitors = []string{"203.0.113.1:6789"}
		o.Config.Clusters[1].Monitors = []string{"203.0.113.2:6789"}
		kc := o.Kernel.Config()
		kc.UdevTimeout = time.Hour // a map that waits for the held udevd below would hang
		o.Kernel = krbd.New(kc)
	}, c1, c2)
	t.Cleanup(func() { n.stop() })
	addImage(n, c1, "img")
	// noudev (what ceph-csi passes) reaches the kernel client: the map returns while udevd
	// holds its events
	n.kernel.HoldUdev()
	t.Cleanup(n.kernel.ReleaseUdev)
	type result struct {
		resp *api.MapResponse
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := n.d.Map(context.Background(), api.MapRequest{Monitors: []string{"v1:203.0.113.1:6789/0"}, Pool: "rbd", Image: "img",
			Options: []string{"noudev", "queue_depth=128"}}, nil)
		done <- result{resp, err}
	}()
	var r result
	waitFor(t, "the noudev map to return while udevd is held", func() bool {
		select {
		case r = <-done:
			return true
		default:
			return false
		}
	})
	resp, err := r.resp, r.err
	if err != nil {
		t.Fatal(err)
	}
	if resp.Claim == nil || resp.Claim.Cluster != "c1" {
		t.Fatalf("map by monitors: %+v", resp)
	}
	writes := strings.Join(n.kernel.Writes(), "\n")
	if !strings.Contains(writes, "queue_depth=128") || strings.Contains(writes, "noudev") {
		t.Fatalf("kernel writes: %s", writes)
	}
	for _, tc := range []struct {
		req  api.MapRequest
		want string
	}{
		{api.MapRequest{Monitors: []string{"198.51.100.9:6789"}, Pool: "rbd", Image: "img"}, "no configured cluster"},
		{api.MapRequest{Monitors: []string{"203.0.113.1:6789"}, Pool: "rbd", Image: "img", Options: []string{"exclusive"}}, "exclusive"},
		{api.MapRequest{Monitors: []string{"203.0.113.1:6789"}, Pool: "rbd", Image: "img", Options: []string{"secret=QUJD"}}, "secret"},
	} {
		_, err := n.d.Map(context.Background(), tc.req, nil)
		if e := server.APIError(err); e.Code != api.CodeInvalidArgument || !strings.Contains(e.Message, tc.want) || strings.Contains(e.Message, "QUJD") {
			t.Errorf("%+v: %+v", tc.req, e)
		}
	}
}

// TestIntruderThatCouldNotBeFencedIsSaidSo: a mapping made outside rbd-owner of an image
// another node holds, whose blocklisting fails, is not shown as "not checked yet": an
// error-priority audit entry says it could NOT be fenced and can write, status says so, and
// the fence is tried again until it stands.
func TestIntruderThatCouldNotBeFencedIsSaidSo(t *testing.T) {
	c := newMemCluster("c1", "rbd", "fsid-intr-fail")
	var failures atomic.Int32
	failures.Store(1)
	c.M.SetHook(func(_ context.Context, call string, _ claim.Image) error {
		if call == "blocklist" && failures.Add(-1) >= 0 {
			return errors.New("the monitors refused the command (EACCES)")
		}
		return nil
	})
	n, al := startIntrusionDaemon(t, c, config.UnmanagedFenceIfClaimed)
	addImage(n, c, "held")
	holdElsewhere(t, c, "held", "10.9.9.9:0/1")
	dv := handMap(t, n, c, "held", "noshare")
	waitFor(t, "the failed fence audited", func() bool { return len(al.Find(audit.UnmanagedDevice, audit.Failed)) == 1 })
	e := al.Find(audit.UnmanagedDevice, audit.Failed)[0]
	if !e.Error || e.OwnerNode != "node-a" || !strings.HasPrefix(e.Message, "could NOT fence "+dv.DevNode+": ") ||
		!strings.Contains(e.Message, "EACCES") || !strings.Contains(e.Message, "and can write") {
		t.Fatalf("audit entry: %+v", e)
	}
	if es := al.Find(audit.UnmanagedDevice, audit.Reported); len(es) != 0 {
		t.Fatalf("reported as well: %+v", es)
	}
	waitFor(t, "the fence tried again until it stands", func() bool { return c.M.Blocklisted(dv.ClientAddr) })
	waitFor(t, "the fence audited", func() bool { return len(al.Find(audit.UnmanagedDevice, audit.Fenced)) == 1 })
	u := nodestate.Unmanaged{Dev: dv, Verdict: claim.FenceIntruder, Why: "rbd/held is held rwo by node-a@1", FenceErr: "the monitors refused"}
	if p := u.Problem(); !strings.Contains(p, "and NOT fenced: the monitors refused") || strings.Contains(p, "not checked yet") {
		t.Fatalf("status line of an unfenced intruder: %q", p)
	}
}

// TestUnmanagedWithANameTheAgentRefusesIsReported: a mapping made outside rbd-owner of an image
// whose name rbd-owner does not accept (no claim can name it) is reported as unprotected at
// once, under every policy: never left "not checked yet" and judged again forever.
func TestUnmanagedWithANameTheAgentRefusesIsReported(t *testing.T) {
	c := newMemCluster("c1", "rbd", "fsid-oddname")
	n, al := startIntrusionDaemon(t, c, config.UnmanagedAdoptOrFence)
	addImage(n, c, "a=b")
	dv := handMap(t, n, c, "a=b", "noshare")
	waitFor(t, "reported", func() bool { return len(al.Find(audit.UnmanagedDevice, audit.Reported)) == 1 })
	e := al.Find(audit.UnmanagedDevice, audit.Reported)[0]
	if !strings.Contains(e.Message, "no claim protects it") || !strings.Contains(e.Message, "a=b") {
		t.Fatalf("report: %+v", e)
	}
	for _, d := range n.d.Status().Devices {
		if d.Device == dv.DevNode && (strings.Contains(d.Problem, "not checked yet") || !strings.Contains(d.Problem, "no claim protects it")) {
			t.Fatalf("status line: %q", d.Problem)
		}
	}
	if _, ok := n.d.state.Get(state.Key{Cluster: "c1", Ref: krbd.Spec{Pool: c.Pool, Image: "a=b"}}); ok {
		t.Fatal("adopted an image whose name the agent refuses")
	}
}

// TestMapOptionsTheClusterAlsoSets: a StorageClass's mapOptions often repeat what the cluster
// needs (ms_mode=secure on a msgr2-only cluster), which the agent's map_options set too. The
// same option with the same value reaches the kernel once; with another value the map is
// refused before anything is claimed, naming the option.
func TestMapOptionsTheClusterAlsoSets(t *testing.T) {
	c1, c2 := newMemCluster("c1", "rbd", "fsid-msgr2"), newMemCluster("c2", "rbd2", "fsid-msgr2")
	n := startMemDaemonWith(t, func(o *Options) {
		o.Config.Clusters[0].Monitors = []string{"203.0.113.1:3300", "203.0.113.2:3300", "203.0.113.3:3300"}
		o.Config.Clusters[0].MapOptions = []string{"ms_mode=secure"}
	}, c1, c2)
	t.Cleanup(func() { n.stop() })
	addImage(n, c1, "same")
	addImage(n, c1, "other")
	mons := []string{"203.0.113.1:3300,203.0.113.2:3300,203.0.113.3:3300"}
	if _, err := n.d.Map(context.Background(), api.MapRequest{Monitors: mons, Pool: "rbd", Image: "same",
		Options: []string{"noudev", "ms_mode=secure"}}, nil); err != nil {
		t.Fatalf("a map whose options repeat the cluster's ms_mode: %v", err)
	}
	writes := strings.Join(n.kernel.Writes(), "\n")
	if strings.Count(writes, "ms_mode=secure") != 1 {
		t.Fatalf("ms_mode=secure reached the kernel %d times, want once: %s", strings.Count(writes, "ms_mode=secure"), writes)
	}
	before := len(n.kernel.Writes())
	_, err := n.d.Map(context.Background(), api.MapRequest{Monitors: mons, Pool: "rbd", Image: "other",
		Options: []string{"noudev", "ms_mode=crc"}}, nil)
	if e := server.APIError(err); e.Code != api.CodeInvalidArgument || !strings.Contains(e.Message, `option "ms_mode"`) ||
		!strings.Contains(e.Message, "map_options") || strings.Contains(e.Message, "crc") {
		t.Fatalf("a map whose ms_mode differs from the cluster's: %+v", e)
	}
	if len(n.kernel.Writes()) != before {
		t.Fatalf("the refused map wrote to the kernel: %v", n.kernel.Writes()[before:])
	}
	s, err := claim.NewStoreOn(c1.M, claim.Config{Node: claim.Node{ID: "observer"}})
	if err != nil {
		t.Fatal(err)
	}
	if rec, err := s.Inspect(context.Background(), claim.Image{Pool: "rbd", Image: "other"}); !errors.Is(err, claim.ErrNoClaim) {
		t.Fatalf("the refused map left a claim: %+v (%v)", rec, err)
	}
}

// A map whose options the kernel would refuse is refused before its claim is written: here the
// caller asks for msgr2 (ms_mode) of a cluster whose monitors are listed as v1 addresses only.
func TestMapTheKernelWouldRefuseClaimsNothing(t *testing.T) {
	c1 := newMemCluster("c1", "rbd", "fsid-v1")
	n := startMemDaemonWith(t, func(o *Options) {
		o.Config.Clusters[0].Monitors = []string{"v1:203.0.113.1:6789", "[v1:203.0.113.2:6789/0]"}
	}, c1)
	t.Cleanup(func() { n.stop() })
	addImage(n, c1, "img")
	var mu sync.Mutex
	var calls []string
	c1.M.SetHook(func(_ context.Context, call string, img claim.Image) error {
		if img.Image == "img" && call != "read" && call != "image" && call != "imageid" {
			mu.Lock()
			calls = append(calls, call)
			mu.Unlock()
		}
		return nil
	})
	_, err := n.d.Map(context.Background(), api.MapRequest{Cluster: "c1", Pool: "rbd", Image: "img",
		Options: []string{"noudev", "ms_mode=secure"}}, nil)
	if e := server.APIError(err); e.Code != api.CodeInvalidArgument || !strings.Contains(e.Message, "no monitor address for the kernel's msgr2") {
		t.Fatalf("a map of v1-only monitors under ms_mode: %+v", e)
	}
	mu.Lock()
	changed := slices.Clone(calls)
	mu.Unlock()
	if len(changed) != 0 {
		t.Fatalf("the refused map changed the image's claim: %v", changed)
	}
	if w := n.kernel.Writes(); len(w) != 0 {
		t.Fatalf("the refused map wrote to the kernel: %v", w)
	}
	// without the ms_mode, the same cluster maps
	if _, err := n.d.Map(context.Background(), api.MapRequest{Cluster: "c1", Pool: "rbd", Image: "img", Options: []string{"noudev"}}, nil); err != nil {
		t.Fatalf("a map over msgr1: %v", err)
	}
	if w := strings.Join(n.kernel.Writes(), "\n"); !strings.Contains(w, "203.0.113.1:6789,203.0.113.2:6789 ") {
		t.Fatalf("the kernel was not given the v1 monitors: %s", w)
	}
}
