// Package cephtest connects tests to the throwaway cluster that tests/ceph/up starts.
//
// The cluster is found through the variables tests/ceph/up writes to DIR/env. Without them a
// test is skipped with a message saying how to start one, unless RBD_OWNER_REQUIRE_CLUSTER=1
// (set by `make test`), which turns the skip into a failure. A named cluster that does not
// answer fails within cephconn's deadline; it never hangs.
package cephtest

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"

	"github.com/rbd-owner/rbd-owner/agent/cephconn"
)

// Pool and Namespace exist in every test cluster (tests/ceph/up creates them).
const (
	Pool      = "rbd"
	Namespace = "ns1"
)

const howTo = "no test cluster: start one with `tests/ceph/up /tmp/rbd-owner-ceph && source /tmp/rbd-owner-ceph/env` " +
	"(stop it with `tests/ceph/down /tmp/rbd-owner-ceph --purge`), or run `make test`"

// Options returns how to reach the test cluster as the agent's least-privilege user.
func Options(t testing.TB) cephconn.Options {
	t.Helper()
	conf := os.Getenv("RBD_OWNER_TEST_CEPH_CONF")
	if conf == "" {
		if os.Getenv("RBD_OWNER_REQUIRE_CLUSTER") == "1" {
			t.Fatal(howTo)
		}
		t.Skip(howTo)
	}
	return cephconn.Options{
		User:     os.Getenv("RBD_OWNER_TEST_USER"),
		Keyring:  os.Getenv("RBD_OWNER_TEST_KEYRING"),
		ConfFile: conf,
		Timeout:  10 * time.Second,
	}
}

// AdminOptions is Options as client.admin (for test set-up only: creating pools, images).
func AdminOptions(t testing.TB) cephconn.Options {
	o := Options(t)
	o.User = "admin"
	o.Keyring = os.Getenv("RBD_OWNER_TEST_ADMIN_KEYRING")
	return o
}

// Conn connects as the agent's user; the connection is shut down when the test ends.
func Conn(t testing.TB) *rados.Conn {
	t.Helper()
	return connect(t, Options(t))
}

// AdminConn connects as client.admin; the connection is shut down when the test ends.
func AdminConn(t testing.TB) *rados.Conn {
	t.Helper()
	return connect(t, AdminOptions(t))
}

func connect(t testing.TB, o cephconn.Options) *rados.Conn {
	t.Helper()
	conn, err := cephconn.Connect(o)
	if err != nil {
		t.Fatalf("%v (is the test cluster at %s running?)", err, o.ConfFile)
	}
	t.Cleanup(conn.Shutdown)
	return conn
}

// UniqueName returns prefix plus random hex, so tests sharing a cluster never collide.
func UniqueName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// Image creates a small image in pool/namespace as admin and removes it when the test ends.
// It returns the image's name.
func Image(t testing.TB, admin *rados.Conn, namespace string) string {
	t.Helper()
	return ImageIn(t, admin, Pool, namespace)
}

// ImageIn is Image in another pool (one of TempPool's).
func ImageIn(t testing.TB, admin *rados.Conn, pool, namespace string) string {
	t.Helper()
	name := UniqueName("img-")
	ioctx, err := admin.OpenIOContext(pool)
	if err != nil {
		t.Fatalf("open pool %s: %v", pool, err)
	}
	ioctx.SetNamespace(namespace)
	opts := rbd.NewRbdImageOptions()
	defer opts.Destroy()
	if err := opts.SetUint64(rbd.ImageOptionFeatures, rbd.FeatureLayering); err != nil {
		t.Fatal(err)
	}
	if err := rbd.CreateImage(ioctx, name, 16<<20, opts); err != nil {
		ioctx.Destroy()
		t.Fatalf("create image %s/%s/%s: %v", pool, namespace, name, err)
	}
	t.Cleanup(func() {
		defer ioctx.Destroy()
		// best effort: a test may have removed it already
		_ = rbd.RemoveImage(ioctx, name)
	})
	return name
}

// TempPool creates a pool of the calling test's own, initialised for rbd, and deletes it when
// the test ends. It is for a test that acts on every claim of a pool (removing orphaned claims):
// the shared pool holds other tests' claims, some of them orphans for a moment by design, and
// the tests of other packages run at the same time.
func TempPool(t testing.TB) string {
	t.Helper()
	admin := AdminConn(t)
	name := UniqueName("pool-")
	if err := admin.MakePool(name); err != nil {
		t.Fatalf("create pool %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := admin.DeletePool(name); err != nil {
			t.Errorf("delete pool %s: %v", name, err)
		}
	})
	ioctx, err := admin.OpenIOContext(name)
	if err != nil {
		t.Fatalf("open pool %s: %v", name, err)
	}
	defer ioctx.Destroy()
	if err := rbd.PoolInit(ioctx, false); err != nil { // also waits for its placement groups
		t.Fatalf("rbd pool init %s: %v", name, err)
	}
	return name
}

// MonitorV1 returns the test cluster's monitor msgr1 address ("127.0.0.1:PORT"), the form
// the kernel client and the agent's config take.
func MonitorV1(t testing.TB) string {
	t.Helper()
	return monitorV1Of(t, Options(t).ConfFile)
}

func monitorV1Of(t testing.TB, conf string) string {
	t.Helper()
	data, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(line, "=")
		if !ok || strings.TrimSpace(k) != "mon_host" {
			continue
		}
		for _, part := range strings.Split(strings.Trim(strings.TrimSpace(v), "[]"), ",") {
			if a, ok := strings.CutPrefix(part, "v1:"); ok {
				return a
			}
		}
	}
	t.Fatalf("no msgr1 monitor address in %s", conf)
	return ""
}

// Secret returns the agent user's base64 key from its keyring.
func Secret(t testing.TB) string {
	t.Helper()
	return secretOf(t, Options(t).Keyring)
}

func secretOf(t testing.TB, keyring string) string {
	t.Helper()
	data, err := os.ReadFile(keyring)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && strings.TrimSpace(k) == "key" {
			return strings.TrimSpace(v)
		}
	}
	t.Fatal("no key in the agent's keyring")
	return ""
}
