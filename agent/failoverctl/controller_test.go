package failoverctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	logtest "github.com/sirupsen/logrus/hooks/test"
	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	kevents "k8s.io/client-go/tools/record"

	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/claim/memory"
	"github.com/rbd-owner/rbd-owner/agent/failover"
)

// scene: node-a holds rbd/vol1 (mapped, client 10.0.0.1:0/111) for pod app-0 through PV pv1;
// node-b is idle. One clock for everything; the controller's monotonic clock is its own.
type scene struct {
	t      *testing.T
	m      *memory.Memory
	a      *claim.Store
	kube   *fake.Clientset
	c      *Controller
	mono   time.Duration
	wall   time.Time
	events *kevents.FakeRecorder
	mu     sync.Mutex
	calls  []string // the cluster's and the API server's changes, in order
}

const clientA = "10.0.0.1:0/111"

func newScene(t *testing.T, opts ...func(*Config)) *scene {
	t.Helper()
	return newSceneAs(t, "node-a", opts...)
}

// newSceneAs is newScene with node-a's agent running under node_id id (its Node's machine id is
// "machine-a").
func newSceneAs(t *testing.T, id string, opts ...func(*Config)) *scene {
	t.Helper()
	s := &scene{t: t, m: memory.New("fsid"), wall: time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC)}
	s.m.SetClock(func() time.Time { return s.wall })
	img := claim.Image{Pool: "rbd", Image: "vol1"}
	s.m.AddImage(img, "id-vol1")
	var err error
	s.a, err = claim.NewStoreOn(s.m, claim.Config{Node: claim.Node{ID: id, Incarnation: "inc-a", BootID: "hb-boot-1"}, Now: func() time.Time { return s.wall }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	r, err := s.a.Acquire(ctx, claim.Request{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.a.SetMapping(ctx, img, r.Holder.Epoch, clientA, "/dev/rbd0"); err != nil {
		t.Fatal(err)
	}
	s.m.SetHook(func(_ context.Context, call string, _ claim.Image) error {
		if call == "blocklist" || call == "unblocklist" {
			s.note("ceph " + call)
		}
		return nil
	})
	s.kube = fake.NewClientset(
		node("node-a", "kb-boot-1"), node("node-b", "kb-boot-2"),
		lease("node-a"), lease("node-b"),
		&corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv1"}, Spec: corev1.PersistentVolumeSpec{PersistentVolumeSource: corev1.PersistentVolumeSource{
			CSI: &corev1.CSIPersistentVolumeSource{Driver: "rbd.csi.ceph.com", VolumeHandle: "vol1", VolumeAttributes: map[string]string{"pool": "rbd", "staticVolume": "true"}}}}},
		&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data-app-0", Namespace: "default"}, Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "pv1"}},
		pod("app-0", "node-a", "data-app-0", nil), pod("other-0", "node-a", "", nil), pod("app-1", "node-b", "data-app-0", nil),
		&storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "va-pv1-a"}, Spec: storagev1.VolumeAttachmentSpec{Attacher: "rbd.csi.ceph.com", NodeName: "node-a", Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: ptr("pv1")}}},
	)
	s.kube.PrependReactor("*", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		switch a.GetVerb() {
		case "update", "delete", "create", "patch":
			what := a.GetResource().Resource
			if what == "leases" || what == "events" {
				return false, nil, nil // the kubelets' renewals in pass
			}
			if u, ok := a.(k8stesting.UpdateAction); ok && what == "nodes" {
				n := u.GetObject().(*corev1.Node)
				what += fmt.Sprintf(" taint=%v phase=%q", hasTaint(n), mustState(t, n).Phase)
			}
			if d, ok := a.(k8stesting.DeleteAction); ok {
				what += " " + d.GetName()
			}
			s.note("kube " + a.GetVerb() + " " + what)
		}
		return false, nil, nil
	})
	s.events = kevents.NewFakeRecorder(100)
	log, _ := logtest.NewNullLogger()
	cfg := Config{Decide: failover.Defaults, Identity: "ctl-0", Now: func() time.Time { return s.wall }, Mono: func() time.Duration { return s.mono }, Log: log, Events: s.events}
	for _, o := range opts {
		o(&cfg)
	}
	s.c, err = New(cfg, s.kube, StoreCluster{Store: mustStore(t, s.m, func() time.Time { return s.wall })})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mustStore(t *testing.T, b claim.Backend, now func() time.Time) *claim.Store {
	t.Helper()
	st, err := claim.NewStoreOn(b, claim.Config{Node: claim.Node{ID: "failover-controller/ctl-0"}, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func mustState(t *testing.T, n *corev1.Node) failover.State {
	st, err := stateOf(n)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func ptr[T any](v T) *T { return &v }

func node(name, boot string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{BootID: boot, MachineID: "machine-" + name[len(name)-1:]}}}
}

func lease(name string) *coordv1.Lease {
	return &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: LeaseNamespace, ResourceVersion: "1"}, Spec: coordv1.LeaseSpec{RenewTime: &metav1.MicroTime{Time: time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC)}}}
}

