// Package daemon is the rbd-owner agent: it owns the claims and the krbd devices of this node,
// runs the map and unmap sagas, renews leases, follows device events, recovers after a restart
// and serves the v1 API on the unix socket. Nothing imports it but the command.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/rbd-owner/rbd-owner/agent/admin"
	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/cephconn"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/devwatch"
	"github.com/rbd-owner/rbd-owner/agent/fault"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/metrics"
	"github.com/rbd-owner/rbd-owner/agent/nodeaddr"
	"github.com/rbd-owner/rbd-owner/agent/nodestate"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
	"github.com/rbd-owner/rbd-owner/agent/saga"
	"github.com/rbd-owner/rbd-owner/agent/server"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// Options are the daemon's parts. Zero fields get the real thing.
type Options struct {
	Config *config.Config
	Log    *logrus.Logger
	Audit  *audit.Log
	// KernelRelease is this node's kernel release (uname -r; krbd.KernelRelease when ""): which
	// key types and protocols its libceph speaks.
	KernelRelease string
	// LibradosRelease is the Ceph release of the librados the agent loads
	// (cephconn.LibradosRelease when ""): which key types it connects with.
	LibradosRelease string
	// Kernel maps and unmaps (a krbd client on a fake kernel in tests).
	Kernel *krbd.Client
	// Listener is the main API socket; nil: socket activation, else the daemon creates it.
	Listener net.Listener
	// CSIListener is the CSI socket (the CSI role whoever calls); nil: socket activation, else
	// the daemon creates it at Config.CSISocket (unless that is "" or "none").
	CSIListener net.Listener
	// Peers gives callers on the main socket their role (default: root and group
	// rbd-owner-admin are admins, group rbd-owner has the CSI role).
	Peers *peercred.Policy
	// Notify sends sd_notify states (default: go-systemd's daemon.SdNotify).
	Notify func(state string)
	// Watchdog is the systemd watchdog interval (default: from the environment).
	Watchdog time.Duration
	// Fault, when set, is called before every saga step; an error fails the step, and
	// ErrCrash makes the saga stop dead as if the process had been killed (tests).
	Fault func(saga, step string) error
	// Now is the wall clock written into records (tests); default time.Now. No decision reads it.
	Now func() time.Time
	// Mono is the monotonic clock leases are judged on (tests give each node its own);
	// default: the process's own.
	Mono func() time.Duration
	// BootID is the kernel's boot id, recorded in this node's holds and heartbeats (default:
	// read from /proc/sys/kernel/random/boot_id).
	BootID string
	// Connect opens a cluster (default: RADOS with the cluster's keyring); tests give an
	// in-memory cluster.
	Connect func(ctx context.Context, c config.Cluster) (Connection, error)
	// Ticker makes the ticker of a periodic loop, named "reconcile", "renew <cluster id>" or
	// "sweep", that runs every every; stop releases it. Tests hand some loops a channel of
	// their own, to decide exactly when a round runs. Default (nil): a time.Ticker.
	Ticker func(loop string, every time.Duration) (tick <-chan time.Time, stop func())
}

// ticker is Options.Ticker, or a time.Ticker.
func (d *Daemon) ticker(loop string, every time.Duration) (<-chan time.Time, func()) {
	if d.opts.Ticker != nil {
		return d.opts.Ticker(loop, every)
	}
	t := time.NewTicker(every)
	return t.C, t.Stop
}

// ErrCrash is what Options.Fault returns to simulate a kill -9 at that step: nothing is undone.
var ErrCrash = saga.ErrCrash

