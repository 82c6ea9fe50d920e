package daemon

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/cephconn"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/fault"
	"github.com/rbd-owner/rbd-owner/agent/image"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
)

// withMapDefaults makes the daemon's connections read the cluster's rbd_default_map_options
// through read.
func withMapDefaults(mc *memCluster, read func(image.Ref) (krbd.ClusterDefaults, error)) func(*Options) {
	return func(o *Options) {
		o.Connect = func(context.Context, config.Cluster) (Connection, error) {
			return Connection{Backend: mc.M, Secret: memSecret, MapDefaults: read}, nil
		}
	}
}

// TestAMapTakesTheClustersDefaultOptionsUnlessTheCallerSetsThem: the cluster's
// rbd_default_map_options reach the kernel's add string for every option the caller leaves out;
// the caller's own value wins; status and the map's audit line say where each option came from.
func TestAMapTakesTheClustersDefaultOptionsUnlessTheCallerSetsThem(t *testing.T) {
	mc := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000001")
	var asked []image.Ref
	n := startMemDaemonWith(t, withMapDefaults(mc, func(ref image.Ref) (krbd.ClusterDefaults, error) {
		asked = append(asked, ref)
		return krbd.ClusterDefaults{Options: "queue_depth=64,alloc_size=65536,share", Level: krbd.LevelPool}, nil
	}), mc)
	defer n.stop()
	mc.M.AddImage(claim.Image{Pool: "rbd", Image: "d1"}, "id-d1")
	n.kernel.AddImage("rbd", "", "d1", 16<<20)
	if _, err := n.d.Map(context.Background(), api.MapRequest{Cluster: "c1", Pool: "rbd", Image: "d1", Options: []string{"queue_depth=128"}}, nil); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(asked, image.Ref{Pool: "rbd", Image: "d1"}) {
		t.Errorf("the defaults were read for %v, want rbd/d1", asked)
	}
	add := ""
	for _, w := range n.kernel.Writes() {
		if strings.Contains(w, " d1 ") {
			add = w
		}
	}
	for _, want := range []string{",queue_depth=128", ",alloc_size=65536"} {
		if !strings.Contains(add, want) {
			t.Errorf("the kernel's add string %q lacks %s", add, want)
		}
	}
	if strings.Contains(add, "queue_depth=64") || strings.Contains(add, ",share") {
		t.Errorf("the kernel's add string %q has a cluster default the caller overrode or the agent sets itself", add)
	}
	from := map[string]string{}
	for _, dv := range n.d.Status().Devices {
		for _, o := range dv.Options {
			from[o.Option] = o.From
		}
	}
	if from["queue_depth=128"] != krbd.FromCaller || from["alloc_size=65536"] != krbd.FromCluster+" (pool)" ||
		!strings.Contains(from["share"], "not applied") {
		t.Errorf("status's options: %v", from)
	}
	maps := n.audited(audit.Map)
	if len(maps) != 1 || !strings.Contains(maps[0].Message, "alloc_size=65536 ("+krbd.FromCluster+" (pool))") {
		t.Errorf("the map's audit entries %+v, want one naming the cluster's option and its level", maps)
	}
}

// TestAMapWhoseClusterDefaultsCannotBeReadClaimsNothing: a cluster that does not answer the
// read of its defaults gets a refusal classified as unavailable, and no claim is made.
func TestAMapWhoseClusterDefaultsCannotBeReadClaimsNothing(t *testing.T) {
	mc := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000001")
	n := startMemDaemonWith(t, withMapDefaults(mc, func(image.Ref) (krbd.ClusterDefaults, error) {
		return krbd.ClusterDefaults{}, errors.Join(cephconn.ErrUnavailable, errors.New("open pool rbd: ret=-110"))
	}), mc)
	defer n.stop()
	mc.M.AddImage(claim.Image{Pool: "rbd", Image: "d2"}, "id-d2")
	n.kernel.AddImage("rbd", "", "d2", 16<<20)
	_, err := n.d.Map(context.Background(), api.MapRequest{Cluster: "c1", Pool: "rbd", Image: "d2"}, nil)
	if !fault.Is(err, fault.Unavailable) || !strings.Contains(err.Error(), "rbd_default_map_options") {
		t.Fatalf("map: %v (%v), want unavailable naming the setting", err, fault.KindOf(err))
	}
	if st := n.d.Status(); st.ClaimsHeld != 0 || len(st.Devices) != 0 {
		t.Errorf("after the refused map: %d claims held, devices %+v; want none", st.ClaimsHeld, st.Devices)
	}
}

