package daemon

import (
	"context"
	"strings"
	"time"

	sddaemon "github.com/coreos/go-systemd/v22/daemon"
)

func (d *Daemon) notify(state string) {
	if d.opts.Notify != nil {
		d.opts.Notify(state)
		return
	}
	sent, err := sddaemon.SdNotify(false, state)
	switch {
	case err != nil:
		d.log.WithError(err).WithField("state", firstLine(state)).Warn("sd_notify failed")
	case !sent && !d.notifyOff:
		// (false, nil): not run by systemd with Type=notify; say so once
		d.notifyOff = true
		d.log.Debug("sd_notify: no NOTIFY_SOCKET, not running under systemd's notify protocol")
	}
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// watchdogInterval is systemd's watchdog interval (Options.Watchdog in tests); 0 for none.
func (d *Daemon) watchdogInterval() time.Duration {
	if d.opts.Watchdog != 0 {
		return d.opts.Watchdog
	}
	interval, err := sddaemon.SdWatchdogEnabled(false)
	if err != nil {
		d.log.WithError(err).Error("systemd watchdog settings unreadable; not pinging the watchdog")
		return 0
	}
	return interval
}

// startWatchdog pings systemd's watchdog at half its interval, but only while every loop (main,
// reconcile, one renewer per cluster) has beaten recently: a hung loop stops the pings and
// systemd restarts the agent. A slow cluster does not: the loops never wait on it.
func (d *Daemon) startWatchdog(ctx context.Context, interval time.Duration) {
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
				loop, age := d.stalest()
				if age < interval/2 {
					d.notify("WATCHDOG=1")
				} else {
					d.log.WithField("loop", loop).WithField("since", age.Round(time.Second)).Error("a loop is stuck; withholding the watchdog ping")
				}
			}
		}
	}()
}
