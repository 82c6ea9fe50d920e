package daemon

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/fault"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
	"github.com/rbd-owner/rbd-owner/agent/server"
)

// scrape reads GET /metrics through the API handler as a caller of role, and parses it.
func scrape(t *testing.T, d *Daemon, role peercred.Role) (int, map[string]*dto.MetricFamily) {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, api.PathMetrics, nil)
	req = req.WithContext(server.WithCaller(req.Context(), server.Caller{Role: role, Known: true, Socket: server.SocketMain}))
	rec := httptest.NewRecorder()
	d.Handler().ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		return rec.Code, nil
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	return rec.Code, fams
}

// sample is the value of the series of family name whose labels include want; ok is false
// when there is none. Counters, gauges and histograms (their sample count).
func sample(fams map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.Metric {
		have := map[string]string{}
		for _, l := range m.Label {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		}
	}
	return 0, false
}

type lbl = map[string]string

// TestMetricsCountWhatHappened drives one daemon through maps, refusals, a takeover, a fenced
// intruder, an admin fence that loses a claim, a device unmapped behind its back and an unmap,
// and checks that GET /metrics says exactly that.
func TestMetricsCountWhatHappened(t *testing.T) {
	c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-0000000000a1")
	mono := &monoClock{}
	n := startMemDaemonWith(t, func(o *Options) {
		o.Mono = mono.Now
		o.Config.Unmanaged = config.UnmanagedFenceIfClaimed
	}, c)
	defer n.stop()
	d := n.d
	ctx := context.Background()
	value := func(fams map[string]*dto.MetricFamily, name string, labels lbl) float64 {
		t.Helper()
		v, ok := sample(fams, name, labels)
		if !ok {
			t.Fatalf("no series %s%v in /metrics", name, labels)
		}
		return v
	}
	now := func() map[string]*dto.MetricFamily {
		t.Helper()
		code, fams := scrape(t, d, peercred.RoleCSI)
		if code != http.StatusOK {
			t.Fatalf("GET /metrics as the CSI role: %d", code)
		}
		return fams
	}
	waitValue := func(name string, labels lbl, want float64) {
		t.Helper()
		waitFor(t, name, func() bool { v, _ := sample(now(), name, labels); return v == want })
	}
	if code, _ := scrape(t, d, peercred.RoleNone); code != http.StatusForbidden {
		t.Fatalf("GET /metrics without a role: %d, want 403", code)
	}

	// a map; the claim is held and its liveness written
	n.mapImage(t, c, "a")
	fams := now()
	if v := value(fams, "rbd_owner_claims", lbl{"cluster": "c1", "state": "held"}); v != 1 {
		t.Fatalf("claims held after one map: %v", v)
	}
	for _, op := range []lbl{{"op": "setkeys", "object": "index"}, {"op": "write", "object": "claim"}, {"op": "image", "object": "image"}} {
		op["cluster"] = "c1"
		if v := value(fams, "rbd_owner_cluster_ops_total", op); v < 1 {
			t.Fatalf("cluster ops %v after one map: %v, want at least 1", op, v)
		}
	}
	waitFor(t, "a liveness write", func() bool { return d.renewed.Load() > 0 })
	renewed := d.renewed.Load()
	if v := value(now(), "rbd_owner_liveness_writes_total", lbl{"cluster": "c1", "result": "ok"}); v < float64(renewed) {
		t.Fatalf("liveness writes %v, but the daemon renewed %d times", v, renewed)
	}

	// refusals: an image another node holds, a cluster the config does not name
	addImage(n, c, "held")
	holdElsewhere(t, c, "held", "10.9.9.9:0/1")
	if _, err := d.Map(ctx, api.MapRequest{Cluster: "c1", Pool: "rbd", Image: "held"}, nil); !fault.Is(err, fault.ClaimedElsewhere) {
		t.Fatalf("map of a held image: %v", err)
	}
	if _, err := d.Map(ctx, api.MapRequest{Cluster: "nope", Pool: "rbd", Image: "x"}, nil); !fault.Is(err, fault.Invalid) {
		t.Fatalf("map on an unknown cluster: %v", err)
	}

	// an intruder: a plain rbd map of the image node-a holds is fenced
	handMap(t, n, c, "held", "noshare")
	waitValue("rbd_owner_intruders_fenced_total", lbl{"cluster": "c1"}, 1)
	waitValue("rbd_owner_unmanaged_devices", lbl{"cluster": "c1", "verdict": "fenced"}, 1)

	// a takeover of a holder whose lease ran out (on this node's clock): one refused look first
	// (after the intruder, which is fenced only while node-a's lease is live)
	addImage(n, c, "taken")
	holdElsewhere(t, c, "taken", "10.9.9.8:0/1")
	take := api.MapRequest{Cluster: "c1", Pool: "rbd", Image: "taken", Takeover: true}
	if _, err := d.Map(asAdmin(ctx), take, nil); !fault.Is(err, fault.ClaimedElsewhere) {
		t.Fatalf("first look at a held image: %v", err)
	}
	mono.Advance(30 * time.Second) // a retry within holdElsewhere's lease (1 min)
	if _, err := d.Map(asAdmin(ctx), take, nil); !fault.Is(err, fault.ClaimedElsewhere) {
		t.Fatalf("a look half a lease in: %v", err)
	}
	mono.Advance(31 * time.Second) // a whole lease of silence since the first look
	if _, err := d.Map(asAdmin(ctx), take, nil); err != nil {
		t.Fatalf("takeover: %v", err)
	}

	// an admin fences this node's own claim on a: the renewals find it lost, and the agent
	// keeps its own mapping fenced
	if _, err := d.admin.Fence(ctx, api.ImageRequest{Cluster: "c1", Pool: "rbd", Image: "a"}, nil); err != nil {
		t.Fatalf("fence: %v", err)
	}
	waitValue("rbd_owner_claims", lbl{"cluster": "c1", "state": "lost"}, 1)
	waitValue("rbd_owner_fences_total", lbl{"cluster": "c1", "cause": "own_lost"}, 1)

	// a managed device unmapped behind the agent's back
	rb := n.mapImage(t, c, "b")
	dv, err := d.kernel.FindByPath(rb.Device)
	if err != nil {
		t.Fatal(err)
	}
	handUnmap(t, n, dv)
	waitValue("rbd_owner_device_lost_total", lbl{"cluster": "c1"}, 1)

	// an unmap
	if _, err := d.Unmap(ctx, api.UnmapRequest{Cluster: "c1", Pool: "rbd", Image: "taken"}, nil); err != nil {
		t.Fatalf("unmap: %v", err)
	}

	fams = now()
	for _, w := range []struct {
		name   string
		labels lbl
		want   float64
	}{
		{"rbd_owner_maps_total", lbl{"cluster": "c1", "result": "ok"}, 3}, // a, taken, b
		{"rbd_owner_maps_total", lbl{"cluster": "c1", "result": "claimed_elsewhere"}, 3},
		{"rbd_owner_maps_total", lbl{"cluster": "unknown", "result": "invalid_argument"}, 1},
		{"rbd_owner_map_duration_seconds", lbl{"cluster": "c1"}, 6},
		{"rbd_owner_map_duration_seconds", lbl{"cluster": "unknown"}, 1},
		{"rbd_owner_map_refusals_total", lbl{"cluster": "c1", "reason": "claimed_elsewhere"}, 3},
		{"rbd_owner_map_refusals_total", lbl{"cluster": "unknown", "reason": "invalid_argument"}, 1},
		{"rbd_owner_takeovers_total", lbl{"cluster": "c1"}, 1},
		{"rbd_owner_fences_total", lbl{"cluster": "c1", "cause": "takeover"}, 1},
		{"rbd_owner_fences_total", lbl{"cluster": "c1", "cause": "admin"}, 1},
		{"rbd_owner_fences_total", lbl{"cluster": "c1", "cause": "own_lost"}, 1},
		{"rbd_owner_intruders_fenced_total", lbl{"cluster": "c1"}, 1},
		{"rbd_owner_claims_lost_total", lbl{"cluster": "c1"}, 1},
		{"rbd_owner_device_lost_total", lbl{"cluster": "c1"}, 1},
		{"rbd_owner_unmaps_total", lbl{"cluster": "c1", "result": "ok"}, 1},
		{"rbd_owner_unmap_duration_seconds", lbl{"cluster": "c1"}, 1},
		{"rbd_owner_claims", lbl{"cluster": "c1", "state": "held"}, 0},
		{"rbd_owner_claims", lbl{"cluster": "c1", "state": "lost"}, 1},
		{"rbd_owner_claims", lbl{"cluster": "c1", "state": "claiming"}, 0},
		{"rbd_owner_unmanaged_devices", lbl{"cluster": "c1", "verdict": "fenced"}, 1},
		{"rbd_owner_unmanaged_devices", lbl{"cluster": "c1", "verdict": "reported"}, 0},
		{"rbd_owner_cluster_connected", lbl{"cluster": "c1"}, 1},
		{"rbd_owner_build_info", lbl{"version": "dev"}, 1},
	} {
		if v := value(fams, w.name, w.labels); v != w.want {
			t.Errorf("%s%v = %v, want %v", w.name, w.labels, v, w.want)
		}
	}
	if v := value(fams, "rbd_owner_adoptions_total", lbl{"cluster": "c1"}); v != 0 {
		t.Errorf("%v adoptions counted; none happened", v)
	}
	for _, name := range []string{"rbd_owner_recovery_duration_seconds", "rbd_owner_liveness_write_age_seconds", "go_goroutines", "process_open_fds"} {
		if _, ok := sample(fams, name, nil); !ok {
			t.Errorf("no %s in /metrics", name)
		}
	}
	// no unbounded labels unless per_image_metrics is on
	if _, ok := fams["rbd_owner_claim_info"]; ok {
		t.Error("rbd_owner_claim_info without per_image_metrics")
	}
	for name, f := range fams {
		for _, m := range f.Metric {
			for _, l := range m.Label {
				if l.GetName() == "image" || l.GetName() == "device" || strings.HasPrefix(l.GetValue(), "/dev/") {
					t.Errorf("%s has an unbounded label %s=%s", name, l.GetName(), l.GetValue())
				}
			}
		}
	}
	// status says the same: the age of the last liveness write on c1
	st := d.Status()
	if len(st.Clusters) != 1 || st.Clusters[0].LivenessWriteAge == nil {
		t.Fatalf("status shows no liveness write age: %+v", st.Clusters)
	}
}

