package daemon

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sort"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/metrics"
	"github.com/rbd-owner/rbd-owner/agent/nodestate"
	"github.com/rbd-owner/rbd-owner/agent/state"
	"github.com/rbd-owner/rbd-owner/agent/version"
)

// The agent's Prometheus metrics (package metrics): the daemon counts events where they happen
// and answers what it holds now at every scrape (metricsSnapshot). GET /metrics is served on
// the sockets (CSI role or more) and, with metrics_listen, on a TCP listener of its own.

// newMetrics makes the daemon's collectors (called by New).
func (d *Daemon) newMetrics() *metrics.Metrics {
	ids := make([]string, 0, len(d.cfg.Clusters))
	for _, c := range d.cfg.Clusters {
		ids = append(ids, c.ID)
	}
	return metrics.New(metrics.Options{Version: version.Version, PerImage: d.cfg.PerImageMetrics, Clusters: ids,
		Lease: d.cfg.LeaseDuration.D(), Renew: d.cfg.RenewInterval.D(), HeartbeatGap: d.cfg.HeartbeatGapBound(), Snapshot: d.metricsSnapshot,
		FenceWarn: min(24*time.Hour, fenceExpiry(d.cfg)/4)})
}

// clusterLabel is the cluster label of a request: the configured cluster it names (or the only
// one), else "unknown", so that a caller cannot make up label values.
func (d *Daemon) clusterLabel(id string) string {
	if c, err := d.cfg.Cluster(id); err == nil {
		return c.ID
	}
	return "unknown"
}

// metricsSnapshot is what the node holds now: the clusters (connected, and the pools where
// this node's liveness must be written), its claims by state, the unmanaged devices.
func (d *Daemon) metricsSnapshot() metrics.Snapshot {
	var s metrics.Snapshot
	mappings := d.state.All()
	for _, u := range d.node.UnmanagedDevices() {
		if u.Pending {
			continue // not judged yet
		}
		v := metrics.VerdictReported
		if u.Verdict == claim.FenceIntruder && u.FenceErr == "" {
			v = metrics.VerdictFenced
		}
		s.Unmanaged = append(s.Unmanaged, metrics.Unmanaged{Cluster: u.Cluster, Verdict: v})
	}
	places := map[string]map[string]bool{}
	for _, m := range mappings {
		if !m.Claimed {
			continue
		}
		st := ""
		switch {
		case d.isLost(m.Key):
			st = metrics.StateLost
		case m.Phase == state.Claiming:
			st = metrics.StateClaiming
		case nodestate.Holds(m):
			st = metrics.StateHeld
		}
		if st != "" {
			s.Claims = append(s.Claims, metrics.Claim{Cluster: m.Cluster, Pool: m.Pool, Namespace: m.Namespace, Image: m.Image,
				Device: m.Device, State: st})
		}
		// the places the renewer's heartbeats write liveness in
		if nodestate.Holds(m) {
			p := livenessPlace(m.Pool, m.Namespace)
			if places[m.Cluster] == nil {
				places[m.Cluster] = map[string]bool{}
			}
			places[m.Cluster][p] = true
		}
	}
	ids := make([]string, 0, len(d.clusters))
	for id := range d.clusters {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		_, _, ok := d.clusters[id].connected()
		c := metrics.Cluster{ID: id, Connected: ok, PriorKeyMappings: d.clusters[id].priorKeyMappings()}
		for p := range places[id] {
			c.Places = append(c.Places, p)
		}
		sort.Strings(c.Places)
		s.Clusters = append(s.Clusters, c)
	}
	s.Fences = d.fences.keptSnapshot()
	werr, _ := d.state.WriteFailure()
	s.StateWriteFailing = werr != nil
	return s
}

// serveMetrics serves GET /metrics (and nothing else) on metrics_listen, when it is set, until
// ctx ends; the server's goroutines are the daemon's (Run waits for them).
func (d *Daemon) serveMetrics(ctx context.Context) error {
	if d.cfg.MetricsListen == "" {
		return nil
	}
	l, err := net.Listen("tcp", d.cfg.MetricsListen)
	if err != nil {
		// never fatal: an agent that exits for its metrics port (another process holding it a
		// moment) stops renewing its leases, and its unit's start limit would end it failed
		d.log.WithError(err).WithField("address", d.cfg.MetricsListen).Error("metrics_listen: cannot listen; the metrics stay on the API socket, retrying every 10s")
		d.bg.Add(1)
		go func() {
			defer d.bg.Done()
			for {
				select {
				case <-ctx.Done():
					return
				case <-time.After(10 * time.Second):
				}
				if l, err := net.Listen("tcp", d.cfg.MetricsListen); err == nil {
					d.serveMetricsOn(ctx, l)
					return
				}
			}
		}()
		return nil
	}
	d.serveMetricsOn(ctx, l)
	return nil
}

// serveMetricsOn serves /metrics on l until ctx ends.
func (d *Daemon) serveMetricsOn(ctx context.Context, l net.Listener) {
	addr := l.Addr().String()
	d.metricsAddr.Store(&addr)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", d.metrics.Handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute}
	d.bg.Add(2)
	go func() {
		defer d.bg.Done()
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.WithError(err).WithField("address", addr).Error("metrics listener stopped")
		}
	}()
	go func() { //nolint:gosec // G118: it runs once ctx has ended; the shutdown needs a context of its own
		defer d.bg.Done()
		<-ctx.Done()
		// ctx has ended: the shutdown gets a bounded context of its own
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			d.log.WithError(err).Warn("metrics listener did not stop cleanly")
		}
	}()
	d.log.WithField("address", addr).Info("serving metrics over TCP")
}

// MetricsAddr is the address the TCP metrics listener is bound to, "" when it is off.
func (d *Daemon) MetricsAddr() string {
	if p := d.metricsAddr.Load(); p != nil {
		return *p
	}
	return ""
}
