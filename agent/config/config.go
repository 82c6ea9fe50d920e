// Package config reads and validates /etc/rbd-owner/config.yaml. Unknown keys and bad values
// are refused with a message that names the key.
package config

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/monaddr"
)

// DefaultPath is where the packaged config lives.
const DefaultPath = "/etc/rbd-owner/config.yaml"

// Takeover policies.
const (
	TakeoverManual           = "manual"
	TakeoverAfterLeaseExpiry = "after-lease-expiry"
	// TakeoverAfterFence takes over only holds whose mapping an entry in the cluster's blocklist
	// already cuts off, whoever added it (an admin's `rbd-owner fence --node`, ceph-csi's fencing
	// of a node Kubernetes declared out of service, a NetworkFence): the default.
	TakeoverAfterFence = "after-fence"
)

// Policies for a mapping made on this node outside rbd-owner (an operator's `rbd map`, a CSI
// plugin without the drop-in, a script).
const (
	// UnmanagedFenceIfClaimed: blocklist it when another node (or another device of this one)
	// holds the image; report it otherwise.
	UnmanagedFenceIfClaimed = "fence-if-claimed"
	// UnmanagedAdoptOrFence: as fence-if-claimed, and a writable mapping of a free image with a
	// kernel client of its own is claimed for this node and managed from then on.
	UnmanagedAdoptOrFence = "adopt-or-fence"
	// UnmanagedReport: only report it (audit and status).
	UnmanagedReport = "report"
)

// Config is the agent's configuration.
type Config struct {
	NodeID        string    `yaml:"node_id"`
	Socket        string    `yaml:"socket"`
	CSISocket     string    `yaml:"csi_socket"`
	StateDir      string    `yaml:"state_dir"`
	Clusters      []Cluster `yaml:"clusters"`
	LeaseDuration Duration  `yaml:"lease_duration"`
	RenewInterval Duration  `yaml:"renew_interval"`
	// OSDFailover is how long the clusters may take to serve a placement group again once the
	// OSD serving it stops answering (OSD failure detection, the new map, peering): a heartbeat
	// stored there waits that long. The lease bound covers it.
	OSDFailover    Duration `yaml:"osd_failover"`
	TakeoverPolicy string   `yaml:"takeover_policy"`
	// Unmanaged is what the agent does with a mapping it did not make (see the Unmanaged* policies).
	Unmanaged    string   `yaml:"unmanaged"`
	FenceExpiry  Duration `yaml:"fence_expiry"`
	MapTimeout   Duration `yaml:"map_timeout"`
	MountTimeout Duration `yaml:"mount_timeout"`
	MapOptions   []string `yaml:"map_options"`
	// OrphanSweep turns the automatic removal of deleted images' free claims on (default) or off.
	OrphanSweep *bool `yaml:"orphan_sweep"`
	// OrphanSweepInterval is how often each pool is swept (default 1h; each node starts at a
	// random point in the period, so nodes spread out).
	OrphanSweepInterval Duration `yaml:"orphan_sweep_interval"`
	// ClaimCheckInterval is how long a held claim may go without being read again (default 1h;
	// at least renew_interval). A claim another node takes over, fences or force-releases is read
	// within one renew interval all the same: whoever changes it leaves this node a notice, read
	// once per interval per pool and namespace held in; this slow check finds what no notice
	// announces (a claim object removed by hand, a notice lost to a crash).
	ClaimCheckInterval Duration `yaml:"claim_check_interval"`
	// MetricsListen is a TCP address (host:port) where GET /metrics is also served, for a
	// Prometheus server to scrape; "" (default) serves metrics on the sockets only.
	MetricsListen string `yaml:"metrics_listen"`
	// PerImageMetrics adds one series per claim (pool, image and device labels) to the metrics.
	PerImageMetrics bool `yaml:"per_image_metrics"`
}

// ShortFencesEnv (set to 1 in the agent's environment) lowers the floor of fence_expiry from an
// hour to a minute: for test labs only, where a fence must outlive its expiry within a test run.
// The packages never set it.
const ShortFencesEnv = "RBD_OWNER_TEST_SHORT_FENCES"

