package daemon

import (
	"context"
	"time"

	sddaemon "github.com/coreos/go-systemd/v22/daemon"
)

func (d *Daemon) notify(state string) {
	if d.opts.Notify != nil {
		d.opts.Notify(state)
		return
	}
	_, _ = sddaemon.SdNotify(false, state)
}

// startWatchdog pings systemd's watchdog at half its interval, but only while the main loop
// has beaten recently: a hung loop stops the pings and systemd restarts the agent.
func (d *Daemon) startWatchdog(ctx context.Context) {
	interval := d.opts.Watchdog
	if interval == 0 {
		interval, _ = sddaemon.SdWatchdogEnabled(false)
	}
	if interval <= 0 {
		return
	}
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		t := time.NewTicker(interval / 2)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				d.mu.Lock()
				age := time.Since(d.heartbeat)
				d.mu.Unlock()
				if age < interval/2 {
					d.notify("WATCHDOG=1")
				} else {
					d.log.WithField("since", age.Round(time.Second)).Error("main loop is stuck; withholding the watchdog ping")
				}
			}
		}
	}()
}
