package krbd_test

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/rbd-owner/rbd-owner/agent/fault"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/krbd/fakekernel"
)

const (
	testSecret = "AQBzXHxlAAAAABAAm0Tq4kVJ2HbsYQ1rLA5pUw=="
	otherKey   = "AQCqX3xlAAAAABAAkbZ8g6fMt6zA1cJrVhFZ0w=="
)

// opts are the map options of most tests. Timeout only bounds a wait that must not fail:
// generous, for a busy machine.
func opts() krbd.MapOptions {
	return krbd.MapOptions{Monitors: []string{"203.0.113.1:6789"}, User: "rbdowner", Secret: testSecret,
		MountTimeout: 5 * time.Second, Timeout: 30 * time.Second}
}

func newFake(t *testing.T, o fakekernel.Options) (*fakekernel.Kernel, *krbd.Client) {
	t.Helper()
	k, err := fakekernel.New(t.TempDir(), o)
	if err != nil {
		t.Fatal(err)
	}
	if err := k.AddUser("rbdowner", testSecret); err != nil {
		t.Fatal(err)
	}
	k.AddImage("rbd", "", "img1", 64<<20, "snap1")
	k.AddImage("rbd", "ns1", "img1", 32<<20)
	cfg := k.Config()
	cfg.Poll = 20 * time.Millisecond
	cfg.EBusyRetry = time.Second
	t.Cleanup(func() {
		if n := k.Subscribers(); n != 0 {
			t.Errorf("%d event subscriptions left open", n)
		}
	})
	return k, krbd.New(cfg)
}

func mustSpec(t *testing.T, s string) krbd.Spec {
	t.Helper()
	sp, err := krbd.ParseSpec(s)
	if err != nil {
		t.Fatal(err)
	}
	return sp
}

func TestParseSpec(t *testing.T) {
	good := map[string]krbd.Spec{
		"rbd/img1":            {Pool: "rbd", Image: "img1"},
		"rbd/ns1/img1":        {Pool: "rbd", Namespace: "ns1", Image: "img1"},
		"rbd/img1@s1":         {Pool: "rbd", Image: "img1", Snap: "s1"},
		"rbd/ns1/img-1.x@s_2": {Pool: "rbd", Namespace: "ns1", Image: "img-1.x", Snap: "s_2"},
		"p/ímage":             {Pool: "p", Image: "ímage"},
	}
	for in, want := range good {
		got, err := krbd.ParseSpec(in)
		if err != nil || got != want {
			t.Errorf("ParseSpec(%q) = %+v, %v; want %+v", in, got, err, want)
		}
		if got.String() != in {
			t.Errorf("String() = %q, want %q", got.String(), in)
		}
	}
	bad := map[string]string{ // input -> field named in the error
		"":                                "want POOL",
		"img":                             "want POOL",
		"a/b/c/d":                         "want POOL",
		"/img":                            "pool",
		"rbd/":                            "image",
		"rbd//img":                        "namespace",
		"rbd/img@":                        "snapshot",
		"rbd/img@-":                       "snapshot",
		"rbd/im g":                        "image",
		"rbd/im\tg":                       "image",
		"rbd/im,g":                        "image",
		"rbd/im=g":                        "image",
		"rbd/img@a@b":                     "snapshot",
		"rbd/im\x00g":                     "image",
		"rbd/im\ng":                       "image",
		"rb\x7fd/img":                     "pool",
		"rbd/..":                          "image",
		"./img":                           "pool",
		"rbd/\xff":                        "image",
		"rbd/im\u00a0g":                   "image",
		"rbd/" + strings.Repeat("x", 256): "image",
	}
	for in, field := range bad {
		_, err := krbd.ParseSpec(in)
		if !errors.Is(err, krbd.ErrInvalid) {
			t.Errorf("ParseSpec(%q) err = %v, want ErrInvalid", in, err)
			continue
		}
		if !strings.Contains(err.Error(), field) {
			t.Errorf("ParseSpec(%q) err %q does not name %q", in, err, field)
		}
	}
	if err := (krbd.Spec{Pool: "rbd", Image: "i", Namespace: "a b"}).Validate(); err == nil || !strings.Contains(err.Error(), "namespace") {
		t.Errorf("Validate namespace with space: %v", err)
	}
}

func TestBuildAddString(t *testing.T) {
	o := opts()
	s, err := krbd.BuildAddString(mustSpec(t, "rbd/img1"), o)
	if err != nil {
		t.Fatal(err)
	}
	if want := "203.0.113.1:6789 name=rbdowner,key=rbd-owner.rbdowner.0,noshare,mount_timeout=5 rbd img1 -"; s != want {
		t.Errorf("got  %q\nwant %q", s, want)
	}
	o.Monitors = []string{"203.0.113.1", "[2001:db8::1]:3300", "mon-a.example:6789"}
	o.ReadOnly = true
	o.MountTimeout = 0
	o.Extra = []string{"ms_mode=crc", "lock_on_read"}
	s, err = krbd.BuildAddString(mustSpec(t, "rbd/ns1/img1@snap1"), o)
	if err != nil {
		t.Fatal(err)
	}
	if want := "203.0.113.1:6789,[2001:db8::1]:3300,mon-a.example:6789 name=rbdowner,key=rbd-owner.rbdowner.0,noshare,mount_timeout=30,read_only,_pool_ns=ns1,ms_mode=crc,lock_on_read rbd img1 snap1"; s != want {
		t.Errorf("got  %q\nwant %q", s, want)
	}
	if strings.Contains(s, "secret") || strings.Contains(s, testSecret) {
		t.Errorf("secret in add string %q", s)
	}
	refuse := []func(*krbd.MapOptions){
		func(o *krbd.MapOptions) { o.Extra = []string{"exclusive"} },
		func(o *krbd.MapOptions) { o.Extra = []string{"secret=" + testSecret} },
		func(o *krbd.MapOptions) { o.Extra = []string{"share"} },
		func(o *krbd.MapOptions) { o.Extra = []string{"mount_timeout=1000"} },
		func(o *krbd.MapOptions) { o.Extra = []string{"ms_mode=crc,exclusive"} },
		func(o *krbd.MapOptions) { o.Extra = []string{"ms_mode"} },
		func(o *krbd.MapOptions) { o.Extra = []string{"lock_on_read=1"} },
		func(o *krbd.MapOptions) { o.Extra = []string{"bogus"} },
		func(o *krbd.MapOptions) { o.Extra = []string{"ms_mode=crc", "ms_mode=secure"} },
		func(o *krbd.MapOptions) { o.Monitors = nil },
		func(o *krbd.MapOptions) { o.Monitors = []string{"203.0.113.1:6789 x!"} },
		func(o *krbd.MapOptions) { o.Monitors = []string{"203.0.113.1:99999"} },
		func(o *krbd.MapOptions) { o.Monitors = []string{"a,b:1x"} },
		func(o *krbd.MapOptions) { o.User = "client.admin,key=x" },
		func(o *krbd.MapOptions) { o.User = "" },
		func(o *krbd.MapOptions) { o.MountTimeout = time.Hour },
		func(o *krbd.MapOptions) { o.MountTimeout = time.Millisecond },
	}
	for i, f := range refuse {
		o := opts()
		f(&o)
		if s, err := krbd.BuildAddString(mustSpec(t, "rbd/img1"), o); !errors.Is(err, krbd.ErrInvalid) {
			t.Errorf("case %d: BuildAddString = %q, %v; want ErrInvalid", i, s, err)
		}
	}
	if _, err := krbd.BuildAddString(krbd.Spec{Pool: "rbd", Image: "a b"}, opts()); !errors.Is(err, krbd.ErrInvalid) {
		t.Errorf("unvalidated spec accepted: %v", err)
	}
}

