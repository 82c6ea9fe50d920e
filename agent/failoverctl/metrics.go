package failoverctl

import (
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	"github.com/rbd-owner/rbd-owner/agent/failover"
)

// Metrics are the controller's Prometheus metrics. A nil *Metrics counts nothing.
type Metrics struct {
	decisions *prometheus.CounterVec
	failures  *prometheus.CounterVec
	refusals  *prometheus.CounterVec
	nodes     *prometheus.GaugeVec
}

// NewMetrics registers the controller's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rbd_owner_failover_decisions_total",
			Help: "Decisions taken on nodes, by step (wait, refuse, declare, fence, advance, move, lift, stuck), one per node per round."}, []string{"step"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rbd_owner_failover_step_failures_total",
			Help: "Steps that failed and are tried again at the next round, by step."}, []string{"step"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rbd_owner_failover_refusals_total",
			Help: "Failovers not done, by reason: limit (too many nodes dead within the window), api_unreadable (the API server could not be read)."}, []string{"reason"}),
		nodes: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "rbd_owner_failover_nodes",
			Help: "Nodes in a failover, by phase (fencing, fenced, moved)."}, []string{"phase"}),
	}
	reg.MustRegister(m.decisions, m.failures, m.refusals, m.nodes)
	return m
}

func (m *Metrics) decided(s failover.Step) {
	if m != nil {
		m.decisions.WithLabelValues(s.String()).Inc()
	}
}

func (m *Metrics) failed(s failover.Step) {
	if m != nil {
		m.failures.WithLabelValues(s.String()).Inc()
	}
}

func (m *Metrics) refused(reason string) {
	if m != nil {
		m.refusals.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) phases(nodes []corev1.Node) {
	if m == nil {
		return
	}
	count := map[failover.Phase]float64{failover.PhaseFencing: 0, failover.PhaseFenced: 0, failover.PhaseMoved: 0}
	for i := range nodes {
		if st, err := stateOf(&nodes[i]); err == nil && st.Phase != failover.PhaseNone {
			count[st.Phase]++
		}
	}
	for p, v := range count {
		m.nodes.WithLabelValues(string(p)).Set(v)
	}
}