func pod(name, nodeName, claimName string, ann map[string]string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Annotations: ann, UID: "uid-" + "name"}, Spec: corev1.PodSpec{NodeName: nodeName}}
	if claimName != "" {
		p.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claimName}}}}
	}
	return p
}

func (s *scene) note(c string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, c)
}

func (s *scene) changes() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.calls...)
}

// pass lets d go by: node-b's kubelet and both agents renew unless stopped says otherwise.
func (s *scene) pass(d time.Duration, alive ...string) {
	s.t.Helper()
	ctx := context.Background()
	for step := time.Duration(0); step < d; step += 5 * time.Second {
		s.mono += 5 * time.Second
		s.wall = s.wall.Add(5 * time.Second)
		for _, n := range alive {
			switch n {
			case "kubelet-a", "kubelet-b":
				l, err := s.kube.CoordinationV1().Leases(LeaseNamespace).Get(ctx, "node-"+n[len(n)-1:], metav1.GetOptions{})
				if err != nil {
					s.t.Fatal(err)
				}
				l.Spec.RenewTime = &metav1.MicroTime{Time: s.wall}
				l.ResourceVersion = fmt.Sprint(s.mono)
				if _, err := s.kube.CoordinationV1().Leases(LeaseNamespace).Update(ctx, l, metav1.UpdateOptions{}); err != nil {
					s.t.Fatal(err)
				}
			case "agent-a":
				if err := s.a.Heartbeat(ctx, "rbd", ""); err != nil {
					s.t.Fatal(err)
				}
			}
		}
		s.c.Round(ctx)
	}
}

// startedBy persists on node the state another controller (by) left after declaring it dead:
// phase fencing, its fence not yet done.
func (s *scene) startedBy(node, by string) {
	s.t.Helper()
	n := s.node(node)
	b, err := json.Marshal(failover.State{Phase: failover.PhaseFencing, Since: s.wall, By: by, KubeletBootID: "kb-boot-1"})
	if err != nil {
		s.t.Fatal(err)
	}
	n.Annotations = map[string]string{failover.Annotation: string(b)}
	if _, err := s.kube.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		s.t.Fatal(err)
	}
}

func (s *scene) node(name string) *corev1.Node {
	s.t.Helper()
	n, err := s.kube.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	return n
}

func (s *scene) exists(resource, ns, name string) bool {
	s.t.Helper()
	var err error
	ctx := context.Background()
	switch resource {
	case "pods":
		_, err = s.kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	case "volumeattachments":
		_, err = s.kube.StorageV1().VolumeAttachments().Get(ctx, name, metav1.GetOptions{})
	}
	if apierrors.IsNotFound(err) {
		return false
	}
	if err != nil {
		s.t.Fatal(err)
	}
	return true
}

