package claim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/cephconn"
	"github.com/rbd-owner/rbd-owner/agent/claim/radosbackend"
	"github.com/rbd-owner/rbd-owner/agent/claim/record"
	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/internal/cephtest"
)

// TestBlocklistReaddKeepsTheOldExpiryOnTheRealCluster pins down what the live cluster does with
// a re-add, which enforce.go's lengthening depends on. On Ceph 16.2, 18.2 and 20.2 (measured on
// 2026-12-06) `osd blocklist add` of an address that is still listed answers success but keeps
// the entry's old expiry (the monitors' list says so), so a re-add lengthens nothing: an entry
// is lengthened by removing and adding it again, under a cover (enforce.go). The test also checks
// that an entry with the default fence_expiry is accepted and listed with that life. Should a
// Ceph release lengthen entries on a re-add, the first check fails and says so (enforce.go's
// re-add would then be enough there).
func TestBlocklistReaddKeepsTheOldExpiryOnTheRealCluster(t *testing.T) {
	conn := cephtest.Conn(t)
	r, err := radosbackend.New(conn)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("198.51.100.%d:0/%d", 1+os.Getpid()%250, time.Now().UnixNano()%1_000_000_000)
	t.Cleanup(func() { _ = cephconn.Unblocklist(conn, addr) })
	first, err := r.Blocklist(ctx(t), addr, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // a later add would name a later expiry
	if _, err := r.Blocklist(ctx(t), addr, time.Hour); err != nil {
		t.Fatal(err)
	}
	listed, ok, err := r.ListedUntil(addr)
	if err != nil || !ok {
		t.Fatalf("%s not listed after two adds: %v", addr, err)
	}
	if !listed.Equal(first) {
		t.Fatalf("a re-add moved the entry's expiry from %s to %s: this cluster lengthens entries on a re-add (docs/claim-record.md's Fence lifetimes say none does)",
			first.Format(time.RFC3339Nano), listed.Format(time.RFC3339Nano))
	}

	long := fmt.Sprintf("198.51.100.%d:0/%d", 1+os.Getpid()%250, 1+time.Now().UnixNano()%1_000_000_000)
	t.Cleanup(func() { _ = cephconn.Unblocklist(conn, long) })
	if _, err := r.Blocklist(ctx(t), long, config.DefaultFenceExpiry.D()); err != nil {
		t.Fatalf("a fence with the default fence_expiry (%s): %v", config.DefaultFenceExpiry.D(), err)
	}
	until, ok, err := r.ListedUntil(long)
	if err != nil || !ok {
		t.Fatalf("%s not listed: %v", long, err)
	}
	if d := time.Until(until) - config.DefaultFenceExpiry.D(); d < -time.Hour || d > time.Hour {
		t.Fatalf("listed until %s, want about %s from now", until.Format(time.RFC3339), config.DefaultFenceExpiry.D())
	}
}

// adminBlocklist runs `ceph osd blocklist OP ADDR [EXPIRE]` as an operator would (op "rm", or
// "add" with expire), and "range add"/"range rm" for a CIDR.
func adminBlocklist(t *testing.T, op, addr string, expire time.Duration) {
	t.Helper()
	rng := ""
	if len(op) > 6 && op[:6] == "range " {
		rng, op = `"range":"range",`, op[6:]
	}
	cmd := fmt.Sprintf(`{"prefix":"osd blocklist",%s"blocklistop":%q,"addr":%q}`, rng, op, addr)
	if op == "add" {
		cmd = fmt.Sprintf(`{"prefix":"osd blocklist",%s"blocklistop":"add","addr":%q,"expire":%.1f}`, rng, addr, expire.Seconds())
	}
	if _, st, err := cephtest.AdminConn(t).MonCommand([]byte(cmd)); err != nil {
		t.Fatalf("osd blocklist %s %s: %v (%s)", op, addr, err, st)
	}
}

// listedUntil reads addr's own entry from the cluster's blocklist.
func listedUntil(t *testing.T, s *Store, addr string) (time.Time, bool) {
	t.Helper()
	entries, err := s.b.BlocklistEntries(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	e, ok := exactEntry(entries, addr)
	return e.Until, ok
}

// realFenceScene: nodeA holds a fresh image with a made-up mapping address on ip (or, with no
// mapping, its node address ip), nodeB took it over: the fence is on the real cluster's list.
func realFenceScene(t *testing.T, ip string, mapping bool) (a, b node, clk *clock, img Image, addr string) {
	t.Helper()
	img = testImage(t, "")
	clk = newClock()
	a, b = newNode(t, "nodeA", clk), newNode(t, "nodeB", clk)
	a.cfg.Node.Addr = func() string { return ip }
	res, err := a.Acquire(ctx(t), Request{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	addr = ip + ":0/0"
	if mapping {
		addr = fmt.Sprintf("%s:0/%d", ip, 1+time.Now().UnixNano()%1_000_000_000)
		if _, err := a.SetMapping(ctx(t), img, res.Holder.Epoch, addr, "/dev/rbd0"); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = cephconn.Unblocklist(cephtest.AdminConn(t), addr) })
	if _, err := b.Watch(ctx(t), img); err != nil { // nodeB's first look at nodeA's lease
		t.Fatal(err)
	}
	silence(t, b.Store, img, clk.Advance, 31*time.Second)
	got, err := b.Acquire(ctx(t), Request{Image: img, Takeover: true})
	if err != nil {
		t.Fatalf("takeover: %v", err)
	}
	if len(got.Fenced) != 1 || got.Fenced[0].Addr != addr || !got.Fenced[0].Made {
		t.Fatalf("takeover fenced %+v; want %s fenced by this project", got.Fenced, addr)
	}
	return a, b, clk, img, addr
}

// TestAFenceRemovedOrShortenedByHandIsRepairedOnTheRealCluster: the cases of issue 50 on a real
// cluster: an operator's `osd blocklist rm` of a live fence is put back at the holder's next
// check; an entry removed and listed again for a minute is found short and lengthened under a
// cover of the fenced node's whole address (nodeA has been silent for a lease), which is removed
// afterwards; and once nodeA's mapping is gone its entry, which this project listed, is removed.
func TestAFenceRemovedOrShortenedByHandIsRepairedOnTheRealCluster(t *testing.T) {
	a, b, clk, img, addr := realFenceScene(t, "127.0.0.7", true)
	cover := "127.0.0.7:0/0"
	t.Cleanup(func() { _ = cephconn.Unblocklist(cephtest.AdminConn(t), cover) })

	adminBlocklist(t, "rm", addr, 0)
	clk.Advance(b.fenceCheck())
	rep, err := b.KeepFences(ctx(t), img)
	if err != nil || len(rep.Faults) != 1 || rep.Faults[0].Kind != "missing" || rep.Faults[0].How == "" {
		t.Fatalf("after an rm by hand: faults %+v, %v", rep.Faults, err)
	}
	if until, ok := listedUntil(t, b.Store, addr); !ok || time.Until(until) < 50*time.Minute {
		t.Fatalf("put back: listed %v until %s", ok, until)
	}

	adminBlocklist(t, "rm", addr, 0)
	adminBlocklist(t, "add", addr, time.Minute)
	clk.Advance(b.fenceCheck())
	rep, err = b.KeepFences(ctx(t), img)
	if err != nil || len(rep.Faults) != 1 || rep.Faults[0].Kind != "short" || rep.Faults[0].How == "" {
		t.Fatalf("after a short re-listing by hand: faults %+v, %v", rep.Faults, err)
	}
	until, ok := listedUntil(t, b.Store, addr)
	if !ok || time.Until(until) < 50*time.Minute {
		t.Fatalf("lengthened: listed %v until %s", ok, until)
	}
	if _, ok := listedUntil(t, b.Store, cover); ok {
		t.Fatalf("the cover %s is still listed", cover)
	}
	if rec, err := b.Inspect(ctx(t), img); err != nil || rec.Fences[0].Expires.Sub(until).Abs() > time.Second {
		t.Fatalf("the record says %v, the cluster %s (%v)", rec, until, err)
	}

	if n, err := a.FenceGone(ctx(t), img, "nodeA", addr, "unmapped (test)"); err != nil || n != 1 {
		t.Fatalf("fence gone: %d, %v", n, err)
	}
	clk.Advance(b.fenceCheck())
	if rep, err := b.KeepFences(ctx(t), img); err != nil || len(rep.Lifted) != 1 {
		t.Fatalf("lifted %+v, %v", rep.Lifted, err)
	}
	if _, ok := listedUntil(t, b.Store, addr); ok {
		t.Fatal("the entry of a gone fence this project listed is still listed")
	}
}

// TestAWholeNodeFenceIsLengthenedUnderARangeOnTheRealCluster: nodeA recorded no mapping, so its
// whole address was fenced; an operator lists it again for a minute; the holder lengthens it
// under a range entry of that one ip (`osd blocklist range add`), which cuts the same clients,
// and removes the range afterwards.
func TestAWholeNodeFenceIsLengthenedUnderARangeOnTheRealCluster(t *testing.T) {
	_, b, clk, img, addr := realFenceScene(t, "127.0.0.8", false)
	t.Cleanup(func() { adminBlocklist(t, "range rm", "127.0.0.8/32", 0) })
	adminBlocklist(t, "rm", addr, 0)
	adminBlocklist(t, "add", addr, time.Minute)
	clk.Advance(b.fenceCheck())
	rep, err := b.KeepFences(ctx(t), img)
	if err != nil || len(rep.Faults) != 1 || rep.Faults[0].How == "" {
		t.Fatalf("faults %+v, %v", rep.Faults, err)
	}
	if until, ok := listedUntil(t, b.Store, addr); !ok || time.Until(until) < 50*time.Minute {
		t.Fatalf("lengthened: listed %v until %s", ok, until)
	}
	entries, err := b.b.BlocklistEntries(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Range.IsValid() && e.Range.String() == "127.0.0.8/32" {
			t.Fatalf("the range cover %s is still listed", e)
		}
	}
}

// TestASwapMarkLeftBehindLapsesOnTheRealCluster: the swap mark on a real cluster. nodeB released
// the image it took over; a claimer (nodeC) wrote its swap mark and stopped after removing the
// fence's entry, as TestAMarkLeftByAStoppedClaimerLapses has it. The record, in format 4, goes
// through RADOS: nodeD is refused (busy, naming nodeC) while the mark lives on its clock, then
// claims: the entry is added whole before its claim, and its write drops the mark (format 3).
func TestASwapMarkLeftBehindLapsesOnTheRealCluster(t *testing.T) {
	_, b, clk, img, addr := realFenceScene(t, "127.0.0.9", true)
	rec, err := b.Inspect(ctx(t), img)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := b.Release(ctx(t), img, rec.Epoch); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if _, err := b.update(ctx(t), img, func(cur *Record, _ uint64) (*Record, error) {
		cur.Swap = &SwapMark{Node: "nodeC", Token: "t-stopped", Addrs: []string{addr}, At: clk.Now()}
		return cur, nil
	}); err != nil {
		t.Fatal(err)
	}
	adminBlocklist(t, "rm", addr, 0) // nodeC's remove, its add never sent
	d := newNode(t, "nodeD", clk)
	for _, after := range []time.Duration{0, swapMarkLife - time.Second} {
		clk.Advance(after)
		if _, err := d.Acquire(ctx(t), Request{Image: img}); !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "nodeC") {
			t.Fatalf("nodeD's claim %s after its first sight of the mark: %v; want busy, naming nodeC", after, err)
		}
	}
	clk.Advance(time.Second)
	if _, err := d.Acquire(ctx(t), Request{Image: img}); err != nil {
		t.Fatalf("nodeD's claim once the mark lapsed: %v", err)
	}
	if until, ok := listedUntil(t, d.Store, addr); !ok || time.Until(until) < 50*time.Minute {
		t.Fatalf("after nodeD's claim: listed %v until %s; want added whole before it", ok, until)
	}
	data, _, err := d.b.Read(ctx(t), img, record.ObjectOf(img))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := record.Decode(data); err != nil || got.Swap != nil || got.Format != FormatVersion {
		t.Fatalf("nodeD's claim left %s", data)
	}
}
