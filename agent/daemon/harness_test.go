package daemon

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/cephconn"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/internal/agenttest"
	"github.com/rbd-owner/rbd-owner/agent/internal/cephtest"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/krbd/fakekernel"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
)

// node is one simulated node: an agenttest.Env (a fake kernel, a config, the audit entries and
// notes the test reads back, and the backend: the live test cluster, clusters in memory, or one
// never reached) and a daemon on it, re-creatable as after a restart.
type node struct {
	t        testing.TB
	id       string
	env      *agenttest.Env
	kernel   *fakekernel.Kernel
	cfg      *config.Config
	stateDir string
	fault    func(saga, step string) error
	// change is applied to the daemon's options at every start, last
	change func(*Options)

	d      *Daemon
	cancel context.CancelFunc
	done   chan error    // Run's answer (a test may take it itself)
	ended  chan struct{} // closed once Run returned and its answer is in done
	// manual holds the loops (Options.Ticker names) that tick only when the test says so
	manual map[string]chan time.Time
}

// newNode is node id on the live test cluster, built (not running: see run).
func newNode(t testing.TB, id string) *node {
	t.Helper()
	n := envNode(agenttest.NewEnv(t, agenttest.Live(), agenttest.Node(id)), nil)
	n.start()
	return n
}

// envNode is a node on env whose daemons' options change changes (nil: none); nothing is
// started yet. The node is stopped when the test ends.
func envNode(env *agenttest.Env, change func(*Options)) *node {
	n := &node{t: env.T, id: env.Config.NodeID, env: env, kernel: env.Kernel, cfg: env.Config, stateDir: env.Config.StateDir, change: change}
	env.T.Cleanup(n.stop)
	return n
}

// testConfig is agenttest.TestConfig: a daemon's config for tests.
func testConfig(t testing.TB, nodeID string, renew time.Duration, clusters ...config.Cluster) *config.Config {
	return agenttest.TestConfig(t, nodeID, renew, clusters...)
}

// quietLog is a logger that only shows errors.
func quietLog() *logrus.Logger { return agenttest.QuietLog() }

// start builds a fresh daemon on the node's state dir and fake kernel (a restart).
func (n *node) start() {
	n.t.Helper()
	if old := n.d; old != nil { // the old "process" is gone: drop its connections
		for _, c := range old.clusters {
			c.close()
		}
	}
	opts := Options{
		Config: n.cfg, Log: n.env.Log, Audit: n.env.AuditLogger(),
		Kernel:   krbd.New(n.env.KernelConfig()),
		Peers:    &peercred.Policy{AdminGroup: -1, CSIGroup: -1},
		Watchdog: n.env.Watchdog,
		Notify:   n.env.Notes.Add,
		Fault: func(saga, step string) error {
			if n.fault != nil {
				return n.fault(saga, step)
			}
			return nil
		},
	}
	if n.env.IsMemory() {
		opts.Connect = func(_ context.Context, c config.Cluster) (Connection, error) {
			return Connection{Backend: n.env.Cluster(c.ID).M, Secret: n.env.Secret}, nil
		}
	}
	if n.change != nil {
		n.change(&opts)
	}
	d, err := New(opts)
	if err != nil {
		n.t.Fatal(err)
	}
	n.d, n.id, n.stateDir = d, n.cfg.NodeID, n.cfg.StateDir
}

// run starts the daemon's Run loop (recovery, API, events) and waits for READY=1.
func (n *node) run() {
	n.t.Helper()
	if n.d.opts.Listener == nil {
		l, err := net.Listen("unix", n.cfg.Socket)
		if err != nil {
			n.t.Fatal(err)
		}
		n.d.opts.Listener = l
	}
	if n.manual != nil {
		n.d.opts.Ticker = n.ticker
	}
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel, n.done, n.ended = cancel, make(chan error, 1), make(chan struct{})
	ready := n.count("READY=1") // the notes of earlier runs on this node stay
	go func() { n.done <- n.d.Run(ctx); close(n.ended) }()
	n.eventually("READY=1 sent", func() bool { return n.count("READY=1") > ready })
}

// stop ends Run (if running), as systemd's SIGTERM would.
func (n *node) stop() {
	if n.cancel == nil {
		return
	}
	n.cancel()
	select {
	case <-n.ended:
		select {
		case err := <-n.done: // unless the test took it
			if err != nil {
				n.t.Errorf("daemon %s: %v", n.id, err)
			}
		default:
		}
	case <-time.After(30 * time.Second):
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

func (n *node) noted(prefix string) bool { return n.count(prefix) > 0 }

// count is how many notes sent to systemd begin with prefix.
func (n *node) count(prefix string) int { return n.env.Notes.Count(prefix) }

// audited returns the audit entries of event recorded so far.
func (n *node) audited(event string) []audit.Entry { return ofEvent(n.env.Audit.Entries(), event) }

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
