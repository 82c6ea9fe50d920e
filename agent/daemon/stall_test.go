package daemon

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/claim/memory"
	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/krbd/fakekernel"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
)

const memSecret = "AQBzXHxlAAAAABAAm0Tq4kVJ2HbsYQ1rLA5pUw=="

// memCluster is an in-memory cluster for a daemon under test, with a hook that counts the
// claim writes and can stall every call.
type memCluster struct {
	id, pool string
	m        *memory.Memory
	writes   atomic.Int64
	stall    atomic.Bool   // stall calls from now on (until released)
	entered  chan struct{} // closed when the first stalled call is blocked
	release  chan struct{} // closed to let the stalled calls go
	once     sync.Once
}

func newMemCluster(id, pool, fsid string) *memCluster {
	c := &memCluster{id: id, pool: pool, m: memory.New(fsid), entered: make(chan struct{}), release: make(chan struct{})}
	c.m.SetHook(func(_ context.Context, call string, _ claim.Image) error {
		if call == "write" {
			c.writes.Add(1)
		}
		if c.stall.Load() {
			c.once.Do(func() { close(c.entered) })
			<-c.release // a cluster that does not answer, and a call that does not honour its deadline
		}
		return nil
	})
	return c
}

// memNodeDaemon is a running daemon on a fake kernel whose clusters are in memory: no Ceph
// needed. It returns the daemon and the notes sent to systemd.
type memDaemon struct {
	d      *Daemon
	k      *fakekernel.Kernel
	mu     sync.Mutex
	notes  []string
	audit  []audit.Entry
	cancel context.CancelFunc
	done   chan error
}

// audited returns the audit entries of event recorded so far.
func (n *memDaemon) audited(event string) []audit.Entry {
	n.mu.Lock()
	defer n.mu.Unlock()
	return ofEvent(n.audit, event)
}

