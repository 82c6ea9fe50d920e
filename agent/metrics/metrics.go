// Package metrics is the agent's Prometheus instrumentation: the collectors, on a registry of
// their own, that the daemon updates where things happen (a map, a refusal, a takeover, a
// heartbeat) and the gauges it computes at scrape time from what the daemon holds now (claims
// by state, unmanaged devices, cluster connections, how long this node's liveness went
// unwritten). Every name has the rbd_owner_ prefix; labels are bounded (a cluster id from the
// config, an error code from the contract, a fixed word), except the per-image gauge that the
// config key per_image_metrics turns on.
//
// Errors are labelled with the contract's code for their kind (api.CodeOf(fault.KindOf(err))),
// the one classification the API and the CLI use too; success is "ok".
package metrics

import (
	"net/http"
	"runtime"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/fault"
)

const ns = "rbd_owner"

// The values of the claims gauge's state label.
const (
	StateHeld     = "held"
	StateLost     = "lost"
	StateClaiming = "claiming"
)

// The values of the unmanaged devices gauge's verdict label.
const (
	VerdictFenced   = "fenced"
	VerdictReported = "reported"
)

// The causes of rbd_owner_fences_total.
const (
	CauseTakeover = "takeover" // a map took an image over and fenced its holder's mapping
	CauseAdmin    = "admin"    // rbd-owner fence
	CauseOwnLost  = "own_lost" // this node re-blocklisted its own mapping of a claim it lost
)

// ResultOK is the result label of a success.
const ResultOK = "ok"

// unknownLabel is the cluster label of a request naming no configured cluster.
const unknownLabel = "unknown"

const (
	labelCluster = "cluster"
	labelResult  = "result"
	labelReason  = "reason"
	labelCause   = "cause"
	labelState   = "state"
	labelVerdict = "verdict"
	labelVersion = "version"
	labelGo      = "goversion"
)

// Snapshot is what the daemon holds at one moment, read at every scrape.
type Snapshot struct {
	Clusters  []Cluster
	Claims    []Claim
	Unmanaged []Unmanaged
	// Fences are the live fences (blocklist entries whose mappings may still exist) of the
	// claims this node keeps, as it last saw them.
	Fences []Fence
	// StateWriteFailing: the last write of the state file failed.
	StateWriteFailing bool
}

// Fence is one live fence a claim records, and when its blocklist entry expires.
type Fence struct {
	Cluster string
	Expires time.Time
}

// Cluster is one configured cluster.
type Cluster struct {
	ID        string
	Connected bool
	// Places are the pools (and namespaces: "pool/ns") where this node holds claims now, so
	// where its liveness record must be kept written.
	Places []string
	// PriorKeyMappings are this node's mappings made with a key the keyring no longer holds.
	PriorKeyMappings int
}

// Claim is one claim this node has, in one of the states held, lost, claiming.
type Claim struct {
	Cluster, Pool, Namespace, Image, Device, State string
}

// Unmanaged is a device mapped outside rbd-owner, with its verdict (fenced or reported).
type Unmanaged struct {
	Cluster, Verdict string
}

// Options configure New.
type Options struct {
	Version string
	// PerImage adds rbd_owner_claim_info, one series per claim (an unbounded label set).
	PerImage bool
	// Lease and Renew are the config's lease_duration and renew_interval, exported so that
	// alert rules can be written against them.
	Lease, Renew time.Duration
	// HeartbeatGap is the longest a healthy node's heartbeat may take to land after the one
	// before (config.HeartbeatGapBound), exported for the renewal alert.
	HeartbeatGap time.Duration
	// Clusters are the configured clusters' ids: their counters start at 0 (so that a rule's
	// increase() sees the first event too).
	Clusters []string
	// Snapshot is called at every scrape (and by LivenessAges).
	Snapshot func() Snapshot
	// Now is the clock of the liveness ages (tests); default time.Now.
	Now func() time.Time
	// FenceWarn: a live fence whose entry expires within it is counted in
	// rbd_owner_fences_expiring (default a day).
	FenceWarn time.Duration
}

