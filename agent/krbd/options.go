package krbd

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/monaddr"
)

// Bounds and default of the kernel's mount_timeout option (how long a map waits for the
// monitors before failing with ETIMEDOUT; the kernel's own default is 60 s).
const (
	DefaultMountTimeout = 30 * time.Second
	MinMountTimeout     = 1 * time.Second
	MaxMountTimeout     = 300 * time.Second
)

// DefaultTimeout is how long a map waits for its device's events (MapOptions.Timeout) and an
// unmap for its device to go (UnmapOptions.Timeout) when the caller gives no timeout; it also
// bounds the removal of a device whose map ran out of time.
const DefaultTimeout = 30 * time.Second

// MapOptions says how to reach the cluster and how to map.
type MapOptions struct {
	// Monitors are the monitors' addresses in any form package monaddr reads ("203.0.113.1:6789",
	// "[2001:db8::1]:6789", mon_host's address vectors); the kernel is given those of the
	// protocol it speaks (see kernelMonitors). It needs at least one.
	Monitors []string
	// User is the cephx id without "client." ("rbdowner").
	User string
	// Secret is the user's base64 cephx key (the "key = " of its keyring). It goes into the
	// kernel keyring as a "ceph" key named "client.<User>"; the add string names that key
	// (key=client.<User>), so the secret never appears in sysfs config_info or udev.
	Secret string
	// ReadOnly maps read-only (snapshots are always read-only).
	ReadOnly bool
	// MountTimeout bounds the kernel's wait for the monitors (DefaultMountTimeout if 0;
	// MinMountTimeout..MaxMountTimeout).
	MountTimeout time.Duration
	// Extra are further kernel options from configuration ("ms_mode=crc", "queue_depth=128"),
	// each checked against the kernel's option names; options this package sets itself
	// (name, key, secret, noshare, share, _pool_ns, read_only, mount_timeout...) and
	// "exclusive" are refused.
	Extra []string
	// Timeout bounds the wait for the device's events after the kernel accepted the write
	// (DefaultTimeout if 0). The write itself is bounded by MountTimeout.
	Timeout time.Duration
	// NoUdev returns as soon as the kernel's block device exists, without waiting for udevd
	// to run its rules (as `rbd map -o noudev`): the stable link follows a moment later.
	NoUdev bool
}

// extraAllowed lists the kernel (rbd + libceph) options Extra may carry; value says whether
// the option takes "=value".
var extraAllowed = map[string]bool{
	// libceph
	"fsid": true, "ip": true, "osdkeepalive": true, "osd_idle_ttl": true,
	"osd_request_timeout": true, "tcp_nodelay": false, "notcp_nodelay": false,
	"crc": false, "nocrc": false, "cephx_require_signatures": false,
	"nocephx_require_signatures": false, "cephx_sign_messages": false,
	"nocephx_sign_messages": false, "abort_on_full": false, "ms_mode": true,
	"rxbounce": false, "read_from_replica": true, "crush_location": true,
	// rbd
	"queue_depth": true, "alloc_size": true, "lock_timeout": true, "lock_on_read": false,
	"notrim": false, "compression_hint": true, "udev": false, "noudev": false,
}

// refusedOptions are set by this package (or must never be set: exclusive, secret).
var refusedOptions = map[string]string{
	"name": "set from User", "key": "set from User", "secret": "the secret never goes into the add string",
	"noshare": "always set", "share": "every mapping has its own client (noshare)",
	"exclusive": "never used: it would break snapshots and resizes",
	"_pool_ns":  "set from the spec's namespace", "read_only": "use ReadOnly", "ro": "use ReadOnly",
	"read_write": "use ReadOnly", "rw": "use ReadOnly", "mount_timeout": "use MountTimeout",
	"mon_addr": "use Monitors",
}

