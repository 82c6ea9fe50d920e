package daemon

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/claim/memory"
	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/internal/agenttest"
)

// TestRenewalCostsOneWritePerPool: a renew interval's work (the heartbeats and the round of
// claim checks) of a node holding 64 claims in one pool and 4 in another costs one heartbeat
// write and one notice read per pool, and no claim read once each claim was read (a claim
// taken over announces itself by a notice; the slow check reads each once per
// claim_check_interval): O(places), not O(volumes). The heartbeat is written against the
// version this node wrote last, without a read.
func TestRenewalCostsOneWritePerPool(t *testing.T) {
	m := memory.New("00000000-0000-4000-8000-000000000005")
	d, _ := roundDaemon(t, m, 68, 64)
	// one renew interval's work: each place's heartbeat once, and the round of claim checks
	hb := d.renewer.heartbeatsOf(d.clusters["c1"])
	round := func() map[string]int {
		m.Counts(true)
		for p := range d.renewer.held("c1") {
			hb.beat(context.Background(), p)
		}
		d.renewer.round(context.Background(), d.clusters["c1"])
		return m.Counts(true)
	}
	if first := round(); first["read claim"] != 68 {
		t.Fatalf("the first round read %d claims, want each once (68): %v", first["read claim"], first)
	}
	for i := range 3 {
		got := round()
		t.Logf("renewal round %d, 68 claims in 2 pools: %v", i+2, got)
		want := map[string]int{"write heartbeat": 2, "readkeys notice": 2}
		if !maps.Equal(got, want) {
			t.Fatalf("renewal round %d did %v, want %v (a heartbeat write and a notice read per pool, no claim read)", i+2, got, want)
		}
	}
	for _, p := range d.Status().Problems {
		t.Errorf("problem after the rounds: %s", p)
	}
}

// roundDaemon is a daemon on m and a fake kernel that does not run its loops (the test runs its
// rounds), on a monotonic clock of the test's, with n images mapped: v00 and on, the first
// inPool in pool rbd, the others in pool other. The defaults: 60 s lease, 20 s renewals, claims
// checked slowly every hour.
func roundDaemon(t *testing.T, m *memory.Memory, n, inPool int) (*Daemon, *monoClock) {
	t.Helper()
	return roundDaemonAs(t, m, "node-c", n, inPool)
}

// roundDaemonAs is roundDaemon with node id id.
func roundDaemonAs(t *testing.T, m *memory.Memory, id string, n, inPool int) (*Daemon, *monoClock) {
	t.Helper()
	env := agenttest.NewEnv(t, agenttest.Memory(&memCluster{ID: "c1", Pool: "rbd", M: m}), agenttest.Node(id), agenttest.Renew(20*time.Second))
	env.Poll, env.Watchdog = 5*time.Millisecond, 0
	mono := &monoClock{}
	nd := envNode(env, func(o *Options) {
		o.Config.LeaseDuration = config.Duration(60 * time.Second)
		o.Mono = mono.Now
	})
	nd.start()
	d, k := nd.d, nd.kernel
	for i := range n {
		pool := "rbd"
		if i >= inPool {
			pool = "other"
		}
		name := fmt.Sprintf("v%02d", i)
		m.AddImage(claim.Image{Pool: pool, Image: name}, "id-"+name)
		k.AddImage(pool, "", name, 1<<20)
		if _, err := d.Map(context.Background(), api.MapRequest{Cluster: "c1", Pool: pool, Image: name}, nil); err != nil {
			t.Fatal(err)
		}
	}
	return d, mono
}

