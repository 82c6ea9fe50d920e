// Package fakekernel is a test double of the kernel's krbd sysfs interface: a temp directory
// serves as sysfs root and /dev root, and writes to /sys/bus/rbd/add* and remove* (through
// krbd.ControlWriter) create and delete devices/N with the kernel's attributes, emit the
// kernel's uevents in the kernel's order and fail with the kernel's errno values:
//
//	add:    ENOENT unknown pool/namespace/image/snapshot, EACCES unknown user or wrong key,
//	        EINVAL malformed string or unknown option, ETIMEDOUT unreachable monitor
//	remove: ENOENT unknown id, EBUSY device open (unless "force"), EINVAL malformed
//
// It is for speed; the real kernel is the judge (see the real-kernel test).
package fakekernel

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/rbd-owner/rbd-owner/agent/krbd"
)

// Major is the dynamic major the fake's single-major mode uses.
const Major = 251

// Options configure a Kernel.
type Options struct {
	NoModule      bool   // start without /sys/bus/rbd (LoadModule creates it)
	NoSingleMajor bool   // only add/remove (each device gets its own major)
	FSID          string // cluster fsid (default a fixed UUID)
	// MonitorFSIDs gives the fsid of the cluster behind a monitor string (the add string's
	// first field), for a node that maps from several clusters; others get FSID.
	MonitorFSIDs map[string]string
	// UnreachableMonitor: an add naming only this monitor fails with ETIMEDOUT.
	UnreachableMonitor string
}

type image struct {
	id    string
	size  uint64
	snaps map[string]bool
}

// Kernel is the fake. Safe for concurrent use.
type Kernel struct {
	Sysfs     string // sysfs root
	Dev       string // /dev root
	MountInfo string // the mount table (krbd.Config.MountInfo): what Mount adds to
	opts      Options

	mu        sync.Mutex
	images    map[string]*image // "pool/ns/image"
	pools     map[string]bool
	users     map[string][][]byte // user id -> decoded secrets (one per cluster it exists in)
	keys      map[string][]byte   // keyring: description -> payload
	devices   map[int]string      // id -> config_info
	open      map[int]bool
	nextMajor int
	clientSeq int
	// shared kernel clients: a map without noshare joins a client made with the same monitors
	// and options (libceph's ceph_compare_options), which lives while a device uses it
	sharedBy map[string]int // client key -> clientSeq
	clientOf map[int]string // device id -> client key ("" for a client of its own)
	subs     map[*sub]bool
	// the fake udevd: it sends its copy of each rbd event (FromUdev) to the udev subscribers,
	// at once, or when ReleaseUdev is called while HoldUdev holds it
	udevHeld  bool
	udevQueue []krbd.Uevent
	dropNext  int
	writes    []string
	loads     int
	mountSeq  int
}

// New creates a fake kernel under dir (dir/sys, dir/dev).
func New(dir string, o Options) (*Kernel, error) {
	if o.FSID == "" {
		o.FSID = "a7f64266-0894-4f1e-a635-d0aeaca0e993"
	}
	k := &Kernel{Sysfs: filepath.Join(dir, "sys"), Dev: filepath.Join(dir, "dev"), MountInfo: filepath.Join(dir, "mountinfo"), opts: o,
		images: map[string]*image{}, pools: map[string]bool{}, users: map[string][][]byte{},
		keys: map[string][]byte{}, devices: map[int]string{}, open: map[int]bool{},
		nextMajor: 240, clientSeq: 4117, subs: map[*sub]bool{},
		sharedBy: map[string]int{}, clientOf: map[int]string{}}
	for _, d := range []string{k.Sysfs, k.Dev, filepath.Join(k.Sysfs, "devices", "rbd")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	// the root file system, as every mount table starts
	if err := os.WriteFile(k.MountInfo, []byte("22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"), 0o644); err != nil {
		return nil, err
	}
	if !o.NoModule {
		if err := k.loadModule(); err != nil {
			return nil, err
		}
	}
	return k, nil
}

func (k *Kernel) fsidOf(mons string) string {
	if f, ok := k.opts.MonitorFSIDs[mons]; ok {
		return f
	}
	return k.opts.FSID
}

func (k *Kernel) bus() string { return filepath.Join(k.Sysfs, "bus", "rbd") }

func (k *Kernel) loadModule() error {
	if err := os.MkdirAll(filepath.Join(k.bus(), "devices"), 0o755); err != nil {
		return err
	}
	files := []string{"add", "remove", "supported_features"}
	if !k.opts.NoSingleMajor {
		files = append(files, "add_single_major", "remove_single_major")
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(k.bus(), f), nil, 0o200); err != nil {
			return err
		}
	}
	return nil
}

