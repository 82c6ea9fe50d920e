package krbd

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Device is one mapped image, as /sys/bus/rbd/devices/<ID> describes it.
type Device struct {
	ID          int
	Pool        string
	Namespace   string // pool_ns; "" for the default namespace
	Image       string // name
	ImageID     string // image_id
	Snap        string // current_snap; "" when the head is mapped (the kernel says "-")
	ClientID    string // client_id, e.g. "client4118"
	ClientAddr  string // client_addr, e.g. "203.0.113.11:0/420843661": what to blocklist
	ClusterFSID string // cluster_fsid
	Major       uint32
	Minor       uint32
	Size        uint64 // bytes
	DevNode     string // <dev root>/rbd<ID>
	// ReadOnly: the kernel refuses writes (mapped read_only, or a snapshot); from the block
	// device's ro attribute.
	ReadOnly bool
	// Options tells how the mapping's kernel client was made, from config_info (the string
	// written to add_single_major; root-only). Only the facts the agent needs are kept: never
	// the string itself, which may hold a secret=.
	Options MapFacts
}

// MapFacts are the facts about a mapping's kernel client read from its config_info.
type MapFacts struct {
	Known bool // config_info could be read
	// NoShare: the mapping has a kernel client of its own (so its own client_addr), which
	// is what lets it be fenced alone.
	NoShare bool
}

// ParseConfigInfo reads the facts the agent needs from a device's config_info
// ("<mons> <options> <pool> <image> [<snap>]").
func ParseConfigInfo(s string) MapFacts {
	f := strings.Fields(s)
	if len(f) < 4 {
		return MapFacts{}
	}
	mf := MapFacts{Known: true}
	for _, o := range strings.Split(f[1], ",") {
		if o == "noshare" {
			mf.NoShare = true
		}
	}
	return mf
}

// Spec returns the image spec of the device.
func (d Device) Spec() Spec {
	return Spec{Pool: d.Pool, Namespace: d.Namespace, Image: d.Image, Snap: d.Snap}
}

// Name returns the kernel name, rbd<ID>.
func (d Device) Name() string { return "rbd" + strconv.Itoa(d.ID) }

// DeviceAttrs are the sysfs attributes ParseDevice reads.
var DeviceAttrs = []string{"pool", "pool_ns", "name", "image_id", "current_snap", "client_id",
	"client_addr", "cluster_fsid", "major", "minor", "size"}

// optionalAttrs may be missing on older kernels.
var optionalAttrs = map[string]bool{"pool_ns": true, "client_addr": true, "image_id": true,
	"cluster_fsid": true, "client_id": true, "size": true}

// ParseDevice builds a Device from attribute file contents (as read, trailing newline
// included). A required attribute that is missing or malformed is an error.
func ParseDevice(id int, attrs map[string]string) (Device, error) {
	if id < 0 {
		return Device{}, fmt.Errorf("rbd device id %d: %w", id, ErrInvalid)
	}
	d := Device{ID: id}
	get := func(name string) (string, error) {
		raw, ok := attrs[name]
		if !ok {
			if optionalAttrs[name] {
				return "", nil
			}
			return "", fmt.Errorf("rbd device %d: attribute %s missing", id, name)
		}
		v := strings.TrimSuffix(raw, "\n")
		if strings.ContainsAny(v, "\n\x00") {
			return "", fmt.Errorf("rbd device %d: attribute %s: %w: more than one line", id, name, ErrInvalid)
		}
		return v, nil
	}
	var err error
	str := func(dst *string, name string) {
		if err == nil {
			*dst, err = get(name)
		}
	}
	num := func(name string, bits int) uint64 {
		if err != nil {
			return 0
		}
		var v string
		if v, err = get(name); err != nil {
			return 0
		}
		if v == "" && optionalAttrs[name] {
			return 0
		}
		n, perr := strconv.ParseUint(v, 10, bits)
		if perr != nil {
			err = fmt.Errorf("rbd device %d: attribute %s %q: %w: not a number", id, name, v, ErrInvalid)
		}
		return n
	}
	str(&d.Pool, "pool")
	str(&d.Namespace, "pool_ns")
	str(&d.Image, "name")
	str(&d.ImageID, "image_id")
	str(&d.Snap, "current_snap")
	str(&d.ClientID, "client_id")
	str(&d.ClientAddr, "client_addr")
	str(&d.ClusterFSID, "cluster_fsid")
	d.Major = uint32(num("major", 32)) //nolint:gosec // parsed with bitSize 32: it fits
	d.Minor = uint32(num("minor", 32)) //nolint:gosec // parsed with bitSize 32: it fits
	d.Size = num("size", 64)
	if err != nil {
		return Device{}, err
	}
	if d.Pool == "" || d.Image == "" {
		return Device{}, fmt.Errorf("rbd device %d: %w: empty pool or image name", id, ErrInvalid)
	}
	if d.Snap == "-" {
		d.Snap = ""
	}
	return d, nil
}

