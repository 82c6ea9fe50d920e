package krbd_test

// The real-kernel test. It runs only with RBD_OWNER_KRBD_REAL=1, inside a throwaway Debian
// guest with a real Ceph cluster (tests/vm/krbd-test does the whole run), as root:
//
//	RBD_OWNER_KRBD_REAL=1            enable
//	RBD_OWNER_KRBD_MON=ip:port       a monitor's address (msgr1; msgr2 with ms_mode in the options)
//	RBD_OWNER_KRBD_OPTIONS=a=b,c     further krbd options (ms_mode=secure), comma-separated; optional
//	RBD_OWNER_KRBD_USER=rbdowner     cephx id
//	RBD_OWNER_KRBD_KEYRING=path      its keyring
//	RBD_OWNER_KRBD_FSID=uuid         the cluster fsid (checked against cluster_fsid and the link)
//	RBD_OWNER_KRBD_IMAGES="rbd/img1 rbd/ns1/img2 rbd/img1@s1"  images to map (first: read-write I/O test)

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rbd-owner/rbd-owner/agent/devwatch"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
)

func TestRealKernel(t *testing.T) {
	if os.Getenv("RBD_OWNER_KRBD_REAL") != "1" {
		t.Skip("real-kernel krbd test: set RBD_OWNER_KRBD_REAL=1 (run by tests/vm/krbd-test inside a guest with a Ceph cluster)")
	}
	if os.Geteuid() != 0 {
		t.Fatal("the real-kernel test must run as root")
	}
	env := func(k string) string {
		v := os.Getenv(k)
		if v == "" {
			t.Fatalf("%s is not set", k)
		}
		return v
	}
	user, fsid := env("RBD_OWNER_KRBD_USER"), env("RBD_OWNER_KRBD_FSID")
	secret, err := krbd.ReadKeyringFile(env("RBD_OWNER_KRBD_KEYRING"), "client."+user)
	if err != nil {
		t.Fatal(err)
	}
	var specs []krbd.Spec
	for _, s := range strings.Fields(env("RBD_OWNER_KRBD_IMAGES")) {
		specs = append(specs, mustSpec(t, s))
	}
	o := krbd.MapOptions{Monitors: []string{env("RBD_OWNER_KRBD_MON")}, User: user, Secret: secret,
		MountTimeout: 20 * time.Second, Timeout: 60 * time.Second}
	if x := os.Getenv("RBD_OWNER_KRBD_OPTIONS"); x != "" {
		o.Extra = strings.Split(x, ",")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	// RBD_OWNER_KRBD_UDEV=wait (default) or no: whether maps wait for udevd to have run its
	// rules (MapOptions.NoUdev, rbd's -o noudev); every wait follows the kernel's own uevents
	noUdev := os.Getenv("RBD_OWNER_KRBD_UDEV") == "no"
	o.NoUdev = noUdev
	_, udevErr := os.Stat("/run/udev/control")
	c := krbd.New(krbd.Config{})
	t.Logf("maps wait for udevd: %v (udevd runs: %v); /sys/bus/rbd present before: %v", !noUdev, udevErr == nil, exists("/sys/bus/rbd"))

	w, err := devwatch.Start(ctx, devwatch.Config{Client: c})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()

	var mapped []krbd.Device
	defer func() { // never leave a device mapped
		for _, d := range mapped {
			if _, err := c.Unmap(context.Background(), d.ID, krbd.UnmapOptions{Force: true}); err != nil {
				t.Errorf("cleanup: unmap rbd%d: %v", d.ID, err)
			}
		}
	}()
	for i, sp := range specs {
		t0 := time.Now()
		d, err := c.Map(ctx, sp, o)
		if err != nil {
			t.Fatalf("map %s: %v", sp, err)
		}
		lat := time.Since(t0)
		mapped = append(mapped, d)
		t.Logf("FIGURE map %s -> %s (%d:%d) in %s; client_id=%s client_addr=%s size=%d",
			sp, d.DevNode, d.Major, d.Minor, lat.Round(time.Millisecond), d.ClientID, d.ClientAddr, d.Size)
		if d.Spec() != sp || d.ClusterFSID != fsid || d.ClientAddr == "" || d.Size == 0 {
			t.Errorf("device %+v", d)
		}
		// a second map of the same image is its own device and client (noshare)
		if i == 0 {
			d2, err := c.Map(ctx, sp, o)
			if err != nil {
				t.Fatalf("second map %s: %v", sp, err)
			}
			mapped = append(mapped, d2)
			if d2.ID == d.ID || d2.ClientID == d.ClientID || d2.ClientAddr == d.ClientAddr {
				t.Errorf("noshare: second map %+v shares with %+v", d2, d)
			}
		}
		// the secret is nowhere: config_info, udev database
		cfg, err := os.ReadFile(filepath.Join("/sys/bus/rbd/devices", itoa(d.ID), "config_info"))
		if err != nil {
			t.Errorf("config_info: %v", err)
		}
		t.Logf("config_info: %s", strings.TrimSpace(string(cfg)))
		for _, bad := range []string{secret, "secret=", "exclusive"} {
			if bytes.Contains(cfg, []byte(bad)) {
				t.Errorf("config_info contains %q", bad)
			}
		}
		if !bytes.Contains(cfg, []byte("noshare")) || !bytes.Contains(cfg, []byte("key=rbd-owner."+user+".")) {
			t.Errorf("config_info lacks noshare/key=: %s", cfg)
		}
		// the stable link
		link := filepath.Join("/dev/rbd-owner", fsid, sp.Pool)
		if sp.Namespace != "" {
			link = filepath.Join(link, sp.Namespace)
		}
		link = filepath.Join(link, sp.Image)
		if sp.Snap != "" {
			link += "@" + sp.Snap
		}
		if !noUdev && udevErr == nil {
			// a map that waited for udevd returns with its link made
			if _, err := os.Lstat(link); err != nil {
				t.Errorf("map %s waited for udevd but its link is not there yet: %v", sp, err)
			}
		}
		udevSettle(t)
		for _, args := range [][]string{{"info", "--query=all", "--name=" + d.DevNode}, {"info", "-a", "--name=" + d.DevNode}} {
			out, err := exec.CommandContext(ctx, "udevadm", args...).CombinedOutput()
			if err != nil {
				t.Errorf("udevadm %v: %v %s", args, err, out)
			}
			if bytes.Contains(out, []byte(secret)) || bytes.Contains(out, []byte("secret=")) {
				t.Errorf("udevadm %v shows the secret", args)
			}
		}
		if tgt, err := filepath.EvalSymlinks(link); err != nil || (i != 0 && tgt != d.DevNode) {
			t.Errorf("link %s -> %q, %v; want %s", link, tgt, err, d.DevNode)
		} else {
			t.Logf("link %s -> %s", link, tgt)
		}
		if got, err := c.FindByPath(link); err != nil || got.Spec() != sp {
			t.Errorf("FindByPath(%s) = %+v, %v", link, got, err)
		}
	}
	// I/O on the first (read-write) image: 1 MiB written with O_DIRECT, read back
	d := mapped[0]
	data := make([]byte, 1<<20)
	rand.Read(data)
	t0 := time.Now()
	if err := directIO(d.DevNode, data, true); err != nil {
		t.Fatalf("write %s: %v", d.DevNode, err)
	}
	t1 := time.Now()
	back := make([]byte, len(data))
	if err := directIO(d.DevNode, back, false); err != nil {
		t.Fatalf("read %s: %v", d.DevNode, err)
	}
	t.Logf("FIGURE 1 MiB O_DIRECT write %s, read %s, match %v", t1.Sub(t0).Round(time.Millisecond), time.Since(t1).Round(time.Millisecond), bytes.Equal(data, back))
	if !bytes.Equal(data, back) {
		t.Error("read back differs")
	}
	// and through the second mapping of the same image (its own client)
	if err := directIO(mapped[1].DevNode, back, false); err != nil || !bytes.Equal(data, back) {
		t.Errorf("read via %s: %v, match %v", mapped[1].DevNode, err, bytes.Equal(data, back))
	}

	// kernel errors, typed
	if _, err := c.Map(ctx, mustSpec(t, "rbd/no-such-image"), o); !errors.Is(err, krbd.ErrNotFound) {
		t.Errorf("missing image: %v", err)
	} else {
		t.Logf("missing image: %v", err)
	}
	bad := o
	bad.Secret = otherKey
	if _, err := c.Map(ctx, specs[0], bad); !errors.Is(err, krbd.ErrPermission) {
		t.Errorf("wrong key: %v", err)
	} else {
		t.Logf("wrong key: %v", err)
	}
	inval := o
	inval.Extra = []string{"queue_depth=0"}
	if _, err := c.Map(ctx, specs[0], inval); !errors.Is(err, krbd.ErrInvalid) {
		t.Errorf("queue_depth=0: %v", err)
	} else {
		t.Logf("bad option: %v", err)
	}
	unreach := o
	unreach.Monitors = []string{"203.0.113.254:6789"} // on the lab subnet, nobody there
	unreach.MountTimeout = 2 * time.Second
	t0 = time.Now()
	if _, err := c.Map(ctx, specs[0], unreach); !errors.Is(err, krbd.ErrTimeout) {
		t.Errorf("unreachable monitor: %v", err)
	} else {
		t.Logf("unreachable monitor (mount_timeout=2): %v after %s", err, time.Since(t0).Round(time.Millisecond))
	}
	// busy: hold the device open
	f, err := os.OpenFile(d.DevNode, os.O_RDONLY|unix.O_EXCL, 0)
	if err != nil {
		t.Fatal(err)
	}
	c2 := krbd.New(krbd.Config{EBusyRetry: 300 * time.Millisecond})
	if _, err := c2.Unmap(ctx, d.ID, krbd.UnmapOptions{}); !errors.Is(err, krbd.ErrBusy) {
		t.Errorf("unmap of an open device: %v", err)
	} else {
		t.Logf("open device: %v", err)
	}
	f.Close()

	// the write and the open above end in a close that udevd's inotify watch turns into a
	// change event, and its probe holds the device open a while: EBUSY for an unmap. Ceph's rbd
	// settles udevd after a second EBUSY; the unmaps below measure the unmap, not that race
	// (which, on a loaded guest, may outlast the 3 s EBUSY retry)
	udevSettle(t)
	for _, d := range mapped {
		t0 := time.Now()
		ok, err := c.Unmap(ctx, d.ID, krbd.UnmapOptions{})
		if !ok || err != nil {
			t.Errorf("unmap rbd%d: %v %v", d.ID, ok, err)
		}
		t.Logf("FIGURE unmap %s (%s) in %s", d.DevNode, d.Spec(), time.Since(t0).Round(time.Millisecond))
	}
	mapped = nil
	udevSettle(t)
	if l, _ := c.List(); len(l) != 0 {
		t.Errorf("still mapped: %+v", l)
	}
	if ents, _ := filepath.Glob("/dev/rbd-owner/*/*/*"); len(ents) != 0 {
		t.Errorf("links left after unmap: %v", ents)
	}
	if ok, err := c.Unmap(ctx, d.ID, krbd.UnmapOptions{}); ok || err != nil {
		t.Errorf("unmap of an unmapped device = %v, %v", ok, err)
	}
	// the watcher saw every map and unmap, with names on remove
	adds, removes := 0, 0
	deadline := time.After(10 * time.Second)
	for adds < len(specs)+1 || removes < len(specs)+1 {
		select {
		case e := <-w.Events():
			t.Logf("devwatch: %v %s rbd%d resync=%v", e.Kind, e.Device.Spec(), e.Device.ID, e.Resync)
			if e.Device.Pool == "" {
				t.Errorf("event without names: %+v", e)
			}
			if e.Kind == devwatch.Added {
				adds++
			} else {
				removes++
			}
		case <-deadline:
			t.Fatalf("devwatch: %d adds, %d removes; want %d each", adds, removes, len(specs)+1)
		}
	}
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

func itoa(i int) string { return strconv.Itoa(i) }

// directIO writes or reads buf at offset 0 with O_DIRECT (buf must be 4 KiB aligned in size;
// the allocation from make of 1 MiB is page aligned in practice, checked here).
func directIO(path string, buf []byte, write bool) error {
	flag := os.O_RDONLY
	if write {
		flag = os.O_WRONLY
	}
	fd, err := unix.Open(path, flag|unix.O_DIRECT, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	aligned, err := unix.Mmap(-1, 0, len(buf), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return err
	}
	defer unix.Munmap(aligned)
	if write {
		copy(aligned, buf)
		_, err = unix.Pwrite(fd, aligned, 0)
	} else {
		_, err = unix.Pread(fd, aligned, 0)
		copy(buf, aligned)
	}
	return err
}

// udevSettle waits for udevd's queue to drain; a failure only makes the checks after it racier.
func udevSettle(t *testing.T) {
	t.Helper()
	if out, err := exec.Command("udevadm", "settle", "--timeout=10").CombinedOutput(); err != nil {
		t.Logf("udevadm settle: %v %s", err, out)
	}
}
