package daemon

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/cephconn"
	"github.com/rbd-owner/rbd-owner/agent/claim/radosbackend"
	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/internal/agenttest"
	"github.com/rbd-owner/rbd-owner/agent/internal/cephtest"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/krbd/fakekernel"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
	"github.com/rbd-owner/rbd-owner/agent/server"
)

// TestFleet is a measurement for tests/bench/fleet, not a check: how the RADOS cost of
// rbd-owner grows with the number of nodes and volumes. It runs `nodes` agents in this one
// process, each a real Daemon with its own node id, fake kernel, state directory and RADOS
// connection (the real claim code and the real RADOS backend) against the throwaway test
// cluster, every one of its cluster calls counted by kind (fleet_count_test.go), and the OSD's
// own op counters read through its admin socket. Skipped unless RBD_OWNER_FLEET is set:
//
//	RBD_OWNER_FLEET="nodes=10 vols=20 steady=60s renew=2s lease=6s churn=10 par=8 sweep=1h"
//
//	nodes   agents (default 10)
//	vols    images each maps (default 20); images fleet-00000... are created in pool rbd when
//	        missing and kept for the next run (a throwaway cluster is meant)
//	steady  how long the steady state is measured (default 60s)
//	renew   renew_interval (default 2s): every figure is also given per node per renew
//	        interval, which does not depend on the interval's length
//	lease   lease_duration (default 3 × renew; shorter than the config accepts, to get figures
//	        fast: it only sets how long a takeover waits)
//	churn   unmap+map cycles of the churn phase, on random nodes (default nodes)
//	par     maps, unmaps and agent starts at once (default 8)
//	sweep   orphan_sweep_interval (default 1h, the config's default): each node lists the pool
//	        and reads every claim in it once per interval (the first at a random moment of the
//	        first interval), so a steady phase shorter than it sees some nodes' sweeps
//
// Phases: setup (agents start, each maps its images), steady (nothing happens), churn (the
// cycles), takeover (the last node dies: its agent stops without releasing anything, as in
// TestTakeoverWaitsOutTheHoldersLeaseOnTheClaimersClock; the others map its images, round
// robin, with takeover_policy after-lease-expiry, each retrying when the refusal's
// retry_after_seconds says). At setup every rbd-owner.* object in the pool is removed first
// (claims and heartbeats of an earlier run).
//
// Output: one JSON line per measurement, to the file RBD_OWNER_FLEET_OUT (appended) or stdout:
// {"rev","nodes","vols","renew_s","phase","seconds","kind","count","per_sec",
// "per_node_per_interval"} for counted kinds (the wrapper's "read claim", "cas-write
// heartbeat", ...; "osd op_r", "osd op_w", "osd op_rw" from the OSD; "error <kind>: <code>";
// "map-error <code>"; "items list-objects @sweep": the claims the listings returned, not calls),
// and {"kind","value"} for single figures (CPU, memory, times). rev is
// RBD_OWNER_FLEET_REV. The OSD's admin socket is RBD_OWNER_FLEET_OSD_ASOK, by default
// run/ceph-osd.0.asok beside the test cluster's ceph.conf (tests/ceph/up).
func TestFleet(t *testing.T) {
	spec := os.Getenv("RBD_OWNER_FLEET")
	if spec == "" {
		t.Skip(`a measurement: set RBD_OWNER_FLEET="nodes=10 vols=20 steady=60s renew=2s" (tests/bench/fleet runs it)`)
	}
	p, err := parseFleetParams(spec)
	if err != nil {
		t.Fatal(err)
	}
	f := newFleet(t, p)
	f.log("fleet: %d nodes × %d volumes, renew %s, lease %s, steady %s, churn %d (rev %s)", p.nodes, p.vols, p.renew, p.lease, p.steady, p.churn, f.rev)

	f.prepareImages()
	f.wipeClaims()

	f.phase("setup", func() {
		f.startNodes()
		f.mapAll()
	})
	time.Sleep(p.renew) // every renewal loop has run once since its last map
	f.phase("steady", func() {
		// how often each node sweeps the pool: the daemon's sweepPeriod with this config
		f.figure("sweep-period-s", max(min(config.DefaultFenceExpiry.D()/8, p.sweep), time.Second).Seconds())
		time.Sleep(p.steady)
	})
	f.phase("churn", f.churn)
	f.phase("takeover", f.takeover)
	f.stopAll()
}