// TestARotatedKeyIsUsedAtTheNextMapAndStatusCountsMappingsOfThePriorKey: the keyring is read at
// every map, so a key rotated in the keyring (the cluster keeping the prior one) maps the next
// image with no restart; status and the metric count the mappings made with the prior key until
// they are unmapped; a key rotated to aes256k on a kernel before 7.0 refuses the map, claiming
// nothing.
func TestARotatedKeyIsUsedAtTheNextMapAndStatusCountsMappingsOfThePriorKey(t *testing.T) {
	mc := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000001")
	const newKey = "AQBzXHxlAAAAABAAAQIDBAUGBwgJCgsMDQ4PEA=="                      // aes, another secret
	const aes256k = "AgAAAAAAAAAAACAAAQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA=" // type 2, 32 bytes
	var mu sync.Mutex
	key := memSecret
	n := startMemDaemonWith(t, func(o *Options) {
		o.KernelRelease, o.LibradosRelease = "6.12.48+deb13-amd64", "20.2.4"
		o.Connect = func(context.Context, config.Cluster) (Connection, error) {
			return Connection{Backend: mc.M, Secret: memSecret, Key: func() (string, error) { mu.Lock(); defer mu.Unlock(); return key, nil }}, nil
		}
	}, mc)
	defer n.stop()
	if err := n.kernel.AddUser("u", newKey); err != nil {
		t.Fatal(err)
	}
	prior := func() int {
		for _, c := range n.d.Status().Clusters {
			if c.ID == "c1" {
				return c.PriorKeyMappings
			}
		}
		return -1
	}
	n.mapImage(t, mc, "k1")
	if p := prior(); p != 0 {
		t.Fatalf("before the rotation: %d mappings of a prior key, want 0", p)
	}
	mu.Lock()
	key = newKey
	mu.Unlock()
	n.mapImage(t, mc, "k2") // the fake kernel takes it only with a key it knows: the new one
	if p := prior(); p != 1 {
		t.Errorf("after the rotation: %d mappings of a prior key, want 1 (k1)", p)
	}
	if !strings.Contains(metricsText(t, n.d), `rbd_owner_prior_key_mappings{cluster="c1"} 1`) {
		t.Errorf("the metric does not count k1's mapping")
	}
	if _, err := n.d.Unmap(context.Background(), api.UnmapRequest{Cluster: "c1", Pool: "rbd", Image: "k1"}, nil); err != nil {
		t.Fatal(err)
	}
	if p := prior(); p != 0 {
		t.Errorf("after k1's unmap: %d mappings of a prior key, want 0", p)
	}
	mu.Lock()
	key = aes256k
	mu.Unlock()
	mc.M.AddImage(claim.Image{Pool: "rbd", Image: "k3"}, "id-k3")
	n.kernel.AddImage("rbd", "", "k3", 16<<20)
	_, err := n.d.Map(context.Background(), api.MapRequest{Cluster: "c1", Pool: "rbd", Image: "k3"}, nil)
	if err == nil || !strings.Contains(err.Error(), "the key is aes256k, which this node cannot use: its kernel 6.12.48+deb13-amd64 needs Linux 7.0 (its librados 20.2.4 reads it)") {
		t.Fatalf("a map with an aes256k key on 6.12: %v, want refused naming the type, the kernel and librados", err)
	}
	if st := n.d.Status(); st.ClaimsHeld != 1 {
		t.Errorf("%d claims held after the refused map, want 1 (k2)", st.ClaimsHeld)
	}
}

// metricsText is what the daemon's /metrics serves now.
func metricsText(t *testing.T, d *Daemon) string {
	t.Helper()
	rec := httptest.NewRecorder()
	d.metrics.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://rbd-owner/metrics", nil))
	return rec.Body.String()
}

// TestTheAgentRefusesToStartWithAKeyItsKernelCannotUse: an aes256k key in a cluster's keyring
// on a kernel before Linux 7.0, or with a librados before Ceph 19.2.6 and 20.2.4, stops the start
// with the one line check-config gives, naming both; on 7.0 with a librados that reads it the
// agent starts.
func TestTheAgentRefusesToStartWithAKeyItsKernelCannotUse(t *testing.T) {
	kr := filepath.Join(t.TempDir(), "keyring")
	if err := os.WriteFile(kr, []byte("[client.u]\n\tkey = AgAAAAAAAAAAACAAAQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA=\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, "node-k", time.Second, config.Cluster{ID: "c1", Monitors: []string{"203.0.113.1:6789"}, User: "u", Keyring: kr})
	for _, tc := range []struct{ kernel, librados, refusal string }{
		{"6.1.0-40-amd64", "16.2.15", "its kernel 6.1.0-40-amd64 needs Linux 7.0 and its librados 16.2.15 needs Ceph 19.2.6 or 20.2.4"},
		{"7.2.0", "19.2.3", "its librados 19.2.3 needs Ceph 19.2.6 or 20.2.4 (its kernel 7.2.0 reads it)"},
	} {
		_, err := New(Options{Config: cfg, Log: quietLog(), KernelRelease: tc.kernel, LibradosRelease: tc.librados})
		want := "clusters[0] (c1): client.u's key in " + kr + ": invalid argument: the key is aes256k, which this node cannot use: " + tc.refusal + ": keep this user's key aes"
		if err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Fatalf("New on %s with librados %s and an aes256k key: %v, want refused: %s...", tc.kernel, tc.librados, err, want)
		}
	}
	if _, err := New(Options{Config: cfg, Log: quietLog(), KernelRelease: "7.2.0", LibradosRelease: "20.2.4"}); err != nil {
		t.Fatalf("New on 7.2 with librados 20.2.4 and an aes256k key: %v", err)
	}
}
