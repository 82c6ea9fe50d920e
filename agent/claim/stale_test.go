package claim

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/claim/memory"
	"github.com/rbd-owner/rbd-owner/agent/claim/record"
)

// The lease rule when time passes between looks: a holder idle in a pool, an observation left
// from an earlier hold, a claimer that looks again only after a long while, and a node whose
// whole address a takeover would cut.

// addrNode is a lease node with a host address: a takeover of a hold with no mapping address
// recorded would fence addr:0/0, every client of that host.
func addrNode(t *testing.T, m *memory.Memory, id, addr string, wall time.Time) (*Store, *nodeClock) {
	t.Helper()
	clk := &nodeClock{wall: wall}
	s, err := NewStoreOn(m, Config{Node: Node{ID: id, Hostname: "host-" + id, AgentVersion: "test", Incarnation: "inc-" + id,
		Addr: func() string { return addr }}, Lease: lease, FenceExpiry: time.Hour, Now: clk.Now, Mono: clk.Mono})
	if err != nil {
		t.Fatal(err)
	}
	return s, clk
}

// staleScene is node-a (10.0.0.1) and node-b (10.0.0.2) on one in-memory cluster, each on its own
// clock from the same instant, with the given images created.
func staleScene(t *testing.T, imgs ...Image) (m *memory.Memory, a, b *Store, clkA, clkB *nodeClock) {
	t.Helper()
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	m = memory.New("fsid")
	a, clkA = addrNode(t, m, "node-a", "10.0.0.1", t0)
	b, clkB = addrNode(t, m, "node-b", "10.0.0.2", t0)
	for _, img := range imgs {
		m.AddImage(img, "id-"+img.Image)
	}
	return m, a, b, clkA, clkB
}

// anyBlocklisted returns the entries of m's blocklist that cut the host addr (its whole node,
// or any of its clients).
func anyBlocklisted(m *memory.Memory, host string) []string {
	entries, _ := m.BlocklistEntries(context.Background())
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Addr, host+":") {
			out = append(out, e.Addr)
		}
	}
	return out
}

// TestIdleHolderClaimsWhileTakeoverRetries is the stale observation hole: node-b watched
// node-a's heartbeat in a pool once; node-a then held nothing there for four leases (so its
// heartbeat there stayed the same), and claims an image there while node-b retries a takeover
// of it at every step of node-a's acquire. node-a is live throughout: it must never be fenced,
// least of all its whole address (10.0.0.1:0/0: every mapping of that host, and its agent).
func TestIdleHolderClaimsWhileTakeoverRetries(t *testing.T) {
	x, y := Image{Pool: "rbd", Image: "x"}, Image{Pool: "rbd", Image: "y"}
	m, a, b, clkA, clkB := staleScene(t, x, y)
	ctx := context.Background()
	// node-a holds x; node-b asks for it and so watches node-a's heartbeat in rbd
	rx, err := a.Acquire(ctx, Request{Image: x})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := takeover(b, x); !errors.Is(err, ErrClaimedElsewhere) {
		t.Fatalf("takeover of a live holder: %v", err)
	}
	// node-a releases x and holds nothing in rbd for four leases: no heartbeat there
	if _, err := a.Release(ctx, x, rx.Holder.Epoch); err != nil {
		t.Fatal(err)
	}
	clkA.Advance(4 * lease)
	clkB.Advance(4 * lease)
	// node-a claims y; at the start of every one of its cluster calls, node-b tries to take y
	var mu sync.Mutex
	inB, armed := false, true
	var tries []string
	m.SetHook(func(_ context.Context, call string, img Image) error {
		mu.Lock()
		if !armed || inB {
			mu.Unlock()
			return nil
		}
		inB = true
		mu.Unlock()
		var err error
		if rec, ierr := b.Inspect(ctx, y); ierr != nil || rec.Free() {
			err = errors.New("y is not held yet")
		} else {
			_, err = takeover(b, y)
		}
		mu.Lock()
		inB = false
		tries = append(tries, call+" "+img.String()+": "+errString(err))
		mu.Unlock()
		return nil
	})
	ry, err := a.Acquire(ctx, Request{Image: y})
	mu.Lock()
	armed = false
	mu.Unlock()
	m.SetHook(nil)
	if fenced := anyBlocklisted(m, "10.0.0.1"); len(fenced) > 0 {
		t.Fatalf("live node-a was fenced (%v) by node-b's takeover during its acquire; node-b's tries:\n%s", fenced, strings.Join(tries, "\n"))
	}
	if err != nil {
		t.Fatalf("node-a's acquire of y: %v / %+v; node-b's tries:\n%s", err, ry, strings.Join(tries, "\n"))
	}
	if len(tries) < 3 {
		t.Fatalf("node-b tried only %d times: %v", len(tries), tries)
	}
}

func errString(err error) string {
	if err == nil {
		return "took it"
	}
	return err.Error()
}