// LoadModule is the fake "modprobe rbd" (krbd.Config.LoadModule).
func (k *Kernel) LoadModule(_ context.Context) error {
	k.mu.Lock()
	k.loads++
	k.mu.Unlock()
	return k.loadModule()
}

// Loads counts LoadModule calls.
func (k *Kernel) Loads() int { k.mu.Lock(); defer k.mu.Unlock(); return k.loads }

// AddPool creates a pool.
func (k *Kernel) AddPool(pool string) { k.mu.Lock(); k.pools[pool] = true; k.mu.Unlock() }

// AddImage creates pool/ns/image (ns "" for none) with snapshots.
func (k *Kernel) AddImage(pool, ns, name string, size uint64, snaps ...string) {
	k.AddImageWithID(pool, ns, name, "", size, snaps...)
}

// AddImageWithID is AddImage with the image's id (image_id) given, e.g. to match the id an
// in-memory cluster gives the same image; "" picks one.
func (k *Kernel) AddImageWithID(pool, ns, name, id string, size uint64, snaps ...string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.pools[pool] = true
	if id == "" {
		id = fmt.Sprintf("%x", 0x1000+len(k.images))
	}
	im := &image{id: id, size: size, snaps: map[string]bool{}}
	for _, s := range snaps {
		im.snaps[s] = true
	}
	k.images[pool+"/"+ns+"/"+name] = im
}

// AddUser lets cephx user id authenticate with secret (base64); a user of the same name in
// another cluster (another secret) may be added too.
func (k *Kernel) AddUser(id, secret string) error {
	b, err := krbd.DecodeSecret(secret)
	if err != nil {
		return err
	}
	k.mu.Lock()
	k.users[id] = append(k.users[id], b)
	k.mu.Unlock()
	return nil
}

// AddCephKey implements krbd.KeyStore (the keyring).
func (k *Kernel) AddCephKey(name string, payload []byte) error {
	k.mu.Lock()
	k.keys[name] = bytes.Clone(payload)
	k.mu.Unlock()
	return nil
}

// DropCephKey implements krbd.KeyStore (the keyring).
func (k *Kernel) DropCephKey(name string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.keys[name]; !ok {
		return syscall.ENOKEY
	}
	delete(k.keys, name)
	return nil
}

// Keys returns the descriptions of the keys in the keyring now.
func (k *Kernel) Keys() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []string
	for n := range k.keys {
		out = append(out, n)
	}
	return out
}

// SetOpen marks device id open (remove fails EBUSY) or closed.
func (k *Kernel) SetOpen(id int, open bool) { k.mu.Lock(); k.open[id] = open; k.mu.Unlock() }

// Mount records device id (partition 0 for the whole disk) as mounted at path in the mount
// table, and marks it open (remove fails EBUSY), as a file system mounted on it does.
func (k *Kernel) Mount(id, partition int, path string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	dir := filepath.Join(k.Sysfs, "devices", "rbd", strconv.Itoa(id))
	maj, err := os.ReadFile(filepath.Join(dir, "major"))
	if err != nil {
		return err
	}
	minb, err := os.ReadFile(filepath.Join(dir, "minor"))
	if err != nil {
		return err
	}
	minor, err := strconv.Atoi(strings.TrimSpace(string(minb)))
	if err != nil {
		return err
	}
	f, err := os.OpenFile(k.MountInfo, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	k.mountSeq++
	src := filepath.Join(k.Dev, "rbd"+strconv.Itoa(id))
	if partition > 0 {
		src += "p" + strconv.Itoa(partition)
	}
	// mountinfo escapes a space in a path as \040
	_, err = fmt.Fprintf(f, "%d 22 %s:%d / %s rw,relatime shared:%d - ext4 %s rw\n",
		100+k.mountSeq, strings.TrimSpace(string(maj)), minor+partition, strings.ReplaceAll(path, " ", `\040`), 100+k.mountSeq, src)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	k.open[id] = true
	return nil
}

// DropEvents makes the next n events vanish for every subscriber, as if the socket buffer
// had overflowed; subscribers then get an Overflow marker before the next delivered event.
func (k *Kernel) DropEvents(n int) { k.mu.Lock(); k.dropNext = n; k.mu.Unlock() }

// Writes returns every string written to a control file, in order ("file: data").
func (k *Kernel) Writes() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.writes...)
}