// Metrics holds the collectors, registered on a registry of their own.
type Metrics struct {
	reg      *prometheus.Registry
	handler  http.Handler
	snapshot func() Snapshot
	perImage bool
	now      func() time.Time
	warn     time.Duration

	mapSeconds, unmapSeconds *prometheus.HistogramVec
	maps, unmaps, refusals   *prometheus.CounterVec
	takeovers, fences        *prometheus.CounterVec
	intruders, adoptions     *prometheus.CounterVec
	watchers                 *prometheus.CounterVec
	liveness, claimsLost     *prometheus.CounterVec
	devicesLost              *prometheus.CounterVec
	fenceRenewals            *prometheus.CounterVec
	fenceFaults              *prometheus.CounterVec
	clusterOps               *prometheus.CounterVec
	recovery                 prometheus.Gauge
	stateSetAside            prometheus.Counter
	stateWriteFailures       prometheus.Counter
	stateRebuilt             *prometheus.GaugeVec

	mu        sync.Mutex
	lastWrite map[[2]string]time.Time // cluster, place → last successful liveness write
	needed    map[[2]string]time.Time // cluster, place → since when this node holds claims there
}

// latency buckets of a map or an unmap: from a fast idempotent answer to a map_timeout
var latencyBuckets = []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}

// New makes the collectors and registers them, with Go's and the process's, on a new registry.
func New(o Options) *Metrics {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Snapshot == nil {
		o.Snapshot = func() Snapshot { return Snapshot{} }
	}
	if o.FenceWarn <= 0 {
		o.FenceWarn = 24 * time.Hour
	}
	m := &Metrics{reg: prometheus.NewRegistry(), snapshot: o.Snapshot, perImage: o.PerImage, now: o.Now, warn: o.FenceWarn,
		lastWrite: map[[2]string]time.Time{}, needed: map[[2]string]time.Time{}}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: name, Help: help}, labels)
	}
	m.mapSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "map_duration_seconds",
		Help: "How long map requests took, refusals and failures included.", Buckets: latencyBuckets}, []string{labelCluster})
	m.unmapSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "unmap_duration_seconds",
		Help: "How long unmap requests took, failures included.", Buckets: latencyBuckets}, []string{labelCluster})
	m.maps = counter("maps_total", "Map requests by result: ok, or the error code (claimed_elsewhere, busy, ...).", labelCluster, labelResult)
	m.unmaps = counter("unmaps_total", "Unmap requests by result: ok, or the error code.", labelCluster, labelResult)
	m.refusals = counter("map_refusals_total", "Maps refused before anything was mapped, by reason (the error code).", labelCluster, labelReason)
	m.takeovers = counter("takeovers_total", "Images this node took over from another node (after fencing its mapping).", labelCluster)
	m.fences = counter("fences_total", "Mappings of claim holders blocklisted by this agent, by cause: takeover, admin (rbd-owner fence), own_lost (this node's own mapping of a claim it lost).", labelCluster, labelCause)
	m.intruders = counter("intruders_fenced_total", "Mappings made outside rbd-owner of an image held elsewhere that this agent blocklisted.", labelCluster)
	m.watchers = counter("unexplained_watchers_total", "Watchers of an image this node holds that no holder's mapping explains (another client mapping or opening it outside rbd-owner, from anywhere), counted at each slow claim check (claim_check_interval) that finds them.", labelCluster)
	m.adoptions = counter("adoptions_total", "Mappings made outside rbd-owner that this agent adopted (claimed and manages).", labelCluster)
	m.liveness = counter("liveness_writes_total", "Writes of this node's liveness record (heartbeats), by result: ok, or the error code.", labelCluster, labelResult)
	m.claimsLost = counter("claims_lost_total", "Claims this node found it no longer holds (taken over or fenced); their devices are left in place.", labelCluster)
	m.devicesLost = counter("device_lost_total", "Managed devices that were unmapped outside rbd-owner (device_lost); their claims are released.", labelCluster)
	m.fenceFaults = counter("fence_faults_total", "Live fences whose blocklist entries were found not as their claim records said, by kind (missing: not listed; short: listed with less life) and outcome (repaired, or not).", labelCluster, "kind", "outcome")
	m.fenceRenewals = counter("fence_renewals_total", "Re-blocklistings of live fences (claims' fences and intruders whose mappings may still exist) before they expire, by result: ok, or the error code.", labelCluster, labelResult)
	m.clusterOps = counter("cluster_ops_total", "RADOS operations this agent sent, by operation (read, write, remove, readkeys, setkeys, removekeys, objects, namespaces, image, imageid, blocklist, unblocklist) and the kind of object (claim, heartbeat, index, notice, image, none): what its claims cost the cluster.", labelCluster, "op", "object")
	m.recovery = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "recovery_duration_seconds",
		Help: "How long the recovery at the agent's start took."})
	m.stateSetAside = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "state_set_aside_total",
		Help: "State files the agent could not use at start (cut short, not JSON, another format), kept as mappings.json.corrupt-<time>; the agent then rebuilt its state from the kernel and the clusters."})
	m.stateWriteFailures = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "state_write_failures_total",
		Help: "Writes of the state file that failed (a full disk, a read-only file system); maps and unmaps are refused while they fail."})
	m.stateRebuilt = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "state_rebuilt_devices",
		Help: "After a state file was set aside at start: the rbd devices found in the kernel, by outcome: adopted (back under the agent, its claim names it), not_adopted (reported, fenced, or not checked yet)."}, []string{"outcome"})
	build := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "build_info", Help: "The agent's version; always 1.",
		ConstLabels: prometheus.Labels{labelVersion: o.Version, labelGo: runtime.Version()}})
	build.Set(1)
	lease := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "lease_duration_seconds", Help: "The config's lease_duration."})
	lease.Set(o.Lease.Seconds())
	renew := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "renew_interval_seconds", Help: "The config's renew_interval."})
	renew.Set(o.Renew.Seconds())
	gap := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "heartbeat_gap_bound_seconds",
		Help: "The longest a heartbeat may take to land after the one before on a healthy cluster: renew_interval, then the heartbeat's deadline or an OSD failover (osd_failover). lease_duration exceeds it."})
	gap.Set(o.HeartbeatGap.Seconds())
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.mapSeconds, m.unmapSeconds, m.maps, m.unmaps, m.refusals, m.takeovers, m.fences, m.intruders, m.watchers, m.adoptions,
		m.liveness, m.claimsLost, m.devicesLost, m.fenceRenewals, m.fenceFaults, m.clusterOps, m.recovery, build, lease, renew, gap,
		m.stateSetAside, m.stateWriteFailures, m.stateRebuilt,
		stateCollector{m},
	)
	for _, c := range o.Clusters {
		for _, v := range []*prometheus.CounterVec{m.takeovers, m.intruders, m.watchers, m.adoptions, m.claimsLost, m.devicesLost} {
			v.WithLabelValues(c)
		}
		for _, cause := range []string{CauseTakeover, CauseAdmin, CauseOwnLost} {
			m.fences.WithLabelValues(c, cause)
		}
		m.liveness.WithLabelValues(c, ResultOK)
		m.fenceRenewals.WithLabelValues(c, ResultOK)
		for _, kind := range []string{"missing", "short"} {
			for _, outcome := range []string{"repaired", "not_repaired"} {
				m.fenceFaults.WithLabelValues(c, kind, outcome) // 0 from the start: increase() sees the first
			}
		}
		m.maps.WithLabelValues(c, ResultOK)
		m.unmaps.WithLabelValues(c, ResultOK)
	}
	m.handler = promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
	return m
}

