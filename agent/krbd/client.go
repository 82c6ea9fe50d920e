package krbd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
)

// Config holds the seams between this package and the kernel. Zero fields get the real thing.
type Config struct {
	SysfsRoot string        // default "/sys"
	DevRoot   string        // default "/dev"
	Writer    ControlWriter // default SysfsWriter
	// Events are the kernel's own uevents, which every wait follows: the device is usable
	// once the kernel announced it and devtmpfs made its node (default &NetlinkSource{Mode:
	// ModeKernel}).
	Events EventSource
	// Udev delivers udevd's events, sent once its rules ran (links made, the device probed);
	// a map waits for them too unless MapOptions.NoUdev. Its Subscribe answers ErrNoUdev when
	// udevd does not run (the map then does not wait). Default: &NetlinkSource{Mode: ModeUdev}
	// when Events is defaulted too; none (no udevd) when a test gives its own Events.
	Udev EventSource
	// UdevTimeout bounds the wait for udevd once the kernel's device is there (default 10 s):
	// a stuck udevd delays the link, never the map, which then returns with a warning.
	UdevTimeout time.Duration
	Keys        KeyStore                                           // default KernelKeyring
	LoadModule  func(ctx context.Context) error                    // default ModprobeRBD; called when /sys/bus/rbd is absent
	StatDev     func(path string) (major, minor uint32, err error) // default StatDevNode
	Logger      logrus.FieldLogger                                 // the agent's logger; default: discard
	// EBusyRetry bounds how long Unmap retries EBUSY (default 3 s): udev's probe holds a
	// freshly mapped device open for a moment.
	EBusyRetry time.Duration
	// Poll is how often waits re-read sysfs besides reacting to events (default 250 ms).
	Poll time.Duration
	// MountInfo is the mount table read to name where a busy device is mounted (default
	// DefaultMountInfo, the agent's own mount namespace).
	MountInfo string
}

// Client maps, unmaps and lists krbd devices. Safe for concurrent use.
type Client struct {
	cfg Config

	mu    sync.Mutex
	locks map[Spec]*specLock // in-process serialisation of maps of the same spec
}

type specLock struct {
	ch   chan struct{}
	refs int
}

// New returns a Client over cfg (zero fields defaulted).
func New(cfg Config) *Client {
	if cfg.SysfsRoot == "" {
		cfg.SysfsRoot = "/sys"
	}
	if cfg.DevRoot == "" {
		cfg.DevRoot = "/dev"
	}
	if cfg.Writer == nil {
		cfg.Writer = SysfsWriter{}
	}
	if cfg.Events == nil {
		cfg.Events = &NetlinkSource{Mode: ModeKernel}
		if cfg.Udev == nil {
			cfg.Udev = &NetlinkSource{Mode: ModeUdev}
		}
	}
	if cfg.UdevTimeout == 0 {
		cfg.UdevTimeout = 10 * time.Second
	}
	if cfg.Keys == nil {
		cfg.Keys = KernelKeyring{}
	}
	if cfg.LoadModule == nil {
		cfg.LoadModule = ModprobeRBD
	}
	if cfg.StatDev == nil {
		cfg.StatDev = StatDevNode
	}
	if cfg.Logger == nil {
		discard := logrus.New()
		discard.SetOutput(io.Discard)
		cfg.Logger = discard
	}
	if cfg.EBusyRetry == 0 {
		cfg.EBusyRetry = 3 * time.Second
	}
	if cfg.Poll == 0 {
		cfg.Poll = 250 * time.Millisecond
	}
	if cfg.MountInfo == "" {
		cfg.MountInfo = DefaultMountInfo
	}
	return &Client{cfg: cfg, locks: map[Spec]*specLock{}}
}

// Config returns the effective configuration.
func (c *Client) Config() Config { return c.cfg }

func (c *Client) busDir() string { return filepath.Join(c.cfg.SysfsRoot, "bus", "rbd") }

// lockSpec serialises maps of one spec inside this process: the kernel does not say which id
// a write created, so two simultaneous maps of the same image could not tell theirs apart.
func (c *Client) lockSpec(ctx context.Context, s Spec) (func(), error) {
	c.mu.Lock()
	l := c.locks[s]
	if l == nil {
		l = &specLock{ch: make(chan struct{}, 1)}
		c.locks[s] = l
	}
	l.refs++
	c.mu.Unlock()
	release := func() {
		c.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(c.locks, s)
		}
		c.mu.Unlock()
	}
	select {
	case l.ch <- struct{}{}:
		return func() { <-l.ch; release() }, nil
	case <-ctx.Done():
		release()
		return nil, ctx.Err()
	}
}