func TestParseKeyring(t *testing.T) {
	ring := "[client.admin]\n\tkey = " + otherKey + "\n\tcaps mon = \"allow *\"\n" +
		"# comment\n[client.rbdowner]\n\tkey = " + testSecret + "\n\tcaps osd = \"profile rbd\"\n"
	got, err := krbd.ParseKeyring(strings.NewReader(ring), "client.rbdowner")
	if err != nil || got != testSecret {
		t.Fatalf("ParseKeyring = %q, %v", got, err)
	}
	if got, _ := krbd.ParseKeyring(strings.NewReader(ring), "client.admin"); got != otherKey {
		t.Errorf("client.admin = %q", got)
	}
	if _, err := krbd.ParseKeyring(strings.NewReader(ring), "client.nobody"); !errors.Is(err, krbd.ErrNotFound) {
		t.Errorf("missing entity: %v", err)
	}
	if _, err := krbd.ParseKeyring(strings.NewReader("[client.x]\n caps mon = x\n"), "client.x"); !errors.Is(err, krbd.ErrInvalid) {
		t.Errorf("no key: %v", err)
	}
	if _, err := krbd.ParseKeyring(strings.NewReader("[client.x]\n key = not base64!\n"), "client.x"); !errors.Is(err, krbd.ErrInvalid) {
		t.Errorf("bad key: %v", err)
	}
	p := filepath.Join(t.TempDir(), "k")
	if err := os.WriteFile(p, []byte(ring), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := krbd.ReadKeyringFile(p, "client.rbdowner"); err != nil || got != testSecret {
		t.Errorf("ReadKeyringFile = %q, %v", got, err)
	}
}

// A keyring as Ceph 20.2's `ceph auth get` writes it while a rotation is pending (after `ceph
// auth get-or-create-pending`) has a "pending key" line, which that release's own librados
// refuses to load ("error setting modifier ... type=pending key": no cephx key, no connection),
// in whichever section it stands. The agent refuses it too, at once and in one line, rather than
// hand the kernel the key line while its own next connection fails.
func TestAKeyringWithAPendingKeyIsRefusedAsLibradosRefusesIt(t *testing.T) {
	for _, ring := range []string{
		"[client.rbdowner]\n\tkey = " + testSecret + "\n\tpending key = " + otherKey + "\n\tcaps mon = \"profile rbd\"\n",
		"[client.admin]\n\tkey = " + otherKey + "\n\tpending key = " + otherKey + "\n[client.rbdowner]\n\tkey = " + testSecret + "\n",
		"[client.rbdowner]\n\tkey = " + testSecret + "\n[client.admin]\n\tpending key = " + otherKey + "\n",
	} {
		_, err := krbd.ParseKeyring(strings.NewReader(ring), "client.rbdowner")
		if !errors.Is(err, krbd.ErrPendingKey) || !fault.Is(err, fault.Invalid) {
			t.Fatalf("keyring with a pending key accepted (%v):\n%s", err, ring)
		}
		if msg := err.Error(); !strings.Contains(msg, "pending key") || !strings.Contains(msg, "ceph auth get-key") || strings.Contains(msg, otherKey) || strings.Contains(msg, testSecret) {
			t.Errorf("refusal should name the line and what to write, and no secret: %s", msg)
		}
	}
	// the lines librados reads beside the key stay accepted: caps, and the old auid
	ok := "[client.rbdowner]\n\tkey = " + testSecret + "\n\tauid = 0\n\tcaps osd = \"profile rbd\"\n"
	if got, err := krbd.ParseKeyring(strings.NewReader(ok), "client.rbdowner"); err != nil || got != testSecret {
		t.Errorf("ParseKeyring = %q, %v", got, err)
	}
}

func TestParseDevice(t *testing.T) {
	attrs := map[string]string{"pool": "rbd\n", "pool_ns": "\n", "name": "img1\n", "image_id": "1234abcd\n",
		"current_snap": "-\n", "client_id": "client4118\n", "client_addr": "203.0.113.11:0/420843661\n",
		"cluster_fsid": "a7f64266-0894-4f1e-a635-d0aeaca0e993\n", "major": "251\n", "minor": "16\n", "size": "67108864\n"}
	d, err := krbd.ParseDevice(1, attrs)
	if err != nil {
		t.Fatal(err)
	}
	want := krbd.Device{ID: 1, Pool: "rbd", Image: "img1", ImageID: "1234abcd", ClientID: "client4118",
		ClientAddr: "203.0.113.11:0/420843661", ClusterFSID: "a7f64266-0894-4f1e-a635-d0aeaca0e993",
		Major: 251, Minor: 16, Size: 64 << 20}
	if d != want {
		t.Errorf("got %+v\nwant %+v", d, want)
	}
	for _, mod := range []func(map[string]string){
		func(m map[string]string) { delete(m, "pool") },
		func(m map[string]string) { delete(m, "major") },
		func(m map[string]string) { m["major"] = "x\n" },
		func(m map[string]string) { m["size"] = "-1\n" },
		func(m map[string]string) { m["name"] = "\n" },
		func(m map[string]string) { m["pool"] = "a\nb\n" },
	} {
		m := map[string]string{}
		for k, v := range attrs {
			m[k] = v
		}
		mod(m)
		if _, err := krbd.ParseDevice(1, m); err == nil {
			t.Errorf("ParseDevice accepted %v", m)
		}
	}
	// old kernel: no pool_ns, client_addr
	delete(attrs, "pool_ns")
	delete(attrs, "client_addr")
	attrs["current_snap"] = "s1\n"
	if d, err := krbd.ParseDevice(0, attrs); err != nil || d.Snap != "s1" || d.Namespace != "" {
		t.Errorf("old kernel attrs: %+v, %v", d, err)
	}
}

func TestMap(t *testing.T) {
	k, c := newFake(t, fakekernel.Options{})
	ctx := context.Background()
	d, err := c.Map(ctx, mustSpec(t, "rbd/img1"), opts())
	if err != nil {
		t.Fatal(err)
	}
	if d.ID != 0 || d.Pool != "rbd" || d.Image != "img1" || d.Snap != "" || d.Major != fakekernel.Major ||
		d.Minor != 0 || d.Size != 64<<20 || d.ClientAddr == "" || d.DevNode != filepath.Join(k.Dev, "rbd0") {
		t.Errorf("device %+v", d)
	}
	d2, err := c.Map(ctx, mustSpec(t, "rbd/ns1/img1"), opts())
	if err != nil {
		t.Fatal(err)
	}
	if d2.ID != 1 || d2.Namespace != "ns1" || d2.Minor != 16 || d2.ClientAddr == d.ClientAddr {
		t.Errorf("device %+v", d2)
	}
	o := opts()
	o.ReadOnly = true
	d3, err := c.Map(ctx, mustSpec(t, "rbd/img1@snap1"), o)
	if err != nil || d3.Snap != "snap1" {
		t.Fatalf("map snap: %+v %v", d3, err)
	}
	w := k.Writes()
	if len(w) != 3 || !strings.HasPrefix(w[0], "add_single_major: ") {
		t.Fatalf("writes %q", w)
	}
	keyNames := map[string]bool{}
	for _, s := range w {
		if strings.Contains(s, "secret") || strings.Contains(s, testSecret) || strings.Contains(s, "exclusive") ||
			!strings.Contains(s, ",noshare,") || !strings.Contains(s, "key=rbd-owner.rbdowner.") {
			t.Errorf("bad add string %q", s)
		}
		_, rest, _ := strings.Cut(s, "key=")
		name, _, _ := strings.Cut(rest, ",")
		keyNames[name] = true
	}
	if len(keyNames) != len(w) {
		t.Errorf("maps shared a key name: %v", keyNames)
	}
	if left := k.Keys(); len(left) != 0 {
		t.Errorf("keys left in the keyring after the maps: %v", left)
	}
	if !strings.Contains(w[1], "_pool_ns=ns1") || !strings.Contains(w[2], "read_only") || !strings.HasSuffix(w[2], " snap1") {
		t.Errorf("writes %q", w)
	}
	cfg, _ := os.ReadFile(filepath.Join(k.Sysfs, "bus/rbd/devices/0/config_info"))
	if strings.Contains(string(cfg), testSecret) {
		t.Errorf("secret in config_info %q", cfg)
	}
	list, err := c.List()
	if err != nil || len(list) != 3 {
		t.Fatalf("List = %v, %v", list, err)
	}
	found, err := c.FindBySpec(mustSpec(t, "rbd/ns1/img1"), "")
	if err != nil || len(found) != 1 || found[0].ID != 1 {
		t.Errorf("FindBySpec = %v, %v", found, err)
	}
	if found, _ := c.FindBySpec(mustSpec(t, "rbd/ns1/img1"), "other-fsid"); len(found) != 0 {
		t.Errorf("FindBySpec with another fsid = %v", found)
	}
	// a stable link resolves to its device
	link := filepath.Join(k.Dev, "rbd-owner", "fsid", "rbd", "ns1", "img1")
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../../../rbd1", link); err != nil {
		t.Fatal(err)
	}
	if got, err := c.FindByPath(link); err != nil || got.ID != 1 {
		t.Errorf("FindByPath(link) = %+v, %v", got, err)
	}
	if _, err := c.FindByPath(filepath.Join(k.Dev, "nope")); !errors.Is(err, krbd.ErrNotFound) {
		t.Errorf("FindByPath(missing) = %v", err)
	}
}