// Daemon is the running agent.
type Daemon struct {
	opts   Options
	cfg    *config.Config
	log    *logrus.Logger
	audit  *audit.Log
	kernel *krbd.Client
	state  *state.Store
	addrs  *nodeaddr.Resolver
	peers  peercred.Policy

	clusters map[string]*cluster

	locks *saga.Locks // one image's sagas, judgements and admin calls at a time
	sagas *saga.Sagas // the map and unmap sagas

	// node is what this node knows of itself (problems, lost claims, unmanaged devices, kept
	// fences, skews): its own type with its own lock (package nodestate)
	node      *nodestate.Node
	beats     loopBeats       // when each loop last beat (see loops.go)
	watches   takeoverWatches // images waiting to be taken over (watch.go)
	unsettled unsettledHolds  // holds the rebuild could not settle (unsettled.go)
	renewed   atomic.Int64    // successful heartbeats (tests)
	judging   atomic.Int64    // judgements of devices under way off the executor (judgeAtOnce)
	// rebootedBefore: the node rebooted after the state was last written, and before this
	// time (when the agent started); zero when it did not (or nothing says so)
	rebootedBefore time.Time
	beatEvery      time.Duration // how often an idle loop beats (set by Run)
	notifyOff      bool          // sd_notify said there is no notify socket (logged once)

	ops *executor

	renewer    *renewer        // the leases' renewals: heartbeats and claim checks (renew.go)
	intrusions *intrusionJudge // the judge of devices mapped outside rbd-owner (intrusion.go)
	sweeper    *sweeper        // the pool sweep (sweep.go)
	reconciler *reconciler     // recovery, reconciliation and device events (recover.go)

	admin *admin.Admin // the admin calls (fence, release, unfence, claims, orphans)

	metrics     *metrics.Metrics       // the Prometheus collectors (metrics.go)
	metricsAddr atomic.Pointer[string] // where the TCP metrics listener is bound (tests)

	bg sync.WaitGroup // goroutines the daemon owns
}

// New builds a daemon; it does not touch the kernel or the clusters yet.
func New(opts Options) (*Daemon, error) {
	if opts.Config == nil {
		return nil, errors.New("daemon: no config")
	}
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
	d.ops = newExecutor(d)
	d.metrics = d.newMetrics()
	d.locks = &saga.Locks{}
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
	for _, c := range d.cfg.Clusters {
		d.clusters[c.ID] = &cluster{cfg: c, d: d}
	}
	d.renewer = newRenewer(d)
	d.intrusions = newIntrusionJudge(d)
	d.sweeper = newSweeper(d)
	d.reconciler = newReconciler(d)
	return d, nil
}

// cluster returns the configured cluster named id ("" for the only one).
func (d *Daemon) cluster(id string) (*cluster, error) {
	cc, err := d.cfg.Cluster(id)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errInvalid, err)
	}
	return d.clusters[cc.ID], nil
}

var errInvalid = fault.ErrInvalid

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

// watchConfig is how the device watcher is started: on the kernel client's own event source,
// the kernel's uevents (not udevd's, which come only after its rules ran), so a mapping made
// behind the agent's back is judged, and fenced, that much sooner. The agent reads sysfs,
// never /dev links, to follow devices.
func (d *Daemon) watchConfig() devwatch.Config {
	return devwatch.Config{Client: d.kernel, Resync: d.cfg.RenewInterval.D(), Logger: d.log}
}

func (d *Daemon) isLost(k state.Key) bool { return d.node.IsLost(k) }

// sinceText is how a problem says since when it has held, in the cluster-neutral UTC.
func sinceText(t time.Time) string {
	return " (since " + t.UTC().Format(time.RFC3339) + ")"
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
		ops: d.ops, sagas: d.sagas, judge: d.intrusions, renew: d.renewer.round, reportRebuild: d.reportRebuild, bg: &d.bg,
		log: d.log, metrics: d.metrics, ticker: d.ticker, beat: d.beat,
		every: d.cfg.RenewInterval.D(), settleWait: d.cfg.MapTimeout.D()}
}

// newRenewer is d's renewer.
func newRenewer(d *Daemon) *renewer {
	return &renewer{state: d.state, node: d.node, unsettled: &d.unsettled, watches: &d.watches, locks: d.locks,
		parts: d, lost: d.sagas, log: d.log, audit: d.audit, metrics: d.metrics, renewed: &d.renewed,
		nodeID: d.cfg.NodeID, mono: d.opts.Mono, ticker: d.ticker, beat: d.beat,
		every: d.cfg.RenewInterval.D(), hbTimeout: d.cfg.HeartbeatTimeout(), checkEvery: claimCheckInterval(d.cfg)}
}

// newSweeper is d's sweeper.
func newSweeper(d *Daemon) *sweeper {
	return &sweeper{clusters: d.clusters, state: d.state, fences: d, audit: d.audit, log: d.log,
		mono: d.opts.Mono, ticker: d.ticker, beat: d.beat,
		period: sweepPeriod(d.cfg, d.fenceExpiry()), orphans: d.cfg.SweepsOrphans()}
}
