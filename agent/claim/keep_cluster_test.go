package claim

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/cephconn"
	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/internal/cephtest"
)

// TestBlocklistReaddKeepsTheOldExpiryOnTheRealCluster pins down what the live cluster does with
// a fence's renewal, which the fence lifetimes depend on. On Ceph 16.2 `osd blocklist add` of an
// address that is still listed answers success but keeps the entry's old expiry (the monitors'
// list says so), so a renewal lengthens nothing: this is why fence_expiry's default is ten
// years (config.DefaultFenceExpiry), and the test checks that such an entry is accepted and
// listed with that life. (It replaces a test that renewed a 10 s fence and expected it to
// outlive its entry: it passed only when a renewal happened to land after the monitors' tick
// had dropped the expired entry, one run in three failed, and the fenced client could write in
// between every time.) Should a Ceph release lengthen entries on a re-add, the first check fails
// and says so: renewals would then work there.
func TestBlocklistReaddKeepsTheOldExpiryOnTheRealCluster(t *testing.T) {
	conn := cephtest.Conn(t)
	r, err := NewRados(conn)
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
	listed, ok, err := r.blocklistExpiry(addr)
	if err != nil || !ok {
		t.Fatalf("%s not listed after two adds: %v", addr, err)
	}
	if !listed.Equal(first) {
		t.Fatalf("a re-add moved the entry's expiry from %s to %s: this cluster lengthens entries, so renewals work on it (docs/claim-record.md's Fence lifetimes say they do not)",
			first.Format(time.RFC3339Nano), listed.Format(time.RFC3339Nano))
	}

	long := fmt.Sprintf("198.51.100.%d:0/%d", 1+os.Getpid()%250, 1+time.Now().UnixNano()%1_000_000_000)
	t.Cleanup(func() { _ = cephconn.Unblocklist(conn, long) })
	if _, err := r.Blocklist(ctx(t), long, config.DefaultFenceExpiry.D()); err != nil {
		t.Fatalf("a fence with the default fence_expiry (%s): %v", config.DefaultFenceExpiry.D(), err)
	}
	until, ok, err := r.blocklistExpiry(long)
	if err != nil || !ok {
		t.Fatalf("%s not listed: %v", long, err)
	}
	if d := time.Until(until) - config.DefaultFenceExpiry.D(); d < -time.Hour || d > time.Hour {
		t.Fatalf("listed until %s, want about %s from now", until.Format(time.RFC3339), config.DefaultFenceExpiry.D())
	}
}