// otherNode is a claim store of another node on m, fencing and releasing as an admin there does.
func otherNode(t *testing.T, m *memory.Memory) *claim.Store {
	t.Helper()
	s, err := claim.NewStoreOn(m, claim.Config{Node: claim.Node{ID: "node-x"}, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestALostClaimIsSeenAtTheNextRoundThroughItsNotice: an admin on another node fences one of
// this node's 16 claims; the very next renewal round reads that claim alone, reports it lost,
// and clears the notice; the round after reads no claim but the lost one (watched every round).
func TestALostClaimIsSeenAtTheNextRoundThroughItsNotice(t *testing.T) {
	m := memory.New("00000000-0000-4000-8000-000000000006")
	d, mono := roundDaemon(t, m, 16, 16)
	cl := d.clusters["c1"]
	d.renewer.round(context.Background(), cl) // the first round reads every claim once
	mono.Advance(20 * time.Second)
	if _, err := otherNode(t, m).Fence(context.Background(), claim.Image{Pool: "rbd", Image: "v07"}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	read := map[string]bool{}
	m.SetHook(func(_ context.Context, call string, img claim.Image) error {
		if call == "read" && img.Image != "" {
			mu.Lock()
			read[img.Image] = true
			mu.Unlock()
		}
		return nil
	})
	d.renewer.round(context.Background(), cl)
	if !maps.Equal(read, map[string]bool{"v07": true}) {
		t.Fatalf("the round after the fence read the claims of %v, want v07's alone (its notice names it)", read)
	}
	lost := 0
	for _, p := range d.Status().Problems {
		if strings.Contains(p, "rbd/v07") && strings.Contains(p, "lost") {
			lost++
		} else {
			t.Errorf("unexpected problem: %s", p)
		}
	}
	if lost != 1 {
		t.Fatalf("rbd/v07 is not reported lost after one round: %v", d.Status().Problems)
	}
	if ns, _, _ := m.ReadKeys(context.Background(), claim.Image{Pool: "rbd"}, claim.NoticePrefix+"node-c", nil); len(ns) != 0 {
		t.Fatalf("notices left after they were handled: %v", ns)
	}
	clear(read)
	mono.Advance(20 * time.Second)
	d.renewer.round(context.Background(), cl)
	if !maps.Equal(read, map[string]bool{"v07": true}) {
		t.Fatalf("the next round read the claims of %v, want the lost claim's alone", read)
	}
}

// TestAClaimRemovedByHandIsFoundByTheSlowCheck: a claim object removed with `rados rm` sends no
// notice; it is found at its slow check, within claim_check_interval, and every claim is read
// once in that interval, spread over the rounds.
func TestAClaimRemovedByHandIsFoundByTheSlowCheck(t *testing.T) {
	m := memory.New("00000000-0000-4000-8000-000000000007")
	d, mono := roundDaemon(t, m, 16, 16)
	cl := d.clusters["c1"]
	d.renewer.round(context.Background(), cl)
	m.Remove(claim.Image{Pool: "rbd"}, claim.ObjectPrefix+"v03")
	m.Counts(true)
	reads, found := 0, time.Duration(0)
	for at := 20 * time.Second; at <= time.Hour+20*time.Second; at += 20 * time.Second {
		mono.Advance(20 * time.Second)
		d.renewer.round(context.Background(), cl)
		if found == 0 && slices.ContainsFunc(d.Status().Problems, func(p string) bool { return strings.Contains(p, "rbd/v03") }) {
			found = at
		}
		if found == 0 {
			reads += m.Counts(true)["read claim"]
		}
	}
	if found == 0 || found > time.Hour {
		t.Fatalf("the removed claim was not found within claim_check_interval (found at %s): %v", found, d.Status().Problems)
	}
	if found < 45*time.Minute {
		t.Fatalf("found at %s: the slow check came early (a read per claim per round?)", found)
	}
	if reads > 16 {
		t.Fatalf("%d claim reads before the slow check found it, want at most one per claim", reads)
	}
}

// TestSlowCheckReportsUnexplainedWatchers: a client that maps or opens a held image outside
// rbd-owner (from any node: an rbd-nbd or librbd client) is seen at the claim's slow check,
// counted in rbd_owner_unexplained_watchers_total and logged at warning priority naming its
// address; the rounds between slow checks read no image.
func TestSlowCheckReportsUnexplainedWatchers(t *testing.T) {
	m := memory.New("00000000-0000-4000-8000-000000000027")
	d, mono := roundDaemon(t, m, 2, 2)
	hook := &logtest{}
	d.log.AddHook(hook)
	d.log.SetLevel(logrus.WarnLevel)
	rec, err := otherNode(t, m).Inspect(context.Background(), claim.Image{Pool: "rbd", Image: "v00"})
	if err != nil {
		t.Fatal(err)
	}
	m.SetWatchers(claim.Image{Pool: "rbd", Image: "v00"}, rec.Holders[0].ClientAddr, "198.51.100.7:0/99")
	counted := func() float64 {
		fams, err := d.metrics.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			if f.GetName() == "rbd_owner_unexplained_watchers_total" {
				return f.GetMetric()[0].GetCounter().GetValue()
			}
		}
		return -1
	}
	d.renewer.round(context.Background(), d.clusters["c1"]) // the first round: every claim's slow check
	if n := counted(); n != 1 {
		t.Fatalf("unexplained_watchers_total %v after the slow check, want 1", n)
	}
	if msgs := hook.messages(); len(msgs) != 1 || !strings.Contains(msgs[0], "rbd/v00, which this node holds, has watchers no claim explains: 198.51.100.7:0/99") {
		t.Fatalf("warnings: %q", msgs)
	}
	m.Counts(true)
	mono.Advance(20 * time.Second)
	d.renewer.round(context.Background(), d.clusters["c1"])
	if got := m.Counts(true); got["image"] != 0 || counted() != 1 {
		t.Fatalf("a round between slow checks read the image: %v", got)
	}
}

// logtest keeps the messages of warnings logged.
type logtest struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logtest) Levels() []logrus.Level { return []logrus.Level{logrus.WarnLevel} }
func (l *logtest) Fire(e *logrus.Entry) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, e.Message)
	return nil
}
func (l *logtest) messages() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.msgs...)
}
