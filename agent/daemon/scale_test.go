package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/krbd/fakekernel"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
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
	k, err := fakekernel.New(t.TempDir(), fakekernel.Options{FSID: "fsid-scale"})
	if err != nil {
		t.Fatal(err)
	}
	if err := k.AddUser("u", memSecret); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, "node-s", time.Second, config.Cluster{ID: "c1", Monitors: []string{"203.0.113.1:6789"}, User: "u", Keyring: "/nonexistent"})
	start := func() (*Daemon, chan error, context.CancelFunc, time.Duration) {
		ready := make(chan struct{})
		var once sync.Once
		log := quietLog()
		kc := k.Config()
		kc.Poll = 10 * time.Millisecond
		d, err := New(Options{Config: cfg, Log: log, Audit: audit.NewWithSink(log, func(audit.Entry) {}), Kernel: krbd.New(kc),
			Peers: &peercred.Policy{AdminGroup: -1, CSIGroup: -1}, Watchdog: 10 * time.Second,
			Notify: func(s string) {
				if strings.HasPrefix(s, "READY=1") {
					once.Do(func() { close(ready) })
				}
			},
			Connect: func(context.Context, config.Cluster) (Connection, error) {
				return Connection{Backend: c.M, Secret: memSecret}, nil
			}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		t0 := time.Now()
		go func() { done <- d.Run(ctx) }()
		select {
		case <-ready:
		case <-time.After(5 * time.Minute):
			t.Fatal("no READY in 5 minutes")
		}
		return d, done, cancel, time.Since(t0)
	}
	d, done, cancel, _ := start()
	for i := 0; i < nImages; i++ {
		name := fmt.Sprintf("s%d", i)
		c.M.AddImage(claim.Image{Pool: "rbd", Image: name}, "id-"+name)
		k.AddImageWithID("rbd", "", name, "id-"+name, 1<<20)
		if _, err := d.Map(context.Background(), api.MapRequest{Cluster: "c1", Pool: "rbd", Image: name}, nil); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	d2, done, cancel, took := start()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
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
