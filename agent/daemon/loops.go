package daemon

import (
	"context"
	"sort"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/devwatch"
)

// The agent's loops. Each only decides and hands the work to goroutines it does not wait on,
// so none of them is ever held up by a cluster, the kernel or an API call, and each beats once
// a second: the systemd watchdog is pinged only while every loop beats ("the agent's loops are
// alive"). A slow or stalled cluster shows in status and the journal; it does not stop a loop.
//
//	main        device events (and restarting the device watcher), status for systemd
//	reconcile   every renew interval: persisted state against the kernel's devices
//	renew <id>  one per cluster: a heartbeat per pool and namespace held, each on its own
//	            schedule; every renew interval a round of claim checks, concurrent within
//	            renewConcurrency, each bounded by the renew interval

// beat records that the loop named name is alive.
func (d *Daemon) beat(name string) {
	d.beats.mu.Lock()
	defer d.beats.mu.Unlock()
	if d.beats.at == nil {
		d.beats.at = map[string]time.Time{}
	}
	d.beats.at[name] = time.Now()
}

// stalest returns the loop that beat longest ago, and how long ago.
func (d *Daemon) stalest() (string, time.Duration) {
	d.beats.mu.Lock()
	defer d.beats.mu.Unlock()
	names := make([]string, 0, len(d.beats.at))
	for n := range d.beats.at {
		names = append(names, n)
	}
	sort.Strings(names)
	worst, age := "", time.Duration(0)
	for _, n := range names {
		if a := time.Since(d.beats.at[n]); a > age || worst == "" {
			worst, age = n, a
		}
	}
	return worst, age
}

// mainLoop follows device events and feeds systemd's status. It owns watcher.
func (d *Daemon) mainLoop(ctx context.Context, watcher *devwatch.Watcher) {
	defer func() {
		if err := watcher.Close(); err != nil {
			d.log.WithError(err).Warn("device watcher did not close cleanly")
		}
	}()
	beat := time.NewTicker(d.beatEvery)
	defer beat.Stop()
	events := watcher.Events()
	for n := 0; ; n++ {
		d.beat("main")
		select {
		case <-ctx.Done():
			return
		case <-beat.C:
			if events == nil && n%5 == 0 { // the watcher died: start a new one (it resyncs from sysfs)
				if w, err := devwatch.Start(ctx, d.watchConfig()); err == nil {
					if err := watcher.Close(); err != nil {
						d.log.WithError(err).Warn("the old device watcher did not close cleanly")
					}
					watcher, events = w, w.Events()
					d.log.Info("device watcher restarted")
				} else {
					d.log.WithError(err).Error("device watcher restart failed")
				}
			}
			if n%10 == 0 {
				d.notify(d.statusLine())
			}
		case ev, ok := <-events:
			if !ok {
				d.log.Error("device watcher stopped; restarting it")
				events = nil
				continue
			}
			d.reconciler.deviceEvent(ctx, ev)
		}
	}
}