// TestPerImageMetrics: per_image_metrics adds one series per claim, with its image.
func TestPerImageMetrics(t *testing.T) {
	c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-0000000000a2")
	n := startMemDaemonWith(t, func(o *Options) { o.Config.PerImageMetrics = true }, c)
	defer n.stop()
	r := n.mapImage(t, c, "img")
	_, fams := scrape(t, n.d, peercred.RoleCSI)
	if v, ok := sample(fams, "rbd_owner_claim_info", lbl{"cluster": "c1", "pool": "rbd", "image": "img", "device": r.Device, "state": "held"}); !ok || v != 1 {
		t.Fatalf("rbd_owner_claim_info for img: %v %v", v, ok)
	}
}

// TestMetricsListener: no TCP listener unless metrics_listen is set; with it, /metrics (and
// nothing else) is served there until the daemon stops.
func TestMetricsListener(t *testing.T) {
	c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-0000000000a3")
	off := startMemDaemon(t, c)
	if a := off.d.MetricsAddr(); a != "" {
		t.Fatalf("a metrics listener on %s without metrics_listen", a)
	}
	off.stop()

	on := startMemDaemonWith(t, func(o *Options) { o.Config.MetricsListen = "127.0.0.1:0" }, c)
	addr := on.d.MetricsAddr()
	if addr == "" {
		on.stop()
		t.Fatal("no metrics listener with metrics_listen set")
	}
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/metrics"); code != http.StatusOK || !strings.Contains(body, "rbd_owner_build_info{") {
		t.Fatalf("GET /metrics over TCP: %d %.200s", code, body)
	}
	if code, _ := get(api.PathStatus); code != http.StatusNotFound {
		t.Fatalf("GET %s over TCP: %d, want 404 (only metrics are served there)", api.PathStatus, code)
	}
	on.stop()
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Fatalf("the metrics listener %s still answers after the daemon stopped", addr)
	}
}

// TestMetricsPortTakenDoesNotStopTheAgent: a metrics_listen address another process holds
// does not keep the agent from starting (it would stop renewing its leases, and a start limit
// would end it failed): it starts, says so, and listens once the address is free.
func TestMetricsPortTakenDoesNotStopTheAgent(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := taken.Addr().String()
	c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000037")
	n := startMemDaemonWith(t, func(o *Options) { o.Config.MetricsListen = addr }, c)
	defer n.stop()
	if a := n.d.MetricsAddr(); a != "" {
		t.Fatalf("listening on %s while the address is taken", a)
	}
	taken.Close()
	waitFor(t, "the metrics listener once the address is free", func() bool { return n.d.MetricsAddr() == addr })
}
