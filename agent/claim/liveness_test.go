package claim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/claim/memory"
	"github.com/rbd-owner/rbd-owner/agent/claim/record"
)

// nodeClock is one node's clocks: a wall clock that may be set anywhere (skewed, stepped
// back), and a monotonic clock that only moves forward.
type nodeClock struct {
	mu   sync.Mutex
	wall time.Time
	mono time.Duration
}

func (c *nodeClock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.wall }
func (c *nodeClock) Mono() time.Duration { c.mu.Lock(); defer c.mu.Unlock(); return c.mono }
func (c *nodeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.wall = c.wall.Add(d)
	c.mono += d
	c.mu.Unlock()
}
func (c *nodeClock) SetWall(t time.Time) { c.mu.Lock(); c.wall = t; c.mu.Unlock() }

const lease = 15 * time.Second

type skewSeen struct {
	node string
	by   time.Duration
}

// leaseNode is a node with its own clocks on a shared in-memory cluster.
func leaseNode(t *testing.T, m *memory.Memory, id string, wall time.Time, skews *[]skewSeen) (*Store, *nodeClock) {
	t.Helper()
	clk := &nodeClock{wall: wall}
	cfg := Config{Node: Node{ID: id, Hostname: "host-" + id, AgentVersion: "test", Incarnation: "inc-" + id},
		Lease: lease, FenceExpiry: time.Hour, Now: clk.Now, Mono: clk.Mono}
	if skews != nil {
		cfg.OnSkew = func(node string, by time.Duration) { *skews = append(*skews, skewSeen{node, by}) }
	}
	s, err := NewStoreOn(m, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, clk
}

func heldImage(t *testing.T, m *memory.Memory, a *Store) (Image, *Result) {
	t.Helper()
	img := Image{Pool: "rbd", Image: "img"}
	m.AddImage(img, "id1")
	r, err := a.Acquire(context.Background(), Request{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.SetMapping(context.Background(), img, r.Holder.Epoch, "10.0.0.1:0/1", "/dev/rbd0"); err != nil {
		t.Fatal(err)
	}
	return img, r
}

func takeover(b *Store, img Image) (*Result, error) {
	return b.Acquire(context.Background(), Request{Image: img, Takeover: true})
}

// TestLeaseIgnoresClockSkew: whatever the skew between the holder's and the claimer's wall
// clocks (up to ten leases either way), a holder that keeps renewing is never taken over, and
// one that stops is taken over a whole lease after the claimer's first look, on its own clock.
func TestLeaseIgnoresClockSkew(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	for _, skew := range []time.Duration{-10 * lease, -lease, -time.Second, 0, 2 * time.Second, lease, 10 * lease} {
		t.Run(fmt.Sprint(skew), func(t *testing.T) {
			m := memory.New("fsid")
			var skews []skewSeen
			a, clkA := leaseNode(t, m, "node-a", t0, nil)
			b, clkB := leaseNode(t, m, "node-b", t0.Add(skew), &skews)
			img, ra := heldImage(t, m, a)
			for round := range 8 { // node-a alive: renews every lease/2
				_, err := takeover(b, img)
				var held *HeldError
				if !errors.As(err, &held) || held.RetryAfter() <= 0 {
					t.Fatalf("round %d: takeover of a live holder: %v", round, err)
				}
				clkA.Advance(lease / 2)
				clkB.Advance(lease / 2)
				if err := a.Heartbeat(context.Background(), "rbd", ""); err != nil {
					t.Fatal(err)
				}
			}
			if m.Blocklisted("10.0.0.1:0/1") {
				t.Fatal("a live holder was fenced")
			}
			if holderAhead := -skew; holderAhead > time.Second || -holderAhead > lease/3 {
				if len(skews) == 0 || skews[0].node != "node-a" || (skews[0].by > 0) != (skew < 0) {
					t.Errorf("skew %s not reported as it should be: %+v", skew, skews)
				}
			} else {
				if len(skews) == 0 {
					t.Errorf("skew %s: no heartbeat heard (a skew in bounds is heard as 0, ending an earlier report)", skew)
				}
				for _, s := range skews {
					if s.by != 0 { // 0: heard, and within bounds
						t.Errorf("skew %s reported: %+v", skew, skews)
					}
				}
			}
			// node-a dies: node-b's look now, a lease of silence on node-b's clock, then it may
			_, err := takeover(b, img)
			var held *HeldError
			if !errors.As(err, &held) {
				t.Fatalf("takeover right after the last renewal: %v", err)
			}
			clkB.Advance(held.RetryAfter() - time.Millisecond)
			if _, err := takeover(b, img); !errors.Is(err, ErrClaimedElsewhere) {
				t.Fatalf("takeover a moment before the lease ran out on node-b's clock: %v", err)
			}
			clkB.Advance(time.Millisecond)
			rb, err := takeover(b, img)
			if err != nil || rb.Holder.Epoch != ra.Holder.Epoch+1 || !m.Blocklisted("10.0.0.1:0/1") {
				t.Fatalf("takeover of a dead holder: %+v %v", rb, err)
			}
		})
	}
}

// TestLeaseClockStepsAndPauses: a holder whose wall clock is stepped back an hour, or that was
// paused and resumes within the claimer's watch, keeps its image.
func TestLeaseClockStepsAndPauses(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	m := memory.New("fsid")
	a, clkA := leaseNode(t, m, "node-a", t0, nil)
	b, clkB := leaseNode(t, m, "node-b", t0, nil)
	img, _ := heldImage(t, m, a)
	if _, err := takeover(b, img); !errors.Is(err, ErrClaimedElsewhere) { // first look
		t.Fatal(err)
	}
	clkB.Advance(lease - time.Second) // node-a paused almost a whole lease
	clkA.SetWall(t0.Add(-time.Hour))  // and its clock was stepped back
	if err := a.Heartbeat(context.Background(), "rbd", ""); err != nil {
		t.Fatal(err)
	}
	clkB.Advance(2 * time.Second) // past the first look's lease, but node-a renewed inside it
	if _, err := takeover(b, img); !errors.Is(err, ErrClaimedElsewhere) {
		t.Fatalf("a holder that resumed within the watch was taken over: %v", err)
	}
	// node-b's own wall clock jumping back changes nothing either: only its monotonic one counts
	clkB.SetWall(t0.Add(-48 * time.Hour))
	clkB.Advance(lease)
	if _, err := takeover(b, img); err != nil {
		t.Fatalf("after a whole lease of silence: %v", err)
	}
}

// TestLeaseWatchStartsAgainAfterRestart: an agent restarted without its observations must
// watch a whole lease again, however long the holder has been silent; a holder that came back
// without its state has a new incarnation, and its first heartbeat counts as a renewal.
func TestLeaseWatchStartsAgainAfterRestart(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	m := memory.New("fsid")
	a, _ := leaseNode(t, m, "node-a", t0, nil)
	b, clkB := leaseNode(t, m, "node-b", t0, nil)
	img, _ := heldImage(t, m, a)
	if _, err := takeover(b, img); !errors.Is(err, ErrClaimedElsewhere) {
		t.Fatal(err)
	}
	clkB.Advance(10 * lease)
	b2, _ := leaseNode(t, m, "node-b", t0.Add(10*lease), nil) // node-b restarted: it has seen nothing
	if _, err := takeover(b2, img); !errors.Is(err, ErrClaimedElsewhere) {
		t.Fatalf("a restarted agent took over on its first look: %v", err)
	}
	// node-a comes back without its state (a new incarnation) and heartbeats once
	a2, err := NewStoreOn(m, Config{Node: Node{ID: "node-a", Incarnation: "inc-a-2"}, Lease: lease})
	if err != nil {
		t.Fatal(err)
	}
	if err := a2.Heartbeat(context.Background(), "rbd", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := takeover(b, img); !errors.Is(err, ErrClaimedElsewhere) {
		t.Fatalf("the old observer took over a node that just heartbeat: %v", err)
	}
}

// TestLegacyHolderRenewalsAreLiveness: a claim written by an agent from before heartbeats
// (format 1, renewed by rewriting the record) is judged by those rewrites; and a record of a
// format this agent does not know is refused, as older agents refuse this one's.
func TestLegacyHolderRenewalsAreLiveness(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	m := memory.New("fsid")
	img := Image{Pool: "rbd", Image: "old"}
	m.AddImage(img, "id-old")
	legacy := func(renewed time.Time) []byte {
		b, _ := json.Marshal(map[string]any{"format": 1, "pool": "rbd", "namespace": "", "image": "old", "image_id": "id-old",
			"access": "rwo", "epoch": 3, "holders": []map[string]any{{"node_id": "old-node", "client_addr": "10.0.0.9:0/9",
				"epoch": 3, "acquired_at": t0, "renewed_at": renewed, "lease_seconds": 15}}})
		return b
	}
	m.Put(img, record.ObjectOf(img), legacy(t0))
	b, clkB := leaseNode(t, m, "node-b", t0.Add(time.Hour), nil) // its clock far ahead
	for i := range 4 {
		if _, err := takeover(b, img); !errors.Is(err, ErrClaimedElsewhere) {
			t.Fatalf("round %d: a renewing legacy holder was taken over: %v", i, err)
		}
		clkB.Advance(lease / 2)
		m.Put(img, record.ObjectOf(img), legacy(t0.Add(time.Duration(i+1)*lease/2))) // the old agent renews its record
	}
	if _, err := takeover(b, img); !errors.Is(err, ErrClaimedElsewhere) {
		t.Fatal(err)
	}
	clkB.Advance(lease)
	r, err := takeover(b, img)
	if err != nil || r.Holder.Epoch != 4 || !m.Blocklisted("10.0.0.9:0/9") {
		t.Fatalf("takeover of a silent legacy holder: %+v %v", r, err)
	}
	data, _, _ := m.Read(context.Background(), img, record.ObjectOf(img))
	if !strings.Contains(string(data), fmt.Sprintf(`"format": %d`, FormatVersion)) {
		t.Fatalf("the record was not rewritten in format %d: %s", FormatVersion, data)
	}
	// a future format is refused, never guessed at
	future := SwapFormat + 1
	m.Put(img, record.ObjectOf(img), fmt.Appendf(nil, `{"format": %d, "pool": "rbd", "image": "old"}`, future))
	if _, err := b.Inspect(context.Background(), img); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("format %d", future)) {
		t.Fatalf("a format-%d record was read: %v", future, err)
	}
}

// TestObserver: the rule on its own.
func TestObserver(t *testing.T) {
	o := NewObserver()
	at := func(node, img, hold string, mark Mark) Sighting {
		return Sighting{Place: "rbd", Image: img, Node: node, Hold: hold, Mark: mark}
	}
	if v := o.Look(at("a", "x", "h1", "m1"), 0, lease); v.Expired || !v.FirstLook || v.Changed || v.Moved || v.RetryAfter != lease {
		t.Fatalf("first look: %+v", v)
	}
	if v := o.Look(at("a", "x", "h1", "m1"), lease-1, lease); v.Expired || v.RetryAfter != 1 {
		t.Fatalf("just before: %+v", v)
	}
	if v := o.Look(at("a", "x", "h1", "m2"), lease, lease); v.Expired || !v.Changed || !v.Moved || v.MovedAgo != 0 || v.RetryAfter != lease {
		t.Fatalf("renewed: %+v", v)
	}
	if v := o.Look(at("a", "x", "h1", "m2"), 2*lease, lease); !v.Expired || v.Unchanged != lease || v.Moved {
		t.Fatalf("a lease later: %+v", v)
	}
	if v := o.Look(at("b", "x", "h1", "m2"), 2*lease, lease); v.Expired {
		t.Fatalf("another holder shares nothing: %+v", v)
	}
	// another hold of the same node, same heartbeat: a watch of its own
	if v := o.Look(at("a", "x", "h2", "m2"), 2*lease, lease); v.Expired || !v.FirstLook {
		t.Fatalf("a new hold judged by the old one's watch: %+v", v)
	}
	// another image of the same node: its own watch, the same heartbeat
	if v := o.Look(at("a", "y", "h3", "m2"), 2*lease, lease); v.Expired || !v.FirstLook || v.Changed {
		t.Fatalf("another image: %+v", v)
	}
	// not looked at for more than a lease: the watch starts over
	if v := o.Look(at("a", "x", "h2", "m2"), 3*lease+1, lease); v.Expired || !v.FirstLook || v.Changed {
		t.Fatalf("a look after a gap of more than a lease: %+v", v)
	}
	// a change seen in another place counts as the node moving
	o.Look(Sighting{Place: "q", Image: "z", Node: "a", Hold: "h9", Mark: "n1"}, 3*lease+2, lease)
	o.Look(Sighting{Place: "q", Image: "z", Node: "a", Hold: "h9", Mark: "n2"}, 3*lease+3, lease)
	if v := o.Look(at("a", "x", "h2", "m2"), 4*lease+1, lease); !v.Expired || !v.Moved || v.MovedAgo != lease-2 {
		t.Fatalf("a node moving elsewhere: %+v", v)
	}
	// what was not looked at for a lease is gone (y/a and x/b), the rest kept
	if len(o.watches) != 2 || len(o.beats) != 2 {
		t.Fatalf("want 2 watches (rbd x/a, q z/a) and 2 heartbeats (rbd/a, q/a) kept: %v %v", o.watches, o.beats)
	}
}
