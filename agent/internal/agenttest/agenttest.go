// Package agenttest is a test node's environment: a fake kernel for a cluster's fsid with the
// cluster's user and pools, the node's config, an audit log and notes the test reads back, and
// the backend the node's clusters are on: Memory (in-memory clusters from agent/claim/memory),
// Live (the live test cluster, through agent/internal/cephtest, skipping as it does when there
// is none) or Offline (a cluster that is never reached).
//
// One constructor, NewEnv, builds all three. The daemon's, the sagas' and the admin calls' tests
// build their node on an Env; agenttest itself imports none of them (it sits with the domain
// packages it uses, and only tests import it: tests/import-graph checks both).
package agenttest

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/claim/memory"
	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/internal/cephtest"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/krbd/fakekernel"
)

// Secret is the cephx key of the user ("u") of a Memory or Offline cluster.
const Secret = "AQBzXHxlAAAAABAAm0Tq4kVJ2HbsYQ1rLA5pUw=="

// User is the cephx user of a Memory or Offline cluster.
const User = "u"

// MemoryMonitor is the monitor address a Memory cluster's config names (never dialled).
const MemoryMonitor = "203.0.113.1:6789"

// Cluster is an in-memory cluster, with a hook that counts the claim writes and can stall every
// call.
type Cluster struct {
	ID, Pool string
	M        *memory.Memory
	Writes   atomic.Int64
	Stall    atomic.Bool   // stall calls from now on (until released)
	Entered  chan struct{} // closed when the first stalled call is blocked
	Release  chan struct{} // closed to let the stalled calls go
	once     sync.Once
}

// NewCluster is an empty in-memory cluster id whose images are in pool, with fsid.
func NewCluster(id, pool, fsid string) *Cluster {
	c := &Cluster{ID: id, Pool: pool, M: memory.New(fsid), Entered: make(chan struct{}), Release: make(chan struct{})}
	c.M.SetHook(func(_ context.Context, call string, _ claim.Image) error {
		if call == "write" {
			c.Writes.Add(1)
		}
		if c.Stall.Load() {
			c.once.Do(func() { close(c.Entered) })
			<-c.Release // a cluster that does not answer, and a call that does not honour its deadline
		}
		return nil
	})
	return c
}

type kind int

const (
	memoryKind kind = iota
	liveKind
	offlineKind
)

// Backend is where a node's clusters are: Memory, Live or Offline.
type Backend struct {
	kind     kind
	clusters []*Cluster
}

// Memory is the in-memory clusters (at least one): the kernel takes the first one's fsid.
func Memory(clusters ...*Cluster) Backend { return Backend{kind: memoryKind, clusters: clusters} }

// Live is the live test cluster (cluster id "test"); a test without one is skipped.
func Live() Backend { return Backend{kind: liveKind} }

// Offline is one cluster "c1" that is never reached: enough for what is decided before a call
// touches a cluster.
func Offline() Backend { return Backend{kind: offlineKind} }

// Env is a test node's environment.
type Env struct {
	T       testing.TB
	Backend Backend
	// Kernel is the node's fake kernel (shared by the node's restarts).
	Kernel *fakekernel.Kernel
	// Config is the node's config (TestConfig's, for the backend's clusters).
	Config *config.Config
	// Log is the node's logger: warnings and errors against the live cluster, errors otherwise.
	Log *logrus.Logger
	// Poll is how often the node's krbd polls the fake kernel (0: krbd's default).
	Poll time.Duration
	// Watchdog is the interval of the node's watchdog pings (0: none).
	Watchdog time.Duration
	// Audit collects the node's audit entries; AuditLog is a logger writing to it.
	Audit *AuditLog
	// Notes collects what the node sends systemd.
	Notes *Notes
	// Secret is the key of the clusters' user.
	Secret string
}

// Option changes an Env before its kernel and config are made.
type Option func(*settings)

type settings struct {
	node   string
	renew  time.Duration
	kernel *fakekernel.Kernel
}

// Node names the node (the config's NodeID).
func Node(id string) Option { return func(s *settings) { s.node = id } }

// Renew sets the config's renew interval.
func Renew(d time.Duration) Option { return func(s *settings) { s.renew = d } }

// OnKernel makes the Env use k (another Env's kernel): the same node after its agent restarted.
func OnKernel(k *fakekernel.Kernel) Option { return func(s *settings) { s.kernel = k } }