// A node dead for both detectors is fenced, its entry read back, and only then tainted; its
// pod that uses the held volume is force-deleted (not the others) and the attachment deleted.
func TestDeadNodeFencedThenMoved(t *testing.T) {
	s := newScene(t)
	s.pass(15*time.Second, "kubelet-b")
	if s.m.Blocklisted(clientA) || hasTaint(s.node("node-a")) {
		t.Fatalf("acted within the grace: %v", s.changes())
	}
	s.pass(10*time.Second, "kubelet-b")
	if !s.m.Blocklisted(clientA) {
		t.Fatalf("node-a's client not fenced after 25 s of silence: %v", s.changes())
	}
	n := s.node("node-a")
	st := mustState(t, n)
	if st.Phase != failover.PhaseMoved || !st.Tainted || st.KubeletBootID != "kb-boot-1" || len(st.Fences) != 1 || st.Fences[0].Addr != clientA {
		t.Fatalf("state %+v", st)
	}
	if !hasTaint(n) {
		t.Fatal("node-a not tainted")
	}
	if s.exists("pods", "default", "app-0") || !s.exists("pods", "default", "other-0") || !s.exists("pods", "default", "app-1") {
		t.Fatal("app-0 should be deleted, other-0 (no held volume) and app-1 (node-b) kept")
	}
	if s.exists("volumeattachments", "", "va-pv1-a") {
		t.Fatal("node-a's attachment of pv1 not deleted")
	}
	// the order: the fence (and its state) before anything Kubernetes acts on
	calls := s.changes()
	first := func(prefix string) int {
		for i, c := range calls {
			if strings.HasPrefix(c, prefix) {
				return i
			}
		}
		t.Fatalf("no %q in %v", prefix, calls)
		return -1
	}
	fenced, tainted := first("ceph blocklist"), first("kube update nodes taint=true")
	if !(fenced < tainted && tainted < first("kube delete pods") && tainted < first("kube delete volumeattachments")) {
		t.Fatalf("not fence → taint → deletions: %v", calls)
	}
	if r, err := s.a.Inspect(context.Background(), claim.Image{Pool: "rbd", Image: "vol1"}); err != nil || !r.Holders[0].Fenced {
		t.Fatalf("the hold is not marked fenced: %+v, %v", r, err)
	}
}

// An agent runs under the node's machine id unless configured (node_id): the controller finds its
// heartbeats under it, fences under it, and records it; a Node annotated with another id is
// looked up under that one only.
func TestTheAgentsNodeIDIsFoundByItsHeartbeats(t *testing.T) {
	s := newSceneAs(t, "machine-a")
	s.pass(30*time.Second, "kubelet-b")
	if !s.m.Blocklisted(clientA) {
		t.Fatalf("node-a (agent machine-a) not fenced: %v", s.changes())
	}
	if st := mustState(t, s.node("node-a")); st.AgentID != "machine-a" || st.Phase != failover.PhaseMoved {
		t.Fatalf("state %+v", st)
	}
	s = newSceneAs(t, "machine-a")
	n := s.node("node-a")
	n.Annotations = map[string]string{failover.NodeIDAnnotation: "other"}
	if _, err := s.kube.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.pass(time.Minute, "kubelet-b")
	if s.m.Blocklisted(clientA) {
		t.Fatal("fenced under an id its annotation does not name")
	}
}

// A node whose agent renews (cut off from the API server only), or whose kubelet renews (cut
// off from the cluster only), is never fenced.
func TestOneDetectorAliveIsNeverFenced(t *testing.T) {
	for _, alive := range []string{"agent-a", "kubelet-a"} {
		t.Run(alive, func(t *testing.T) {
			s := newScene(t)
			s.pass(3*time.Minute, alive, "kubelet-b")
			if s.m.Blocklisted(clientA) || hasTaint(s.node("node-a")) || len(s.changes()) > 0 {
				t.Fatalf("changed: %v", s.changes())
			}
		})
	}
}