// Config returns a krbd.Config wired to this fake.
func (k *Kernel) Config() krbd.Config {
	return krbd.Config{SysfsRoot: k.Sysfs, DevRoot: k.Dev, Writer: k, Events: k, Udev: k.Udevd(), Keys: k,
		LoadModule: k.LoadModule, StatDev: k.StatDev, MountInfo: k.MountInfo}
}

// Udevd returns the fake udevd's event source: a copy of every rbd event the kernel emits,
// marked FromUdev, as udevd sends it once its rules ran.
func (k *Kernel) Udevd() krbd.EventSource { return udevSource{k} }

type udevSource struct{ k *Kernel }

func (u udevSource) Subscribe(ctx context.Context) (krbd.Subscription, error) {
	return u.k.subscribe(ctx, true)
}

// HoldUdev makes the fake udevd keep its events (as a busy udevd running slow rules does)
// until ReleaseUdev.
func (k *Kernel) HoldUdev() { k.mu.Lock(); k.udevHeld = true; k.mu.Unlock() }

// ReleaseUdev sends what the fake udevd held, in order, and stops holding.
func (k *Kernel) ReleaseUdev() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.udevHeld = false
	q := k.udevQueue
	k.udevQueue = nil
	for _, ev := range q {
		k.deliver(ev, true)
	}
}

// StatDev reads the fake device node (a regular file holding "major:minor").
func (k *Kernel) StatDev(path string) (uint32, uint32, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, err
	}
	var maj, mnr uint32
	if _, err := fmt.Sscanf(string(b), "%d:%d", &maj, &mnr); err != nil {
		return 0, 0, fmt.Errorf("%s: not a (fake) block device", path)
	}
	return maj, mnr, nil
}