// valueRules are the options whose values have a form of their own (the error says it, never
// the value given).
var valueRules = map[string]struct {
	re   *regexp.Regexp
	want string
}{
	// the kernel's CRUSH location: type:name pairs joined by '|' (ceph-csi's read affinity
	// passes one pair per topology label)
	"crush_location": {regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}:[A-Za-z0-9_.-]{1,64}(\|[A-Za-z0-9_.-]{1,64}:[A-Za-z0-9_.-]{1,64}){0,15}$`),
		"want TYPE:NAME pairs joined by '|' (host:node-1|zone:z1), each of letters, digits and _.-"},
	"read_from_replica": {regexp.MustCompile(`^(no|balance|localize)$`), "want no, balance or localize"},
	"ms_mode":           {regexp.MustCompile(`^(legacy|crc|secure|prefer-crc|prefer-secure)$`), "want legacy, crc, secure, prefer-crc or prefer-secure"},
}

var (
	optValueRE = regexp.MustCompile(`^[A-Za-z0-9_.:+-]{1,64}$`)
	userRE     = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)
	secretRE   = regexp.MustCompile(`^[A-Za-z0-9+/]+={0,2}$`)
)

// KeyName is the kernel keyring description (and key= value) of one map's key: the cephx
// user and a nonce, unique per map. Two maps (of two clusters with one user name, say) can
// then never replace each other's key between add_key and the write, and config_info names
// exactly one map, which is how Map recognises its own device.
func KeyName(user, nonce string) string { return "rbd-owner." + user + "." + nonce }

// maxAddLen: the kernel reads a sysfs write of at most one page; a longer add string would be
// cut and the rest taken as a second, different add.
const maxAddLen = 4000

// ValidateExtraOption checks one extra kernel option ("name" or "name=value").
func ValidateExtraOption(o string) error {
	name, val, hasVal := strings.Cut(o, "=")
	// errors name the option, never its value: a misplaced secret must not reach a log
	if why, bad := refusedOptions[name]; bad {
		return fmt.Errorf("%w: option %q: %s", ErrInvalid, name, why)
	}
	wantVal, known := extraAllowed[name]
	if !known {
		return fmt.Errorf("%w: option %q: not a known kernel rbd/libceph option", ErrInvalid, name)
	}
	if wantVal != hasVal {
		if wantVal {
			return fmt.Errorf("%w: option %q: needs a value (%s=...)", ErrInvalid, name, name)
		}
		return fmt.Errorf("%w: option %q: takes no value", ErrInvalid, name)
	}
	if rule, ok := valueRules[name]; ok && hasVal {
		if !rule.re.MatchString(val) {
			return fmt.Errorf("%w: option %q: %s", ErrInvalid, name, rule.want)
		}
		return nil
	}
	if hasVal && !optValueRE.MatchString(val) {
		return fmt.Errorf("%w: option %q: value has characters other than letters, digits and _.:+-", ErrInvalid, name)
	}
	return nil
}

// msgr2 says whether the options make the kernel speak msgr2 to the cluster: an ms_mode other
// than legacy (the kernel's default).
func (o MapOptions) msgr2() bool {
	for _, e := range o.Extra {
		if v, ok := strings.CutPrefix(e, "ms_mode="); ok {
			return v != "legacy"
		}
	}
	return false
}

// kernelMonitors is the monitors' list for the kernel, each host:port. A monitor is written as
// the kernel takes it ("10.0.0.1:6789", "10.0.0.1"), or as Ceph writes addresses elsewhere (its
// mon_host, ceph-csi's config): typed ("v2:10.0.0.1:3300", "v1:10.0.0.1:6789"), in an address
// vector ("[v2:10.0.0.1:3300/0,v1:10.0.0.1:6789/0]"), with or without a nonce. The kernel takes
// the addresses of the protocol it speaks: the v2 ones with an ms_mode other than legacy, the
// v1 ones without (as Ceph's own rbd map chooses); untyped ones always.
func (o MapOptions) kernelMonitors() ([]string, error) {
	if len(o.Monitors) == 0 {
		return nil, fmt.Errorf("%w: no monitor address", ErrInvalid)
	}
	addrs, err := monaddr.ParseAll(o.Monitors)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	want, other := monaddr.V1, monaddr.V2
	if o.msgr2() {
		want, other = monaddr.V2, monaddr.V1
	}
	var out []string
	for _, a := range addrs {
		if a.Type != other {
			out = append(out, a.HostPort())
		}
	}
	if len(out) == 0 {
		mode := "msgr1 (no ms_mode, or ms_mode=legacy)"
		if o.msgr2() {
			mode = "msgr2 (an ms_mode other than legacy)"
		}
		return nil, fmt.Errorf("%w: no monitor address for the kernel's %s among %s: list the cluster's %s: addresses, or set ms_mode to match them",
			ErrInvalid, mode, strings.Join(o.Monitors, ", "), want)
	}
	return out, nil
}

// Validate checks the options without the spec (see BuildAddString).
func (o MapOptions) Validate() error {
	if _, err := o.kernelMonitors(); err != nil {
		return err
	}
	if !userRE.MatchString(o.User) {
		return fmt.Errorf("%w: user %q: want 1-64 of letters, digits, '_', '.', '-' (without \"client.\")", ErrInvalid, o.User)
	}
	if o.MountTimeout != 0 && (o.MountTimeout < MinMountTimeout || o.MountTimeout > MaxMountTimeout) {
		return fmt.Errorf("%w: mount_timeout %s: want %s..%s", ErrInvalid, o.MountTimeout, MinMountTimeout, MaxMountTimeout)
	}
	if o.Timeout < 0 {
		return fmt.Errorf("%w: timeout %s is negative", ErrInvalid, o.Timeout)
	}
	seen := map[string]bool{}
	for _, e := range o.Extra {
		if err := ValidateExtraOption(e); err != nil {
			return err
		}
		n := family(e)
		if seen[n] {
			return fmt.Errorf("%w: option %q given twice", ErrInvalid, n)
		}
		seen[n] = true
	}
	return nil
}

func (o MapOptions) mountTimeout() time.Duration {
	if o.MountTimeout == 0 {
		return DefaultMountTimeout
	}
	return o.MountTimeout
}

// BuildAddString returns the string written to /sys/bus/rbd/add_single_major:
//
//	<mon>[,<mon>...] name=<user>,key=rbd-owner.<user>.<nonce>,noshare,mount_timeout=<s>[,read_only][,_pool_ns=<ns>][,<extra>...] <pool> <image> <snap|->
//
// Every part is validated first; nothing here can carry a secret (the key is referred to by
// its keyring name).
func BuildAddString(spec Spec, o MapOptions) (string, error) {
	return buildAddString(spec, o, "0")
}

var nonceRE = regexp.MustCompile(`^[a-z0-9]{1,32}$`)

func buildAddString(spec Spec, o MapOptions, nonce string) (string, error) {
	if !nonceRE.MatchString(nonce) {
		return "", fmt.Errorf("%w: key nonce %q", ErrInvalid, nonce)
	}
	if err := spec.Validate(); err != nil {
		return "", err
	}
	if err := o.Validate(); err != nil {
		return "", err
	}
	mons, err := o.kernelMonitors()
	if err != nil { // Validate checked them: never expected
		return "", err
	}
	opts := []string{
		"name=" + o.User,
		"key=" + KeyName(o.User, nonce),
		"noshare",
		"mount_timeout=" + strconv.Itoa(int((o.mountTimeout()+time.Second-1)/time.Second)),
	}
	if o.ReadOnly {
		opts = append(opts, "read_only")
	}
	if spec.Namespace != "" {
		opts = append(opts, "_pool_ns="+spec.Namespace)
	}
	opts = append(opts, o.Extra...)
	snap := spec.Snap
	if snap == "" {
		snap = "-"
	}
	add := strings.Join(mons, ",") + " " + strings.Join(opts, ",") + " " + spec.Pool + " " + spec.Image + " " + snap
	if len(add) > maxAddLen {
		return "", fmt.Errorf("%w: the add string would be %d bytes; the kernel reads at most one page (fewer monitors or options)", ErrInvalid, len(add))
	}
	return add, nil
}

// mergeExtra adds a caller's kernel options (Requested.Extra) to the configured ones (the
// config's and the cluster's map_options). An option both give with the same value is kept
// once: a StorageClass's mapOptions often repeat what the cluster needs (ms_mode=secure). One
// given with another value (crc and nocrc are one option) is refused, naming the option only
// (never a value): which one is meant is not the agent's to guess.
func mergeExtra(configured, asked []string) ([]string, error) {
	out := append([]string(nil), configured...)
	for _, a := range asked {
		i := slices.IndexFunc(out, func(c string) bool { return family(c) == family(a) })
		switch {
		case i < 0:
			out = append(out, a)
		case out[i] != a:
			return nil, fmt.Errorf("%w: option %q: the caller's map options give it another value than the agent's map_options for this cluster; make them agree, or leave it to one of them", ErrInvalid, family(a))
		}
	}
	return out, nil
}

// Requested is what a caller's map options ask for (RequestOptions).
type Requested struct {
	Extra    []string // kernel options for MapOptions.Extra
	ReadOnly bool     // read_only or ro: a read-only mapping
	NoUdev   bool     // noudev: do not wait for udevd (MapOptions.NoUdev); udev undoes it
}

// RequestOptions sorts the map options a caller sent (a CSI plugin's StorageClass mapOptions,
// as `rbd map --options` carries them) by the agent's rules: noshare is always set anyway;
// noudev and udev mean what they mean to Ceph's rbd tool (whether the map waits for udevd;
// the last one wins) and never reach the kernel; read_only and ro ask for a read-only mapping;
// name=, key=, secret=, share, exclusive and the other options the agent sets itself are
// refused (the error names the option, never its value); every other option must be a known
// kernel option and is returned in Extra.
func RequestOptions(opts []string) (Requested, error) {
	var r Requested
	for _, o := range opts {
		for _, one := range strings.Split(o, ",") {
			one = strings.TrimSpace(one)
			name, _, _ := strings.Cut(one, "=")
			switch name {
			case "", "noshare":
				continue
			case "noudev", "udev":
				r.NoUdev = name == "noudev"
				continue
			case "read_only", "ro":
				r.ReadOnly = true
				continue
			}
			if err := ValidateExtraOption(one); err != nil {
				return Requested{}, err
			}
			r.Extra = append(r.Extra, one)
		}
	}
	return r, nil
}
