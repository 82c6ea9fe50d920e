package daemon

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
)

// TestARemoveEventWhileAnotherOperationRunsIsNotDropped: a device removed behind the agent's
// back while another operation on its image runs (a settle the reconciler started, say) still
// has its claim released once that operation ends, by the event alone. The executor used to
// drop an operation asked for while another ran on the image, as it rightly does for the
// reconciler's, which asks again at its next round; but no round repeats an event, so the claim
// of the gone device stayed held until the next reconciliation (seen in the lab as a claim not
// released within 3 s of `echo ID > remove_single_major`, one run in several).
func TestARemoveEventWhileAnotherOperationRunsIsNotDropped(t *testing.T) {
	c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000041")
	// no reconcile round: only the remove event may release the claim
	n := startMemDaemonWith(t, noReconcile, c)
	defer n.stop()
	resp := n.mapImage(t, c, "x")
	dev, err := n.d.kernel.FindByPath(resp.Device)
	if err != nil {
		t.Fatal(err)
	}
	ms := n.d.state.All()
	if len(ms) != 1 {
		t.Fatalf("state after the map: %+v", ms)
	}
	key := ms[0].Key

	// another operation on the image runs until the test lets it end
	running, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	end := func() { once.Do(func() { close(release) }) }
	defer end()
	if !n.d.ops.start(context.Background(), key, func(context.Context) error {
		close(running)
		<-release
		return nil
	}) {
		t.Fatal("the blocking operation was not started")
	}
	select {
	case <-running:
	case <-time.After(30 * time.Second):
		t.Fatal("the blocking operation did not start running")
	}

	// the device is removed behind the agent's back meanwhile
	if err := n.kernel.WriteControl(n.kernel.Sysfs+"/bus/rbd/remove_single_major", []byte(fmt.Sprint(dev.ID))); err != nil {
		t.Fatal(err)
	}
	// events are handled in order: once a device mapped after the removal is judged, the
	// remove event has been handled (and, before the fix, dropped)
	n.kernel.AddImage("rbd", "", "probe", 16<<20)
	other := krbd.New(n.kernel.Config())
	probe, err := other.Map(context.Background(), krbd.Spec{Pool: "rbd", Image: "probe"},
		krbd.MapOptions{Monitors: []string{"203.0.113.1:6789"}, User: "u", Secret: memSecret})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the probe device judged unmanaged", func() bool { _, seen := n.d.node.UnmanagedOf(probe); return seen })
	if got := n.d.state.All(); len(got) != 1 {
		t.Fatalf("the lost mapping was dropped while another operation on its image ran: %+v", got)
	}

	end()
	waitFor(t, "the gone device's mapping released and dropped", func() bool { return len(n.d.state.All()) == 0 })
	if rec := inspectMem(t, c, claim.Image{Pool: "rbd", Image: "x"}); !rec.Free() {
		t.Fatalf("claim of x after its device was lost: %+v", rec)
	}
}