// DefaultLeaseDuration is lease_duration's default (claim.DefaultLease, for a claim store
// made without a lease, is this one).
const DefaultLeaseDuration = Duration(60 * time.Second)

// DefaultClaimCheckInterval is claim_check_interval's default.
const DefaultClaimCheckInterval = Duration(time.Hour)

// DefaultOrphanSweepInterval is orphan_sweep_interval's default.
const DefaultOrphanSweepInterval = Duration(time.Hour)

// RenewsPerLease is how many renew intervals a lease lasts when renew_interval is not set: its
// default is lease_duration / RenewsPerLease, at most MaxDefaultRenew.
const RenewsPerLease = 3

// MaxDefaultRenew caps renew_interval's default: a renewal that waited out a stalled placement
// group is followed by the next one at once only while renew_interval is at most a write's
// ClusterCallTimeout (LeaseBound), so a longer one costs the lease more than its length.
const MaxDefaultRenew = 10 * time.Second

// DefaultRenew is renew_interval's default for a lease.
func DefaultRenew(lease time.Duration) time.Duration {
	return min(lease/RenewsPerLease, MaxDefaultRenew)
}

// DefaultOSDFailover is osd_failover's default: Ceph's osd_heartbeat_grace (20 s) before the
// monitors mark a silent OSD down, then the new map and peering.
const DefaultOSDFailover = Duration(30 * time.Second)

// minOSDFailover and maxOSDFailover bound osd_failover.
const (
	minOSDFailover = time.Second
	maxOSDFailover = 10 * time.Minute
)

// DefaultMachineID is the file node_id's default is read from.
const DefaultMachineID = "/etc/machine-id"

// Bounds the checks below apply (Keys describes them from the same constants).
const (
	maxNodeIDLength        = 128
	minOrphanSweepInterval = time.Minute
	minMapTimeout          = time.Second
)

// the values of takeover_policy and unmanaged, in the order their messages list them
var (
	takeoverPolicies  = []string{TakeoverManual, TakeoverAfterFence, TakeoverAfterLeaseExpiry}
	unmanagedPolicies = []string{UnmanagedFenceIfClaimed, UnmanagedAdoptOrFence, UnmanagedReport}
)

// DefaultFenceExpiry is fence_expiry's default: ten years, so that a fence's blocklist entry
// does not run out while its mapping may exist. Renewing an entry does not lengthen it on every
// Ceph release: on 16.2 (Pacific) `osd blocklist add` of an address already listed answers
// "blocklisting … until <new time>" but keeps the old expiry, and an add that comes after the
// old expiry but before the monitors' next tick is undone by that tick; the renewals the agent
// makes every quarter of fence_expiry are then no-ops, and a 7-day entry lapsed after 7 days.
// An entry whose mapping is known gone runs out on its own; a whole-node fence is lifted with
// `rbd-owner unfence --node`, an intruder's with `rbd-owner unfence`. claim.DefaultFenceExpiry,
// for a claim store made without one, is this one.
const DefaultFenceExpiry = Duration(10 * 365 * 24 * time.Hour)

// The shortest fence_expiry allowed, and the one with ShortFencesEnv set.
const (
	minFenceExpiry      = time.Hour
	minFenceExpiryShort = time.Minute
)

// Env is what of the agent's environment the verdict on a config depends on.
type Env struct {
	// ShortFences: ShortFencesEnv is set to 1.
	ShortFences bool
}

// ProcessEnv is this process's Env: the one Load and Parse judge a config in.
func ProcessEnv() Env { return Env{ShortFences: os.Getenv(ShortFencesEnv) == "1"} }

// fenceExpiryFloor is the shortest fence_expiry allowed in env.
func (e Env) fenceExpiryFloor() time.Duration {
	if e.ShortFences {
		return minFenceExpiryShort
	}
	return minFenceExpiry
}