// WriteControl implements krbd.ControlWriter: it dispatches on the control file.
func (k *Kernel) WriteControl(path string, data []byte) error {
	rel, err := filepath.Rel(k.bus(), path)
	if err != nil || strings.Contains(rel, "/") {
		return fmt.Errorf("fakekernel: write outside %s: %s", k.bus(), path)
	}
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("open: %w", err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.writes = append(k.writes, rel+": "+string(data))
	switch rel {
	case "add", "add_single_major":
		return k.add(string(data), rel == "add_single_major")
	case "remove", "remove_single_major":
		return k.remove(string(data))
	}
	return syscall.EACCES // supported_features etc. are read-only
}

var knownOpts = map[string]bool{"name": true, "key": true, "secret": true, "noshare": false,
	"share": false, "mount_timeout": true, "read_only": false, "ro": false, "read_write": false,
	"rw": false, "_pool_ns": true, "exclusive": false, "ms_mode": true, "queue_depth": true,
	"lock_on_read": false, "notrim": false, "crc": false, "nocrc": false, "alloc_size": true,
	"osd_request_timeout": true, "lock_timeout": true, "tcp_nodelay": false}

// add parses like rbd_add_parse_args + libceph's option parser.
func (k *Kernel) add(s string, single bool) error {
	f := strings.Fields(strings.TrimSuffix(s, "\n"))
	if len(f) < 4 || len(f) > 5 {
		return syscall.EINVAL
	}
	mons, optstr, pool, name, snap := f[0], f[1], f[2], f[3], "-"
	if len(f) == 5 {
		snap = f[4]
	}
	opts := map[string]string{}
	for _, o := range strings.Split(optstr, ",") {
		key, val, hasVal := strings.Cut(o, "=")
		wantVal, ok := knownOpts[key]
		if !ok || wantVal != hasVal {
			return syscall.EINVAL
		}
		opts[key] = val
	}
	user := opts["name"]
	if user == "" {
		user = "guest"
	}
	var secret []byte
	switch {
	case opts["key"] != "":
		p, ok := k.keys[opts["key"]]
		if !ok {
			return syscall.ENOKEY
		}
		secret = p
	case opts["secret"] != "":
		b, err := krbd.DecodeSecret(opts["secret"])
		if err != nil {
			return syscall.EINVAL
		}
		secret = b
	}
	if k.opts.UnreachableMonitor != "" && mons == k.opts.UnreachableMonitor {
		return syscall.ETIMEDOUT
	}
	if !slices.ContainsFunc(k.users[user], func(want []byte) bool { return bytes.Equal(want, secret) }) {
		return syscall.EACCES
	}
	if !k.pools[pool] {
		return syscall.ENOENT
	}
	ns := opts["_pool_ns"]
	im := k.images[pool+"/"+ns+"/"+name]
	if im == nil || (snap != "-" && !im.snaps[snap]) {
		return syscall.ENOENT
	}
	id := 0
	for k.devices[id] != "" {
		id++
	}
	major, minor := Major, id<<4
	if !single {
		k.nextMajor--
		major, minor = k.nextMajor, 0
	}
	seq, clientKey := 0, ""
	if _, own := opts["noshare"]; !own {
		clientKey = mons + " " + optstr
		seq = k.sharedBy[clientKey]
	}
	if seq == 0 {
		k.clientSeq++
		seq = k.clientSeq
		if clientKey != "" {
			k.sharedBy[clientKey] = seq
		}
	}
	_, hasRO := opts["read_only"]
	_, hasRO2 := opts["ro"]
	ro := hasRO || hasRO2 || snap != "-"
	attrs := map[string]string{
		"pool": pool, "pool_id": "2", "pool_ns": ns, "name": name, "image_id": im.id,
		"current_snap": snap, "snap_id": "18446744073709551614",
		"client_id":    "client" + strconv.Itoa(seq),
		"client_addr":  fmt.Sprintf("203.0.113.11:0/%d", 100000+seq),
		"cluster_fsid": k.fsidOf(mons), "features": "0x3d",
		"major": strconv.Itoa(major), "minor": strconv.Itoa(minor),
		"size": strconv.FormatUint(im.size, 10), "config_info": s,
	}
	// build devices/N atomically (a temp dir renamed into place), then the links, like
	// device_add; then the block device and its node.
	top := filepath.Join(k.Sysfs, "devices", "rbd")
	tmp, err := os.MkdirTemp(top, ".new")
	if err != nil {
		return syscall.ENOMEM
	}
	for a, v := range attrs {
		if err := os.WriteFile(filepath.Join(tmp, a), []byte(v+"\n"), 0o444); err != nil {
			return syscall.ENOMEM
		}
	}
	blk := "rbd" + strconv.Itoa(id)
	if err := os.MkdirAll(filepath.Join(tmp, "block", blk), 0o755); err != nil {
		return syscall.ENOMEM
	}
	roAttr := "0"
	if ro {
		roAttr = "1"
	}
	if err := os.WriteFile(filepath.Join(tmp, "block", blk, "ro"), []byte(roAttr+"\n"), 0o444); err != nil {
		return syscall.ENOMEM
	}
	dir := filepath.Join(top, strconv.Itoa(id))
	if err := os.Rename(tmp, dir); err != nil {
		return syscall.ENOMEM
	}
	_ = os.Symlink(filepath.Join("..", "..", "..", "devices", "rbd", strconv.Itoa(id)), filepath.Join(k.bus(), "devices", strconv.Itoa(id)))
	k.devices[id] = s
	k.clientOf[id] = clientKey
	k.emit(krbd.Uevent{Action: "add", Subsystem: "rbd", DevPath: "/devices/rbd/" + strconv.Itoa(id)})
	k.emit(krbd.Uevent{Action: "add", Subsystem: "bdi", DevPath: fmt.Sprintf("/devices/virtual/bdi/%d:%d", major, minor)})
	if err := os.WriteFile(filepath.Join(k.Dev, blk), []byte(fmt.Sprintf("%d:%d", major, minor)), 0o600); err != nil {
		return syscall.ENOMEM
	}
	k.emit(krbd.Uevent{Action: "add", Subsystem: "block", DevType: "disk", DevName: blk,
		DevPath: "/devices/rbd/" + strconv.Itoa(id) + "/block/" + blk,
		Major:   strconv.Itoa(major), Minor: strconv.Itoa(minor)})
	return nil
}

func (k *Kernel) remove(s string) error {
	f := strings.Fields(strings.TrimSuffix(s, "\n"))
	if len(f) < 1 || len(f) > 2 || (len(f) == 2 && f[1] != "force") {
		return syscall.EINVAL
	}
	id, err := strconv.Atoi(f[0])
	if err != nil || id < 0 {
		return syscall.EINVAL
	}
	if k.devices[id] == "" {
		return syscall.ENOENT
	}
	if k.open[id] && len(f) == 1 {
		return syscall.EBUSY
	}
	sid := strconv.Itoa(id)
	dir := filepath.Join(k.Sysfs, "devices", "rbd", sid)
	maj, _ := os.ReadFile(filepath.Join(dir, "major"))
	mnr, _ := os.ReadFile(filepath.Join(dir, "minor"))
	mm := strings.TrimSpace(string(maj)) + ":" + strings.TrimSpace(string(mnr))
	blk := "rbd" + sid
	k.emit(krbd.Uevent{Action: "remove", Subsystem: "bdi", DevPath: "/devices/virtual/bdi/" + mm})
	_ = os.Remove(filepath.Join(k.Dev, blk))
	k.emit(krbd.Uevent{Action: "remove", Subsystem: "block", DevType: "disk", DevName: blk,
		DevPath: "/devices/rbd/" + sid + "/block/" + blk})
	_ = os.Remove(filepath.Join(k.bus(), "devices", sid))
	_ = os.RemoveAll(dir)
	k.emit(krbd.Uevent{Action: "remove", Subsystem: "rbd", DevPath: "/devices/rbd/" + sid})
	delete(k.devices, id)
	delete(k.open, id)
	if key := k.clientOf[id]; key != "" {
		delete(k.clientOf, id)
		inUse := false
		for _, other := range k.clientOf {
			inUse = inUse || other == key
		}
		if !inUse {
			delete(k.sharedBy, key)
		}
	}
	delete(k.clientOf, id)
	return nil
}

// Subscribe implements krbd.EventSource: the kernel's own events.
func (k *Kernel) Subscribe(ctx context.Context) (krbd.Subscription, error) {
	return k.subscribe(ctx, false)
}

func (k *Kernel) subscribe(ctx context.Context, udev bool) (krbd.Subscription, error) {
	s := &sub{k: k, udev: udev, ch: make(chan krbd.Uevent, 64), done: make(chan struct{})}
	k.mu.Lock()
	k.subs[s] = true
	k.mu.Unlock()
	go func() {
		select {
		case <-ctx.Done():
			_ = s.Close() // always nil: the fake's Close only unregisters
		case <-s.done:
		}
	}()
	return s, nil
}

// Subscribers counts open subscriptions (tests check for leaks).
func (k *Kernel) Subscribers() int { k.mu.Lock(); defer k.mu.Unlock(); return len(k.subs) }

// emit delivers ev to every subscriber without blocking (k.mu held): a full subscriber loses
// the event and gets an Overflow marker later, like a netlink socket with ENOBUFS.
func (k *Kernel) emit(ev krbd.Uevent) {
	ev.Env = map[string]string{"ACTION": ev.Action, "DEVPATH": ev.DevPath, "SUBSYSTEM": ev.Subsystem}
	if k.dropNext > 0 {
		k.dropNext--
		for s := range k.subs {
			if s.udev {
				continue // the kernel's socket overflowed, not udevd's
			}
			// like ENOBUFS: the next receive reports the loss at once
			select {
			case s.ch <- krbd.Uevent{Overflow: true}:
				s.lost = false
			default:
				s.lost = true
			}
		}
		return
	}
	if !ev.IsRBD() {
		return // the real source filters non-rbd events (bdi) too
	}
	k.deliver(ev, false)
	ev.FromUdev = true
	if ev.DevName != "" {
		ev.DevName = "/dev/" + ev.DevName
	}
	if k.udevHeld {
		k.udevQueue = append(k.udevQueue, ev)
	} else {
		k.deliver(ev, true)
	}
}

// deliver sends ev to the kernel's (udev false) or udevd's subscribers (k.mu held).
func (k *Kernel) deliver(ev krbd.Uevent, udev bool) {
	for s := range k.subs {
		if s.udev != udev {
			continue
		}
		if s.lost {
			select {
			case s.ch <- krbd.Uevent{Overflow: true}:
				s.lost = false
			default:
				continue
			}
		}
		select {
		case s.ch <- ev:
		default:
			s.lost = true
		}
	}
}

type sub struct {
	k    *Kernel
	udev bool // a subscriber of the fake udevd
	ch   chan krbd.Uevent
	done chan struct{}
	once sync.Once
	lost bool // guarded by k.mu
}

func (s *sub) Events() <-chan krbd.Uevent { return s.ch }

func (s *sub) Close() error {
	s.once.Do(func() {
		s.k.mu.Lock()
		delete(s.k.subs, s)
		close(s.ch)
		s.k.mu.Unlock()
		close(s.done)
	})
	return nil
}