func TestMapFallbacks(t *testing.T) {
	k, c := newFake(t, fakekernel.Options{NoModule: true, NoSingleMajor: true})
	d, err := c.Map(context.Background(), mustSpec(t, "rbd/img1"), opts())
	if err != nil {
		t.Fatal(err)
	}
	if k.Loads() != 1 {
		t.Errorf("module loaded %d times", k.Loads())
	}
	if w := k.Writes(); len(w) != 1 || !strings.HasPrefix(w[0], "add: ") {
		t.Errorf("writes %q, want one to add", w)
	}
	if d.Major == fakekernel.Major || d.Minor != 0 {
		t.Errorf("non-single-major device %+v", d)
	}
	if ok, err := c.Unmap(context.Background(), d.ID, krbd.UnmapOptions{}); !ok || err != nil {
		t.Errorf("Unmap = %v, %v", ok, err)
	}
	if w := k.Writes(); !strings.HasPrefix(w[len(w)-1], "remove: 0") {
		t.Errorf("writes %q, want remove", w)
	}
}

func TestMapModuleLoadFails(t *testing.T) {
	k, err := fakekernel.New(t.TempDir(), fakekernel.Options{NoModule: true})
	if err != nil {
		t.Fatal(err)
	}
	cfg := k.Config()
	cfg.LoadModule = func(context.Context) error { return errors.New("modprobe: FATAL: Module rbd not found") }
	_, err = krbd.New(cfg).Map(context.Background(), krbd.Spec{Pool: "rbd", Image: "img1"}, opts())
	if !errors.Is(err, krbd.ErrNoKernelSupport) || !strings.Contains(err.Error(), "map rbd/img1") {
		t.Errorf("err = %v", err)
	}
}

func TestMapErrors(t *testing.T) {
	k, c := newFake(t, fakekernel.Options{UnreachableMonitor: "203.0.113.99:6789"})
	ctx := context.Background()
	cases := []struct {
		spec  string
		mod   func(*krbd.MapOptions)
		kind  error
		errno syscall.Errno
	}{
		{"rbd/missing", nil, krbd.ErrNotFound, syscall.ENOENT},
		{"nopool/img1", nil, krbd.ErrNotFound, syscall.ENOENT},
		{"rbd/ns2/img1", nil, krbd.ErrNotFound, syscall.ENOENT},
		{"rbd/img1@nosnap", nil, krbd.ErrNotFound, syscall.ENOENT},
		{"rbd/img1", func(o *krbd.MapOptions) { o.Secret = otherKey }, krbd.ErrPermission, syscall.EACCES},
		{"rbd/img1", func(o *krbd.MapOptions) { o.User = "nobody" }, krbd.ErrPermission, syscall.EACCES},
		{"rbd/img1", func(o *krbd.MapOptions) { o.Extra = []string{"read_from_replica=balance"} }, krbd.ErrInvalid, syscall.EINVAL},
		{"rbd/img1", func(o *krbd.MapOptions) { o.Monitors = []string{"203.0.113.99"} }, krbd.ErrTimeout, syscall.ETIMEDOUT},
	}
	for _, tc := range cases {
		o := opts()
		if tc.mod != nil {
			tc.mod(&o)
		}
		_, err := c.Map(ctx, mustSpec(t, tc.spec), o)
		if !errors.Is(err, tc.kind) || !errors.Is(err, tc.errno) {
			t.Errorf("Map(%s) err = %v, want %v and %v", tc.spec, err, tc.kind, tc.errno)
		}
		if err != nil && !strings.HasPrefix(err.Error(), "map "+tc.spec+": ") {
			t.Errorf("error lacks context: %v", err)
		}
		var ke *krbd.KernelError
		if !errors.As(err, &ke) || ke.Errno != tc.errno {
			t.Errorf("Map(%s): not a KernelError with %v: %v", tc.spec, tc.errno, err)
		}
	}
	// refused before anything is written
	n := len(k.Writes())
	o := opts()
	o.Secret = "not a key"
	if _, err := c.Map(ctx, mustSpec(t, "rbd/img1"), o); !errors.Is(err, krbd.ErrInvalid) {
		t.Errorf("bad secret: %v", err)
	}
	if _, err := c.Map(ctx, krbd.Spec{Pool: "rbd", Image: "img1 x"}, opts()); !errors.Is(err, krbd.ErrInvalid) {
		t.Errorf("bad spec: %v", err)
	}
	if len(k.Writes()) != n {
		t.Errorf("invalid input reached the kernel: %q", k.Writes()[n:])
	}
	if l, _ := c.List(); len(l) != 0 {
		t.Errorf("devices after failed maps: %v", l)
	}
}

// silentWriter accepts writes and does nothing: no device ever appears.
type silentWriter struct{}

func (silentWriter) WriteControl(string, []byte) error { return nil }

// writerFunc is a krbd.ControlWriter made of a function.
type writerFunc func(path string, data []byte) error

func (f writerFunc) WriteControl(path string, data []byte) error { return f(path, data) }

func TestMapTimeout(t *testing.T) {
	k, err := fakekernel.New(t.TempDir(), fakekernel.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := k.Config()
	cfg.Writer = silentWriter{}
	cfg.Poll = 10 * time.Millisecond
	o := opts()
	o.Timeout = 150 * time.Millisecond
	start := time.Now()
	_, err = krbd.New(cfg).Map(context.Background(), krbd.Spec{Pool: "rbd", Image: "img1"}, o)
	if !errors.Is(err, krbd.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v", err)
	}
	// o.Timeout, not the 30 s default, ended the wait (the bound leaves a busy machine room)
	if el := time.Since(start); el > 20*time.Second {
		t.Errorf("timeout took %s", el)
	}
	// a context cancelled while Map waits for the device ends the wait too: the write that
	// starts the wait cancels it
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg.Writer = writerFunc(func(string, []byte) error { cancel(); return nil })
	o.Timeout = time.Hour
	if _, err := krbd.New(cfg).Map(ctx, krbd.Spec{Pool: "rbd", Image: "img1"}, o); !errors.Is(err, context.Canceled) {
		t.Errorf("cancel: %v", err)
	}
	if k.Subscribers() != 0 {
		t.Errorf("subscriptions left: %d", k.Subscribers())
	}
}

func TestMapConcurrent(t *testing.T) {
	k, c := newFake(t, fakekernel.Options{})
	const n = 20
	for i := range n {
		k.AddImage("rbd", "", fmt.Sprintf("vol%02d", i), uint64(i+1)<<20)
	}
	var wg sync.WaitGroup
	devs := make([]krbd.Device, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			devs[i], errs[i] = c.Map(context.Background(), krbd.Spec{Pool: "rbd", Image: fmt.Sprintf("vol%02d", i)}, opts())
		}()
	}
	wg.Wait()
	ids := map[int]bool{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("map %d: %v", i, errs[i])
		}
		if devs[i].Image != fmt.Sprintf("vol%02d", i) || devs[i].Size != uint64(i+1)<<20 {
			t.Errorf("map %d got %+v", i, devs[i])
		}
		if ids[devs[i].ID] {
			t.Errorf("id %d returned twice", devs[i].ID)
		}
		ids[devs[i].ID] = true
	}
	// the same image 5 times at once: 5 distinct devices (noshare), serialised in-process
	same := make([]krbd.Device, 5)
	for i := range same {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if same[i], err = c.Map(context.Background(), mustSpec(t, "rbd/img1"), opts()); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	seen := map[int]bool{}
	for _, d := range same {
		if seen[d.ID] || ids[d.ID] {
			t.Errorf("same-image maps share id %d", d.ID)
		}
		seen[d.ID] = true
	}
	// and unmap all of them at once
	all, _ := c.List()
	for _, d := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if ok, err := c.Unmap(context.Background(), d.ID, krbd.UnmapOptions{}); !ok || err != nil {
				t.Errorf("unmap %d: %v %v", d.ID, ok, err)
			}
		}()
	}
	wg.Wait()
	if l, _ := c.List(); len(l) != 0 {
		t.Errorf("left mapped: %v", l)
	}
}

