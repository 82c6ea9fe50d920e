package daemon

import (
	"context"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/cephconn"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/internal/cephtest"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/krbd/fakekernel"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
)

// node is one simulated node: a fake kernel, a state dir, and a daemon (re-creatable, as
// after a restart) against the live test cluster.
type node struct {
	t        testing.TB
	id       string
	kernel   *fakekernel.Kernel
	cfg      *config.Config
	stateDir string
	fault    func(saga, step string) error

	mu      sync.Mutex
	entries []audit.Entry
	notes   []string

	d      *Daemon
	cancel context.CancelFunc
	done   chan error
	// manual holds the loops (Options.Ticker names) that tick only when the test says so
	manual map[string]chan time.Time
}

func newNode(t testing.TB, id string) *node {
	t.Helper()
	fsid := clusterFSID(t)
	k, err := fakekernel.New(t.TempDir(), fakekernel.Options{FSID: fsid})
	if err != nil {
		t.Fatal(err)
	}
	o := cephtest.Options(t)
	if err := k.AddUser(o.User, cephtest.Secret(t)); err != nil {
		t.Fatal(err)
	}
	k.AddPool(cephtest.Pool)
	n := &node{t: t, id: id, kernel: k, stateDir: t.TempDir()}
	n.cfg = testConfig(t, id, 200*time.Millisecond, config.Cluster{ID: "test", Monitors: []string{cephtest.MonitorV1(t)}, User: o.User, Keyring: o.Keyring})
	n.cfg.StateDir = n.stateDir
	n.start()
	t.Cleanup(n.stop)
	return n
}

// testConfig is a daemon's config for tests: sockets and state in temporary directories, a
// 30 s lease renewed every renew, manual takeover, 10 s map and mount timeouts.
func testConfig(t testing.TB, nodeID string, renew time.Duration, clusters ...config.Cluster) *config.Config {
	dir := t.TempDir()
	return &config.Config{
		NodeID: nodeID, Socket: filepath.Join(dir, "s.sock"), StateDir: t.TempDir(), Clusters: clusters,
		LeaseDuration: config.Duration(30 * time.Second), RenewInterval: config.Duration(renew),
		TakeoverPolicy: config.TakeoverManual, FenceExpiry: config.Duration(time.Hour),
		MapTimeout: config.Duration(10 * time.Second), MountTimeout: config.Duration(10 * time.Second),
		ClaimCheckInterval: config.DefaultClaimCheckInterval,
	}
}

// quietLog is a logger that only shows errors.
func quietLog() *logrus.Logger {
	log := logrus.New()
	log.SetLevel(logrus.ErrorLevel)
	return log
}

var (
	fsidOnce sync.Once
	fsid     string
)

func clusterFSID(t testing.TB) string {
	fsidOnce.Do(func() {
		conn := cephtest.Conn(t)
		fsid, _ = conn.GetFSID()
	})
	return fsid
}

// start builds a fresh daemon on the node's state dir and fake kernel (a restart).
func (n *node) start() {
	n.t.Helper()
	if old := n.d; old != nil { // the old "process" is gone: drop its connections
		for _, c := range old.clusters {
			c.close()
		}
	}
	log := logrus.New()
	log.SetLevel(logrus.WarnLevel)
	d, err := New(Options{
		Config: n.cfg, Log: log,
		Audit: audit.NewWithSink(log, func(e audit.Entry) {
			n.mu.Lock()
			n.entries = append(n.entries, e)
			n.mu.Unlock()
		}),
		Kernel: krbd.New(func() krbd.Config { c := n.kernel.Config(); c.Poll = 20 * time.Millisecond; return c }()),
		Peers:  &peercred.Policy{AdminGroup: -1, CSIGroup: -1},
		Notify: func(s string) { n.mu.Lock(); n.notes = append(n.notes, s); n.mu.Unlock() },
		Fault: func(saga, step string) error {
			if n.fault != nil {
				return n.fault(saga, step)
			}
			return nil
		},
	})
	if err != nil {
		n.t.Fatal(err)
	}
	n.d = d
}

// run starts the daemon's Run loop (recovery, API, events) on a socket in a temp dir.
func (n *node) run() {
	n.t.Helper()
	l, err := net.Listen("unix", n.cfg.Socket)
	if err != nil {
		n.t.Fatal(err)
	}
	n.d.opts.Listener = l
	n.d.opts.Ticker = n.ticker
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel, n.done = cancel, make(chan error, 1)
	go func() { n.done <- n.d.Run(ctx) }()
	n.eventually("READY=1 sent", func() bool { return n.noted("READY=1") })
}

// stop ends Run (if running), as systemd's SIGTERM would.
func (n *node) stop() {
	if n.cancel == nil {
		return
	}
	n.cancel()
	select {
	case err := <-n.done:
		if err != nil {
			n.t.Errorf("daemon %s: %v", n.id, err)
		}
	case <-time.After(20 * time.Second):
		n.t.Errorf("daemon %s did not stop", n.id)
	}
	n.cancel = nil
}