type fleetParams struct {
	nodes, vols, churn, par     int
	steady, renew, lease, sweep time.Duration
}

func parseFleetParams(spec string) (fleetParams, error) {
	p := fleetParams{nodes: 10, vols: 20, churn: -1, par: 8, steady: 60 * time.Second, renew: 2 * time.Second, sweep: time.Hour}
	for _, kv := range strings.Fields(spec) {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return p, fmt.Errorf("RBD_OWNER_FLEET: %q is not key=value", kv)
		}
		var err error
		switch k {
		case "nodes":
			p.nodes, err = strconv.Atoi(v)
		case "vols":
			p.vols, err = strconv.Atoi(v)
		case "churn":
			p.churn, err = strconv.Atoi(v)
		case "par":
			p.par, err = strconv.Atoi(v)
		case "steady":
			p.steady, err = time.ParseDuration(v)
		case "renew":
			p.renew, err = time.ParseDuration(v)
		case "lease":
			p.lease, err = time.ParseDuration(v)
		case "sweep":
			p.sweep, err = time.ParseDuration(v)
		default:
			return p, fmt.Errorf("RBD_OWNER_FLEET: unknown parameter %q (nodes, vols, steady, renew, lease, churn, par, sweep)", k)
		}
		if err != nil {
			return p, fmt.Errorf("RBD_OWNER_FLEET: %s: %w", kv, err)
		}
	}
	if p.lease == 0 {
		p.lease = 3 * p.renew
	}
	if p.churn < 0 {
		p.churn = p.nodes
	}
	if p.nodes < 2 || p.vols < 1 || p.par < 1 || p.renew <= 0 || p.lease < 2*p.renew || p.steady <= 0 || p.sweep <= 0 {
		return p, fmt.Errorf("RBD_OWNER_FLEET: want nodes >= 2, vols >= 1, par >= 1, steady > 0, sweep > 0, renew > 0, lease >= 2 × renew: %+v", p)
	}
	return p, nil
}

// fleet is the running simulation.
type fleet struct {
	t      *testing.T
	p      fleetParams
	rev    string
	run    string // this run's tag in the node ids: each run's nodes are new to the cluster
	counts *fleetCounts
	out    *os.File

	fsid, secret, mon string
	opts              cephconn.Options
	asok              string

	nodes []*fleetNode

	mu        sync.Mutex
	mapErrors map[string]int64 // failed maps and unmaps of the running phase, by error code
	figures   map[string]float64
	audits    map[string]int64
}

type fleetNode struct {
	id     string
	k      *fakekernel.Kernel
	d      *Daemon
	cancel context.CancelFunc
	done   chan error
	vols   []string
}

func newFleet(t *testing.T, p fleetParams) *fleet {
	o := cephtest.Options(t)
	f := &fleet{t: t, p: p, rev: os.Getenv("RBD_OWNER_FLEET_REV"), counts: newFleetCounts(), out: os.Stdout,
		fsid: agenttest.LiveFSID(t), secret: cephtest.Secret(t), mon: cephtest.MonitorV1(t), opts: o,
		run: fmt.Sprintf("%04x", rand.IntN(1<<16)), mapErrors: map[string]int64{}, figures: map[string]float64{}, audits: map[string]int64{}}
	if f.rev == "" {
		f.rev = "unnamed"
	}
	f.asok = os.Getenv("RBD_OWNER_FLEET_OSD_ASOK")
	if f.asok == "" {
		f.asok = filepath.Join(filepath.Dir(o.ConfFile), "run", "ceph-osd.0.asok")
	}
	if path := os.Getenv("RBD_OWNER_FLEET_OUT"); path != "" {
		out, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = out.Close() })
		f.out = out
	}
	t.Cleanup(f.stopAll)
	return f
}