// NewEnv is a node's environment on b. Defaults per backend: Memory is node "node-m" renewing
// every 100 ms with a 2 s watchdog and a 10 ms kernel poll; Live is "node" renewing every
// 200 ms with a 20 ms poll; Offline is "node-r" renewing every 10 s.
func NewEnv(t testing.TB, b Backend, opts ...Option) *Env {
	t.Helper()
	e := &Env{T: t, Backend: b, Audit: &AuditLog{}, Notes: &Notes{}, Secret: Secret}
	var s settings
	var fsid string
	var clusters []config.Cluster
	var pools []string
	switch b.kind {
	case memoryKind:
		if len(b.clusters) == 0 {
			t.Fatal("agenttest.Memory: no cluster")
		}
		s = settings{node: "node-m", renew: 100 * time.Millisecond}
		e.Log, e.Poll, e.Watchdog = QuietLog(), 10*time.Millisecond, 2*time.Second
		fsid = b.clusters[0].M.FSID()
		for _, c := range b.clusters {
			clusters = append(clusters, config.Cluster{ID: c.ID, Monitors: []string{MemoryMonitor}, User: User, Keyring: "/nonexistent"})
			pools = append(pools, c.Pool)
		}
	case liveKind:
		o := cephtest.Options(t) // skips without a cluster
		s = settings{node: "node", renew: 200 * time.Millisecond}
		e.Log, e.Poll = logrus.New(), 20*time.Millisecond
		e.Log.SetLevel(logrus.WarnLevel)
		fsid, e.Secret = LiveFSID(t), cephtest.Secret(t)
		clusters = []config.Cluster{{ID: "test", Monitors: []string{cephtest.MonitorV1(t)}, User: o.User, Keyring: o.Keyring}}
		pools = []string{cephtest.Pool}
	case offlineKind:
		s = settings{node: "node-r", renew: 10 * time.Second}
		e.Log = QuietLog()
		clusters = []config.Cluster{{ID: "c1", Monitors: []string{"127.0.0.1:9"}, User: User, Keyring: "/nonexistent"}}
	}
	for _, o := range opts {
		o(&s)
	}
	e.Kernel = s.kernel
	if e.Kernel == nil {
		k, err := fakekernel.New(t.TempDir(), fakekernel.Options{FSID: fsid})
		if err != nil {
			t.Fatal(err)
		}
		if b.kind != offlineKind {
			if err := k.AddUser(clusters[0].User, e.Secret); err != nil {
				t.Fatal(err)
			}
		}
		for _, p := range pools {
			k.AddPool(p)
		}
		e.Kernel = k
	}
	e.Config = TestConfig(t, s.node, s.renew, clusters...)
	return e
}

// AuditLogger is an audit log whose entries go to e.Audit.
func (e *Env) AuditLogger() *audit.Log { return audit.NewWithSink(e.Log, e.Audit.Record) }

// KernelConfig is the node's krbd config on its fake kernel.
func (e *Env) KernelConfig() krbd.Config {
	kc := e.Kernel.Config()
	if e.Poll > 0 {
		kc.Poll = e.Poll
	}
	return kc
}

// Cluster is the Memory cluster id (nil if there is none).
func (e *Env) Cluster(id string) *Cluster {
	for _, c := range e.Backend.clusters {
		if c.ID == id {
			return c
		}
	}
	return nil
}

// IsMemory says whether the node's clusters are in memory.
func (e *Env) IsMemory() bool { return e.Backend.kind == memoryKind }

// AddImage adds image (in c's pool, with its id "id-<image>") to c and to the node's kernel:
// the two agree on the image's id.
func (e *Env) AddImage(c *Cluster, image string) {
	c.M.AddImage(claim.Image{Pool: c.Pool, Image: image}, "id-"+image)
	e.Kernel.AddImageWithID(c.Pool, "", image, "id-"+image, 16<<20)
}

// TestConfig is a daemon's config for tests: sockets and state in temporary directories, a 30 s
// lease renewed every renew, manual takeover, 10 s map and mount timeouts.
func TestConfig(t testing.TB, nodeID string, renew time.Duration, clusters ...config.Cluster) *config.Config {
	dir := t.TempDir()
	return &config.Config{
		NodeID: nodeID, Socket: filepath.Join(dir, "s.sock"), StateDir: t.TempDir(), Clusters: clusters,
		LeaseDuration: config.Duration(30 * time.Second), RenewInterval: config.Duration(renew),
		TakeoverPolicy: config.TakeoverManual, FenceExpiry: config.Duration(time.Hour),
		MapTimeout: config.Duration(10 * time.Second), MountTimeout: config.Duration(10 * time.Second),
		ClaimCheckInterval: config.DefaultClaimCheckInterval,
	}
}

// QuietLog is a logger that only shows errors.
func QuietLog() *logrus.Logger {
	log := logrus.New()
	log.SetLevel(logrus.ErrorLevel)
	return log
}

var (
	fsidOnce sync.Once
	fsid     string
)

// LiveFSID is the live test cluster's fsid (the test is skipped without one).
func LiveFSID(t testing.TB) string {
	fsidOnce.Do(func() {
		conn := cephtest.Conn(t)
		fsid, _ = conn.GetFSID()
	})
	return fsid
}

// AuditLog collects audit entries (its Record is an audit.Sink).
type AuditLog struct {
	mu      sync.Mutex
	entries []audit.Entry
}

// Record adds e.
func (a *AuditLog) Record(e audit.Entry) {
	a.mu.Lock()
	a.entries = append(a.entries, e)
	a.mu.Unlock()
}

// Entries is a copy of the entries recorded so far.
func (a *AuditLog) Entries() []audit.Entry {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]audit.Entry(nil), a.entries...)
}

// Find is the entries of event with result ("": any result).
func (a *AuditLog) Find(event, result string) []audit.Entry {
	var out []audit.Entry
	for _, e := range a.Entries() {
		if e.Event == event && (result == "" || e.Result == result) {
			out = append(out, e)
		}
	}
	return out
}

// Notes collects the notes a node sends systemd (READY=1, WATCHDOG=1, STATUS=...).
type Notes struct {
	mu    sync.Mutex
	notes []string
}

// Add records s (a daemon's Options.Notify).
func (n *Notes) Add(s string) { n.mu.Lock(); n.notes = append(n.notes, s); n.mu.Unlock() }

// Count is how many notes begin with prefix.
func (n *Notes) Count(prefix string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	c := 0
	for _, s := range n.notes {
		if strings.HasPrefix(s, prefix) {
			c++
		}
	}
	return c
}