// SweepsOrphans says whether the orphan sweep is on.
func (c *Config) SweepsOrphans() bool { return c.OrphanSweep == nil || *c.OrphanSweep }

// Cluster is one Ceph cluster the node maps images from.
type Cluster struct {
	ID         string   `yaml:"id"`
	Monitors   []string `yaml:"monitors"`
	User       string   `yaml:"user"`
	Keyring    string   `yaml:"keyring"`
	MapOptions []string `yaml:"map_options"`
}

// Duration is a time.Duration written as "60s", "5m", "168h".
type Duration time.Duration

// UnmarshalYAML parses a Go duration string (Parse decodes durations itself, with the same
// message).
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return err
	}
	v, err := parseDuration(s)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	*d = Duration(v)
	return nil
}

// D is the value as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// Defaults. The sockets' paths are the API's (api.DefaultSocket, api.DefaultCSISocket, which
// the clients use too).
const (
	DefaultSocket    = api.DefaultSocket
	DefaultCSISocket = api.DefaultCSISocket
	DefaultStateDir  = "/var/lib/rbd-owner"
)

// The lease rule (agent/claim/liveness.go; proved in model/lease.pml) keeps a holder that
// renews from ever being judged expired when R + D < L: R is the longest gap between two of
// its heartbeats landing, D the longest time from a read of a heartbeat at the OSD to the
// reader's judgement of it, L the lease. The deadlines that make up R and D:

// ClusterCallTimeout is how long one operation sent to a cluster may take: the agent connects
// with it as rados_osd_op_timeout, rados_mon_op_timeout and client_mount_timeout
// (cephconn.DefaultTimeout is this constant). A call's context is looked at before an operation
// is sent, never while librados waits for its answer: an operation once sent is bounded by this
// alone. It is D: a claimer judges a heartbeat (Observer.Look) as soon as the read that
// returned it answers, at most this long after the OSD read it.
const ClusterCallTimeout = 10 * time.Second

// MaxHeartbeatTimeout caps HeartbeatTimeout.
const MaxHeartbeatTimeout = 10 * time.Second

// HeartbeatTimeout is the deadline of one heartbeat call (Store.Heartbeat, one per pool and
// namespace every renew_interval): renew_interval, at most MaxHeartbeatTimeout. Its write is
// sent before the deadline and answered within ClusterCallTimeout after.
func (c *Config) HeartbeatTimeout() time.Duration {
	return min(c.RenewInterval.D(), MaxHeartbeatTimeout)
}

// LeaseBound is what lease_duration must exceed: R + D, where R is the longest gap between two
// heartbeats landing and D a read's answer (ClusterCallTimeout).
//
// R is the longer of two gaps. While the heartbeat's placement group answers, a heartbeat lands
// at most renew_interval after the one before started, plus its call's deadline, plus its
// write's answer. When the OSD serving it stops, the write sent next (at most renew_interval
// after the last landed) waits up to osd_failover until another OSD serves the group; librados
// then resends the writes sent within the last ClusterCallTimeout, and the others have timed
// out: the next renewal lands at once, or up to renew_interval - ClusterCallTimeout later.
func (c *Config) LeaseBound() time.Duration {
	return c.HeartbeatGapBound() + ClusterCallTimeout
}

// HeartbeatGapBound is R above: the longest a healthy node's heartbeat may take to land after
// the one before, an OSD failover included. A liveness write older than that means renewals
// are failing for a reason a healthy cluster does not explain (the metrics export it for the
// alert rules).
func (c *Config) HeartbeatGapBound() time.Duration {
	return c.RenewInterval.D() + max(c.HeartbeatTimeout()+ClusterCallTimeout, c.stallGap())
}

// stallGap is the part of a stalled placement group's gap after the renew interval.
func (c *Config) stallGap() time.Duration {
	return c.osdFailover() + max(0, c.RenewInterval.D()-ClusterCallTimeout)
}

func (c *Config) osdFailover() time.Duration {
	if c.OSDFailover == 0 {
		return DefaultOSDFailover.D()
	}
	return c.OSDFailover.D()
}

