package claim

import (
	"context"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ceph/go-ceph/rados"

	"github.com/rbd-owner/rbd-owner/agent/cephconn"
	"github.com/rbd-owner/rbd-owner/agent/internal/cephtest"
)

// clock is a settable clock shared by the stores of one test: a wall clock (written into
// records) and a monotonic one (what leases are judged on), advanced together.
type clock struct {
	mu   sync.Mutex
	t    time.Time
	mono time.Duration
}

// Mono is the monotonic reading.
func (c *clock) Mono() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mono
}

func newClock() *clock { return &clock{t: time.Now().UTC()} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mono += d
	c.mu.Unlock()
}

// node is one claimer standing in for a node: its own RADOS connection and Store.
type node struct {
	*Store
	conn *rados.Conn
}

// Node ids here are nodeA, nodeB, …: the daemon package's tests run against the same cluster
// at the same time as node-a, node-b, … and renew their heartbeats, and two agents sharing an
// id are one node to every observer.
func newNode(t testing.TB, id string, clk *clock) node {
	t.Helper()
	return newNodeWith(t, id, clk, cephtest.Options(t))
}

func newNodeWith(t testing.TB, id string, clk *clock, o cephconn.Options) node {
	t.Helper()
	conn, err := cephconn.Connect(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Shutdown)
	cfg := Config{
		Node:        Node{ID: id, Hostname: "host-" + id, AgentVersion: "test"},
		Lease:       30 * time.Second,
		FenceExpiry: time.Hour,
	}
	if clk != nil {
		cfg.Now, cfg.Mono = clk.Now, clk.Mono
	}
	s, err := NewStore(conn, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return node{Store: s, conn: conn}
}

// testImage makes a fresh image (removed at the end) and returns its claim key.
func testImage(t testing.TB, namespace string) Image {
	t.Helper()
	admin := cephtest.AdminConn(t)
	name := cephtest.Image(t, admin, namespace)
	return Image{Pool: cephtest.Pool, Namespace: namespace, Image: name}
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

// fakeClientAddr is a mapping address that belongs to no live client: blocklisting it harms
// nothing else in the shared test cluster (never fence 127.0.0.1:0/0, that is everyone).
func fakeClientAddr(n int) string {
	return "127.0.0.2:0/" + strconv.Itoa(1000+n)
}

func writeFile(path string, b []byte) error { return os.WriteFile(path, b, 0o600) }

// silence lets d pass on a claimer's clock while it keeps watching img's holders, as an agent
// waiting to take it over does: a look at least every lease/3 (an observation not refreshed for
// a lease is dropped).
func silence(t testing.TB, s *Store, img Image, advance func(time.Duration), d time.Duration) {
	t.Helper()
	step := s.cfg.Lease / 3
	for d > 0 {
		st := min(step, d)
		advance(st)
		d -= st
		if _, err := s.Watch(context.Background(), img); err != nil {
			t.Fatal(err)
		}
	}
}