// The way back: nothing is lifted while the node stays away or runs again with the same boot
// and its mapping; its agent's report of the mapping gone lifts the taint (the entry is the
// agents' to lift); a new boot does too.
func TestLiftOnlyOnceTheFencedMappingIsGone(t *testing.T) {
	for _, how := range []string{"mapping gone", "kubelet boot id", "heartbeat boot id"} {
		t.Run(how, func(t *testing.T) {
			s := newScene(t)
			s.pass(30*time.Second, "kubelet-b")
			s.pass(time.Minute, "kubelet-a", "agent-a", "kubelet-b") // healed, same boot, still mapped
			if !hasTaint(s.node("node-a")) || !s.m.Blocklisted(clientA) {
				t.Fatal("lifted while the fenced mapping may still write")
			}
			ctx := context.Background()
			switch how {
			case "mapping gone":
				if _, err := s.a.FenceGone(ctx, claim.Image{Pool: "rbd", Image: "vol1"}, "node-a", clientA, "unmapped"); err != nil {
					t.Fatal(err)
				}
			case "kubelet boot id":
				n := s.node("node-a")
				n.Status.NodeInfo.BootID = "kb-boot-9"
				if _, err := s.kube.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			case "heartbeat boot id":
				a2, err := claim.NewStoreOn(s.m, claim.Config{Node: claim.Node{ID: "node-a", Incarnation: "inc-a2", BootID: "hb-boot-2"}, Now: func() time.Time { return s.wall }})
				if err != nil {
					t.Fatal(err)
				}
				s.a = a2
			}
			s.pass(5*time.Second, "kubelet-a", "agent-a", "kubelet-b")
			n := s.node("node-a")
			if hasTaint(n) || n.Annotations[failover.Annotation] != "" {
				t.Fatalf("not lifted after %s: taint %v, state %q", how, hasTaint(n), n.Annotations[failover.Annotation])
			}
		})
	}
}

// A taint that was there before the failover is not the controller's: never removed by it.
func TestATaintNotItsOwnStays(t *testing.T) {
	s := newScene(t)
	n := s.node("node-a")
	n.Spec.Taints = []corev1.Taint{{Key: OutOfService, Value: "by-hand", Effect: corev1.TaintEffectNoExecute}}
	if _, err := s.kube.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.pass(30*time.Second, "kubelet-b")
	if st := mustState(t, s.node("node-a")); st.Phase != failover.PhaseMoved || st.Tainted {
		t.Fatalf("state %+v", st)
	}
	if _, err := s.a.FenceGone(context.Background(), claim.Image{Pool: "rbd", Image: "vol1"}, "node-a", clientA, "unmapped"); err != nil {
		t.Fatal(err)
	}
	s.pass(5*time.Second, "kubelet-a", "agent-a", "kubelet-b")
	if n := s.node("node-a"); !hasTaint(n) || n.Annotations[failover.Annotation] != "" {
		t.Fatalf("taint %v, state %q", hasTaint(n), n.Annotations[failover.Annotation])
	}
}

// Nothing at all while the cluster or the API server cannot be read; a limit reached stops a
// failover; dry run changes nothing.
func TestNothingBlindNothingBeyondTheLimitNothingInDryRun(t *testing.T) {
	t.Run("cluster unreadable", func(t *testing.T) {
		s := newScene(t)
		s.m.SetHook(func(_ context.Context, call string, _ claim.Image) error {
			if call == "read" {
				return errors.New("timed out")
			}
			return nil
		})
		s.pass(time.Minute, "kubelet-b")
		if s.m.Blocklisted(clientA) || hasTaint(s.node("node-a")) {
			t.Fatal("acted blind")
		}
	})
	t.Run("api unreadable", func(t *testing.T) {
		s := newScene(t)
		s.kube.PrependReactor("list", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewServiceUnavailable("down")
		})
		s.pass(time.Minute)
		if s.m.Blocklisted(clientA) {
			t.Fatal("acted blind")
		}
	})
	t.Run("limit", func(t *testing.T) {
		s := newScene(t)
		n := s.node("node-b")
		b, _ := json.Marshal(failover.State{Phase: failover.PhaseMoved, Since: s.wall, Whole: true,
			Fences: []failover.Fenced{{Pool: "rbd", Image: "gone", Addr: "10.0.0.2:0/0"}}}) // stuck until it reboots
		n.Annotations = map[string]string{failover.Annotation: string(b)}
		if _, err := s.kube.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		s.pass(time.Minute)
		if s.m.Blocklisted(clientA) {
			t.Fatal("a second node fenced within the window")
		}
		if !strings.Contains(drain(s.events), "FailoverLimited") {
			t.Fatal("no FailoverLimited event")
		}
	})
	t.Run("dry run", func(t *testing.T) {
		s := newScene(t, func(c *Config) { c.DryRun = true })
		s.pass(time.Minute, "kubelet-b")
		if s.m.Blocklisted(clientA) || len(s.changes()) > 0 {
			t.Fatalf("changed in a dry run: %v", s.changes())
		}
		if !strings.Contains(drain(s.events), "would declare") {
			t.Fatal("no dry-run event")
		}
	})
}