func TestLostEvents(t *testing.T) {
	k, c := newFake(t, fakekernel.Options{})
	k.DropEvents(3) // the whole map's events vanish
	d, err := c.Map(context.Background(), mustSpec(t, "rbd/img1"), opts())
	if err != nil {
		t.Fatalf("map with lost events: %v", err)
	}
	k.DropEvents(3) // and the whole unmap's
	if ok, err := c.Unmap(context.Background(), d.ID, krbd.UnmapOptions{}); !ok || err != nil {
		t.Fatalf("unmap with lost events: %v %v", ok, err)
	}
	// the marker arrives even when only some events were lost
	k.DropEvents(1)
	if _, err := c.Map(context.Background(), mustSpec(t, "rbd/img1"), opts()); err != nil {
		t.Fatalf("map with one lost event: %v", err)
	}
}

func TestUnmap(t *testing.T) {
	k, c := newFake(t, fakekernel.Options{})
	ctx := context.Background()
	d, err := c.Map(ctx, mustSpec(t, "rbd/img1"), opts())
	if err != nil {
		t.Fatal(err)
	}
	// EBUSY for a moment (udev probing), then free: retried. The device is freed by the
	// first EBUSY itself (not after some time), so the retry finds it free however late it
	// runs; EBusyRetry is generous so that the retry is never given up on a busy machine.
	k.SetOpen(d.ID, true)
	cfg := k.Config()
	cfg.Poll, cfg.EBusyRetry = 20*time.Millisecond, time.Minute
	cfg.Writer = writerFunc(func(path string, data []byte) error {
		err := k.WriteControl(path, data)
		if errors.Is(err, syscall.EBUSY) {
			k.SetOpen(d.ID, false) // udev's probe closes the device
		}
		return err
	})
	if ok, err := krbd.New(cfg).Unmap(ctx, d.ID, krbd.UnmapOptions{}); !ok || err != nil {
		t.Fatalf("Unmap after EBUSY = %v, %v", ok, err)
	}
	if busy := strings.Count(strings.Join(k.Writes(), "\n"), "remove_single_major: 0"); busy < 2 {
		t.Errorf("EBUSY was not retried: %q", k.Writes())
	}
	if _, err := os.Stat(d.DevNode); !os.IsNotExist(err) {
		t.Errorf("%s still there: %v", d.DevNode, err)
	}
	// not mapped: not an error
	if ok, err := c.Unmap(ctx, d.ID, krbd.UnmapOptions{}); ok || err != nil {
		t.Errorf("Unmap(not mapped) = %v, %v", ok, err)
	}
	// EBUSY for good: ErrBusy, then force
	d, _ = c.Map(ctx, mustSpec(t, "rbd/img1"), opts())
	k.SetOpen(d.ID, true)
	_, err = c.Unmap(ctx, d.ID, krbd.UnmapOptions{})
	if !errors.Is(err, krbd.ErrBusy) || !errors.Is(err, syscall.EBUSY) || !strings.HasPrefix(err.Error(), "unmap rbd0: ") {
		t.Errorf("Unmap(open) err = %v", err)
	}
	if ok, err := c.Unmap(ctx, d.ID, krbd.UnmapOptions{Force: true}); !ok || err != nil {
		t.Errorf("Unmap(force) = %v, %v", ok, err)
	}
	if w := k.Writes(); w[len(w)-1] != "remove_single_major: 0 force" {
		t.Errorf("last write %q", w[len(w)-1])
	}
	// by spec and by path
	d, _ = c.Map(ctx, mustSpec(t, "rbd/ns1/img1"), opts())
	if ok, err := c.UnmapSpec(ctx, mustSpec(t, "rbd/ns1/img1"), "", krbd.UnmapOptions{}); !ok || err != nil {
		t.Errorf("UnmapSpec = %v, %v", ok, err)
	}
	if ok, err := c.UnmapSpec(ctx, mustSpec(t, "rbd/ns1/img1"), "", krbd.UnmapOptions{}); ok || err != nil {
		t.Errorf("UnmapSpec(not mapped) = %v, %v", ok, err)
	}
	d, _ = c.Map(ctx, mustSpec(t, "rbd/img1"), opts())
	if ok, err := c.UnmapPath(ctx, d.DevNode, krbd.UnmapOptions{}); !ok || err != nil {
		t.Errorf("UnmapPath = %v, %v", ok, err)
	}
	if ok, err := c.UnmapPath(ctx, d.DevNode, krbd.UnmapOptions{}); ok || err != nil {
		t.Errorf("UnmapPath(gone) = %v, %v", ok, err)
	}
	if _, err := c.Unmap(ctx, -1, krbd.UnmapOptions{}); !errors.Is(err, krbd.ErrInvalid) {
		t.Errorf("Unmap(-1) = %v", err)
	}
}

func TestUnmapNoModule(t *testing.T) {
	_, c := newFake(t, fakekernel.Options{NoModule: true})
	if ok, err := c.Unmap(context.Background(), 0, krbd.UnmapOptions{}); ok || err != nil {
		t.Errorf("Unmap without rbd module = %v, %v", ok, err)
	}
	if l, err := c.List(); err != nil || len(l) != 0 {
		t.Errorf("List = %v, %v", l, err)
	}
}

