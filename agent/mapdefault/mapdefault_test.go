package mapdefault_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"

	"github.com/rbd-owner/rbd-owner/agent/image"
	"github.com/rbd-owner/rbd-owner/agent/internal/cephtest"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/mapdefault"
)

// configSet sets (value != "") or removes rbd_default_map_options for who in the monitors'
// config store, as `ceph config set|rm` does.
func configSet(t *testing.T, admin *rados.Conn, who, value string) {
	t.Helper()
	cmd := map[string]string{"prefix": "config rm", "who": who, "name": mapdefault.Option}
	if value != "" {
		cmd = map[string]string{"prefix": "config set", "who": who, "name": mapdefault.Option, "value": value}
	}
	b, _ := json.Marshal(cmd)
	if _, st, err := admin.MonCommand(b); err != nil {
		t.Fatalf("%s: %v (%s)", b, err, st)
	}
}

// readWithin reads ref's defaults until they are want, or fails after 30 s.
func readWithin(t *testing.T, conn *rados.Conn, ref image.Ref, want krbd.ClusterDefaults) {
	t.Helper()
	var got krbd.ClusterDefaults
	var err error
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if got, err = mapdefault.Read(conn, ref); err == nil && got == want {
			return
		}
	}
	t.Fatalf("Read(%s) = %+v, %v; want %+v", ref, got, err, want)
}

// TestTheClustersMapOptionsAreReadAsRbdReadsThem, on the test cluster: the client configuration
// the monitors hand out at connect, then a pool's override, then an image's, each the most
// specific one winning whole; the pool's and the image's are read again at every call.
func TestTheClustersMapOptionsAreReadAsRbdReadsThem(t *testing.T) {
	admin := cephtest.AdminConn(t)
	pool := cephtest.TempPool(t)
	name := cephtest.ImageIn(t, admin, pool, "")
	ref := image.Ref{Pool: pool, Image: name}
	// set for client.admin and read as it: the agent's user is the other packages' daemons',
	// which connect to this cluster meanwhile and must not map with this test's options
	who := "client.admin"

	readWithin(t, cephtest.AdminConn(t), ref, krbd.ClusterDefaults{Level: krbd.LevelConfig})
	t.Cleanup(func() { configSet(t, admin, who, "") })
	configSet(t, admin, who, "ms_mode=secure")
	// librados takes the monitors' configuration when it connects (a connection made before
	// the change keeps the old value: docs/configuration.md says so)
	conn := cephtest.AdminConn(t)
	readWithin(t, conn, ref, krbd.ClusterDefaults{Options: "ms_mode=secure", Level: krbd.LevelConfig})

	io, err := admin.OpenIOContext(pool)
	if err != nil {
		t.Fatal(err)
	}
	defer io.Destroy()
	if err := rbd.SetPoolMetadata(io, mapdefault.MetadataKey, "queue_depth=64"); err != nil {
		t.Fatal(err)
	}
	readWithin(t, conn, ref, krbd.ClusterDefaults{Options: "queue_depth=64", Level: krbd.LevelPool})

	im, err := rbd.OpenImage(io, name, rbd.NoSnapshot)
	if err != nil {
		t.Fatal(err)
	}
	if err := im.SetMetadata(mapdefault.MetadataKey, "alloc_size=65536"); err != nil {
		t.Fatal(err)
	}
	_ = im.Close()
	readWithin(t, conn, ref, krbd.ClusterDefaults{Options: "alloc_size=65536", Level: krbd.LevelImage})
	// the agent's own user (osd 'profile rbd') reads the pool's and the image's levels too
	readWithin(t, cephtest.Conn(t), ref, krbd.ClusterDefaults{Options: "alloc_size=65536", Level: krbd.LevelImage})

	gone := image.Ref{Pool: pool, Image: "no-such-image"}
	readWithin(t, conn, gone, krbd.ClusterDefaults{Options: "queue_depth=64", Level: krbd.LevelPool})
}