// checkLease refuses a lease_duration that does not exceed LeaseBound, in one line that spells
// the bound out and names what to change.
func (c *Config) checkLease() error {
	bound := c.LeaseBound()
	if c.LeaseDuration.D() > bound {
		return nil
	}
	next := fmt.Sprintf("raise lease_duration above %s", bound)
	if r := c.longestRenew(); r > 0 {
		next += fmt.Sprintf(" or lower renew_interval to %s", r)
	} else {
		floor := (&Config{RenewInterval: 1, OSDFailover: Duration(c.osdFailover())}).LeaseBound().Truncate(time.Second)
		next += fmt.Sprintf(" (no renew_interval makes a lease of %s or less safe)", floor)
	}
	// the longer of the two gaps is the one spelled out
	if c.stallGap() > c.HeartbeatTimeout()+ClusterCallTimeout {
		return fieldErr("lease_duration", "%s is too short for renew_interval %s: a lease must exceed renew_interval (%s) + "+
			"the OSDs' failover (osd_failover, %s)%s + a read's answer (%s) = %s, or a heartbeat stalled by a stopped OSD "+
			"makes this live node look dead; %s",
			c.LeaseDuration.D(), c.RenewInterval.D(), c.RenewInterval.D(), c.osdFailover(), c.renewPastWrite(),
			ClusterCallTimeout, bound, next)
	}
	return fieldErr("lease_duration", "%s is too short for renew_interval %s: a lease must exceed renew_interval (%s) + "+
		"the heartbeat's deadline (%s) + its write's answer (%s) + a read's answer (%s) = %s; %s",
		c.LeaseDuration.D(), c.RenewInterval.D(), c.RenewInterval.D(), c.HeartbeatTimeout(), ClusterCallTimeout,
		ClusterCallTimeout, bound, next)
}

// renewPastWrite spells out the stalled gap's last term when it is not zero.
func (c *Config) renewPastWrite() string {
	if d := c.RenewInterval.D() - ClusterCallTimeout; d > 0 {
		return fmt.Sprintf(" + renew_interval past a write's answer (%s)", d)
	}
	return ""
}

// longestRenew is the longest whole-second renew_interval (at most half the lease) whose bound
// the lease exceeds, or 0 when there is none.
func (c *Config) longestRenew() time.Duration {
	for r := (c.LeaseDuration.D() / 2).Truncate(time.Second); r >= time.Second; r -= time.Second {
		try := Config{LeaseDuration: c.LeaseDuration, RenewInterval: Duration(r), OSDFailover: Duration(c.osdFailover())}
		if try.LeaseBound() < c.LeaseDuration.D() {
			return r
		}
	}
	return 0
}

// Load reads and validates the file at path. machineID is the path of the machine-id file
// used when node_id is not set ("" means /etc/machine-id).
func Load(path, machineID string) (*Config, error) {
	return LoadIn(path, machineID, ProcessEnv())
}

// LoadIn is Load as an agent whose environment is env judges the file: `rbd-owner
// check-config` runs where the agent's unit environment is not, and says when the verdict
// depends on it.
func LoadIn(path, machineID string, env Env) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	c, err := parse(data, machineID, env)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// Parse decodes and validates a config document and fills in the defaults. An error is one
// line in the file's terms: the line (when the key is in the file), the key's path, what is
// wrong and what to write instead ("line 3: lease_duraton: unknown key; did you mean
// lease_duration?").
func Parse(data []byte, machineID string) (*Config, error) {
	return parse(data, machineID, ProcessEnv())
}