// Registry is the registry the collectors are on.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the metrics in the Prometheus exposition formats.
func (m *Metrics) Handler() http.Handler { return m.handler }

// Result is the result label of an outcome: ok, or the contract's code of the error's kind.
func Result(err error) string {
	if err == nil {
		return ResultOK
	}
	return api.CodeOf(fault.KindOf(err))
}

func cl(cluster string) string {
	if cluster == "" {
		return unknownLabel
	}
	return cluster
}

// Map records a map request that started at start and ended with err.
func (m *Metrics) Map(cluster string, start time.Time, err error) {
	if m == nil {
		return
	}
	m.mapSeconds.WithLabelValues(cl(cluster)).Observe(time.Since(start).Seconds())
	m.maps.WithLabelValues(cl(cluster), Result(err)).Inc()
}

// Unmap records an unmap request that started at start and ended with err.
func (m *Metrics) Unmap(cluster string, start time.Time, err error) {
	if m == nil {
		return
	}
	m.unmapSeconds.WithLabelValues(cl(cluster)).Observe(time.Since(start).Seconds())
	m.unmaps.WithLabelValues(cl(cluster), Result(err)).Inc()
}

// Refused records a refused map.
func (m *Metrics) Refused(cluster string, err error) {
	if m == nil || err == nil {
		return
	}
	m.refusals.WithLabelValues(cl(cluster), Result(err)).Inc()
}

// Takeover records a map that took an image over, fencing fenced holders' mappings.
func (m *Metrics) Takeover(cluster string, fenced int) {
	if m == nil || fenced == 0 {
		return
	}
	m.takeovers.WithLabelValues(cl(cluster)).Inc()
	m.fences.WithLabelValues(cl(cluster), CauseTakeover).Add(float64(fenced))
}

// Fenced records a fence of a holder's mapping for cause (CauseAdmin, CauseOwnLost).
func (m *Metrics) Fenced(cluster, cause string) {
	if m == nil {
		return
	}
	m.fences.WithLabelValues(cl(cluster), cause).Inc()
}