func (c *Client) devicesDir() string { return filepath.Join(c.cfg.SysfsRoot, "bus", "rbd", "devices") }

// ReadDevice reads /sys/bus/rbd/devices/<id>. A device that is not there is ErrNotFound.
func (c *Client) ReadDevice(id int) (Device, error) {
	dir := filepath.Join(c.devicesDir(), strconv.Itoa(id))
	attrs := make(map[string]string, len(DeviceAttrs))
	for _, a := range DeviceAttrs {
		b, err := os.ReadFile(filepath.Join(dir, a))
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				if _, serr := os.Stat(dir); serr != nil {
					return Device{}, fmt.Errorf("rbd device %d: %w", id, ErrNotFound)
				}
				continue // an attribute this kernel does not have
			}
			return Device{}, fmt.Errorf("rbd device %d: %w", id, err)
		}
		attrs[a] = string(b)
	}
	d, err := ParseDevice(id, attrs)
	if err != nil {
		return Device{}, err
	}
	d.DevNode = filepath.Join(c.cfg.DevRoot, d.Name())
	// the block device's ro (a child of the rbd device); a snapshot is read-only whatever it says
	if b, err := os.ReadFile(filepath.Join(dir, "block", d.Name(), "ro")); err == nil {
		d.ReadOnly = strings.TrimSpace(string(b)) == "1"
	}
	d.ReadOnly = d.ReadOnly || d.Snap != ""
	if b, err := os.ReadFile(filepath.Join(dir, "config_info")); err == nil {
		d.Options = ParseConfigInfo(string(b))
	}
	return d, nil
}

// ids lists the ids under /sys/bus/rbd/devices (none when the directory is absent).
func (c *Client) ids() ([]int, error) {
	ents, err := os.ReadDir(c.devicesDir())
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("list rbd devices: %w", err)
	}
	ids := make([]int, 0, len(ents))
	for _, e := range ents {
		if n, err := strconv.Atoi(e.Name()); err == nil && n >= 0 {
			ids = append(ids, n)
		}
	}
	sort.Ints(ids)
	return ids, nil
}

// List returns the mapped devices, by id. A device that disappears while being read is left out.
func (c *Client) List() ([]Device, error) {
	ids, err := c.ids()
	if err != nil {
		return nil, err
	}
	out := make([]Device, 0, len(ids))
	for _, id := range ids {
		d, err := c.ReadDevice(id)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

// FindBySpec returns the devices that map spec (more than one is possible: noshare lets the
// same image be mapped twice). fsid, when not empty, also has to match cluster_fsid.
// Each device's image name is read first and the whole device only when it matches: a map on
// a node with N devices reads N small files, not N whole devices (with 1,024 devices, reading
// them all for every map made mapping them one after the other quadratic).
func (c *Client) FindBySpec(spec Spec, fsid string) ([]Device, error) {
	ids, err := c.ids()
	if err != nil {
		return nil, err
	}
	var out []Device
	for _, id := range ids {
		name, err := os.ReadFile(filepath.Join(c.devicesDir(), strconv.Itoa(id), "name"))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue // gone meanwhile
		case err != nil:
			return nil, fmt.Errorf("rbd%d: %w", id, err)
		case strings.TrimSpace(string(name)) != spec.Image:
			continue
		}
		d, err := c.ReadDevice(id)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if d.Spec() == spec && (fsid == "" || d.ClusterFSID == "" || d.ClusterFSID == fsid) {
			out = append(out, d)
		}
	}
	return out, nil
}

// FindByPath returns the device behind a /dev path: /dev/rbdN, a stable link
// (/dev/rbd-owner/...) or any other link to it, matched by the node's major:minor.
func (c *Client) FindByPath(path string) (Device, error) {
	maj, mnr, err := c.cfg.StatDev(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return Device{}, fmt.Errorf("find %s: %w", path, ErrNotFound)
		}
		return Device{}, fmt.Errorf("find %s: %w", path, err)
	}
	devs, err := c.List()
	if err != nil {
		return Device{}, fmt.Errorf("find %s: %w", path, err)
	}
	for _, d := range devs {
		if d.Major == maj && d.Minor == mnr {
			return d, nil
		}
	}
	return Device{}, fmt.Errorf("find %s (%d:%d): %w: no mapped rbd device has that number", path, maj, mnr, ErrNotFound)
}