func (f *fleet) log(format string, args ...any) {
	f.t.Logf("%s "+format, append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func fleetImage(i int) string { return fmt.Sprintf("fleet-%05d", i) }

// prepareImages creates the images nodes × vols that are missing (16 MiB, layering only).
func (f *fleet) prepareImages() {
	admin := cephtest.AdminConn(f.t)
	ioctx, err := admin.OpenIOContext(cephtest.Pool)
	if err != nil {
		f.t.Fatal(err)
	}
	defer ioctx.Destroy()
	names, err := rbd.GetImageNames(ioctx)
	if err != nil {
		f.t.Fatal(err)
	}
	var missing []string
	for i := range f.p.nodes * f.p.vols {
		if !slices.Contains(names, fleetImage(i)) {
			missing = append(missing, fleetImage(i))
		}
	}
	if len(missing) == 0 {
		return
	}
	start := time.Now()
	err = fleetEach(missing, f.p.par, func(name string) error {
		ioctx, err := admin.OpenIOContext(cephtest.Pool)
		if err != nil {
			return err
		}
		defer ioctx.Destroy()
		opts := rbd.NewRbdImageOptions()
		defer opts.Destroy()
		if err := opts.SetUint64(rbd.ImageOptionFeatures, rbd.FeatureLayering); err != nil {
			return err
		}
		return rbd.CreateImage(ioctx, name, 16<<20, opts)
	})
	if err != nil {
		f.t.Fatal(err)
	}
	f.log("created %d images in %s", len(missing), time.Since(start).Round(time.Millisecond))
}

// wipeClaims removes every rbd-owner object of the pool: the claims, heartbeats (and whatever
// else a version keeps) of earlier runs, so that this run's nodes find every image free.
func (f *fleet) wipeClaims() {
	admin := cephtest.AdminConn(f.t)
	ioctx, err := admin.OpenIOContext(cephtest.Pool)
	if err != nil {
		f.t.Fatal(err)
	}
	defer ioctx.Destroy()
	ioctx.SetNamespace(rados.AllNamespaces)
	iter, err := ioctx.Iter()
	if err != nil {
		f.t.Fatal(err)
	}
	type obj struct{ ns, oid string }
	var objs []obj
	for iter.Next() {
		if strings.HasPrefix(iter.Value(), "rbd-owner.") {
			objs = append(objs, obj{iter.Namespace(), iter.Value()})
		}
	}
	iter.Close()
	if err := iter.Err(); err != nil {
		f.t.Fatal(err)
	}
	err = fleetEach(objs, f.p.par, func(o obj) error {
		ioctx, err := admin.OpenIOContext(cephtest.Pool)
		if err != nil {
			return err
		}
		defer ioctx.Destroy()
		ioctx.SetNamespace(o.ns)
		return ioctx.Delete(o.oid)
	})
	if err != nil {
		f.t.Fatal(err)
	}
	if len(objs) > 0 {
		f.log("removed %d rbd-owner objects of an earlier run", len(objs))
	}
}

// fleetEach runs fn on every item, par at once, and returns the first error.
func fleetEach[T any](items []T, par int, fn func(T) error) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	sem := make(chan struct{}, par)
	for _, it := range items {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := fn(it); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return first
}

// startNodes starts the agents, par at once, each on its own fake kernel with its own images.
func (f *fleet) startNodes() {
	f.nodes = make([]*fleetNode, f.p.nodes)
	for i := range f.p.nodes {
		n := &fleetNode{id: fmt.Sprintf("fleet-%s-n%03d", f.run, i)}
		for v := range f.p.vols {
			n.vols = append(n.vols, fleetImage(i*f.p.vols+v))
		}
		f.nodes[i] = n
	}
	if err := fleetEach(f.nodes, f.p.par, f.startNode); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fleet) startNode(n *fleetNode) error {
	k, err := fakekernel.New(f.t.TempDir(), fakekernel.Options{FSID: f.fsid})
	if err != nil {
		return err
	}
	if err := k.AddUser(f.opts.User, f.secret); err != nil {
		return err
	}
	k.AddPool(cephtest.Pool)
	for _, v := range n.vols {
		k.AddImage(cephtest.Pool, "", v, 16<<20)
	}
	n.k = k
	dir := f.t.TempDir()
	cfg := &config.Config{
		NodeID: n.id, Socket: filepath.Join(dir, "s.sock"), StateDir: filepath.Join(dir, "state"),
		Clusters:      []config.Cluster{{ID: "fleet", Monitors: []string{f.mon}, User: f.opts.User, Keyring: f.opts.Keyring}},
		LeaseDuration: config.Duration(f.p.lease), RenewInterval: config.Duration(f.p.renew),
		TakeoverPolicy: config.TakeoverAfterLeaseExpiry, FenceExpiry: config.DefaultFenceExpiry,
		OrphanSweepInterval: config.Duration(f.p.sweep),
		MapTimeout:          config.Duration(30 * time.Second), MountTimeout: config.Duration(10 * time.Second),
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return err
	}
	l, err := net.Listen("unix", cfg.Socket)
	if err != nil {
		return err
	}
	log := quietLog()
	kc := k.Config()
	kc.Poll = 50 * time.Millisecond
	ready := make(chan struct{})
	var once sync.Once
	d, err := New(Options{
		Config: cfg, Log: log, Kernel: krbd.New(kc), Listener: l,
		Audit: audit.NewWithSink(log, func(e audit.Entry) {
			f.mu.Lock()
			f.audits[e.Event]++
			f.mu.Unlock()
		}),
		Peers: &peercred.Policy{AdminGroup: -1, CSIGroup: -1},
		Notify: func(s string) {
			if strings.HasPrefix(s, "READY=1") {
				once.Do(func() { close(ready) })
			}
		},
		Connect: func(_ context.Context, c config.Cluster) (Connection, error) {
			conn, err := cephconn.Connect(cephconn.Options{User: c.User, Keyring: c.Keyring, Monitors: c.Monitors})
			if err != nil {
				return Connection{}, err
			}
			b, err := radosbackend.New(conn)
			if err != nil {
				conn.Shutdown()
				return Connection{}, err
			}
			return Connection{Backend: countingBackend{Backend: b, c: f.counts}, Secret: f.secret, Close: conn.Shutdown}, nil
		},
	})
	if err != nil {
		_ = l.Close()
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	n.d, n.cancel, n.done = d, cancel, make(chan error, 1)
	go func() { n.done <- d.Run(ctx) }()
	select {
	case <-ready:
		return nil
	case err := <-n.done:
		n.cancel = nil
		return fmt.Errorf("%s: Run ended before READY: %v", n.id, err)
	case <-time.After(2 * time.Minute):
		return fmt.Errorf("%s: no READY within 2 minutes", n.id)
	}
}

// stop ends the node's agent as a SIGTERM would: nothing is released (the agent never
// releases at exit), its heartbeats stop, its connection closes.
func (n *fleetNode) stop() error {
	if n.cancel == nil {
		return nil
	}
	n.cancel()
	n.cancel = nil
	select {
	case err := <-n.done:
		return err
	case <-time.After(time.Minute):
		return fmt.Errorf("%s: the agent did not stop within a minute", n.id)
	}
}

func (f *fleet) stopAll() {
	var live []*fleetNode
	for _, n := range f.nodes {
		if n != nil && n.cancel != nil {
			live = append(live, n)
		}
	}
	if err := fleetEach(live, 16, (*fleetNode).stop); err != nil {
		f.t.Error(err)
	}
}

func (f *fleet) mapErr(what string, err error) {
	f.mu.Lock()
	f.mapErrors[what+" "+server.APIError(err).Code]++
	f.mu.Unlock()
}

func (f *fleet) mapOne(n *fleetNode, img string) (*api.MapResponse, error) {
	resp, err := n.d.Map(context.Background(), api.MapRequest{Pool: cephtest.Pool, Image: img, Requester: "fleet"}, nil)
	if err != nil {
		f.mapErr("map-error", err)
	}
	return resp, err
}

// mapAll has every node map its images, par maps at once across the fleet.
func (f *fleet) mapAll() {
	type job struct {
		n   *fleetNode
		img string
	}
	var jobs []job
	for v := range f.p.vols { // interleaved: the nodes map at the same time
		for _, n := range f.nodes {
			jobs = append(jobs, job{n, n.vols[v]})
		}
	}
	start := time.Now()
	if err := fleetEach(jobs, f.p.par, func(j job) error {
		_, err := f.mapOne(j.n, j.img)
		if err != nil {
			return fmt.Errorf("%s: map %s: %w", j.n.id, j.img, err)
		}
		return nil
	}); err != nil {
		f.t.Fatal(err)
	}
	took := time.Since(start)
	f.figure("maps-per-s", float64(len(jobs))/took.Seconds())
	f.log("mapped %d images in %s", len(jobs), took.Round(time.Millisecond))
}

// churn unmaps and maps again p.churn images of random nodes (the last node's excepted: it
// dies next), par at once.
func (f *fleet) churn() {
	type job struct {
		n   *fleetNode
		img string
	}
	var jobs []job
	seen := map[string]bool{}
	for len(jobs) < min(f.p.churn, (f.p.nodes-1)*f.p.vols) {
		n := f.nodes[rand.IntN(f.p.nodes-1)]
		img := n.vols[rand.IntN(len(n.vols))]
		if !seen[img] {
			seen[img] = true
			jobs = append(jobs, job{n, img})
		}
	}
	f.figure("churn-cycles", float64(len(jobs)))
	var failed atomic.Int64
	_ = fleetEach(jobs, f.p.par, func(j job) error {
		if _, err := j.n.d.Unmap(context.Background(), api.UnmapRequest{Pool: cephtest.Pool, Image: j.img}, nil); err != nil {
			f.mapErr("unmap-error", err)
			failed.Add(1)
			return nil
		}
		if _, err := f.mapOne(j.n, j.img); err != nil {
			failed.Add(1)
		}
		return nil
	})
	if n := failed.Load(); n > 0 {
		f.t.Errorf("churn: %d of %d cycles failed", n, len(jobs))
	}
}

// takeover stops the last node's agent (it dies holding its claims) and has the others map its
// images, round robin, each retrying after the refusal's retry_after_seconds (half a renew
// interval when it names none) until it has it.
func (f *fleet) takeover() {
	dead := f.nodes[len(f.nodes)-1]
	survivors := f.nodes[:len(f.nodes)-1]
	died := time.Now()
	if err := dead.stop(); err != nil {
		f.t.Error(err)
	}
	for i, img := range dead.vols {
		survivors[i%len(survivors)].k.AddImage(cephtest.Pool, "", img, 16<<20)
	}
	first := time.Now()
	deadline := first.Add(4*f.p.lease + 2*time.Minute)
	var (
		mu       sync.Mutex
		last     time.Time
		attempts atomic.Int64
		lost     atomic.Int64
	)
	var wg sync.WaitGroup
	for i, img := range dead.vols {
		n := survivors[i%len(survivors)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				attempts.Add(1)
				_, err := f.mapOne(n, img)
				if err == nil {
					mu.Lock()
					if now := time.Now(); now.After(last) {
						last = now
					}
					mu.Unlock()
					return
				}
				wait := f.p.renew / 2
				if e := server.APIError(err); e.RetryAfterSeconds > 0 {
					wait = time.Duration(e.RetryAfterSeconds) * time.Second
				}
				if time.Now().Add(wait).After(deadline) {
					lost.Add(1)
					f.t.Errorf("%s: %s not taken over by %s: %v", n.id, img, deadline.Format(time.TimeOnly), err)
					return
				}
				time.Sleep(wait)
			}
		}()
	}
	wg.Wait()
	if lost.Load() == 0 {
		f.figure("takeover-s", last.Sub(first).Seconds())
		f.figure("takeover-from-death-s", last.Sub(died).Seconds())
		f.figure("takeover-lease-s", f.p.lease.Seconds())
	}
	f.figure("takeover-map-attempts", float64(attempts.Load()))
	f.figure("takeover-images", float64(len(dead.vols)))
	f.log("took over %d images of %s (%d attempts, %d not taken) in %s after the first attempt", len(dead.vols), dead.id, attempts.Load(), lost.Load(), last.Sub(first).Round(time.Millisecond))
}

func (f *fleet) figure(kind string, v float64) {
	f.mu.Lock()
	f.figures[kind] = v
	f.mu.Unlock()
}

// fleetSample is everything measured at one moment.
type fleetSample struct {
	at      time.Time
	counts  fleetSnapshot
	osd     map[string]float64 // op_r, op_w, op_rw, op of perf dump's "osd" section
	cpu     time.Duration      // this process: user + system
	osdCPU  time.Duration
	monCPU  time.Duration
	audits  map[string]int64
	mapErrs map[string]int64
}

func (f *fleet) sample() fleetSample {
	s := fleetSample{at: time.Now(), counts: f.counts.snapshot(), osd: f.osdOps()}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	dir := filepath.Dir(f.opts.ConfFile)
	s.osdCPU = pidCPU(filepath.Join(dir, "run", "osd.0.pid"))
	s.monCPU = pidCPU(filepath.Join(dir, "run", "mon.a.pid"))
	f.mu.Lock()
	s.audits, s.mapErrs = copyCounts(f.audits), copyCounts(f.mapErrors)
	f.mu.Unlock()
	return s
}

func copyCounts(m map[string]int64) map[string]int64 {
	out := make(map[string]int64, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

var osdWarned sync.Once

// osdOps reads the OSD's op counters (perf dump) from its admin socket; nil when it cannot.
func (f *fleet) osdOps() map[string]float64 {
	out, err := adminSocket(f.asok, `{"prefix":"perf dump"}`)
	var dump struct {
		OSD map[string]json.RawMessage `json:"osd"`
	}
	if err == nil {
		err = json.Unmarshal(out, &dump)
	}
	if err != nil {
		osdWarned.Do(func() { f.log("the OSD's counters are not read (%s): %v", f.asok, err) })
		return nil
	}
	ops := map[string]float64{}
	for _, k := range []string{"op", "op_r", "op_w", "op_rw"} {
		var v float64
		if json.Unmarshal(dump.OSD[k], &v) == nil {
			ops[k] = v
		}
	}
	return ops
}

// adminSocket sends a command to a Ceph daemon's admin socket, as `ceph --admin-daemon` does (the
// command and a NUL; the answer's length, 4 bytes big endian, and the answer), without the
// CLI's start-up time between the two readings of a phase.
func adminSocket(path, cmd string) ([]byte, error) {
	c, err := net.DialTimeout("unix", path, 5*time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return nil, err
	}
	if _, err := c.Write(append([]byte(cmd), 0)); err != nil {
		return nil, err
	}
	var n [4]byte
	if _, err := io.ReadFull(c, n[:]); err != nil {
		return nil, err
	}
	out := make([]byte, binary.BigEndian.Uint32(n[:]))
	_, err = io.ReadFull(c, out)
	return out, err
}

// pidCPU is the user + system time of the process whose pid file is path (0 when unknown),
// in clock ticks of 10 ms (USER_HZ 100).
func pidCPU(pidFile string) time.Duration {
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return 0
	}
	stat, err := os.ReadFile("/proc/" + strings.TrimSpace(string(b)) + "/stat")
	if err != nil {
		return 0
	}
	s := string(stat)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:]) // after "pid (comm) "
	if len(fields) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(fields[11], 10, 64) // utime is field 14 of the line
	st, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(u+st) * 10 * time.Millisecond
}

// procStatus returns a field of /proc/self/status in kB (VmRSS) or as a count (Threads).
func procStatus(field string) float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.ParseFloat(strings.Fields(v)[0], 64)
			return n
		}
	}
	return 0
}

