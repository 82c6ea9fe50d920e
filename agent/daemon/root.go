package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/admin"
	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/cephconn"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/devwatch"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/nodeaddr"
	"github.com/rbd-owner/rbd-owner/agent/nodestate"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
	"github.com/rbd-owner/rbd-owner/agent/saga"
	"github.com/rbd-owner/rbd-owner/agent/server"
	"github.com/rbd-owner/rbd-owner/agent/state"
	"github.com/sirupsen/logrus"
)

// readBootID returns the kernel's boot id ("" when it cannot be read: fences of this node's
// mappings then only end by its unmap reports or an admin).
func readBootID() string {
	b, err := os.ReadFile(bootIDFile)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// withDefaults is o with what it leaves unset filled in: the real logger, audit, kernel,
// clocks, boot id and releases.
func (opts Options) withDefaults() Options {
	if opts.Log == nil {
		opts.Log = logrus.New()
	}
	if opts.Audit == nil {
		opts.Audit = audit.New(opts.Log, true)
	}
	if opts.Kernel == nil {
		opts.Kernel = krbd.New(krbd.Config{Logger: opts.Log})
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Mono == nil {
		start := time.Now()
		opts.Mono = func() time.Duration { return time.Since(start) }
	}
	if opts.BootID == "" {
		opts.BootID = readBootID()
	}
	if opts.KernelRelease == "" {
		opts.KernelRelease = krbd.KernelRelease()
	}
	if opts.LibradosRelease == "" {
		opts.LibradosRelease = cephconn.LibradosRelease()
	}
	return opts
}

// New builds a daemon; it does not touch the kernel or the clusters yet.
func New(opts Options) (*Daemon, error) {
	if opts.Config == nil {
		return nil, errors.New("daemon: no config")
	}
	opts = opts.withDefaults()
	if err := config.CheckKeys(opts.Config, krbd.NodeVersions{Kernel: opts.KernelRelease, Librados: opts.LibradosRelease}); err != nil {
		return nil, err
	}
	st, err := state.OpenAt(opts.Config.StateDir, opts.BootID)
	if err != nil {
		return nil, err
	}
	d := &Daemon{
		opts: opts, cfg: opts.Config, log: opts.Log, audit: opts.Audit, kernel: opts.Kernel, state: st,
		addrs: nodeaddr.New(), clusters: map[string]*cluster{}, node: nodestate.New(st),
	}
	// the node rebooted since the state was last written: its devices went with the boot
	if prior := st.PriorBoot(); prior != "" && prior != opts.BootID {
		d.rebootedBefore = time.Now()
	}
	d.locks = &saga.Locks{}
	d.ops = newExecutor(&d.bg, d.locks, d.cfg.MapTimeout.D()+time.Minute, d.log)
	d.metrics = d.newMetrics()
	d.sagas = &saga.Sagas{Agent: sagaAgent{d}, Config: d.cfg, Kernel: d.kernel, State: st, Node: d.node, Locks: d.locks,
		Audit: d.audit, Metrics: d.metrics, Log: d.log, Fault: opts.Fault, RebootedBefore: d.rebootedBefore,
		KernelRelease: opts.KernelRelease, LibradosRelease: opts.LibradosRelease}
	d.admin = &admin.Admin{Agent: adminAgent{d}, NodeID: d.cfg.NodeID, Kernel: d.kernel, State: st, Audit: d.audit, Metrics: d.metrics, Log: d.log}
	d.watchState()
	if opts.Peers != nil {
		d.peers = *opts.Peers
	} else {
		d.peers = peercred.Policy{AdminGroup: server.LookupGroup("rbd-owner-admin"), CSIGroup: server.LookupGroup("rbd-owner")}
	}
	env := &clusterEnv{connect: opts.Connect, cfg: d.cfg, state: st, addrs: d.addrs, bootID: opts.BootID,
		now: opts.Now, mono: opts.Mono, log: d.log, metrics: d.metrics, onSkew: d.noteSkew}
	for _, c := range d.cfg.Clusters {
		d.clusters[c.ID] = &cluster{cfg: c, env: env}
	}
	d.fences = newFenceUpkeep(d)
	d.settler = newSettler(d)
	d.renewer = newRenewer(d)
	d.intrusions = newIntrusionJudge(d)
	d.sweeper = newSweeper(d)
	d.reconciler = newReconciler(d)
	return d, nil
}

// Run recovers, serves the API, renews leases and follows device events until ctx ends.
// Stopping leaves every mapping in place.
func (d *Daemon) Run(ctx context.Context) error {
	defer func() {
		for _, c := range d.clusters {
			c.close()
		}
	}()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	d.notify("STATUS=recovering")
	// the watcher subscribes first, so that nothing that happens during recovery is missed
	watcher, err := devwatch.Start(ctx, d.watchConfig())
	if err != nil {
		return fmt.Errorf("device watcher: %w", err)
	}
	if err := d.serveMetrics(ctx); err != nil {
		return err
	}
	// connecting starts first: no device found at recovery is judged before its claim is read
	d.connectAll(ctx)
	d.reconciler.recover(ctx)
	failed := make(chan error, 2) // an API server that stopped on its own
	servers, err := d.serveAPI(func(err error) {
		select {
		case failed <- err:
		default:
		}
		cancel()
	})
	if err != nil {
		return err
	}
	d.notify("READY=1\n" + d.statusLine())
	d.log.WithField("socket", d.cfg.Socket).WithField("node", d.cfg.NodeID).Info("rbd-owner agent ready")
	d.startLoops(ctx)
	d.mainLoop(ctx, watcher)

	d.notify("STOPPING=1")
	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer scancel()
	for _, s := range servers {
		if err := s.Shutdown(sctx); err != nil {
			d.log.WithError(err).Warn("API server did not stop cleanly")
		}
	}
	cancel()
	d.bg.Wait()
	select {
	case err := <-failed:
		// an error exit: systemd restarts the agent (Restart=on-failure); a clean one would
		// leave it down and its leases unrenewed
		d.log.WithError(err).Error("rbd-owner agent stopped because an API socket failed; mappings left in place")
		return err
	default:
	}
	d.log.Info("rbd-owner agent stopped; mappings left in place")
	return nil
}

// serveAPI serves the API on the main socket and the CSI socket (when configured), each until
// it is shut down; a server that stops on its own ends the agent with its error (stopped). It
// returns both servers, to be shut down.
func (d *Daemon) serveAPI(stopped func(error)) ([]*http.Server, error) {
	l, lcsi, err := d.listeners()
	if err != nil {
		return nil, err
	}
	srv, csiSrv := d.servers()
	serve := func(srv *http.Server, l net.Listener, name string) {
		d.bg.Add(1)
		go func() {
			defer d.bg.Done()
			if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				d.log.WithError(err).WithField("socket", name).Error("API server stopped")
				stopped(fmt.Errorf("the API server on %s stopped: %w", name, err))
			}
		}()
	}
	serve(srv, l, server.SocketMain)
	if lcsi != nil {
		serve(csiSrv, lcsi, server.SocketCSI)
	}
	return []*http.Server{srv, csiSrv}, nil
}

// startLoops starts the daemon's loops, each owned by d.bg and stopped by ctx: the route
// watcher, the watchdog, the reconciler, one renewer per cluster and the sweep.
func (d *Daemon) startLoops(ctx context.Context) {
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		if err := d.addrs.Watch(ctx); err != nil {
			d.log.WithError(err).Warn("route changes are not followed; node address is looked up once")
		}
	}()
	wd := d.watchdogInterval()
	// every loop beats well within the watchdog's half interval, so that a ping is withheld only
	// for a loop that is really stuck, not for a beat that came a moment late
	d.beatEvery = time.Second
	if wd > 0 {
		d.beatEvery = min(time.Second, wd/8)
	}
	d.beat("main")
	d.beat("reconcile")
	for _, c := range d.clusters {
		d.beat("renew " + c.cfg.ID)
	}
	d.startWatchdog(ctx, wd)
	d.bg.Add(1)
	go func() { defer d.bg.Done(); d.reconciler.loop(ctx, d.beatEvery) }()
	for _, c := range d.clusters {
		d.bg.Add(1)
		go func() { defer d.bg.Done(); d.renewer.loop(ctx, c, d.beatEvery) }()
	}
	d.beat("sweep") // always: the sweep keeps the fences of claims nobody holds
	d.bg.Add(1)
	go func() { defer d.bg.Done(); d.sweeper.loop(ctx, d.beatEvery) }()
}

