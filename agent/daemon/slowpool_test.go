package daemon

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/config"
)

// TestSlowPoolDoesNotStarveAnotherPoolsHeartbeat: one cluster, two pools. Every call to pool
// "slow" blocks once it is stalled (until its deadline, or ignoring it), with 32 claims there
// to check;
// pool "fast" holds one claim. This node's heartbeat in "fast" goes on, each gap within the
// bound the lease proof needs (renew interval + the heartbeat's deadline). Asserted by
// causality first (heartbeats awaited after the stalled calls are known to be blocked, before
// they are released), then the gaps measured between those writes.
func TestSlowPoolDoesNotStarveAnotherPoolsHeartbeat(t *testing.T) {
	t.Run("calls honour their deadlines", func(t *testing.T) { slowPool(t, true) })
	t.Run("calls ignore their deadlines", func(t *testing.T) { slowPool(t, false) })
}

func slowPool(t *testing.T, honour bool) {
	c := newMemCluster("c1", "fast", "00000000-0000-4000-8000-000000000031")
	var mu sync.Mutex
	var beats []time.Time // heartbeat writes in pool fast
	stalled := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	stall := false
	c.M.SetHook(func(ctx context.Context, call string, img claim.Image) error {
		mu.Lock()
		if call == "write" && img.Pool == "fast" && img.Image == "" {
			beats = append(beats, time.Now())
		}
		s := stall && img.Pool == "slow"
		mu.Unlock()
		if s {
			once.Do(func() { close(stalled) })
			if honour { // a pool that does not answer: every call runs to its deadline
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-release:
				}
			}
			<-release // a pool that does not answer, and calls that do not honour their deadlines
		}
		return nil
	})
	renew := 500 * time.Millisecond
	n := startMemDaemonWith(t, func(o *Options) {
		o.Config.RenewInterval = config.Duration(renew)
	}, c)
	defer n.stop()
	defer close(release)
	n.mapImage(t, c, "f")
	slow := &memCluster{ID: "c1", Pool: "slow", M: c.M}
	n.kernel.AddPool("slow")
	for i := range 32 {
		n.mapImage(t, slow, fmt.Sprintf("s%d", i))
	}
	mu.Lock()
	stall = true
	mu.Unlock()
	select {
	case <-stalled:
	case <-time.After(30 * time.Second):
		t.Fatal("no call reached the stalled pool")
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(beats) }
	b0 := count()
	waitFor(t, "7 heartbeats in pool fast while pool slow is stalled", func() bool { return count() >= b0+7 })
	select {
	case <-release:
		t.Fatal("released before the assertions")
	default:
	}
	mu.Lock()
	got := append([]time.Time(nil), beats[b0:]...)
	mu.Unlock()
	bound := renew + n.d.renewer.hbTimeout
	var worst time.Duration
	for i := 1; i < len(got); i++ {
		worst = max(worst, got[i].Sub(got[i-1]))
	}
	t.Logf("heartbeat gaps in pool fast with pool slow stalled: worst %s (renew %s, bound %s)", worst, renew, bound)
	if worst > bound {
		t.Fatalf("a heartbeat gap of %s in the healthy pool: more than renew + heartbeat deadline = %s", worst, bound)
	}
}