func parse(data []byte, machineID string, env Env) (*Config, error) {
	var c Config
	doc, err := parseDocument(data, &c)
	if err != nil {
		return nil, err
	}
	if !doc.has("clusters") {
		return nil, &keyError{path: "clusters", msg: "missing; add the Ceph clusters this node maps images from, e.g. " +
			"clusters: [{id: ceph-a, monitors: [10.0.0.1:6789], user: rbd-owner, keyring: /etc/ceph/ceph.client.rbd-owner.keyring}] " +
			"(or clusters: [] for none yet)"}
	}
	if err := c.fill(machineID); err != nil {
		return nil, doc.withLine(err)
	}
	if err := c.validate(env); err != nil {
		return nil, doc.withLine(err)
	}
	return &c, nil
}

func (c *Config) fill(machineID string) error {
	if c.Socket == "" {
		c.Socket = DefaultSocket
	}
	if c.CSISocket == "" {
		c.CSISocket = DefaultCSISocket
	}
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	}
	if c.LeaseDuration == 0 {
		c.LeaseDuration = DefaultLeaseDuration
	}
	if c.RenewInterval == 0 {
		c.RenewInterval = Duration(DefaultRenew(c.LeaseDuration.D()))
	}
	if c.OSDFailover == 0 {
		c.OSDFailover = DefaultOSDFailover
	}
	if c.TakeoverPolicy == "" {
		c.TakeoverPolicy = TakeoverAfterFence
	}
	if c.Unmanaged == "" {
		c.Unmanaged = UnmanagedFenceIfClaimed
	}
	if c.FenceExpiry == 0 {
		c.FenceExpiry = DefaultFenceExpiry
	}
	if c.MapTimeout == 0 {
		c.MapTimeout = Duration(krbd.DefaultTimeout)
	}
	if c.MountTimeout == 0 {
		c.MountTimeout = Duration(krbd.DefaultMountTimeout)
	}
	if c.OrphanSweepInterval == 0 {
		c.OrphanSweepInterval = DefaultOrphanSweepInterval
	}
	if c.ClaimCheckInterval == 0 {
		c.ClaimCheckInterval = DefaultClaimCheckInterval
	}
	if c.NodeID == "" {
		if machineID == "" {
			machineID = DefaultMachineID
		}
		b, err := os.ReadFile(machineID)
		if err != nil {
			return fieldErr("node_id", "not set and %s unreadable: %v", machineID, err)
		}
		c.NodeID = strings.TrimSpace(string(b))
		if c.NodeID == "" {
			return fieldErr("node_id", "not set and %s is empty", machineID)
		}
	}
	return nil
}

