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
	"os"
	"sync"
	"time"

	"github.com/ceph/go-ceph/rados"
	"github.com/sirupsen/logrus"

	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/cephconn"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/devwatch"
	"github.com/rbd-owner/rbd-owner/agent/fault"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/nodeaddr"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
	"github.com/rbd-owner/rbd-owner/agent/state"
	"github.com/rbd-owner/rbd-owner/agent/version"
)

// Options are the daemon's parts. Zero fields get the real thing.
type Options struct {
	Config *config.Config
	Log    *logrus.Logger
	Audit  *audit.Log
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
	// Now is the clock used for leases (tests); default time.Now.
	Now func() time.Time
}

// ErrCrash, returned by Options.Fault, simulates a kill -9 at that step: nothing is undone.
var ErrCrash = errors.New("simulated crash")

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

	locks keyedLocks

	mu       sync.Mutex
	problems map[state.Key]string // claims that cannot be renewed, devices that cannot be explained
	lost     map[state.Key]bool   // claims this node knows it no longer holds (device kept)
	// selfFenced: when this node last re-blocklisted its own lost mapping
	selfFenced map[state.Key]time.Time
	unmanaged  map[int]krbd.Device // devices mapped behind the agent's back
	heartbeat  time.Time
	notifyOff  bool // sd_notify said there is no notify socket (logged once)

	bg sync.WaitGroup // goroutines the daemon owns
}

// cluster is one configured cluster: its connection and claim store, made on first use.
type cluster struct {
	cfg config.Cluster
	d   *Daemon

	mu      sync.Mutex
	conn    *rados.Conn
	store   *claim.Store
	secret  string
	lastTry time.Time
	lastErr error
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
	st, err := state.Open(opts.Config.StateDir)
	if err != nil {
		return nil, err
	}
	d := &Daemon{
		opts: opts, cfg: opts.Config, log: opts.Log, audit: opts.Audit, kernel: opts.Kernel, state: st,
		addrs: nodeaddr.New(), clusters: map[string]*cluster{},
		problems: map[state.Key]string{}, lost: map[state.Key]bool{}, selfFenced: map[state.Key]time.Time{}, unmanaged: map[int]krbd.Device{},
	}
	if opts.Peers != nil {
		d.peers = *opts.Peers
	} else {
		d.peers = peercred.Policy{AdminGroup: lookupGroup("rbd-owner-admin"), CSIGroup: lookupGroup("rbd-owner")}
	}
	for _, c := range d.cfg.Clusters {
		d.clusters[c.ID] = &cluster{cfg: c, d: d}
	}
	return d, nil
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
				_, err := c.claims()
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

// reconnectEvery limits how often a failed cluster connection is retried.
const reconnectEvery = 5 * time.Second

// claims returns the cluster's claim store, connecting when needed.
func (c *cluster) claims() (*claim.Store, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.store != nil {
		return c.store, nil
	}
	if c.lastErr != nil && time.Since(c.lastTry) < reconnectEvery {
		return nil, fmt.Errorf("cluster %s: %w", c.cfg.ID, c.lastErr)
	}
	c.lastTry = time.Now()
	store, err := c.connect()
	c.lastErr = err
	if err != nil {
		return nil, fmt.Errorf("cluster %s: %w", c.cfg.ID, err)
	}
	c.store = store
	return store, nil
}

func (c *cluster) connect() (*claim.Store, error) {
	secret, err := krbd.ReadKeyringFile(c.cfg.Keyring, "client."+c.cfg.User)
	if err != nil {
		return nil, fmt.Errorf("keyring: %w", err)
	}
	conn, err := cephconn.Connect(cephconn.Options{User: c.cfg.User, Keyring: c.cfg.Keyring, Monitors: c.cfg.Monitors})
	if err != nil {
		return nil, err
	}
	hostname, err := os.Hostname()
	if err != nil {
		c.d.log.WithError(err).Warn("hostname unknown; claim records will show none")
	}
	store, err := claim.NewStore(conn, claim.Config{
		Node: claim.Node{
			ID: c.d.cfg.NodeID, Hostname: hostname, AgentVersion: version.Version,
			Addr: func() string {
				a, err := c.d.addrs.SourceFor(c.cfg.Monitors)
				if err != nil {
					c.d.log.WithError(err).Warn("node address unknown")
				}
				return a
			},
		},
		Lease:       c.d.cfg.LeaseDuration.D(),
		FenceExpiry: c.d.cfg.FenceExpiry.D(),
		Now:         c.d.opts.Now,
	})
	if err != nil {
		conn.Shutdown()
		return nil, err
	}
	c.conn, c.secret = conn, secret
	return store, nil
}

func (c *cluster) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != nil {
		c.conn.Shutdown()
		c.conn, c.store = nil, nil
	}
}