// TestAcquireWritesHeartbeatFirst: a holder's heartbeat in a pool is current before its claim
// there is visible: the heartbeat is written first, and a claim whose heartbeat could not be
// written is not made.
func TestAcquireWritesHeartbeatFirst(t *testing.T) {
	m := memory.New("fsid")
	a, _ := addrNode(t, m, "node-a", "10.0.0.1", time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	ctx := context.Background()
	img := Image{Pool: "rbd", Image: "x"}
	m.AddImage(img, "id-x")
	var mu sync.Mutex
	var writes []string
	m.SetHook(func(_ context.Context, call string, i Image) error {
		if call == "write" {
			mu.Lock()
			writes = append(writes, "write "+i.String())
			mu.Unlock()
		}
		return nil
	})
	if _, err := a.Acquire(ctx, Request{Image: img}); err != nil {
		t.Fatal(err)
	}
	if len(writes) != 2 || writes[0] != "write rbd/" || writes[1] != "write rbd/x" {
		t.Fatalf("want the heartbeat written before the claim, got %v", writes)
	}
	// a heartbeat that cannot be written: no claim
	img2 := Image{Pool: "other", Image: "y"}
	m.AddImage(img2, "id-y")
	m.SetHook(func(_ context.Context, call string, i Image) error {
		if call == "write" && i.Image == "" {
			return errors.New("held back")
		}
		return nil
	})
	_, err := a.Acquire(ctx, Request{Image: img2})
	m.SetHook(nil)
	if err == nil || !strings.Contains(err.Error(), "heartbeat") {
		t.Fatalf("an acquire whose heartbeat could not be written: %v", err)
	}
	if rec, _, _ := a.read(ctx, img2); !rec.Free() {
		t.Fatalf("it claimed the image anyway: %+v", rec)
	}
}

// TestObservationOfAnEarlierHoldIsNotKept: a claim record that names a new hold of node-a
// while its heartbeat has not moved (an agent from before heartbeat-first claims writes the
// claim first, its heartbeat after) starts a new watch: what node-b saw of node-a's earlier
// hold is no evidence about this one.
func TestObservationOfAnEarlierHoldIsNotKept(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	m := memory.New("fsid")
	a, _ := addrNode(t, m, "node-a", "10.0.0.1", t0)
	b, clkB := addrNode(t, m, "node-b", "10.0.0.2", t0)
	ctx := context.Background()
	img, _ := heldImage(t, m, a) // node-a then stops renewing
	if _, err := takeover(b, img); !errors.Is(err, ErrClaimedElsewhere) {
		t.Fatal(err)
	}
	clkB.Advance(lease / 2)
	if _, err := takeover(b, img); !errors.Is(err, ErrClaimedElsewhere) {
		t.Fatal(err)
	}
	// node-a's hold is replaced by a new one (released and claimed again at a higher epoch, no
	// mapping recorded yet) by an older agent: the record changes, its heartbeat does not
	rec, _, err := a.read(ctx, img)
	if err != nil {
		t.Fatal(err)
	}
	rec.Epoch++
	h := &rec.Holders[0]
	h.Epoch, h.AcquiredAt, h.ClientAddr, h.Device = rec.Epoch, h.AcquiredAt.Add(lease/2), "", ""
	data, err := record.Encode(rec)
	if err != nil {
		t.Fatal(err)
	}
	m.Put(img, record.ObjectOf(img), data)
	clkB.Advance(lease/2 + time.Second)
	if _, err := takeover(b, img); !errors.Is(err, ErrClaimedElsewhere) || anyBlocklisted(m, "10.0.0.1") != nil {
		t.Fatalf("node-b judged node-a's new hold by what it saw of the old one: %v, fenced %v", err, anyBlocklisted(m, "10.0.0.1"))
	}
}

// TestObservationNotRefreshedForALeaseExpires: node-b looked at node-a's hold once, then not
// again for two leases. Its next look starts a new watch instead of trusting that nothing
// changed in between; a lease of looks later it may take over.
func TestObservationNotRefreshedForALeaseExpires(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	m := memory.New("fsid")
	a, _ := addrNode(t, m, "node-a", "10.0.0.1", t0)
	b, clkB := addrNode(t, m, "node-b", "10.0.0.2", t0)
	img, r := heldImage(t, m, a) // mapped as 10.0.0.1:0/1; node-a then stops
	if _, err := takeover(b, img); !errors.Is(err, ErrClaimedElsewhere) {
		t.Fatal(err)
	}
	clkB.Advance(2 * lease)
	_, err := takeover(b, img)
	var held *HeldError
	if !errors.As(err, &held) || held.RetryAfter() != lease {
		t.Fatalf("a look two leases after the last one trusted the old observation: %v", err)
	}
	clkB.Advance(lease / 2)
	if _, err := takeover(b, img); !errors.Is(err, ErrClaimedElsewhere) {
		t.Fatal(err)
	}
	clkB.Advance(lease / 2)
	rb, err := takeover(b, img)
	if err != nil || rb.Holder.Epoch != r.Holder.Epoch+1 || !m.Blocklisted("10.0.0.1:0/1") {
		t.Fatalf("after a lease of refreshed looks: %+v %v", rb, err)
	}
}

// TestWholeNodeFenceRefusedWhileItsHeartbeatMoves: node-a holds y in pool p with no mapping
// address recorded yet (its kernel map is slow) and its heartbeat in p stalled (a slow pool),
// while its heartbeat in pool q keeps changing. node-b may judge the lease in p expired, but
// fencing 10.0.0.1:0/0 would cut a node it has just seen alive: refused.
func TestWholeNodeFenceRefusedWhileItsHeartbeatMoves(t *testing.T) {
	y, z := Image{Pool: "p", Image: "y"}, Image{Pool: "q", Image: "z"}
	m, a, b, clkA, clkB := staleScene(t, y, z)
	ctx := context.Background()
	if _, err := a.Acquire(ctx, Request{Image: y}); err != nil { // no SetMapping: map in progress
		t.Fatal(err)
	}
	rz, err := a.Acquire(ctx, Request{Image: z})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.SetMapping(ctx, z, rz.Holder.Epoch, "10.0.0.1:0/7", "/dev/rbd1"); err != nil {
		t.Fatal(err)
	}
	advance := func(d time.Duration) { clkA.Advance(d); clkB.Advance(d) }
	for range 3 { // node-b watches both; node-a renews only in q
		for _, img := range []Image{y, z} {
			if _, err := takeover(b, img); !errors.Is(err, ErrClaimedElsewhere) {
				t.Fatalf("%s: %v", img, err)
			}
		}
		advance(lease / 3)
		if err := a.Heartbeat(ctx, "q", ""); err != nil {
			t.Fatal(err)
		}
	}
	_, err = takeover(b, y)
	if fenced := anyBlocklisted(m, "10.0.0.1"); len(fenced) > 0 {
		t.Fatalf("node-a, whose heartbeat in q changed %s ago on node-b's clock, was fenced whole: %v (%v)", lease/3, fenced, err)
	}
	var held *HeldError
	if !errors.As(err, &held) || !strings.Contains(held.Reason, "whole") {
		t.Fatalf("want a refusal that names the whole-node fence: %v", err)
	}
	// node-a stops everywhere: once node-b has seen it silent for a lease, it may fence it whole
	for range 5 {
		advance(lease / 2)
		for _, img := range []Image{z, y} {
			_, _ = takeover(b, img)
		}
	}
	if !m.Blocklisted("10.0.0.1:0/7") || !m.Blocklisted("10.0.0.1:0/0") {
		t.Fatalf("a node silent everywhere for a lease was not taken over: %v", anyBlocklisted(m, "10.0.0.1"))
	}
}

// TestWholeNodeFenceRefusedWhileItsHeartbeatMovesWhereTheTakerDoesNotWatch is case 4's other half
// (issue 50): as above, but node-b watches only pool p, where node-a's heartbeat stalled. node-a's
// heartbeat in p lists the places it heartbeats in (q too), so node-b looks there as well before
// it fences node-a's whole address, and finds it alive: refused, without listing any pool.
func TestWholeNodeFenceRefusedWhileItsHeartbeatMovesWhereTheTakerDoesNotWatch(t *testing.T) {
	y, z := Image{Pool: "p", Image: "y"}, Image{Pool: "q", Image: "z"}
	m, a, b, clkA, clkB := staleScene(t, y, z)
	ctx := context.Background()
	rz, err := a.Acquire(ctx, Request{Image: z})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.SetMapping(ctx, z, rz.Holder.Epoch, "10.0.0.1:0/7", "/dev/rbd1"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Acquire(ctx, Request{Image: y}); err != nil { // no SetMapping: map in progress
		t.Fatal(err)
	}
	advance := func(d time.Duration) { clkA.Advance(d); clkB.Advance(d) }
	for range 5 { // node-b looks at y alone; node-a renews only in q
		_, err = takeover(b, y)
		if fenced := anyBlocklisted(m, "10.0.0.1"); len(fenced) > 0 {
			t.Fatalf("node-a, renewing in q, was fenced whole: %v (%v)", fenced, err)
		}
		advance(lease / 3)
		if err := a.Heartbeat(ctx, "q", ""); err != nil {
			t.Fatal(err)
		}
	}
	var held *HeldError
	if !errors.As(err, &held) || !strings.Contains(held.Reason, "whole") {
		t.Fatalf("want a refusal that names the whole-node fence: %v", err)
	}
	// node-a stops everywhere: silent for a lease, it may be fenced whole
	for range 5 {
		advance(lease / 2)
		_, _ = takeover(b, y)
	}
	if !m.Blocklisted("10.0.0.1:0/0") {
		t.Fatalf("a node silent everywhere for a lease was not taken over: %v", anyBlocklisted(m, "10.0.0.1"))
	}
}
