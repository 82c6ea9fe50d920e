package daemon

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

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
			return Connection{Backend: mc.m, Secret: memSecret, MapDefaults: read}, nil
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
	defer n.stop(t)
	mc.m.AddImage(claim.Image{Pool: "rbd", Image: "d1"}, "id-d1")
	n.k.AddImage("rbd", "", "d1", 16<<20)
	if _, err := n.d.Map(context.Background(), api.MapRequest{Cluster: "c1", Pool: "rbd", Image: "d1", Options: []string{"queue_depth=128"}}, nil); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(asked, image.Ref{Pool: "rbd", Image: "d1"}) {
		t.Errorf("the defaults were read for %v, want rbd/d1", asked)
	}
	add := ""
	for _, w := range n.k.Writes() {
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
	defer n.stop(t)
	mc.m.AddImage(claim.Image{Pool: "rbd", Image: "d2"}, "id-d2")
	n.k.AddImage("rbd", "", "d2", 16<<20)
	_, err := n.d.Map(context.Background(), api.MapRequest{Cluster: "c1", Pool: "rbd", Image: "d2"}, nil)
	if !fault.Is(err, fault.Unavailable) || !strings.Contains(err.Error(), "rbd_default_map_options") {
		t.Fatalf("map: %v (%v), want unavailable naming the setting", err, fault.KindOf(err))
	}
	if st := n.d.Status(); st.ClaimsHeld != 0 || len(st.Devices) != 0 {
		t.Errorf("after the refused map: %d claims held, devices %+v; want none", st.ClaimsHeld, st.Devices)
	}
}