// IntruderFenced records a mapping made outside rbd-owner that was blocklisted.
func (m *Metrics) IntruderFenced(cluster string) {
	if m == nil {
		return
	}
	m.intruders.WithLabelValues(cl(cluster)).Inc()
}

// UnexplainedWatchers records watchers of a held image that no holder explains.
func (m *Metrics) UnexplainedWatchers(cluster string, n int) {
	if m == nil {
		return
	}
	m.watchers.WithLabelValues(cl(cluster)).Add(float64(n))
}

// Adopted records a mapping made outside rbd-owner that was adopted.
func (m *Metrics) Adopted(cluster string) {
	if m == nil {
		return
	}
	m.adoptions.WithLabelValues(cl(cluster)).Inc()
}

// ClaimLost records a claim found lost.
func (m *Metrics) ClaimLost(cluster string) {
	if m == nil {
		return
	}
	m.claimsLost.WithLabelValues(cl(cluster)).Inc()
}

// DeviceLost records a managed device unmapped outside rbd-owner.
func (m *Metrics) DeviceLost(cluster string) {
	if m == nil {
		return
	}
	m.devicesLost.WithLabelValues(cl(cluster)).Inc()
}

// Liveness records a write of this node's liveness record in place ("pool" or "pool/ns").
func (m *Metrics) Liveness(cluster, place string, err error) {
	if m == nil {
		return
	}
	m.liveness.WithLabelValues(cl(cluster), Result(err)).Inc()
	if err == nil {
		m.mu.Lock()
		m.lastWrite[[2]string{cluster, place}] = m.now()
		m.mu.Unlock()
	}
}

// FenceRenewed records one re-blocklisting of a live fence (err: it failed).
func (m *Metrics) FenceRenewed(cluster string, err error) {
	if m == nil {
		return
	}
	m.fenceRenewals.WithLabelValues(cl(cluster), Result(err)).Inc()
}

// FenceFault records a live fence's entry found missing or short (kind), repaired or not.
func (m *Metrics) FenceFault(cluster, kind string, repaired bool) {
	if m == nil {
		return
	}
	outcome := "repaired"
	if !repaired {
		outcome = "not_repaired"
	}
	m.fenceFaults.WithLabelValues(cl(cluster), kind, outcome).Inc()
}

// ClusterOp records one RADOS operation of the agent: op on an object of kind object.
func (m *Metrics) ClusterOp(cluster, op, object string) {
	if m == nil {
		return
	}
	m.clusterOps.WithLabelValues(cl(cluster), op, object).Inc()
}

// StateSetAside records a state file set aside at start.
func (m *Metrics) StateSetAside() {
	if m == nil {
		return
	}
	m.stateSetAside.Inc()
}

// StateWriteFailed records a failed write of the state file.
func (m *Metrics) StateWriteFailed() {
	if m == nil {
		return
	}
	m.stateWriteFailures.Inc()
}

// StateRebuilt records what the rebuild after a set-aside state found: devices adopted back,
// and devices not adopted.
func (m *Metrics) StateRebuilt(adopted, notAdopted int) {
	if m == nil {
		return
	}
	m.stateRebuilt.WithLabelValues("adopted").Set(float64(adopted))
	m.stateRebuilt.WithLabelValues("not_adopted").Set(float64(notAdopted))
}

// Recovered records how long the recovery at start took.
func (m *Metrics) Recovered(took time.Duration) {
	if m == nil {
		return
	}
	m.recovery.Set(took.Seconds())
}

// LivenessAges is, for each cluster where this node holds claims, how long the stalest of its
// liveness records there has gone without a successful write (counted at the earliest from
// when it first held a claim in that place). Clusters where it holds none are absent.
func (m *Metrics) LivenessAges() map[string]time.Duration {
	if m == nil {
		return nil
	}
	return m.ages(m.snapshot())
}

func (m *Metrics) ages(s Snapshot) map[string]time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	out := map[string]time.Duration{}
	want := map[[2]string]bool{}
	for _, c := range s.Clusters {
		for _, p := range c.Places {
			k := [2]string{c.ID, p}
			want[k] = true
			since, ok := m.needed[k]
			if !ok {
				since = now
				m.needed[k] = since
			}
			if w := m.lastWrite[k]; w.After(since) {
				since = w
			}
			if age := now.Sub(since); age > out[c.ID] || !hasKey(out, c.ID) {
				out[c.ID] = max(age, 0)
			}
		}
	}
	for k := range m.needed {
		if !want[k] {
			delete(m.needed, k)
			delete(m.lastWrite, k)
		}
	}
	return out
}

func hasKey(m map[string]time.Duration, k string) bool { _, ok := m[k]; return ok }