// cluster returns the configured cluster named id ("" for the only one).
func (d *Daemon) cluster(id string) (*cluster, error) {
	cc, err := d.cfg.Cluster(id)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errInvalid, err)
	}
	return d.clusters[cc.ID], nil
}

// clusterByFSID finds a connected cluster by fsid.
func (d *Daemon) clusterByFSID(fsid string) *cluster {
	for _, c := range d.clusters {
		if s, err := c.claims(); err == nil && s.FSID() == fsid {
			return c
		}
	}
	return nil
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
	watcher, err := devwatch.Start(ctx, devwatch.Config{Client: d.kernel, Resync: d.cfg.RenewInterval.D()})
	if err != nil {
		return fmt.Errorf("device watcher: %w", err)
	}
	d.recover(ctx)

	l, lcsi, err := d.listeners()
	if err != nil {
		return err
	}
	srv, csiSrv := d.servers()
	serve := func(srv *http.Server, l net.Listener, name string) {
		d.bg.Add(1)
		go func() {
			defer d.bg.Done()
			if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				d.log.WithError(err).WithField("socket", name).Error("API server stopped")
				cancel()
			}
		}()
	}
	serve(srv, l, socketMain)
	if lcsi != nil {
		serve(csiSrv, lcsi, socketCSI)
	}
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		if err := d.addrs.Watch(ctx); err != nil {
			d.log.WithError(err).Warn("route changes are not followed; node address is looked up once")
		}
	}()
	d.connectAll(ctx)
	d.notify("READY=1\n" + d.statusLine())
	d.log.WithField("socket", d.cfg.Socket).WithField("node", d.cfg.NodeID).Info("rbd-owner agent ready")
	d.startWatchdog(ctx)
	d.loop(ctx, watcher)

	d.notify("STOPPING=1")
	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer scancel()
	for _, s := range []*http.Server{srv, csiSrv} {
		if err := s.Shutdown(sctx); err != nil {
			d.log.WithError(err).Warn("API server did not stop cleanly")
		}
	}
	cancel()
	d.bg.Wait()
	d.log.Info("rbd-owner agent stopped; mappings left in place")
	return nil
}

// loop is the main loop: lease renewal, device events, reconciliation. It owns watcher.
func (d *Daemon) loop(ctx context.Context, watcher *devwatch.Watcher) {
	defer func() {
		if err := watcher.Close(); err != nil {
			d.log.WithError(err).Warn("device watcher did not close cleanly")
		}
	}()
	renew := time.NewTicker(d.cfg.RenewInterval.D())
	defer renew.Stop()
	beat := time.NewTicker(time.Second)
	defer beat.Stop()
	events := watcher.Events()
	for n := 0; ; n++ {
		d.beat()
		select {
		case <-ctx.Done():
			return
		case <-beat.C:
			if n%10 == 0 {
				d.notify(d.statusLine())
			}
		case <-renew.C:
			if events == nil { // the watcher died: start a new one (it resyncs from sysfs)
				if w, err := devwatch.Start(ctx, devwatch.Config{Client: d.kernel, Resync: d.cfg.RenewInterval.D()}); err == nil {
					if err := watcher.Close(); err != nil {
						d.log.WithError(err).Warn("the old device watcher did not close cleanly")
					}
					watcher, events = w, w.Events()
				} else {
					d.log.WithError(err).Error("device watcher restart failed")
				}
			}
			d.renewAll(ctx)
			d.reconcile(ctx)
			d.notify(d.statusLine())
		case ev, ok := <-events:
			if !ok {
				d.log.Error("device watcher stopped; restarting it at the next renewal")
				events = nil
				continue
			}
			d.deviceEvent(ctx, ev)
		}
	}
}

func (d *Daemon) beat() {
	d.mu.Lock()
	d.heartbeat = time.Now()
	d.mu.Unlock()
}

func (d *Daemon) setProblem(k state.Key, p string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if p == "" {
		delete(d.problems, k)
		delete(d.lost, k)
	} else {
		d.problems[k] = p
	}
}

// setLost records that this node's claim on k is gone (fenced or taken over).
func (d *Daemon) setLost(k state.Key, why string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.problems[k] = why
	d.lost[k] = true
}

func (d *Daemon) isLost(k state.Key) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lost[k]
}

func (d *Daemon) problem(k state.Key) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.problems[k]
}
