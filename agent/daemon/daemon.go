// Package daemon is the rbd-owner agent: it owns the claims and the krbd devices of this node,
// runs the map and unmap sagas, renews leases, follows device events, recovers after a restart
// and serves the v1 API on the unix socket. Nothing imports it but the command.
package daemon

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/rbd-owner/rbd-owner/agent/admin"
	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/devwatch"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/metrics"
	"github.com/rbd-owner/rbd-owner/agent/nodeaddr"
	"github.com/rbd-owner/rbd-owner/agent/nodestate"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
	"github.com/rbd-owner/rbd-owner/agent/saga"
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
	fences     *fenceUpkeep    // the fences the claims record, kept (fences.go)
	settler    *settler        // a rebuilt state's holds, settled (rebuild.go)

	admin *admin.Admin // the admin calls (fence, release, unfence, claims, orphans)

	metrics     *metrics.Metrics       // the Prometheus collectors (metrics.go)
	metricsAddr atomic.Pointer[string] // where the TCP metrics listener is bound (tests)

	bg sync.WaitGroup // goroutines the daemon owns
}

// cluster returns the configured cluster named id ("" for the only one).
func (d *Daemon) cluster(id string) (*cluster, error) {
	cc, err := d.cfg.Cluster(id)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errInvalid, err)
	}
	return d.clusters[cc.ID], nil
}

// watchConfig is how the device watcher is started: on the kernel client's own event source,
// the kernel's uevents (not udevd's, which come only after its rules ran), so a mapping made
// behind the agent's back is judged, and fenced, that much sooner. The agent reads sysfs,
// never /dev links, to follow devices.
func (d *Daemon) watchConfig() devwatch.Config {
	return devwatch.Config{Client: d.kernel, Resync: d.cfg.RenewInterval.D(), Logger: d.log}
}

func (d *Daemon) isLost(k state.Key) bool { return d.node.IsLost(k) }