// The workers, built from the daemon's parts: each holds only what it uses.

// newIntrusionJudge is d's judge of devices mapped outside rbd-owner.
func newIntrusionJudge(d *Daemon) *intrusionJudge {
	return &intrusionJudge{clusters: d.clusters, kernel: d.kernel, state: d.state, node: d.node, locks: d.locks, ops: d.ops,
		bg: &d.bg, judging: &d.judging, audit: d.audit, log: d.log, metrics: d.metrics, nodeID: d.cfg.NodeID,
		policy: claim.UnmanagedPolicy(d.cfg.Unmanaged), lockWait: d.cfg.MapTimeout.D() + time.Minute, judgedFor: d.cfg.FenceExpiry.D() / 4}
}

// newReconciler is d's reconciler; d's judge and renewer are built first.
func newReconciler(d *Daemon) *reconciler {
	return &reconciler{clusters: d.clusters, state: d.state, kernel: d.kernel, node: d.node, locks: d.locks,
		ops: d.ops, sagas: d.sagas, judge: d.intrusions, renew: d.renewer.round, reportRebuild: d.settler.reportRebuild, bg: &d.bg,
		log: d.log, metrics: d.metrics, ticker: d.ticker, beat: d.beat,
		every: d.cfg.RenewInterval.D(), settleWait: d.cfg.MapTimeout.D()}
}