// fleetLine is one JSON line of output.
type fleetLine struct {
	Rev                string   `json:"rev"`
	Nodes              int      `json:"nodes"`
	Vols               int      `json:"vols"`
	RenewS             float64  `json:"renew_s"`
	Phase              string   `json:"phase"`
	Seconds            float64  `json:"seconds"`
	Kind               string   `json:"kind"`
	Count              *float64 `json:"count,omitempty"`
	PerSec             *float64 `json:"per_sec,omitempty"`
	PerNodePerInterval *float64 `json:"per_node_per_interval,omitempty"`
	MeanMs             *float64 `json:"mean_ms,omitempty"`
	Value              *float64 `json:"value,omitempty"`
}

// phase runs fn and writes what it cost.
func (f *fleet) phase(name string, fn func()) {
	f.figures = map[string]float64{}
	before := f.sample()
	fn()
	after := f.sample()
	secs := after.at.Sub(before.at).Seconds()
	intervals := secs / f.p.renew.Seconds()
	base := fleetLine{Rev: f.rev, Nodes: f.p.nodes, Vols: f.p.vols, RenewS: f.p.renew.Seconds(), Phase: name, Seconds: secs}
	ptr := func(v float64) *float64 { return &v }
	count := func(kind string, n float64, mean *float64) {
		l := base
		l.Kind, l.Count, l.PerSec, l.PerNodePerInterval, l.MeanMs = kind, ptr(n), ptr(n/secs), ptr(n/float64(f.p.nodes)/intervals), mean
		f.emit(l)
	}
	value := func(kind string, v float64) {
		l := base
		l.Kind, l.Value = kind, ptr(v)
		f.emit(l)
	}
	kinds, calls, errs, taking := after.counts.since(before.counts)
	var total float64
	for _, k := range kinds {
		if strings.HasPrefix(k, "items ") { // not calls
			count(k, float64(calls[k]), nil)
			continue
		}
		count(k, float64(calls[k]), ptr(float64(taking[k].Microseconds())/1000/float64(calls[k])))
		total += float64(calls[k])
	}
	count("all counted calls", total, nil)
	for _, k := range sortedKeys(errs) {
		count("error "+k, float64(errs[k]), nil)
	}
	for _, k := range sortedKeys(after.mapErrs) {
		if d := after.mapErrs[k] - before.mapErrs[k]; d > 0 {
			count(k, float64(d), nil)
		}
	}
	for _, k := range sortedKeys(after.audits) {
		if d := after.audits[k] - before.audits[k]; d > 0 {
			count("audit "+k, float64(d), nil)
		}
	}
	if before.osd != nil && after.osd != nil {
		for _, k := range []string{"op", "op_r", "op_w", "op_rw"} {
			count("osd "+k, after.osd[k]-before.osd[k], nil)
		}
	}
	value("cpu-cores test process", (after.cpu-before.cpu).Seconds()/secs)
	if after.osdCPU > 0 {
		value("cpu-cores osd", (after.osdCPU-before.osdCPU).Seconds()/secs)
		value("cpu-cores mon", (after.monCPU-before.monCPU).Seconds()/secs)
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	value("heap-alloc-mb", float64(ms.HeapAlloc)/(1<<20))
	value("rss-mb", procStatus("VmRSS")/1024)
	value("threads", procStatus("Threads"))
	value("goroutines", float64(runtime.NumGoroutine()))
	for _, k := range sortedKeys(f.figures) {
		value(k, f.figures[k])
	}
	f.log("phase %s: %.1fs, %.0f counted calls (%.2f per node per renew interval), osd ops %v → %v, cpu %.2f cores",
		name, secs, total, total/float64(f.p.nodes)/intervals, before.osd["op"], after.osd["op"], (after.cpu-before.cpu).Seconds()/secs)
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func (f *fleet) emit(l fleetLine) {
	b, err := json.Marshal(l)
	if err != nil {
		f.t.Fatal(err)
	}
	if _, err := fmt.Fprintln(f.out, string(b)); err != nil {
		f.t.Fatal(err)
	}
}