func TestUevent(t *testing.T) {
	kmsg := []byte("add@/devices/rbd/3/block/rbd3\x00ACTION=add\x00DEVPATH=/devices/rbd/3/block/rbd3\x00SUBSYSTEM=block\x00MAJOR=251\x00MINOR=48\x00DEVNAME=rbd3\x00DEVTYPE=disk\x00SEQNUM=2101\x00")
	ev, err := krbd.ParseUevent(kmsg)
	if err != nil {
		t.Fatal(err)
	}
	if id, ok := ev.DiskID(); !ok || id != 3 || ev.Action != "add" || ev.FromUdev || ev.Major != "251" || !ev.IsRBD() {
		t.Errorf("kernel event %+v", ev)
	}
	if _, ok := ev.RBDID(); ok {
		t.Error("block event taken for rbd device event")
	}
	rmsg := []byte("remove@/devices/rbd/12\x00ACTION=remove\x00DEVPATH=/devices/rbd/12\x00SUBSYSTEM=rbd\x00SEQNUM=7\x00")
	ev, _ = krbd.ParseUevent(rmsg)
	if id, ok := ev.RBDID(); !ok || id != 12 || ev.Action != "remove" {
		t.Errorf("rbd event %+v", ev)
	}
	bdi, _ := krbd.ParseUevent([]byte("add@/devices/virtual/bdi/251:0\x00ACTION=add\x00DEVPATH=/devices/virtual/bdi/251:0\x00SUBSYSTEM=bdi\x00"))
	loop, _ := krbd.ParseUevent([]byte("add@/devices/virtual/block/loop0\x00ACTION=add\x00DEVPATH=/devices/virtual/block/loop0\x00SUBSYSTEM=block\x00DEVTYPE=disk\x00"))
	part, _ := krbd.ParseUevent([]byte("add@/devices/rbd/0/block/rbd0/rbd0p1\x00ACTION=add\x00DEVPATH=/devices/rbd/0/block/rbd0/rbd0p1\x00SUBSYSTEM=block\x00DEVTYPE=partition\x00"))
	if bdi.IsRBD() || loop.IsRBD() || !part.IsRBD() {
		t.Errorf("IsRBD: bdi %v loop %v partition %v", bdi.IsRBD(), loop.IsRBD(), part.IsRBD())
	}
	if _, ok := part.DiskID(); ok {
		t.Error("partition taken for the disk")
	}
	// udev format: "libudev\0", magic 0xfeedcafe (big endian) at 8, payload offset at 16
	payload := "ACTION=add\x00DEVPATH=/devices/rbd/0/block/rbd0\x00SUBSYSTEM=block\x00DEVTYPE=disk\x00DEVNAME=/dev/rbd0\x00DEVLINKS=/dev/rbd-owner/f/rbd/img1\x00"
	hdr := make([]byte, 40)
	copy(hdr, "libudev\x00")
	hdr[8], hdr[9], hdr[10], hdr[11] = 0xfe, 0xed, 0xca, 0xfe
	hdr[16] = 40 // native (little endian) payload offset
	ev, err = krbd.ParseUevent(append(hdr, payload...))
	if err != nil || !ev.FromUdev || ev.DevName != "/dev/rbd0" || ev.Env["DEVLINKS"] == "" {
		t.Errorf("udev event %+v, %v", ev, err)
	}
	if _, err := krbd.ParseUevent([]byte("garbage")); err == nil {
		t.Error("garbage parsed")
	}
}

func TestKernelErrorClassify(t *testing.T) {
	e := &krbd.KernelError{File: "add", Errno: syscall.EROFS}
	if errors.Is(e, krbd.ErrBusy) || !errors.Is(e, syscall.EROFS) || !strings.Contains(e.Error(), "read-only") {
		t.Errorf("%v", e)
	}
}

// An id freed and reused by another map is not unmapped by a late UnmapDevice of the old one.
func TestUnmapDeviceLeavesAReusedIDAlone(t *testing.T) {
	k, c := newFake(t, fakekernel.Options{})
	k.AddImage("rbd", "", "img2", 1<<20)
	ctx := context.Background()
	old, err := c.Map(ctx, mustSpec(t, "rbd/img1"), opts())
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := c.UnmapDevice(ctx, old, krbd.UnmapOptions{}); !ok || err != nil {
		t.Fatalf("first unmap: %v %v", ok, err)
	}
	other, err := c.Map(ctx, mustSpec(t, "rbd/img2"), opts())
	if err != nil {
		t.Fatal(err)
	}
	if other.ID != old.ID {
		t.Fatalf("the fake did not reuse id %d (got %d)", old.ID, other.ID)
	}
	// a retried unmap of the old device comes late: it must not remove img2
	if ok, err := c.UnmapDevice(ctx, old, krbd.UnmapOptions{}); ok || err != nil {
		t.Fatalf("late unmap of the old device: %v %v", ok, err)
	}
	if d, err := c.ReadDevice(other.ID); err != nil || d.Image != "img2" {
		t.Fatalf("img2's device is gone: %+v %v", d, err)
	}
}

// TestParseConfigInfo: noshare is read from the options field of config_info; nothing else
// of the string is kept.
func TestParseConfigInfo(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want krbd.MapFacts
	}{
		{"10.0.0.1:6789 name=admin,key=client.admin,noshare rbd img\n", krbd.MapFacts{Known: true, NoShare: true}},
		{"10.0.0.1:6789 name=admin,secret=QUJD,read_only rbd img snap1", krbd.MapFacts{Known: true}},
		{"10.0.0.1:6789 name=admin,nosharex rbd img", krbd.MapFacts{Known: true}},
		{"", krbd.MapFacts{}},
		{"garbage", krbd.MapFacts{}},
	} {
		if got := krbd.ParseConfigInfo(tc.in); got != tc.want {
			t.Errorf("ParseConfigInfo(%q) = %+v, want %+v", tc.in, got, tc.want)
		}
	}
}

// TestRequestOptions: a caller's map options are filtered by the agent's rules.
func TestRequestOptions(t *testing.T) {
	r, err := krbd.RequestOptions([]string{"noudev", "queue_depth=128,noshare", "read_only", "ms_mode=prefer-crc"})
	if err != nil || !r.ReadOnly || !r.NoUdev || strings.Join(r.Extra, ",") != "queue_depth=128,ms_mode=prefer-crc" {
		t.Fatalf("got %+v %v", r, err)
	}
	// udev and noudev never reach the kernel; the last one wins, as in Ceph's rbd
	for opts, want := range map[string]bool{"": false, "udev": false, "noudev": true, "noudev,udev": false, "udev,noudev": true} {
		r, err := krbd.RequestOptions([]string{opts})
		if err != nil || r.NoUdev != want || r.ReadOnly || len(r.Extra) != 0 {
			t.Errorf("%q: got %+v %v, want NoUdev %v and nothing else", opts, r, err, want)
		}
	}
	for _, bad := range []string{"exclusive", "share", "name=admin", "secret=QUJD", "key=client.admin", "mon_addr=1.2.3.4", "nosuch", "queue_depth=1 2"} {
		_, err := krbd.RequestOptions([]string{bad})
		if err == nil || !errors.Is(err, krbd.ErrInvalid) {
			t.Errorf("%q: want an invalid-argument error, got %v", bad, err)
		}
		if err != nil && strings.Contains(err.Error(), "QUJD") {
			t.Errorf("%q: the error shows the value: %v", bad, err)
		}
	}
}