// newRenewer is d's renewer.
func newRenewer(d *Daemon) *renewer {
	return &renewer{state: d.state, node: d.node, unsettled: &d.unsettled, watches: &d.watches, locks: d.locks,
		settler: d.settler, fences: d.fences, lost: d.sagas, log: d.log, audit: d.audit, metrics: d.metrics, renewed: &d.renewed,
		nodeID: d.cfg.NodeID, mono: d.opts.Mono, ticker: d.ticker, beat: d.beat,
		every: d.cfg.RenewInterval.D(), hbTimeout: d.cfg.HeartbeatTimeout(), checkEvery: claimCheckInterval(d.cfg)}
}

// newFenceUpkeep is d's keeper of the fences its claims record.
func newFenceUpkeep(d *Daemon) *fenceUpkeep {
	return &fenceUpkeep{state: d.state, node: d.node, audit: d.audit, log: d.log, metrics: d.metrics,
		nodeID: d.cfg.NodeID, expiry: fenceExpiry(d.cfg), mono: d.opts.Mono}
}

// newSettler is d's settler of a rebuilt state's holds.
func newSettler(d *Daemon) *settler {
	return &settler{clusters: d.clusters, kernel: d.kernel, state: d.state, node: d.node, unsettled: &d.unsettled,
		judging: &d.judging, audit: d.audit, log: d.log, metrics: d.metrics,
		nodeID: d.cfg.NodeID, every: d.cfg.RenewInterval.D(), judgeWait: d.cfg.MapTimeout.D()}
}

// newSweeper is d's sweeper.
func newSweeper(d *Daemon) *sweeper {
	return &sweeper{clusters: d.clusters, state: d.state, fences: d.fences, audit: d.audit, log: d.log,
		mono: d.opts.Mono, ticker: d.ticker, beat: d.beat,
		period: sweepPeriod(d.cfg, fenceExpiry(d.cfg)), orphans: d.cfg.SweepsOrphans()}
}

// connectAll connects every cluster in the background, retrying until it works, so that a
// wrong monitor address or keyring shows in status and the journal at start, not at the
// first map.
func (d *Daemon) connectAll(ctx context.Context) {
	for _, c := range d.clusters {
		d.bg.Add(1)
		go func() {
			defer d.bg.Done()
			logged := false
			for {
				cctx, cancel := context.WithTimeout(ctx, 2*cephconn.DefaultTimeout)
				_, err := c.Claims(cctx)
				cancel()
				if err == nil {
					if logged {
						d.log.WithField("cluster", c.cfg.ID).Info("connected to the cluster")
					}
					return
				}
				if !logged {
					d.log.WithError(err).WithField("cluster", c.cfg.ID).Error("cannot reach the cluster; retrying")
					logged = true
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(reconnectEvery):
				}
			}
		}()
	}
}