// A standby that becomes the leader after the last one stopped mid-decision (the state says
// fencing, nothing fenced yet) finishes it at its first round, without a grace: the decision
// was taken. Another controller's state write since its read fails its own.
func TestAStandbyFinishesAStartedFailover(t *testing.T) {
	s := newScene(t)
	s.startedBy("node-a", "ctl-1")
	s.pass(5*time.Second, "kubelet-b")
	if !s.m.Blocklisted(clientA) || mustState(t, s.node("node-a")).Phase != failover.PhaseMoved {
		t.Fatalf("not finished: %v", s.changes())
	}
}

// A leader whose election lease was not renewed lately (stopped, then let go before its election
// noticed) takes no step, not even one its persisted phase asks for; once it leads again it
// finishes, and the state names it as its last writer.
func TestALeaderWhoseLeaseLapsedTakesNoStep(t *testing.T) {
	var leading atomic.Bool
	s := newScene(t, func(c *Config) { c.Leading = leading.Load })
	s.startedBy("node-a", "ctl-1")
	s.pass(30*time.Second, "kubelet-b")
	if st := mustState(t, s.node("node-a")); s.m.Blocklisted(clientA) || st.Phase != failover.PhaseFencing || st.By != "ctl-1" || hasTaint(s.node("node-a")) {
		t.Fatalf("a controller not leading took a step: state %+v, changes %v", st, s.changes())
	}
	leading.Store(true)
	s.pass(5*time.Second, "kubelet-b")
	if st := mustState(t, s.node("node-a")); !s.m.Blocklisted(clientA) || st.Phase != failover.PhaseMoved || st.By != "ctl-0" {
		t.Fatalf("not finished by ctl-0 once leading: state %+v, changes %v", st, s.changes())
	}
}

func drain(r *kevents.FakeRecorder) string {
	var out []string
	for {
		select {
		case e := <-r.Events:
			out = append(out, e)
		default:
			return strings.Join(out, "\n")
		}
	}
}

// A failover whose node holds nothing any more when it comes to the fence (released since it
// was declared dead) is abandoned: no taint without a fence.
func TestNothingHeldAnyMoreNoTaint(t *testing.T) {
	s := newScene(t)
	ctx := context.Background()
	if _, err := s.a.Release(ctx, claim.Image{Pool: "rbd", Image: "vol1"}, 1); err != nil {
		t.Fatal(err)
	}
	n := s.node("node-a")
	b, _ := json.Marshal(failover.State{Phase: failover.PhaseFencing, Since: s.wall})
	n.Annotations = map[string]string{failover.Annotation: string(b)}
	if _, err := s.kube.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.pass(5*time.Second, "kubelet-b")
	if n := s.node("node-a"); hasTaint(n) || n.Annotations[failover.Annotation] != "" || !s.exists("pods", "default", "app-0") {
		t.Fatalf("taint %v, state %q: %v", hasTaint(n), n.Annotations[failover.Annotation], s.changes())
	}
}
