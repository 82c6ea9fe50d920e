package daemon

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/claim"
)

// TestUnmapUnlistsBesideItsLastStateWrite: after the release, the unmap's last two writes, the
// heartbeat that drops the image from this node's list of holds and the state file's forget,
// run at once: neither waits for the other. The heartbeat write is held back until the forget
// is seen; when the saga wrote the heartbeat first (as it did), the forget never comes while it
// waits. The image is unlisted all the same.
func TestUnmapUnlistsBesideItsLastStateWrite(t *testing.T) {
	c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000042")
	n := startMemDaemonWith(t, noReconcile, c)
	defer n.stop()
	n.mapImage(t, c, "x")
	ms := n.d.state.All()
	if len(ms) != 1 {
		t.Fatalf("state after the map: %+v", ms)
	}
	key := ms[0].Key

	var armed, waited, sawForget atomic.Bool
	c.M.SetHook(func(_ context.Context, call string, img claim.Image) error {
		if call != "write" || img.Image != "" || !armed.Load() || waited.Swap(true) {
			return nil
		}
		// the first heartbeat write after the unmap began waits for the forget (bounded, so
		// that the code before the change fails instead of hanging)
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			if _, ok := n.d.state.Get(key); !ok {
				sawForget.Store(true)
				return nil
			}
			time.Sleep(time.Millisecond)
		}
		return nil
	})
	armed.Store(true)
	if _, err := n.d.Unmap(context.Background(), api.UnmapRequest{Cluster: "c1", Pool: "rbd", Image: "x"}, nil); err != nil {
		t.Fatal(err)
	}
	if !waited.Load() {
		t.Fatal("no heartbeat was written during the unmap")
	}
	if !sawForget.Load() {
		t.Fatal("the unmap's heartbeat was written before its state forget could run: the two writes waited for each other")
	}
	if rec := inspectMem(t, c, claim.Image{Pool: "rbd", Image: "x"}); !rec.Free() {
		t.Fatalf("claim after the unmap: %+v", rec)
	}
	data, _, err := c.M.Read(context.Background(), claim.Image{Pool: "rbd"}, claim.HeartbeatPrefix+"node-m")
	if err != nil {
		t.Fatal(err)
	}
	var hb claim.Heartbeat
	if err := json.Unmarshal(data, &hb); err != nil {
		t.Fatalf("heartbeat %q: %v", data, err)
	}
	if !hb.HoldsListed {
		t.Fatalf("the heartbeat lists no holds: %+v", hb)
	}
	for _, h := range hb.Holds {
		if h == "x" {
			t.Fatalf("the heartbeat still lists x after the unmap: %+v", hb)
		}
	}
}
