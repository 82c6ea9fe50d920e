package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/internal/agenttest"
)

// TestScaleFigures is a measurement for tests/bench/run, not a check: with
// RBD_OWNER_BENCH_SCALE=N it maps N images on the fake kernel and an in-memory cluster, restarts
// the agent on the same kernel and state, and prints (as the benchmark's JSON lines) the time
// from start to READY with N devices to re-adopt and the Go heap in use with N claims held.
func TestScaleFigures(t *testing.T) {
	nImages, _ := strconv.Atoi(os.Getenv("RBD_OWNER_BENCH_SCALE"))
	if nImages <= 0 {
		t.Skip("a measurement: set RBD_OWNER_BENCH_SCALE=N")
	}
	c := newMemCluster("c1", "rbd", "fsid-scale")
	env := agenttest.NewEnv(t, agenttest.Memory(c), agenttest.Node("node-s"), agenttest.Renew(time.Second))
	env.Watchdog = 10 * time.Second
	// the audit entries are not kept: the heap measured is the agent's
	n := envNode(env, func(o *Options) { o.Audit = audit.NewWithSink(o.Log, func(audit.Entry) {}) })
	n.start()
	n.run()
	for i := 0; i < nImages; i++ {
		name := fmt.Sprintf("s%d", i)
		env.AddImage(c, name)
		if _, err := n.d.Map(context.Background(), api.MapRequest{Cluster: "c1", Pool: "rbd", Image: name}, nil); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	n.stop() // as after a SIGTERM: the devices and claims stay
	n.start()
	t0 := time.Now()
	n.run()
	took := time.Since(t0)
	d2 := n.d
	managed := 0
	for _, dv := range d2.Status().Devices {
		if dv.Managed && dv.Problem == "" {
			managed++
		}
	}
	if managed != nImages {
		t.Errorf("at READY %d of %d devices are managed without a problem", managed, nImages)
	}
	emit := func(op string, v float64) {
		b, _ := json.Marshal(map[string]any{"what": "agent-fake-kernel", "op": op, "value": v})
		fmt.Println(string(b))
	}
	emit(fmt.Sprintf("ready-s-%d-devices", nImages), took.Seconds())
	emit(fmt.Sprintf("heap-kb-%d-claims", nImages), float64(ms.HeapInuse)/1024)
}