// stateCollector computes the gauges of what the daemon holds at scrape time.
type stateCollector struct{ m *Metrics }

var (
	descClaims = prometheus.NewDesc(ns+"_claims", "Claims this node has, by state: held, lost (taken over or fenced, device left in place), claiming (a map under way).",
		[]string{labelCluster, labelState}, nil)
	descUnmanaged = prometheus.NewDesc(ns+"_unmanaged_devices", "Devices mapped on this node outside rbd-owner, by verdict: fenced, reported.",
		[]string{labelCluster, labelVerdict}, nil)
	descConnected = prometheus.NewDesc(ns+"_cluster_connected", "1 when the agent has a connection to the cluster, else 0.",
		[]string{labelCluster}, nil)
	descLivenessAge = prometheus.NewDesc(ns+"_liveness_write_age_seconds", "Seconds since this node's liveness record was last written, in the stalest pool of the cluster where it holds claims (absent when it holds none there).",
		[]string{labelCluster}, nil)
	descExpiring = prometheus.NewDesc(ns+"_fences_expiring", "Live fences (their mappings may still exist) of the claims this node keeps whose blocklist entries expire within a day (or a quarter of fence_expiry, if less): their renewals are failing.",
		[]string{labelCluster}, nil)
	descClaimInfo = prometheus.NewDesc(ns+"_claim_info", "One series per claim this node has (only with per_image_metrics: true).",
		[]string{labelCluster, "pool", "namespace", "image", "device", labelState}, nil)
	descPriorKey = prometheus.NewDesc(ns+"_prior_key_mappings", "This node's mappings of the cluster made with a key its keyring no longer holds (a rotation's prior key): the prior key can be dropped once this is 0 on every node.",
		[]string{labelCluster}, nil)
	descStateFailing = prometheus.NewDesc(ns+"_state_write_failing", "1 while the last write of the state file failed (maps and unmaps are refused), else 0.", nil, nil)
)

func (c stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descClaims, descUnmanaged, descConnected, descLivenessAge, descExpiring, descClaimInfo, descStateFailing, descPriorKey} {
		ch <- d
	}
}

func (c stateCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.m.snapshot()
	ch <- prometheus.MustNewConstMetric(descStateFailing, prometheus.GaugeValue, b2f(s.StateWriteFailing))
	claims := map[[2]string]int{}
	unmanaged := map[[2]string]int{}
	for _, k := range s.Clusters {
		for _, st := range []string{StateHeld, StateLost, StateClaiming} {
			claims[[2]string{k.ID, st}] = 0
		}
		for _, v := range []string{VerdictFenced, VerdictReported} {
			unmanaged[[2]string{k.ID, v}] = 0
		}
		ch <- prometheus.MustNewConstMetric(descConnected, prometheus.GaugeValue, b2f(k.Connected), k.ID)
		ch <- prometheus.MustNewConstMetric(descPriorKey, prometheus.GaugeValue, float64(k.PriorKeyMappings), k.ID)
	}
	for _, x := range s.Claims {
		claims[[2]string{x.Cluster, x.State}]++
		if c.m.perImage {
			ch <- prometheus.MustNewConstMetric(descClaimInfo, prometheus.GaugeValue, 1, x.Cluster, x.Pool, x.Namespace, x.Image, x.Device, x.State)
		}
	}
	for _, u := range s.Unmanaged {
		unmanaged[[2]string{cl(u.Cluster), u.Verdict}]++
	}
	expiring := map[string]int{}
	for _, k := range s.Clusters {
		expiring[k.ID] = 0
	}
	now := c.m.now()
	for _, f := range s.Fences {
		if f.Expires.Sub(now) < c.m.warn {
			expiring[cl(f.Cluster)]++
		}
	}
	for id, n := range expiring {
		ch <- prometheus.MustNewConstMetric(descExpiring, prometheus.GaugeValue, float64(n), id)
	}
	for _, k := range sortedKeys(claims) {
		ch <- prometheus.MustNewConstMetric(descClaims, prometheus.GaugeValue, float64(claims[k]), k[0], k[1])
	}
	for _, k := range sortedKeys(unmanaged) {
		ch <- prometheus.MustNewConstMetric(descUnmanaged, prometheus.GaugeValue, float64(unmanaged[k]), k[0], k[1])
	}
	for id, age := range c.m.ages(s) {
		ch <- prometheus.MustNewConstMetric(descLivenessAge, prometheus.GaugeValue, age.Seconds(), id)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func sortedKeys(m map[[2]string]int) [][2]string {
	out := make([][2]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i][0] < out[j][0] || (out[i][0] == out[j][0] && out[i][1] < out[j][1]) })
	return out
}