// EnsureModule loads the rbd module when /sys/bus/rbd is absent and waits (bounded by ctx
// and 10 s) for it to appear.
func (c *Client) EnsureModule(ctx context.Context) error {
	if _, err := os.Stat(c.busDir()); err == nil {
		return nil
	}
	c.cfg.Logger.WithField("bus", c.busDir()).Info("loading rbd module")
	if err := c.cfg.LoadModule(ctx); err != nil {
		return fmt.Errorf("%w: %w", ErrNoKernelSupport, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		if _, err := os.Stat(filepath.Join(c.busDir(), "add")); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %s did not appear after loading rbd", ErrNoKernelSupport, c.busDir())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// controlFile picks <base>_single_major when the kernel has it, else <base>.
func (c *Client) controlFile(base string) (string, error) {
	for _, name := range []string{base + "_single_major", base} {
		p := filepath.Join(c.busDir(), name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: no %s control file under %s", ErrNoKernelSupport, base, c.busDir())
}

// Map maps spec and returns the new device once the kernel added it, its block device was
// announced and /dev/rbdN exists with the major:minor sysfs gives, and then (unless
// o.NoUdev) once udevd has run its rules for it (see Config.Udev). Every map is a new device
// (noshare): callers that want idempotence look for an existing one first (FindBySpec).
func (c *Client) Map(ctx context.Context, spec Spec, o MapOptions) (Device, error) {
	d, err := c.mapImage(ctx, spec, o)
	if err != nil {
		return Device{}, fmt.Errorf("map %s: %w", spec, err)
	}
	return d, nil
}

func (c *Client) mapImage(ctx context.Context, spec Spec, o MapOptions) (Device, error) {
	req, err := c.prepareAdd(ctx, spec, o)
	if err != nil {
		return Device{}, err
	}
	unlock, err := c.lockSpec(ctx, spec)
	if err != nil {
		return Device{}, err
	}
	defer unlock()

	sub, udev, err := c.subscribeMap(ctx, o)
	if err != nil {
		return Device{}, err
	}
	defer c.closeSub("uevent", sub)
	if udev != nil {
		defer c.closeSub("udev event", udev)
	}
	seen, err := c.knownDevices()
	if err != nil {
		return Device{}, err
	}

	start := time.Now()
	if err := c.writeWithKey(req.keyName, req.payload, req.file, []byte(req.add)); err != nil {
		return Device{}, classify(filepath.Base(req.file), err)
	}
	c.cfg.Logger.WithFields(logrus.Fields{"spec": spec.String(), "file": req.file, "took": time.Since(start)}).Debug("rbd add written")

	timeout := o.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	d, err := c.waitMapped(wctx, sub, spec, req.add, seen)
	if err != nil {
		return Device{}, c.removeUnfinished(ctx, req.add, err)
	}
	if udev != nil {
		c.waitUdev(ctx, udev, d)
	}
	return d, nil
}

// addRequest is one map's write to the bus: the add string, and the key it names.
type addRequest struct {
	file    string // the control file: add, or add_single_major
	add     string // unique to this map by its key name
	keyName string
	payload []byte // the secret, decoded
}

// prepareAdd builds a map's add string and key, and makes sure the kernel can take them (the
// module loaded, the control file found).
func (c *Client) prepareAdd(ctx context.Context, spec Spec, o MapOptions) (addRequest, error) {
	nonce, err := newNonce()
	if err != nil {
		return addRequest{}, err
	}
	add, err := buildAddString(spec, o, nonce)
	if err != nil {
		return addRequest{}, err
	}
	payload, err := DecodeSecret(o.Secret)
	if err != nil {
		return addRequest{}, err
	}
	if err := c.EnsureModule(ctx); err != nil {
		return addRequest{}, err
	}
	file, err := c.controlFile("add")
	if err != nil {
		return addRequest{}, err
	}
	return addRequest{file: file, add: add, keyName: KeyName(o.User, nonce), payload: payload}, nil
}

// subscribeMap listens before a map's write (the kernel emits its events before the write
// returns): sub's events wake the wait for whatever sysfs and /dev did not show at once, and
// udev's say udevd is done (nil with noudev, or without udevd).
func (c *Client) subscribeMap(ctx context.Context, o MapOptions) (sub, udev Subscription, err error) {
	sub, err = c.cfg.Events.Subscribe(ctx)
	if err != nil {
		return nil, nil, err
	}
	if o.NoUdev || c.cfg.Udev == nil {
		return sub, nil, nil
	}
	switch u, err := c.cfg.Udev.Subscribe(ctx); {
	case errors.Is(err, ErrNoUdev):
		return sub, nil, nil
	case err != nil:
		c.closeSub("uevent", sub)
		return nil, nil, err
	default:
		return sub, u, nil
	}
}

// knownDevices lists the devices there before a map, with their client ids: an id freed and
// reused meanwhile is a new device.
func (c *Client) knownDevices() (map[int]string, error) {
	before, err := c.ids()
	if err != nil {
		return nil, err
	}
	seen := make(map[int]string, len(before))
	for _, id := range before {
		seen[id] = c.attr(id, "client_id")
	}
	return seen, nil
}

// removeUnfinished is a map's way out when the kernel accepted its write but the device did not
// come up in time (err): the device is removed, found by its config_info (the add string,
// unique by its key name), so that no claim-less device stays.
func (c *Client) removeUnfinished(ctx context.Context, add string, err error) error {
	ours, ok := c.findByAdd(add)
	if !ok {
		return err
	}
	uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultTimeout)
	defer ucancel()
	if _, uerr := c.UnmapDevice(uctx, ours, UnmapOptions{Force: true}); uerr != nil {
		return fmt.Errorf("%w (and rbd%d, which it made, could not be removed: %v): %w", err, ours.ID, uerr, ErrLeftMapped)
	}
	return err
}

// closeSub closes an event subscription a map or unmap is done with. A failure changes nothing
// about the device, so it is logged, not returned.
func (c *Client) closeSub(what string, s Subscription) {
	if err := s.Close(); err != nil {
		c.cfg.Logger.WithError(err).Warnf("could not close a %s subscription", what)
	}
}

// newNonce returns a random lower-case hex string for a map's key name.
func newNonce() (string, error) {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("random key name: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// attr reads one attribute of device id ("" when unreadable).
func (c *Client) attr(id int, name string) string {
	b, err := os.ReadFile(filepath.Join(c.devicesDir(), strconv.Itoa(id), name))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// findByAdd finds the device whose config_info is add.
func (c *Client) findByAdd(add string) (Device, bool) {
	ids, err := c.ids()
	if err != nil {
		return Device{}, false
	}
	for _, id := range ids {
		if c.attr(id, "config_info") == add {
			if d, err := c.ReadDevice(id); err == nil {
				return d, true
			}
		}
	}
	return Device{}, false
}

// writeWithKey adds the map's key and writes on one locked OS thread, so the kernel's keyring
// lookup (done in the writing task's context) finds the key; the key is dropped afterwards
// (the kernel copied the secret while parsing).
func (c *Client) writeWithKey(keyName string, payload []byte, file string, data []byte) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := c.cfg.Keys.AddCephKey(keyName, payload); err != nil {
		return err
	}
	defer func() {
		if err := c.cfg.Keys.DropCephKey(keyName); err != nil {
			c.cfg.Logger.WithError(err).WithField("key", keyName).Warn("could not drop the map's key from the keyring")
		}
	}()
	return c.cfg.Writer.WriteControl(file, data)
}

// waitMapped waits for the device our write created: a new id (not present before the
// write) whose config_info is our add string (or, on kernels without it, whose names are
// spec), and /dev/rbdN with sysfs's major:minor. The kernel has made all of that by the time
// the write returns (rbd's add is synchronous, devtmpfs makes the node in device_add), so
// this normally finds it at once; the kernel's events and every Poll re-read sysfs for the
// rest (a kernel without devtmpfs, whose node udevd makes).
func (c *Client) waitMapped(ctx context.Context, sub Subscription, spec Spec, add string, seen map[int]string) (Device, error) {
	tick := time.NewTicker(c.cfg.Poll)
	defer tick.Stop()
	var cand *Device
	var lastErr error
	for {
		// find our device: the one whose config_info is exactly our add string (its key name
		// is unique to this map), so each device costs one small read, not a whole device
		// (with 256 maps at once, reading every new device whole for each map made the
		// agent's search quadratic and starved its loops); kernels without config_info fall
		// back to the names of the ids that were not there before the write
		if cand == nil {
			ids, err := c.ids()
			if err != nil {
				return Device{}, err
			}
			for _, id := range ids {
				ci := c.attr(id, "config_info")
				if ci != add && ci != "" {
					continue // someone else's device
				}
				if ci == "" {
					if cid, old := seen[id]; old && cid == c.attr(id, "client_id") {
						continue // there before the write
					}
				}
				d, err := c.ReadDevice(id)
				if err != nil {
					continue // going away, or still being set up: look again later
				}
				if ci == "" && d.Spec() != spec {
					seen[id] = d.ClientID // someone else's device
					continue
				}
				cand = &d
				break
			}
		}
		if cand != nil {
			maj, mnr, err := c.cfg.StatDev(cand.DevNode)
			switch {
			case err == nil && maj == cand.Major && mnr == cand.Minor:
				return *cand, nil
			case err == nil:
				lastErr = fmt.Errorf("%s is %d:%d, sysfs says %d:%d", cand.DevNode, maj, mnr, cand.Major, cand.Minor)
			default:
				lastErr = err
			}
		}
		select {
		case <-ctx.Done():
			what := "no new rbd device with these names appeared"
			if cand != nil {
				what = fmt.Sprintf("rbd%d: its block device node is not there", cand.ID)
				if lastErr != nil {
					what += ": " + lastErr.Error()
				}
			}
			return Device{}, fmt.Errorf("%w waiting for the device: %s: %w", ErrTimeout, what, ctx.Err())
		case _, ok := <-sub.Events(): // something changed: look again
			if !ok {
				sub = closedSub{} // the stream ended: polling goes on
			}
		case <-tick.C:
		}
	}
}

// waitUdev waits, bounded by Config.UdevTimeout, for udevd's add event of d's block device:
// its rules ran, so its links exist. The device is usable without them, so neither a slow
// udevd nor lost udev events fail the map: they are logged and the map returns.
func (c *Client) waitUdev(ctx context.Context, udev Subscription, d Device) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.UdevTimeout)
	defer cancel()
	log := c.cfg.Logger.WithFields(logrus.Fields{"device": d.DevNode, "spec": d.Spec().String()})
	for {
		select {
		case <-ctx.Done():
			log.WithField("waited", c.cfg.UdevTimeout).Warn("udevd has not handled the new device yet; its link follows when it does")
			return
		case ev, ok := <-udev.Events():
			switch id, disk := ev.DiskID(); {
			case !ok || ev.Overflow:
				log.Warn("udev events were lost: not waiting for udevd; the device's link follows when it has run its rules")
				return
			case disk && id == d.ID && ev.Action == "add":
				return
			}
		}
	}
}

type closedSub struct{}

func (closedSub) Events() <-chan Uevent { return nil }
func (closedSub) Close() error          { return nil }

// UnmapOptions control Unmap.
type UnmapOptions struct {
	// Force unmaps even when the device is open ("N force"); I/O in flight fails.
	Force bool
	// Timeout bounds the wait for the remove events (DefaultTimeout if 0).
	Timeout time.Duration
}

// Unmap removes device id, whatever is mapped there now. It returns false (and no error)
// when no such device is mapped. EBUSY is retried for Config.EBusyRetry, then returned as
// ErrBusy. Prefer UnmapDevice, which makes sure the id still names the same mapping.
func (c *Client) Unmap(ctx context.Context, id int, o UnmapOptions) (bool, error) {
	ok, err := c.unmap(ctx, id, "", "", o)
	if err != nil {
		return false, fmt.Errorf("unmap rbd%d: %w", id, err)
	}
	return ok, nil
}

// UnmapDevice removes d only while its id still names the same mapping (same client_addr,
// or client_id when the kernel gives no address): an id freed and reused by another map in
// the meantime is left alone, and (false, nil) is returned as for "not mapped".
func (c *Client) UnmapDevice(ctx context.Context, d Device, o UnmapOptions) (bool, error) {
	attr, want := "client_addr", d.ClientAddr
	if want == "" {
		attr, want = "client_id", d.ClientID
	}
	ok, err := c.unmap(ctx, d.ID, attr, want, o)
	if err != nil {
		return false, fmt.Errorf("unmap %s (rbd%d): %w", d.Spec(), d.ID, err)
	}
	return ok, nil
}

func (c *Client) unmap(ctx context.Context, id int, attr, want string, o UnmapOptions) (bool, error) {
	if id < 0 {
		return false, fmt.Errorf("%w: negative id", ErrInvalid)
	}
	if _, err := os.Stat(c.busDir()); errors.Is(err, fs.ErrNotExist) {
		return false, nil // no rbd module: nothing is mapped
	}
	file, err := c.controlFile("remove")
	if err != nil {
		return false, err
	}
	sub, err := c.cfg.Events.Subscribe(ctx)
	if err != nil {
		return false, err
	}
	defer c.closeSub("uevent", sub)
	msg := strconv.Itoa(id)
	if o.Force {
		msg += " force"
	}
	same := func() bool { return want == "" || c.attr(id, attr) == want }
	deadline := time.Now().Add(c.cfg.EBusyRetry)
	backoff := 50 * time.Millisecond
	for {
		if !same() {
			return false, nil // gone, or the id now names another mapping
		}
		err = classify(filepath.Base(file), c.cfg.Writer.WriteControl(file, []byte(msg)))
		if err == nil {
			break
		}
		if errors.Is(err, ErrNotFound) {
			return false, nil // not mapped: unmap is idempotent
		}
		if !errors.Is(err, ErrBusy) {
			return false, err
		}
		if time.Now().Add(backoff).After(deadline) {
			return false, c.busy(id, err)
		}
		c.cfg.Logger.WithFields(logrus.Fields{"id": id, "backoff": backoff}).Debug("rbd remove busy, retrying")
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("%w (after EBUSY)", ctx.Err())
		case <-time.After(backoff):
		}
		if backoff < 400*time.Millisecond {
			backoff *= 2
		}
	}
	timeout := o.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return true, c.waitRemoved(wctx, sub, id, attr, want)
}

// waitRemoved waits until /sys/bus/rbd/devices/<id> is gone, or names another mapping (the
// id freed and reused). The kernel's remove is synchronous, so this normally holds at once;
// the kernel's events and every Poll re-read sysfs otherwise.
func (c *Client) waitRemoved(ctx context.Context, sub Subscription, id int, attr, want string) error {
	dir := filepath.Join(c.devicesDir(), strconv.Itoa(id))
	tick := time.NewTicker(c.cfg.Poll)
	defer tick.Stop()
	for {
		_, err := os.Stat(dir)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if want != "" && c.attr(id, attr) != want {
			return nil // removed, and the id already reused by another map
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w waiting for rbd%d to go (still in sysfs): %w", ErrTimeout, id, ctx.Err())
		case _, ok := <-sub.Events():
			if !ok {
				sub = closedSub{}
			}
		case <-tick.C:
		}
	}
}

// UnmapSpec unmaps every device mapping spec (fsid as in FindBySpec). It returns whether
// anything was mapped.
func (c *Client) UnmapSpec(ctx context.Context, spec Spec, fsid string, o UnmapOptions) (bool, error) {
	if err := spec.Validate(); err != nil {
		return false, fmt.Errorf("unmap %s: %w", spec, err)
	}
	devs, err := c.FindBySpec(spec, fsid)
	if err != nil {
		return false, fmt.Errorf("unmap %s: %w", spec, err)
	}
	unmapped := false
	for _, d := range devs {
		ok, err := c.UnmapDevice(ctx, d, o)
		if err != nil {
			return unmapped, fmt.Errorf("unmap %s: %w", spec, err)
		}
		unmapped = unmapped || ok
	}
	return unmapped, nil
}

// UnmapPath unmaps the device behind a /dev path (see FindByPath). A path that does not
// exist or is no mapped rbd device is "not mapped" (false, nil).
func (c *Client) UnmapPath(ctx context.Context, path string, o UnmapOptions) (bool, error) {
	d, err := c.FindByPath(path)
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("unmap %s: %w", path, err)
	}
	return c.UnmapDevice(ctx, d, o)
}
