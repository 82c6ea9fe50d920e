package metrics

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rbd-owner/rbd-owner/agent/fault"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time          { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) advance(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// The liveness age runs from the later of the last write and the moment claims were first
// held in a place, is the stalest place's, and is absent where no claim is held.
func TestLivenessAges(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	var places []string
	m := New(Options{Now: clk.now, Snapshot: func() Snapshot {
		return Snapshot{Clusters: []Cluster{{ID: "c1", Places: places}, {ID: "c2"}}}
	}})
	if a := m.LivenessAges(); len(a) != 0 {
		t.Fatalf("ages without claims: %v", a)
	}
	places = []string{"rbd", "rbd/ns"}
	if a := m.LivenessAges(); a["c1"] != 0 || len(a) != 1 {
		t.Fatalf("ages when claims are first held: %v", a)
	}
	clk.advance(10 * time.Second)
	m.Liveness("c1", "rbd", nil)
	m.Liveness("c1", "rbd/ns", errors.New("boom"))
	clk.advance(5 * time.Second)
	if a := m.LivenessAges(); a["c1"] != 15*time.Second {
		t.Fatalf("the stalest place (rbd/ns, never written) is 15s old: %v", a)
	}
	m.Liveness("c1", "rbd/ns", nil)
	clk.advance(time.Second)
	if a := m.LivenessAges(); a["c1"] != 6*time.Second {
		t.Fatalf("rbd written 6s ago, rbd/ns 1s ago: %v", a)
	}
	places = nil
	if a := m.LivenessAges(); len(a) != 0 {
		t.Fatalf("ages once no claim is held: %v", a)
	}
	if got := testutil.ToFloat64(m.liveness.WithLabelValues("c1", "internal")); got != 1 {
		t.Fatalf("failed liveness writes: %v", got)
	}
	if got := testutil.ToFloat64(m.liveness.WithLabelValues("c1", ResultOK)); got != 2 {
		t.Fatalf("liveness writes: %v", got)
	}
}

// Results are the contract's codes of the error kinds.
func TestResult(t *testing.T) {
	for err, want := range map[error]string{
		nil:                                   "ok",
		fmt.Errorf("x: %w", fault.ErrBusy):    "busy",
		fault.ErrClaimedElsewhere:             "claimed_elsewhere",
		fault.ErrUnavailable:                  "cluster_unavailable",
		errors.New("unclassified"):            "internal",
		fmt.Errorf("y: %w", fault.ErrInvalid): "invalid_argument",
	} {
		if got := Result(err); got != want {
			t.Errorf("Result(%v) = %q, want %q", err, got, want)
		}
	}
}

// A nil *Metrics is a no-op, and every collector passes the registry's lint.
func TestNilAndLint(t *testing.T) {
	var none *Metrics
	none.Map("c", time.Now(), nil)
	none.Liveness("c", "p", nil)
	m := New(Options{Version: "1.2.3", Lease: time.Minute, Renew: 20 * time.Second})
	problems, err := testutil.GatherAndLint(m.Registry())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "rbd_owner") {
			t.Errorf("lint: %s: %s", p.Metric, p.Text)
		}
	}
}

// Every metric the shipped alert rules use is one the agent exports, with the labels the rules
// match on: a rule on a renamed or missing metric would never fire.
func TestShippedRulesUseExportedMetrics(t *testing.T) {
	rules, err := os.ReadFile("../../packaging/prometheus/rbd-owner-rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, n := range regexp.MustCompile(`rbd_owner_[a-z_]+`).FindAllString(string(rules), -1) {
		used[n] = true
	}
	clk := &clock{t: time.Unix(1000, 0)}
	m := New(Options{Version: "1", Lease: time.Minute, Renew: 10 * time.Second, HeartbeatGap: 40 * time.Second, Clusters: []string{"c1"}, Now: clk.now,
		Snapshot: func() Snapshot {
			return Snapshot{Clusters: []Cluster{{ID: "c1", Connected: true, Places: []string{"rbd"}}},
				Claims:    []Claim{{Cluster: "c1", Pool: "rbd", Image: "i", Device: "/dev/rbd0", State: "held"}},
				Unmanaged: []Unmanaged{{Cluster: "c1", Verdict: "fenced"}},
				Fences:    []Fence{{Cluster: "c1", Expires: clk.now().Add(time.Hour)}}}
		}})
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, f := range families {
		exported[f.GetName()] = true
		for _, s := range []string{"_bucket", "_sum", "_count"} {
			exported[f.GetName()+s] = true
		}
	}
	if len(used) < 5 {
		t.Fatalf("the rules name only %d metrics: %v", len(used), used)
	}
	for n := range used {
		if !exported[n] {
			t.Errorf("the alert rules use %s, which the agent does not export", n)
		}
	}
}