func (c *Config) validate(env Env) error {
	if strings.ContainsAny(c.NodeID, " \t\n\x00/") || len(c.NodeID) > maxNodeIDLength {
		return fieldErr("node_id", "%q must be a single word of at most %d characters", c.NodeID, maxNodeIDLength)
	}
	if !strings.HasPrefix(c.Socket, "/") {
		return fieldErr("socket", "%q must be an absolute path", c.Socket)
	}
	if c.CSISocket != "none" && !strings.HasPrefix(c.CSISocket, "/") {
		return fieldErr("csi_socket", "%q must be an absolute path (or none)", c.CSISocket)
	}
	if c.CSISocket == c.Socket || filepath.Dir(c.CSISocket) == filepath.Dir(c.Socket) {
		return fieldErr("csi_socket", "%q must be in a directory of its own, not beside socket %q (a pod mounts that directory)", c.CSISocket, c.Socket)
	}
	if c.ClaimCheckInterval.D() < c.RenewInterval.D() {
		return fieldErr("claim_check_interval", "%s is shorter than renew_interval (%s)", c.ClaimCheckInterval.D(), c.RenewInterval.D())
	}
	if c.OrphanSweepInterval.D() < minOrphanSweepInterval {
		return fieldErr("orphan_sweep_interval", "%s is shorter than %s (each sweep lists every claim of a pool)", c.OrphanSweepInterval.D(), FormatDuration(minOrphanSweepInterval))
	}
	if err := checkListen(c.MetricsListen); err != nil {
		return err
	}
	if !strings.HasPrefix(c.StateDir, "/") {
		return fieldErr("state_dir", "%q must be an absolute path", c.StateDir)
	}
	if c.RenewInterval.D() <= 0 || c.RenewInterval.D()*2 > c.LeaseDuration.D() {
		return fieldErr("renew_interval", "%s must be positive and at most half of lease_duration (%s)", c.RenewInterval.D(), c.LeaseDuration.D())
	}
	if d := c.OSDFailover.D(); d < minOSDFailover || d > maxOSDFailover {
		return fieldErr("osd_failover", "%s: want %s to %s (how long your clusters take to mark a stopped OSD down and peer its placement groups elsewhere: osd_heartbeat_grace, 20s by default, plus about 10s)",
			d, FormatDuration(minOSDFailover), FormatDuration(maxOSDFailover))
	}
	if err := c.checkLease(); err != nil {
		return err
	}
	if err := oneOf("takeover_policy", c.TakeoverPolicy, takeoverPolicies...); err != nil {
		return err
	}
	if err := oneOf("unmanaged", c.Unmanaged, unmanagedPolicies...); err != nil {
		return err
	}
	if floor := env.fenceExpiryFloor(); c.FenceExpiry.D() < floor {
		return fieldErr("fence_expiry", "%s is too short (at least %s): a fence is renewed every quarter of it while its mapping may exist, so a short one only adds blocklist calls", c.FenceExpiry.D(), floor)
	}
	if c.MapTimeout.D() < minMapTimeout {
		return fieldErr("map_timeout", "%s is too short (at least %s)", c.MapTimeout.D(), FormatDuration(minMapTimeout))
	}
	if d := c.MountTimeout.D(); d < krbd.MinMountTimeout || d > krbd.MaxMountTimeout {
		// the kernel's option takes these; krbd refuses a map outside them
		return fieldErr("mount_timeout", "%s is outside the kernel's range, %s to %s", d, FormatDuration(krbd.MinMountTimeout), FormatDuration(krbd.MaxMountTimeout))
	}
	if err := checkOptions("map_options", c.MapOptions); err != nil {
		return err
	}
	return c.validateClusters()
}

// validateClusters validates the clusters list: each entry complete, ids unique.
func (c *Config) validateClusters() error {
	seen := map[string]bool{}
	for i, cl := range c.Clusters {
		key := fmt.Sprintf("clusters[%d]", i)
		switch {
		case cl.ID == "":
			return fieldErr(key+".id", "missing; add a name of your choice, e.g. id: ceph-a")
		case strings.ContainsAny(cl.ID, " \t\n\x00/,="):
			return fieldErr(key+".id", "%q must be a non-empty word without '/', ',' or '='", cl.ID)
		case seen[cl.ID]:
			return fieldErr(key+".id", "%q is listed twice", cl.ID)
		case len(cl.Monitors) == 0:
			return fieldErr(key+".monitors", "missing; add the cluster's monitor addresses, e.g. monitors: [10.0.0.1:6789]")
		case cl.User == "":
			return fieldErr(key+".user", "missing; add the agent's cephx id, e.g. user: rbd-owner")
		case strings.HasPrefix(cl.User, "client."):
			return fieldErr(key+".user", "%q: give the id without the \"client.\" prefix", cl.User)
		case strings.ContainsAny(cl.User, " \t\n\x00,="):
			return fieldErr(key+".user", "%q is not a valid cephx id", cl.User)
		case cl.Keyring == "":
			return fieldErr(key+".keyring", "missing; add the path of the file that holds the user's key, e.g. keyring: /etc/ceph/ceph.client.rbd-owner.keyring")
		case !strings.HasPrefix(cl.Keyring, "/"):
			// not echoed: it may be the key itself, pasted in the wrong place
			return fieldErr(key+".keyring", "must be the absolute path of the keyring file (not the key), e.g. /etc/ceph/ceph.client.rbd-owner.keyring")
		}
		for j, m := range cl.Monitors {
			if _, err := monaddr.Parse(m); err != nil {
				return fieldErr(fmt.Sprintf("%s.monitors[%d]", key, j), "%v (write ip:port, v2:ip:port, or the address vector ceph.conf's mon_host has)", err)
			}
		}
		if err := checkOptions(key+".map_options", cl.MapOptions); err != nil {
			return err
		}
		seen[cl.ID] = true
	}
	return nil
}