// TestTodaysCephCSIOptionsPass: the options newer ceph-csi releases pass to rbd map reach the
// kernel as given: read affinity (read_from_replica=localize with a CRUSH location of several
// type:name pairs joined by '|', as its ConstructReadAffinityMapOption builds it) and each
// ms_mode; values the kernel would not take are refused.
func TestTodaysCephCSIOptionsPass(t *testing.T) {
	affinity := "read_from_replica=localize,crush_location=region:east|zone:east-1|host:worker-01.example"
	r, err := krbd.RequestOptions([]string{"noudev", affinity, "ms_mode=prefer-crc"})
	want := "read_from_replica=localize,crush_location=region:east|zone:east-1|host:worker-01.example,ms_mode=prefer-crc"
	if err != nil || strings.Join(r.Extra, ",") != want {
		t.Fatalf("got %+v %v, want Extra %s", r, err, want)
	}
	long := "crush_location=" + strings.Repeat("rack:r-0123456789|", 12) + "host:h"
	for _, ok := range []string{"read_from_replica=balance", "read_from_replica=no", long,
		"ms_mode=legacy", "ms_mode=crc", "ms_mode=secure", "ms_mode=prefer-crc", "ms_mode=prefer-secure"} {
		if err := krbd.ValidateExtraOption(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for _, bad := range []string{"read_from_replica=everywhere", "crush_location=host", "crush_location=host:", "crush_location=|host:a",
		"crush_location=host:a|", "crush_location=host:a b", "ms_mode=fast", "queue_depth=1|2"} {
		if err := krbd.ValidateExtraOption(bad); !errors.Is(err, krbd.ErrInvalid) {
			t.Errorf("%s: %v, want invalid", bad, err)
		}
	}
}

// TestMapWaitsForUdev: a map returns once udevd has handled the new device (its link exists),
// not merely once the kernel made it; with NoUdev (rbd's -o noudev, what ceph-csi passes) it
// returns at the kernel's device; a udevd that never answers delays the map by UdevTimeout,
// then the map returns the device with a warning instead of failing.
func TestMapWaitsForUdev(t *testing.T) {
	k, _ := newFake(t, fakekernel.Options{})
	log, hook := logtest.NewNullLogger()
	client := func(udevTimeout time.Duration) *krbd.Client {
		cfg := k.Config()
		cfg.Poll, cfg.Logger, cfg.UdevTimeout = 20*time.Millisecond, log, udevTimeout
		return krbd.New(cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	spec := mustSpec(t, "rbd/img1")
	unmapAll := func() {
		t.Helper()
		k.ReleaseUdev()
		if _, err := client(time.Minute).UnmapSpec(ctx, spec, "", krbd.UnmapOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// held udevd: the map has made its device but has not returned; it does once udevd answers
	k.HoldUdev()
	type result struct {
		d   krbd.Device
		err error
	}
	done := make(chan result, 1)
	go func() { d, err := client(time.Minute).Map(ctx, spec, opts()); done <- result{d, err} }()
	for {
		if devs, err := client(time.Minute).FindBySpec(spec, ""); err == nil && len(devs) == 1 {
			if _, _, err := k.StatDev(devs[0].DevNode); err == nil {
				break // the kernel's part is done: device, block device and node
			}
		}
		select {
		case r := <-done:
			t.Fatalf("the map returned before udevd handled the device: %+v %v", r.d, r.err)
		case <-ctx.Done():
			t.Fatal("the device never appeared")
		case <-time.After(5 * time.Millisecond):
		}
	}
	select {
	case r := <-done:
		t.Fatalf("the map returned before udevd handled the device: %+v %v", r.d, r.err)
	default:
	}
	k.ReleaseUdev()
	if r := <-done; r.err != nil || r.d.DevNode == "" {
		t.Fatalf("map after udevd answered: %+v %v", r.d, r.err)
	}
	unmapAll()

	// NoUdev: returns at the kernel's device while udevd holds its events
	k.HoldUdev()
	o := opts()
	o.NoUdev = true
	if d, err := client(time.Minute).Map(ctx, spec, o); err != nil || d.DevNode == "" {
		t.Fatalf("map with NoUdev while udevd is held: %+v %v", d, err)
	}
	unmapAll()

	// a udevd that never answers: the map still returns its device, and says so
	hook.Reset()
	k.HoldUdev()
	d, err := client(50*time.Millisecond).Map(ctx, spec, opts())
	if err != nil || d.DevNode == "" {
		t.Fatalf("map with a silent udevd: %+v %v", d, err)
	}
	warned := false
	for _, e := range hook.AllEntries() {
		warned = warned || (e.Level == logrus.WarnLevel && strings.Contains(e.Message, "udevd has not handled"))
	}
	if !warned {
		t.Errorf("no warning that udevd did not answer; log: %v", hook.AllEntries())
	}
	unmapAll()
}

// TestUnmapOfAMountedDeviceNamesItsMountPoints: the kernel's EBUSY is reported as what a
// person undoes: the device and every place it, or a partition of it, is mounted (from the
// mount table), not the control file that refused the write.
func TestUnmapOfAMountedDeviceNamesItsMountPoints(t *testing.T) {
	for _, o := range []fakekernel.Options{{}, {NoSingleMajor: true}} {
		k, c := newFake(t, o)
		ctx := context.Background()
		other, err := c.Map(ctx, mustSpec(t, "rbd/ns1/img1"), opts())
		if err != nil {
			t.Fatal(err)
		}
		d, err := c.Map(ctx, mustSpec(t, "rbd/img1"), opts())
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range []struct {
			id, part int
			at       string
		}{{d.ID, 0, "/mnt/x"}, {other.ID, 0, "/mnt/other"}, {d.ID, 1, "/mnt/a dir/part1"}} {
			if err := k.Mount(m.id, m.part, m.at); err != nil {
				t.Fatal(err)
			}
		}
		_, err = c.UnmapDevice(ctx, d, krbd.UnmapOptions{})
		want := fmt.Sprintf("unmap rbd/img1 (rbd%d): %s is mounted at /mnt/x, /mnt/a dir/part1: unmount it first (or unmap --force)", d.ID, d.DevNode)
		if err == nil || err.Error() != want {
			t.Fatalf("unmap of a mounted device (%+v):\n got %v\nwant %s", o, err, want)
		}
		if !errors.Is(err, krbd.ErrBusy) || !errors.Is(err, syscall.EBUSY) {
			t.Errorf("not classified as busy: %v", err)
		}
		// open, but not mounted here: said so
		k.SetOpen(other.ID, true)
		if err := os.WriteFile(k.MountInfo, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		_, err = c.UnmapDevice(ctx, other, krbd.UnmapOptions{})
		if err == nil || !strings.Contains(err.Error(), other.DevNode+" is open (") || !strings.Contains(err.Error(), "not mounted in the agent's mount namespace") {
			t.Errorf("unmap of a device open but not mounted: %v", err)
		}
	}
}

// TestMergeExtra: the caller's options after the configured ones; one both give with the same
// value kept once, with another value (crc and nocrc are one option) refused by name only.
func TestMergeExtra(t *testing.T) {
	for _, tc := range []struct {
		configured, asked, want []string
		err                     string
	}{
		{nil, nil, nil, ""},
		{[]string{"ms_mode=secure"}, []string{"queue_depth=128"}, []string{"ms_mode=secure", "queue_depth=128"}, ""},
		{[]string{"ms_mode=secure"}, []string{"ms_mode=secure", "queue_depth=128"}, []string{"ms_mode=secure", "queue_depth=128"}, ""},
		{[]string{"ms_mode=secure", "queue_depth=64"}, []string{"queue_depth=128"}, nil, `option "queue_depth"`},
		{[]string{"ms_mode=secure"}, []string{"ms_mode=crc"}, nil, `option "ms_mode"`},
		{[]string{"notrim"}, []string{"notrim"}, []string{"notrim"}, ""},
		{[]string{"crc"}, []string{"nocrc"}, nil, `option "crc"`},
	} {
		got, _, err := krbd.Compose(krbd.Layers{Agent: tc.configured, Caller: tc.asked})
		if tc.err != "" {
			if !errors.Is(err, krbd.ErrInvalid) || !strings.Contains(err.Error(), tc.err) || strings.Contains(err.Error(), "=") {
				t.Errorf("%v + %v: error %v, want one naming %s and no value", tc.configured, tc.asked, err, tc.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%v + %v: %v, %v; want %v", tc.configured, tc.asked, got, err, tc.want)
		}
	}
}

// TestTheClustersMapOptionsApplyUnlessTheCallerOrTheAgentSetTheOption: rbd_default_map_options
// of the most specific level fill in every option the caller and map_options leave out (as
// Ceph's rbd does); options the agent decides itself are listed as not applied; each option
// says where it came from.
func TestTheClustersMapOptionsApplyUnlessTheCallerOrTheAgentSetTheOption(t *testing.T) {
	got, src, err := krbd.Compose(krbd.Layers{
		Caller:  []string{"queue_depth=128"},
		Agent:   []string{"notrim"},
		Cluster: krbd.ClusterDefaults{Options: "queue_depth=64, alloc_size=65536,share,exclusive,nocrc", Level: krbd.LevelPool},
	})
	want := []string{"notrim", "queue_depth=128", "alloc_size=65536", "nocrc"}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("options %v, %v; want %v", got, err, want)
	}
	from := map[string]string{}
	for _, s := range src {
		from[s.Option] = s.From
	}
	for opt, f := range map[string]string{
		"notrim": krbd.FromAgent, "queue_depth=128": krbd.FromCaller,
		"alloc_size=65536": krbd.FromCluster + " (pool)", "nocrc": krbd.FromCluster + " (pool)",
	} {
		if from[opt] != f {
			t.Errorf("%s from %q, want %q", opt, from[opt], f)
		}
	}
	for _, opt := range []string{"share", "exclusive"} {
		if !strings.HasPrefix(from[opt], krbd.FromCluster+" (pool), not applied: ") {
			t.Errorf("the cluster's %s: %q, want listed as not applied", opt, from[opt])
		}
	}
	if _, ok := from["queue_depth=64"]; ok {
		t.Errorf("the cluster's queue_depth=64 listed as applied beside the caller's: %v", src)
	}
	_, _, err = krbd.Compose(krbd.Layers{Cluster: krbd.ClusterDefaults{Options: "ms_mode=secure,bogus", Level: krbd.LevelConfig}})
	if !errors.Is(err, krbd.ErrInvalid) || !strings.Contains(err.Error(), `"bogus"`) || !strings.Contains(err.Error(), "rbd_default_map_options (config level)") {
		t.Errorf("an unknown option in the cluster's defaults: %v, want refused naming it and the level", err)
	}
}

// TestAClusterThatAsksForSecureNeverGetsAClearTextMapping: with the cluster's defaults at
// ms_mode=secure, a caller or map_options asking for any other mode is refused (naming where it
// came from), and secure from either is fine.
func TestAClusterThatAsksForSecureNeverGetsAClearTextMapping(t *testing.T) {
	secure := krbd.ClusterDefaults{Options: "ms_mode=secure", Level: krbd.LevelImage}
	for _, tc := range []struct {
		l    krbd.Layers
		want string // the error's source, or "" for a secure mapping
	}{
		{krbd.Layers{Cluster: secure}, ""},
		{krbd.Layers{Cluster: secure, Caller: []string{"ms_mode=secure"}}, ""},
		{krbd.Layers{Cluster: secure, Caller: []string{"ms_mode=crc"}}, krbd.FromCaller},
		{krbd.Layers{Cluster: secure, Caller: []string{"ms_mode=prefer-secure"}}, krbd.FromCaller},
		{krbd.Layers{Cluster: secure, Agent: []string{"ms_mode=legacy"}}, krbd.FromAgent},
		{krbd.Layers{Cluster: krbd.ClusterDefaults{Options: "share,exclusive,ms_mode=secure", Level: krbd.LevelPool}, Caller: []string{"ms_mode=crc"}}, krbd.FromCaller},
		{krbd.Layers{Cluster: secure, Agent: []string{"ms_mode=prefer-crc"}, Monitors: []string{"v2:10.0.0.1:3300"}, KernelMsgr2: true}, krbd.FromAgent},
	} {
		got, _, err := krbd.Compose(tc.l)
		if tc.want == "" {
			if err != nil || !slices.Contains(got, "ms_mode=secure") {
				t.Errorf("%+v: %v, %v; want ms_mode=secure", tc.l, got, err)
			}
			continue
		}
		if !errors.Is(err, krbd.ErrInvalid) || !strings.Contains(err.Error(), "ask for ms_mode=secure and the "+tc.want+"'s") {
			t.Errorf("%+v: %v, %v; want refused, naming the %s", tc.l, got, err, tc.want)
		}
	}
}

// TestMonitorsThatOfferMsgr2GetPreferCrcByDefault: no layer naming an ms_mode, monitors with
// an msgr2 address and a kernel from 5.11 give ms_mode=prefer-crc (as Tentacle's rbd device map
// does); v1-only monitors, an older kernel or any layer's ms_mode leave it out.
func TestMonitorsThatOfferMsgr2GetPreferCrcByDefault(t *testing.T) {
	vec := []string{"[v2:10.0.0.1:3300/0,v1:10.0.0.1:6789/0]"}
	for _, tc := range []struct {
		l    krbd.Layers
		want string // the ms_mode option, or ""
	}{
		{krbd.Layers{Monitors: vec, KernelMsgr2: true}, "ms_mode=prefer-crc"},
		{krbd.Layers{Monitors: []string{"10.0.0.1:3300"}, KernelMsgr2: true}, "ms_mode=prefer-crc"},
		{krbd.Layers{Monitors: vec}, ""},
		{krbd.Layers{Monitors: []string{"v1:10.0.0.1:6789", "10.0.0.2:6789"}, KernelMsgr2: true}, ""},
		{krbd.Layers{Monitors: vec, KernelMsgr2: true, Cluster: krbd.ClusterDefaults{Options: "ms_mode=legacy", Level: krbd.LevelConfig}}, "ms_mode=legacy"},
		{krbd.Layers{Monitors: vec, KernelMsgr2: true, Caller: []string{"ms_mode=secure"}}, "ms_mode=secure"},
	} {
		got, src, err := krbd.Compose(tc.l)
		i := slices.IndexFunc(got, func(o string) bool { return strings.HasPrefix(o, "ms_mode=") })
		switch {
		case err != nil:
			t.Errorf("%+v: %v", tc.l, err)
		case tc.want == "" && i >= 0, tc.want != "" && (i < 0 || got[i] != tc.want):
			t.Errorf("%+v: %v, want ms_mode %q", tc.l, got, tc.want)
		case tc.want == "ms_mode=prefer-crc" && src[i].From != krbd.FromDefault:
			t.Errorf("%+v: prefer-crc from %q, want the agent's default", tc.l, src[i].From)
		}
	}
	for rel, want := range map[string]bool{"6.12.48+deb13-amd64": true, "5.11.0": true, "5.10.0-32-amd64": false, "4.18.0-553.el8": false, "7.2.0": true, "": false} {
		if got := krbd.KernelSpeaksMsgr2(rel); got != want {
			t.Errorf("KernelSpeaksMsgr2(%q) = %v, want %v", rel, got, want)
		}
	}
}

// TestMonitorsAsCephWritesThem: monitors written as Ceph's mon_host and ceph-csi's config write
// them (typed, in address vectors, with nonces) reach the kernel as host:port, the addresses of
// the protocol the kernel speaks: v2 with an ms_mode other than legacy, v1 without. A list
// with none for that protocol is refused, naming what to change.
func TestMonitorsAsCephWritesThem(t *testing.T) {
	vec := "[v2:10.0.0.1:3300/0,v1:10.0.0.1:6789/0]"
	for _, tc := range []struct {
		mons  []string
		extra []string
		want  string // the add string's monitors, or the error's text
		err   bool
	}{
		{[]string{vec}, nil, "10.0.0.1:6789", false},
		{[]string{vec}, []string{"ms_mode=secure"}, "10.0.0.1:3300", false},
		{[]string{vec}, []string{"ms_mode=legacy"}, "10.0.0.1:6789", false},
		{[]string{vec, "[v2:10.0.0.2:3300,v1:10.0.0.2:6789]"}, []string{"ms_mode=prefer-crc"}, "10.0.0.1:3300,10.0.0.2:3300", false},
		{[]string{"v2:10.0.0.1:3300", "v2:10.0.0.2:3300"}, []string{"ms_mode=crc"}, "10.0.0.1:3300,10.0.0.2:3300", false},
		{[]string{"v1:10.0.0.1:6789"}, nil, "10.0.0.1:6789", false},
		{[]string{"10.0.0.1:3300"}, []string{"ms_mode=secure"}, "10.0.0.1:3300", false},
		{[]string{"[v2:[2001:db8::1]:3300/0,v1:[2001:db8::1]:6789/0]"}, []string{"ms_mode=secure"}, "[2001:db8::1]:3300", false},
		{[]string{"[2001:db8::1]:6789"}, nil, "[2001:db8::1]:6789", false},
		{[]string{"v2:10.0.0.1:3300"}, nil, "no monitor address for the kernel's msgr1", true},
		{[]string{"v1:10.0.0.1:6789"}, []string{"ms_mode=secure"}, "no monitor address for the kernel's msgr2", true},
		{[]string{"[v2:10.0.0.1:bad/0]"}, []string{"ms_mode=secure"}, `port "bad"`, true},
		{[]string{"10.0.0.1:6789 10.0.0.2,v2:10.0.0.3"}, nil, "10.0.0.1:6789,10.0.0.2:6789", false}, // a list in one entry, as mon_host has it
		{[]string{"v2:10.0.0.1"}, []string{"ms_mode=crc"}, "10.0.0.1:3300", false},                  // msgr2's own port
	} {
		o := opts()
		o.Monitors, o.Extra = tc.mons, tc.extra
		s, err := krbd.BuildAddString(mustSpec(t, "rbd/img1"), o)
		if tc.err {
			if !errors.Is(err, krbd.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v %v: %q, %v; want an error saying %q", tc.mons, tc.extra, s, err, tc.want)
			}
			continue
		}
		if err != nil || !strings.HasPrefix(s, tc.want+" ") {
			t.Errorf("%v %v: %q, %v; want monitors %q", tc.mons, tc.extra, s, err, tc.want)
		}
	}
}

// keyOf builds a base64 cephx secret of Ceph's form: type, created, length, key bytes.
func keyOf(typ uint16, n int, fill byte) string {
	b := make([]byte, 12+n)
	binary.LittleEndian.PutUint16(b, typ)
	binary.LittleEndian.PutUint16(b[10:], uint16(n))
	for i := range n {
		b[12+i] = fill + byte(i)
	}
	return base64.StdEncoding.EncodeToString(b)
}

// TestAnAes256kKeyNeedsLinux7AndCeph19_2_6: the key type is read from the key itself; an
// aes256k key on a kernel before 7.0 or with a librados before Ceph 19.2.6 (20.2.4 in 20.x) is
// refused in one line naming the type, the kernel's and librados's releases, what each needs and
// what to do; a librados release not known refuses nothing (the connection will say) but is
// named; aes keys pass everywhere; key ids differ between keys and never show the key.
func TestAnAes256kKeyNeedsLinux7AndCeph19_2_6(t *testing.T) {
	aes, aes256k := keyOf(1, 16, 1), keyOf(2, 32, 1)
	for key, want := range map[string]string{aes: krbd.KeyAES, aes256k: krbd.KeyAES256K, keyOf(7, 16, 1): "type 7"} {
		if got, err := krbd.KeyType(key); err != nil || got != want {
			t.Errorf("KeyType: %q, %v; want %q", got, err, want)
		}
	}
	const todo = ": keep this user's key aes until the nodes run "
	const rook = " (Rook: its CSI key type; by hand: a new aes key for the user)"
	const refused = "invalid argument: the key is aes256k, which this node cannot use: "
	for _, tc := range []struct {
		typ, kernel, librados string
		want                  string // the refusal, "" for none
	}{
		{krbd.KeyAES, "4.18.0-553.el8", "16.2.15", ""},
		{krbd.KeyAES, "", "", ""},
		{krbd.KeyAES256K, "7.0.0", "19.2.6", ""},
		{krbd.KeyAES256K, "7.2.1-amd64", "20.2.4", ""},
		{krbd.KeyAES256K, "7.2.1-amd64", "", ""},
		{krbd.KeyAES256K, "6.1.0-50-amd64", "16.2.15",
			refused + "its kernel 6.1.0-50-amd64 needs Linux 7.0 and its librados 16.2.15 needs Ceph 19.2.6 or 20.2.4" + todo + "Linux 7.0 and those libraries" + rook},
		{krbd.KeyAES256K, "6.12.48+deb13-amd64", "20.2.4",
			refused + "its kernel 6.12.48+deb13-amd64 needs Linux 7.0 (its librados 20.2.4 reads it)" + todo + "Linux 7.0" + rook},
		{krbd.KeyAES256K, "6.1.0-40-amd64", "",
			refused + "its kernel 6.1.0-40-amd64 needs Linux 7.0 (librados version unknown; it needs Ceph 19.2.6 or 20.2.4)" + todo + "Linux 7.0" + rook},
		{krbd.KeyAES256K, "", "19.2.6",
			refused + "its kernel (release unknown) needs Linux 7.0 (its librados 19.2.6 reads it)" + todo + "Linux 7.0" + rook},
		{krbd.KeyAES256K, "7.2.12-amd64", "19.2.3",
			refused + "its librados 19.2.3 needs Ceph 19.2.6 or 20.2.4 (its kernel 7.2.12-amd64 reads it)" + todo + "those libraries" + rook},
		{krbd.KeyAES256K, "7.0.0", "20.2.1-17-gabcdef0",
			refused + "its librados 20.2.1-17-gabcdef0 needs Ceph 19.2.6 or 20.2.4 (its kernel 7.0.0 reads it)" + todo + "those libraries" + rook},
	} {
		err := krbd.CheckNodeKey(tc.typ, krbd.NodeVersions{Kernel: tc.kernel, Librados: tc.librados})
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s on kernel %q, librados %q: %v, want accepted", tc.typ, tc.kernel, tc.librados, err)
		case tc.want == "":
		case err == nil || err.Error() != tc.want || !errors.Is(err, krbd.ErrInvalid):
			t.Errorf("%s on kernel %q, librados %q:\n %v\nwant (wrapping ErrInvalid)\n %s", tc.typ, tc.kernel, tc.librados, err, tc.want)
		}
	}
	if a, b := krbd.KeyID(aes), krbd.KeyID(keyOf(1, 16, 2)); a == "" || a == b || strings.Contains(aes, a) {
		t.Errorf("KeyID: %q and %q", a, b)
	}
}

// TestLibradosReadsKey: librados reads aes256k keys from Ceph 19.2.6 in 19.x, 20.2.4 in 20.x,
// and in every release from 21; a release it cannot read is not refused (the connection will
// say); other key types are read by all.
func TestLibradosReadsKey(t *testing.T) {
	for _, tc := range []struct {
		typ, release string
		reads        bool
	}{
		{krbd.KeyAES, "16.2.15", true}, {krbd.KeyAES, "", true}, {"type 7", "16.2.15", true},
		{krbd.KeyAES256K, "16.2.15", false}, {krbd.KeyAES256K, "17.2.9", false}, {krbd.KeyAES256K, "18.2.7", false},
		{krbd.KeyAES256K, "19.1.9", false}, {krbd.KeyAES256K, "19.2.5", false}, {krbd.KeyAES256K, "19.2.6", true},
		{krbd.KeyAES256K, "19.2.10", true}, {krbd.KeyAES256K, "19.3.0-1234-g0123abc", true},
		{krbd.KeyAES256K, "20.1.0", false}, {krbd.KeyAES256K, "20.2.3", false}, {krbd.KeyAES256K, "20.2.3-99-g0123abc", false},
		{krbd.KeyAES256K, "20.2.4", true}, {krbd.KeyAES256K, "20.2.12", true}, {krbd.KeyAES256K, "20.3.0", true},
		{krbd.KeyAES256K, "21.0.0", true}, {krbd.KeyAES256K, "21.2.0", true}, {krbd.KeyAES256K, "100.0.0", true},
		{krbd.KeyAES256K, "9.2.6", false}, {krbd.KeyAES256K, "1.2.40", false},
		// not a release it can read: left to the connection
		{krbd.KeyAES256K, "", true}, {krbd.KeyAES256K, "16.2", true}, {krbd.KeyAES256K, "v16.2.15", true},
		{krbd.KeyAES256K, "16.2.15.1", true}, {krbd.KeyAES256K, "unknown", true},
	} {
		if got := krbd.LibradosReadsKey(tc.typ, tc.release); got != tc.reads {
			t.Errorf("LibradosReadsKey(%q, %q): %v, want %v", tc.typ, tc.release, got, tc.reads)
		}
	}
}
