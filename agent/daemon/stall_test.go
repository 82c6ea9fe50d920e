package daemon

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/internal/agenttest"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/krbd/fakekernel"
)

// memSecret is the key of a memory cluster's user.
const memSecret = agenttest.Secret

// memCluster is an in-memory cluster for a daemon under test, with a hook that counts the
// claim writes and can stall every call.
type memCluster = agenttest.Cluster

func newMemCluster(id, pool, fsid string) *memCluster { return agenttest.NewCluster(id, pool, fsid) }

// memDaemon is a running node on clusters in memory: no Ceph needed.
type memDaemon = node

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
	var opts []agenttest.Option
	if k != nil {
		opts = append(opts, agenttest.OnKernel(k))
	}
	n := envNode(agenttest.NewEnv(t, agenttest.Memory(clusters...), opts...), change)
	n.start()
	n.run()
	return n
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

func (n *node) mapImage(t *testing.T, c *memCluster, name string) *api.MapResponse {
	t.Helper()
	c.M.AddImage(claim.Image{Pool: c.Pool, Image: name}, "id-"+name)
	n.kernel.AddImage(c.Pool, "", name, 16<<20)
	resp, err := n.d.Map(context.Background(), api.MapRequest{Cluster: c.ID, Pool: c.Pool, Image: name, Requester: "test"}, nil)
	if err != nil {
		t.Fatalf("map %s/%s on %s: %v", c.Pool, name, c.ID, err)
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
	defer n.stop()
	defer func() { stalled.Stall.Store(false); close(stalled.Release) }()
	n.mapImage(t, healthy, "fast")
	n.mapImage(t, stalled, "slow")

	stalled.Stall.Store(true)
	select {
	case <-stalled.Entered:
	case <-time.After(30 * time.Second):
		t.Fatal("no call reached the stalled cluster")
	}
	w0, p0 := healthy.Writes.Load(), n.count("WATCHDOG=1")
	waitFor(t, "3 renewals on the healthy cluster", func() bool { return healthy.Writes.Load() >= w0+3 })
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
	case <-stalled.Release:
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
	defer n.stop()
	busy := n.mapImage(t, c, "busy")
	n.mapImage(t, c, "other")
	dev, err := n.d.kernel.FindByPath(busy.Device)
	if err != nil {
		t.Fatal(err)
	}
	n.kernel.SetOpen(dev.ID, true)
	removes := func() int {
		c := 0
		for _, w := range n.kernel.Writes() {
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
	w0, p0 := c.Writes.Load(), n.count("WATCHDOG=1")
	waitFor(t, "3 renewals", func() bool { return c.Writes.Load() >= w0+3 })
	waitFor(t, "2 watchdog pings", func() bool { return n.count("WATCHDOG=1") >= p0+2 })
	select {
	case err := <-unmapped:
		t.Fatalf("the unmap of an open device ended before it was closed: %v", err)
	default:
	}
	n.kernel.SetOpen(dev.ID, false)
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