// checkListen validates metrics_listen: "" or host:port with a port from 1 to 65535.
func checkListen(addr string) error {
	if addr == "" {
		return nil
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fieldErr("metrics_listen", "%q is not host:port (e.g. 127.0.0.1:9283): %v", addr, err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fieldErr("metrics_listen", "%q: the port must be a number from 1 to 65535", addr)
	}
	return nil
}

// options the agent sets itself, or must never be set
var reservedOptions = map[string]string{
	"name": "the agent sets it from the cluster's user", "secret": "secrets never go into the map string",
	"key": "the agent passes the key through the kernel keyring", "noshare": "the agent always sets it",
	"share": "every mapping must have its own client (noshare)", "exclusive": "it would break snapshots and resizes",
	"_pool_ns": "the agent sets it from the image spec", "mount_timeout": "use the mount_timeout key",
	"ro": "use --read-only", "read_only": "use --read-only",
}

func checkOptions(key string, opts []string) error {
	for i, o := range opts {
		name, _, _ := strings.Cut(o, "=")
		// errors name the option, never its value: a misplaced secret must not reach a log
		if o == "" || strings.ContainsAny(o, " \t\n\x00,") {
			return fieldErr(fmt.Sprintf("%s[%d]", key, i), "option %q: one option per entry, without spaces or commas", name)
		}
		if why, ok := reservedOptions[name]; ok {
			return fieldErr(fmt.Sprintf("%s[%d]", key, i), "option %q is not allowed: %s", name, why)
		}
	}
	return nil
}

// ClusterByMonitors finds the one configured cluster that has one of the given monitor
// addresses (as a CSI plugin passes them to `rbd -m`: "host:port", "v1:host:port", an
// address vector "[v2:host:3300,v1:host:6789]", with or without "/nonce"). A monitor without a
// port matches any port of that host. None or several matching is an error that says so.
func (c *Config) ClusterByMonitors(mons []string) (*Cluster, error) {
	if len(mons) == 0 {
		return nil, errors.New("no monitor address given to find the cluster by")
	}
	want, err := monaddr.ParseAll(mons)
	if err != nil {
		return nil, fmt.Errorf("the monitors given: %w", err)
	}
	var found []int
	for i, cl := range c.Clusters {
		have, err := monaddr.ParseAll(cl.Monitors)
		if err != nil {
			return nil, fmt.Errorf("cluster %s: %w", cl.ID, err)
		}
		if slices.ContainsFunc(want, func(w monaddr.Addr) bool { return slices.ContainsFunc(have, w.Same) }) {
			found = append(found, i)
		}
	}
	switch len(found) {
	case 1:
		return &c.Clusters[found[0]], nil
	case 0:
		return nil, fmt.Errorf("no configured cluster has monitor %s (add the cluster to the agent's config, or name it with --cluster)", strings.Join(mons, ","))
	}
	ids := make([]string, len(found))
	for i, f := range found {
		ids[i] = c.Clusters[f].ID
	}
	return nil, fmt.Errorf("monitors %s belong to several configured clusters (%s): name one", strings.Join(mons, ","), strings.Join(ids, ", "))
}

// Cluster returns the cluster named id; "" picks the only one.
func (c *Config) Cluster(id string) (*Cluster, error) {
	if id == "" {
		if len(c.Clusters) == 1 {
			return &c.Clusters[0], nil
		}
		if len(c.Clusters) == 0 {
			return nil, errors.New("no cluster is configured (clusters: in the config)")
		}
		return nil, fmt.Errorf("%d clusters are configured: name one (--cluster)", len(c.Clusters))
	}
	for i := range c.Clusters {
		if c.Clusters[i].ID == id {
			return &c.Clusters[i], nil
		}
	}
	return nil, fmt.Errorf("cluster %q is not configured", id)
}