func (n *memDaemon) count(prefix string) int {
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

func startMemDaemon(t *testing.T, clusters ...*memCluster) *memDaemon {
	t.Helper()
	return startMemDaemonWith(t, nil, clusters...)
}

// startMemDaemonWith is startMemDaemon with a change to the options (and config) first.
func startMemDaemonWith(t *testing.T, change func(*Options), clusters ...*memCluster) *memDaemon {
	t.Helper()
	return startMemDaemonOn(t, nil, change, clusters...)
}

// startMemDaemonOn is startMemDaemonWith on the fake kernel k (nil: a new one), as an agent
// restarted on the same node.
func startMemDaemonOn(t *testing.T, k *fakekernel.Kernel, change func(*Options), clusters ...*memCluster) *memDaemon {
	t.Helper()
	if k == nil {
		var err error
		if k, err = fakekernel.New(t.TempDir(), fakekernel.Options{FSID: clusters[0].m.FSID()}); err != nil {
			t.Fatal(err)
		}
		if err := k.AddUser("u", memSecret); err != nil {
			t.Fatal(err)
		}
	}
	byID := map[string]*memCluster{}
	var ccfg []config.Cluster
	for _, c := range clusters {
		byID[c.id] = c
		ccfg = append(ccfg, config.Cluster{ID: c.id, Monitors: []string{"203.0.113.1:6789"}, User: "u", Keyring: "/nonexistent"})
	}
	cfg := testConfig(t, "node-m", 100*time.Millisecond, ccfg...)
	log := quietLog()
	n := &memDaemon{k: k}
	kc := k.Config()
	kc.Poll = 10 * time.Millisecond
	opts := Options{Config: cfg, Log: log, Audit: audit.NewWithSink(log, func(e audit.Entry) { n.mu.Lock(); n.audit = append(n.audit, e); n.mu.Unlock() }), Kernel: krbd.New(kc),
		Peers: &peercred.Policy{AdminGroup: -1, CSIGroup: -1}, Watchdog: 2 * time.Second,
		Notify: func(s string) { n.mu.Lock(); n.notes = append(n.notes, s); n.mu.Unlock() },
		Connect: func(_ context.Context, c config.Cluster) (Connection, error) {
			return Connection{Backend: byID[c.ID].m, Secret: memSecret}, nil
		}}
	if change != nil {
		change(&opts)
	}
	d, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	n.d = d
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel, n.done = cancel, make(chan error, 1)
	go func() { n.done <- d.Run(ctx) }()
	waitFor(t, "READY=1", func() bool { return n.count("READY=1") > 0 })
	return n
}

func (n *memDaemon) stop(t *testing.T) {
	n.cancel()
	select {
	case err := <-n.done:
		if err != nil {
			t.Errorf("daemon: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("daemon did not stop")
	}
}

// waitFor polls cond; the bound only turns a hang into a failure, it is never what a test
// asserts.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (n *memDaemon) mapImage(t *testing.T, c *memCluster, name string) *api.MapResponse {
	t.Helper()
	c.m.AddImage(claim.Image{Pool: c.pool, Image: name}, "id-"+name)
	n.k.AddImage(c.pool, "", name, 16<<20)
	resp, err := n.d.Map(context.Background(), api.MapRequest{Cluster: c.id, Pool: c.pool, Image: name, Requester: "test"}, nil)
	if err != nil {
		t.Fatalf("map %s/%s on %s: %v", c.pool, name, c.id, err)
	}
	return resp
}

// TestStalledClusterDoesNotStopRenewalsOrTheWatchdog: while a call to one cluster is blocked
// (and ignores its deadline), the other cluster's renewals go on, the watchdog keeps being
// fed, and status names the stalled cluster. Asserted by causality: each condition is awaited
// after the stalled call is known to be blocked and before it is released.
func TestStalledClusterDoesNotStopRenewalsOrTheWatchdog(t *testing.T) {
	healthy := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000001")
	stalled := newMemCluster("c2", "slow", "00000000-0000-4000-8000-000000000001")
	n := startMemDaemon(t, healthy, stalled)
	defer n.stop(t)
	defer func() { stalled.stall.Store(false); close(stalled.release) }()
	n.mapImage(t, healthy, "fast")
	n.mapImage(t, stalled, "slow")

	stalled.stall.Store(true)
	select {
	case <-stalled.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("no call reached the stalled cluster")
	}
	w0, p0 := healthy.writes.Load(), n.count("WATCHDOG=1")
	waitFor(t, "3 renewals on the healthy cluster", func() bool { return healthy.writes.Load() >= w0+3 })
	waitFor(t, "2 watchdog pings", func() bool { return n.count("WATCHDOG=1") >= p0+2 })
	waitFor(t, "status naming the stalled cluster", func() bool {
		for _, p := range n.d.Status().Problems {
			if strings.Contains(p, "c2:slow/slow") && strings.Contains(p, "cluster c2") {
				return true
			}
		}
		return false
	})
	// an API call that needs the stalled cluster does not stop another on the healthy one
	n.mapImage(t, healthy, "fast2")
	select {
	case <-stalled.release:
		t.Fatal("the stalled call was released before the assertions")
	default:
	}
}

// TestStuckUnmapDoesNotStopRenewalsOrTheWatchdog: an unmap stuck on EBUSY (the device is
// open) holds its own image only.
func TestStuckUnmapDoesNotStopRenewalsOrTheWatchdog(t *testing.T) {
	c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000002")
	// the unmap retries EBUSY for EBusyRetry (3 s by default) and then fails: longer than
	// anything below may take, so that it is still stuck when the assertions run
	n := startMemDaemonWith(t, func(o *Options) {
		kc := o.Kernel.Config()
		kc.EBusyRetry = time.Hour
		o.Kernel = krbd.New(kc)
	}, c)
	defer n.stop(t)
	busy := n.mapImage(t, c, "busy")
	n.mapImage(t, c, "other")
	dev, err := n.d.kernel.FindByPath(busy.Device)
	if err != nil {
		t.Fatal(err)
	}
	n.k.SetOpen(dev.ID, true)
	removes := func() int {
		c := 0
		for _, w := range n.k.Writes() {
			if strings.Contains(w, "remove") {
				c++
			}
		}
		return c
	}
	r0 := removes()
	unmapped := make(chan error, 1)
	go func() {
		_, err := n.d.Unmap(context.Background(), api.UnmapRequest{Cluster: "c1", Pool: "rbd", Image: "busy"}, nil)
		unmapped <- err
	}()
	waitFor(t, "a refused remove (EBUSY)", func() bool { return removes() > r0 })
	w0, p0 := c.writes.Load(), n.count("WATCHDOG=1")
	waitFor(t, "3 renewals", func() bool { return c.writes.Load() >= w0+3 })
	waitFor(t, "2 watchdog pings", func() bool { return n.count("WATCHDOG=1") >= p0+2 })
	select {
	case err := <-unmapped:
		t.Fatalf("the unmap of an open device ended before it was closed: %v", err)
	default:
	}
	n.k.SetOpen(dev.ID, false)
	select {
	case err := <-unmapped:
		if err != nil {
			t.Fatalf("unmap after close: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("unmap did not finish after the device was closed")
	}
	if _, err := n.d.kernel.ReadDevice(dev.ID); !errors.Is(err, krbd.ErrNotFound) {
		t.Fatalf("device still there after unmap: %v", err)
	}
}