// manualTicks makes the named periodic loops ("reconcile", "renew test") of the daemon that
// run() starts tick only when tick or round says so, instead of every renew interval.
func (n *node) manualTicks(loops ...string) {
	if n.manual == nil {
		n.manual = map[string]chan time.Time{}
	}
	for _, l := range loops {
		n.manual[l] = make(chan time.Time) // unbuffered: a send returns once the loop took it
	}
}

// ticker is the daemon's Options.Ticker: a manual channel, or a real ticker.
func (n *node) ticker(loop string, every time.Duration) (<-chan time.Time, func()) {
	if ch, ok := n.manual[loop]; ok {
		return ch, func() {}
	}
	t := time.NewTicker(every)
	return t.C, t.Stop
}

// tick hands the named manual loop one tick; it returns once the loop took it.
func (n *node) tick(loop string) {
	n.t.Helper()
	select {
	case n.manual[loop] <- time.Now():
	case <-time.After(30 * time.Second):
		n.t.Fatalf("%s: loop %q took no tick within 30 s", n.id, loop)
	}
}

// reconcileRound returns once a whole reconciliation has run after the call: the reconcile
// loop takes a tick only when the round started by the one before is over, so it takes the
// second tick only when the round started by the first is over. (The second round may still
// be running.)
func (n *node) reconcileRound() {
	n.t.Helper()
	n.tick("reconcile")
	n.tick("reconcile")
}

func (n *node) noted(prefix string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, s := range n.notes {
		if len(s) >= len(prefix) && s[:len(prefix)] == prefix {
			return true
		}
	}
	return false
}

func (n *node) audited(event string) []audit.Entry {
	n.mu.Lock()
	defer n.mu.Unlock()
	return ofEvent(n.entries, event)
}

// ofEvent returns the entries of event among es.
func ofEvent(es []audit.Entry, event string) []audit.Entry {
	var out []audit.Entry
	for _, e := range es {
		if e.Event == event {
			out = append(out, e)
		}
	}
	return out
}

func (n *node) eventually(what string, f func() bool) {
	n.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			n.t.Fatalf("%s: timed out waiting for %s", n.id, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// image creates an image in the live cluster and the same in the fake kernel.
func (n *node) image(ns string, also ...*node) string {
	n.t.Helper()
	name := cephtest.Image(n.t, cephtest.AdminConn(n.t), ns)
	for _, m := range append([]*node{n}, also...) {
		m.kernel.AddImage(cephtest.Pool, ns, name, 16<<20)
	}
	return name
}

func mapReq(ns, image string) api.MapRequest {
	return api.MapRequest{Pool: cephtest.Pool, Namespace: ns, Image: image, Requester: "test"}
}

func unmapReq(ns, image string) api.UnmapRequest {
	return api.UnmapRequest{Pool: cephtest.Pool, Namespace: ns, Image: image}
}

// claimStore is an independent view of the claims (an admin's, or another node's).
func claimStore(t testing.TB) *claim.Store {
	conn, err := cephconn.Connect(cephtest.Options(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Shutdown)
	s, err := claim.NewStore(conn, claim.Config{Node: claim.Node{ID: "observer"}})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// consistent checks the safety invariant for one image on node n: a device exists exactly
// when n's claim exists, the claim names that device's client address, and the state agrees.
func (n *node) consistent(ns, image string) (mapped bool) {
	n.t.Helper()
	spec := krbd.Spec{Pool: cephtest.Pool, Namespace: ns, Image: image}
	devs, err := n.d.kernel.FindBySpec(spec, "")
	if err != nil {
		n.t.Fatal(err)
	}
	rec, err := claimStore(n.t).Inspect(context.Background(), claim.Image{Pool: cephtest.Pool, Namespace: ns, Image: image})
	var h *claim.Holder
	if err == nil {
		h = rec.Holder(n.id)
	}
	switch {
	case len(devs) > 1:
		n.t.Fatalf("%s: %d devices for %s", n.id, len(devs), spec)
	case len(devs) == 1 && h == nil:
		n.t.Fatalf("%s: device %s without a claim (%v)", n.id, devs[0].DevNode, err)
	case len(devs) == 0 && h != nil:
		n.t.Fatalf("%s: claim (epoch %d) without a device", n.id, h.Epoch)
	case len(devs) == 1 && h.ClientAddr != devs[0].ClientAddr:
		n.t.Fatalf("%s: claim names client %q, device is %q", n.id, h.ClientAddr, devs[0].ClientAddr)
	}
	for _, m := range n.d.state.All() {
		if m.Image == image && len(devs) == 0 {
			n.t.Fatalf("%s: state keeps %+v with no device", n.id, m)
		}
	}
	return len(devs) == 1
}
