// Package failoverctl is the failover controller's I/O (issue 53): each round it reads the
// nodes, their kubelet leases and their rbd-owner heartbeats, asks agent/failover what to do
// with each node, and does it: fence --node through the claim packages with the controller's
// own cephx user, the entries read back, then on Kubernetes the out-of-service taint, the
// pods' force deletion and the VolumeAttachments' deletion; on the node's return, the lift.
// Every step is an Event on the Node and a log line (the audit).
package failoverctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	kevents "k8s.io/client-go/tools/record"

	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/claim/record"
	"github.com/rbd-owner/rbd-owner/agent/failover"
)

// Cluster is what the controller needs of the Ceph cluster: *claim.Store, through StoreCluster.
type Cluster interface {
	NodeBeats(ctx context.Context, node string) ([]claim.NodeBeat, []error)
	NodeHolds(ctx context.Context, node string) ([]claim.NodeHold, []error)
	FenceNode(ctx context.Context, node string) ([]claim.NodeFenceImage, []error)
	UnfenceNode(ctx context.Context, node, why string, force bool) (*claim.UnfenceNodeResult, error)
	Inspect(ctx context.Context, img claim.Image) (*claim.Record, error)
	Blocklist(ctx context.Context) ([]claim.BlockEntry, error)
}

// StoreCluster is a claim store as the controller's Cluster.
type StoreCluster struct{ *claim.Store }

// Blocklist is the cluster's blocklist as read now.
func (s StoreCluster) Blocklist(ctx context.Context) ([]claim.BlockEntry, error) {
	return s.Backend().BlocklistEntries(ctx)
}

// OutOfService is the taint that tells Kubernetes a node is down for good: its pods are deleted
// and their volumes detached at once (non-graceful node shutdown).
const OutOfService = "node.kubernetes.io/out-of-service"

// LeaseNamespace holds the kubelets' leases.
const LeaseNamespace = "kube-node-lease"

// Config configures a Controller.
type Config struct {
	Decide failover.Config
	// Identity names this controller (its pod) in states, events and logs.
	Identity string
	// Driver is the CSI driver whose volumes the agents hold (ceph-csi's RBD driver).
	Driver string
	// DryRun: decide and report, change nothing.
	DryRun bool
	// Interval between rounds; CallTimeout bounds each call to the API server or the cluster.
	Interval, CallTimeout time.Duration
	// Now and Mono: the wall clock (states, the window) and this process's monotonic clock
	// (the detectors); defaults time.Now and the time since New.
	Now  func() time.Time
	Mono func() time.Duration
	Log  logrus.FieldLogger
	// Events records the steps on the nodes (nil: none).
	Events kevents.EventRecorder
	// Metrics counts decisions (nil: none).
	Metrics *Metrics
	// Leading says whether this controller still holds its election's lease, judged on its
	// own clock from its last renewal (nil: always). A leader that was stopped (a frozen
	// process, a stalled API server) may run on before its election notices; no step is
	// taken while this is false.
	Leading func() bool
}

// Controller runs the rounds. One goroutine (Run's) uses it.
type Controller struct {
	cfg     Config
	kube    kubernetes.Interface
	ceph    Cluster
	kubelet *failover.Watch
	agent   *failover.Watch
	said    map[string]string // the last decision reported per node: a change is logged
	ids     map[string]string // each node's rbd-owner node_id, once its heartbeats were found under it
}

// New returns a controller with nothing seen: it waits a whole grace from its first look.
func New(cfg Config, kube kubernetes.Interface, ceph Cluster) (*Controller, error) {
	if err := cfg.Decide.Validate(); err != nil {
		return nil, fmt.Errorf("failover: %w", err)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Mono == nil {
		start := time.Now()
		cfg.Mono = func() time.Duration { return time.Since(start) }
	}
	if cfg.Log == nil {
		cfg.Log = logrus.StandardLogger()
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 5 * time.Second
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = 15 * time.Second
	}
	if cfg.Driver == "" {
		cfg.Driver = "rbd.csi.ceph.com"
	}
	return &Controller{cfg: cfg, kube: kube, ceph: ceph, kubelet: failover.NewWatch(), agent: failover.NewWatch(), said: map[string]string{}, ids: map[string]string{}}, nil
}

// Run does a round every interval until ctx ends.
func (c *Controller) Run(ctx context.Context) {
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	for {
		c.Round(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Round looks at every node once and takes each as far as it can go now.
func (c *Controller) Round(ctx context.Context) {
	lctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	nodes, err := c.kube.CoreV1().Nodes().List(lctx, metav1.ListOptions{})
	cancel()
	if err != nil {
		c.cfg.Metrics.refused("api_unreadable")
		c.cfg.Log.WithError(err).Warn("failover: the nodes could not be read from the API server: nothing is done this round")
		return
	}
	now := c.cfg.Now()
	names := map[string]bool{}
	recent := map[string]bool{}
	for i := range nodes.Items {
		n := &nodes.Items[i]
		names[n.Name] = true
		if st, err := stateOf(n); err == nil && st.Phase != failover.PhaseNone && now.Sub(st.Since) < c.cfg.Decide.Window {
			recent[n.Name] = true
		}
	}
	c.kubelet.Forget(func(k string) bool { return names[k] })
	c.agent.Forget(func(k string) bool { return names[k] })
	for k := range c.ids {
		if !names[k] {
			delete(c.ids, k)
		}
	}
	for i := range nodes.Items {
		n := nodes.Items[i]
		others := len(recent)
		if recent[n.Name] {
			others--
		}
		c.node(ctx, &n, others, len(nodes.Items))
	}
	c.cfg.Metrics.phases(nodes.Items)
}

// node takes one node as far as it goes this round: one decision after another until a wait.
func (c *Controller) node(ctx context.Context, n *corev1.Node, recent, total int) {
	log := c.cfg.Log.WithField("node", n.Name)
	st, err := stateOf(n)
	if err != nil {
		c.report(n, log, failover.Decision{Step: failover.Wait, Reason: "bad-state", Why: err.Error()})
		return
	}
	look := failover.Look{DeclaredRecently: recent, Nodes: total}
	c.lookKubelet(ctx, n, &look)
	id, beats := c.lookAgent(ctx, n, st, &look)
	for range 5 { // declare → fence → advance → taint → move: at most five steps in one round
		if st.Phase == failover.PhaseNone && look.KubeletStill >= c.cfg.Decide.KubeletGrace && look.AgentStill >= c.cfg.Decide.AgentGrace && look.AgentRead {
			c.lookHolds(ctx, id, &look)
		}
		if st.AgentID != "" {
			id = st.AgentID
		}
		if st.Phase == failover.PhaseMoved {
			c.lookReturn(ctx, n, id, st, beats, &look)
		}
		d := failover.Decide(c.cfg.Decide, st, look)
		c.report(n, log, d)
		if c.cfg.DryRun || d.Step == failover.Wait || d.Step == failover.Refuse || d.Step == failover.Stuck {
			return
		}
		if c.cfg.Leading != nil && !c.cfg.Leading() {
			c.cfg.Metrics.refused("not_leading")
			log.WithField("step", d.Step.String()).Warn("failover: this controller's election lease was not renewed lately (it may be another's now): the step is not taken")
			return
		}
		next, err := c.do(ctx, n, id, st, d, beats, &look)
		if err != nil {
			c.cfg.Metrics.failed(d.Step)
			c.event(n, corev1.EventTypeWarning, "FailoverStepFailed", "%s: %v", d.Step, err)
			log.WithError(err).WithField("step", d.Step.String()).Error("failover: a step failed; it is tried again next round")
			return
		}
		if next == nil {
			return
		}
		st = *next
		if n, err = c.getNode(ctx, n.Name); err != nil {
			log.WithError(err).Warn("failover: the node could not be read again; its next step waits for the next round")
			return
		}
	}
}

// lookKubelet watches the node's kubelet lease: its renew time and version as the mark.
func (c *Controller) lookKubelet(ctx context.Context, n *corev1.Node, look *failover.Look) {
	lctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	defer cancel()
	lease, err := c.kube.CoordinationV1().Leases(LeaseNamespace).Get(lctx, n.Name, metav1.GetOptions{})
	mark := "none"
	switch {
	case err == nil:
		rt := ""
		if lease.Spec.RenewTime != nil {
			rt = lease.Spec.RenewTime.UTC().Format(time.RFC3339Nano)
		}
		mark = lease.ResourceVersion + "/" + rt
	case apierrors.IsNotFound(err):
	default:
		// not read: no evidence either way; the watch is not moved, the still time not trusted
		c.cfg.Log.WithError(err).WithField("node", n.Name).Warn("failover: the node's kubelet lease could not be read")
		look.KubeletStill = 0
		return
	}
	look.KubeletStill = c.kubelet.Still(n.Name, mark, c.cfg.Mono())
}

// agentIDs are the rbd-owner node ids a node's agent may run under, in the order tried: the
// Node's annotation rbd-owner.io/node-id alone when set; else its machine id (the agent's
// default node_id) and its name.
func agentIDs(n *corev1.Node) []string {
	if id := n.Annotations[failover.NodeIDAnnotation]; id != "" {
		return []string{id}
	}
	var out []string
	for _, id := range []string{n.Status.NodeInfo.MachineID, n.Name} {
		if id != "" && !contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}

// lookAgent watches the node's rbd-owner heartbeats in every place of the cluster, under its
// node id: the state's, else the one its heartbeats were found under (agentIDs). It returns the
// id and the heartbeats read.
func (c *Controller) lookAgent(ctx context.Context, n *corev1.Node, st failover.State, look *failover.Look) (string, []claim.NodeBeat) {
	ids := agentIDs(n)
	if st.AgentID != "" {
		ids = []string{st.AgentID}
	} else if id, ok := c.ids[n.Name]; ok {
		ids = []string{id}
	}
	cctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	defer cancel()
	id, found := ids[0], []claim.NodeBeat(nil)
	for _, cand := range ids {
		beats, errs := c.ceph.NodeBeats(cctx, cand)
		if len(errs) > 0 {
			c.cfg.Log.WithError(errors.Join(errs...)).WithField("node", n.Name).Warn("failover: the node's heartbeats could not all be read")
			return cand, beats
		}
		if len(beats) > 0 {
			id, found = cand, beats
			c.ids[n.Name] = cand
			break
		}
	}
	marks := make([]string, 0, len(found))
	for _, b := range found {
		marks = append(marks, record.PoolNS(b.Place)+"="+string(b.Mark))
	}
	look.AgentRead = true
	look.AgentStill = c.agent.Still(n.Name, id+"@"+failover.JoinMarks(marks), c.cfg.Mono())
	return id, found
}

// lookHolds counts the node's holds.
func (c *Controller) lookHolds(ctx context.Context, node string, look *failover.Look) {
	cctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	defer cancel()
	holds, errs := c.ceph.NodeHolds(cctx, node)
	look.Holds, look.HoldsRead = len(holds), len(errs) == 0
	for _, h := range holds {
		if h.Holder.ClientAddr == "" {
			look.Unrecorded++
		}
	}
	if len(errs) > 0 {
		c.cfg.Log.WithError(errors.Join(errs...)).WithField("node", node).Warn("failover: the node's holds could not all be read")
	}
}

// lookReturn says whether the node came back: a new boot (its kubelet's or a heartbeat's boot
// id), or every fence of the state ended in its claim.
func (c *Controller) lookReturn(ctx context.Context, n *corev1.Node, id string, st failover.State, beats []claim.NodeBeat, look *failover.Look) {
	if id := n.Status.NodeInfo.BootID; id != "" && st.KubeletBootID != "" && id != st.KubeletBootID {
		look.Rebooted = true
	}
	known := map[string]bool{}
	for _, id := range st.HeartbeatBootIDs {
		known[id] = true
	}
	for _, b := range beats {
		if id := b.Heartbeat.BootID; id != "" && len(known) > 0 && !known[id] {
			look.Rebooted = true
		}
	}
	cctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	defer cancel()
	for _, f := range st.Fences {
		rec, err := c.ceph.Inspect(cctx, claim.Image{Pool: f.Pool, Namespace: f.Namespace, Image: f.Image})
		if errors.Is(err, claim.ErrNoClaim) {
			continue // released and removed: its fence ended with it
		}
		if err != nil {
			return // not known: not ended
		}
		for _, k := range rec.Kept() {
			if k.NodeID == id && record.BareAddr(k.Addr) == record.BareAddr(f.Addr) {
				return
			}
		}
	}
	look.FencesEnded = true
}

// do takes one step and returns the state after it (nil: nothing more this round).
func (c *Controller) do(ctx context.Context, n *corev1.Node, id string, st failover.State, d failover.Decision, beats []claim.NodeBeat, look *failover.Look) (*failover.State, error) {
	switch d.Step {
	case failover.Declare:
		next := failover.State{Phase: failover.PhaseFencing, Since: c.cfg.Now().UTC(), By: c.cfg.Identity, AgentID: id, KubeletBootID: n.Status.NodeInfo.BootID}
		for _, b := range beats {
			if b.Heartbeat.BootID != "" && !contains(next.HeartbeatBootIDs, b.Heartbeat.BootID) {
				next.HeartbeatBootIDs = append(next.HeartbeatBootIDs, b.Heartbeat.BootID)
			}
		}
		if err := c.save(ctx, n, &next); err != nil {
			return nil, err
		}
		c.event(n, corev1.EventTypeWarning, "FailoverDeclaredDead", "%s; fencing its holds", d.Why)
		c.cfg.Log.WithField("node", n.Name).WithField("holds", look.Holds).Warn("failover: node declared dead: " + d.Why)
		return &next, nil
	case failover.Fence:
		return c.fence(ctx, n, id, st, look)
	case failover.Advance:
		next := st
		next.Phase = failover.PhaseFenced
		if err := c.save(ctx, n, &next); err != nil {
			return nil, err
		}
		return &next, nil
	case failover.Taint:
		next := st
		next.Phase = failover.PhaseTainted
		if err := c.write(ctx, n, &next, func(m *corev1.Node) {
			next.Tainted = !hasTaint(m) // one already there is not this controller's
			setTaint(m, true, c.cfg.Now())
		}); err != nil {
			return nil, err
		}
		c.event(n, corev1.EventTypeWarning, "FailoverTainted", "tainted %s=nodeshutdown:NoExecute: its fence is in force", OutOfService)
		return &next, nil
	case failover.Move:
		return c.move(ctx, n, st)
	case failover.Lift:
		return nil, c.lift(ctx, n, id, st, look)
	}
	return nil, nil
}

// fence fences every hold of the node, records the fences in the state, and reads the entries
// back from the cluster's blocklist.
func (c *Controller) fence(ctx context.Context, n *corev1.Node, id string, st failover.State, look *failover.Look) (*failover.State, error) {
	cctx, cancel := context.WithTimeout(ctx, 4*c.cfg.CallTimeout)
	defer cancel()
	fenced, errs := c.ceph.FenceNode(cctx, id)
	next := st
	for _, f := range fenced {
		if f.Err != nil {
			errs = append(errs, f.Err)
			continue
		}
		fe := failover.Fenced{Pool: f.Image.Pool, Namespace: f.Image.Namespace, Image: f.Image.Image, Addr: f.Fence.Addr}
		if !containsFence(next.Fences, fe) {
			next.Fences = append(next.Fences, fe)
		}
		if wholeAddr(f.Fence.Addr) {
			next.Whole = true
		}
		c.event(n, corev1.EventTypeWarning, "FailoverFenced", "fenced %s's hold on %s: %s blocklisted until %s", n.Name, f.Image, f.Fence.Addr, f.Fence.Expires.UTC().Format(time.RFC3339))
	}
	if len(next.Fences) == 0 && len(errs) == 0 {
		// its holds were released or taken over since it was declared dead: nothing of it to
		// fence, and no fence to stand on: nothing is done on Kubernetes
		if err := c.save(ctx, n, nil); err != nil {
			return nil, err
		}
		c.event(n, corev1.EventTypeNormal, "FailoverAbandoned", "nothing of %s is held any more (released or taken over since it was declared dead): nothing fenced, left to Kubernetes", n.Name)
		return nil, nil
	}
	if err := c.save(ctx, n, &next); err != nil {
		return nil, err
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("fence --node %s: incomplete, %d holds not found or not fenced (nothing is done on Kubernetes until all are): %w", n.Name, len(errs), errors.Join(errs...))
	}
	entries, err := c.ceph.Blocklist(cctx)
	if err != nil {
		return nil, fmt.Errorf("fence --node %s: the blocklist could not be read back: %w", n.Name, err)
	}
	for _, f := range next.Fences {
		if !listed(entries, f.Addr, c.cfg.Now()) {
			return nil, fmt.Errorf("fence --node %s: %s (its hold on %s/%s) is not on the cluster's blocklist after the fence", n.Name, f.Addr, f.Pool, f.Image)
		}
	}
	look.InForce = true
	c.event(n, corev1.EventTypeNormal, "FailoverFenceInForce", "%d blocklist entries read back in force: %s", len(next.Fences), addrs(next.Fences))
	return &next, nil
}

// listed says whether addr has its own entry on the blocklist, not expired on this clock.
func listed(entries []claim.BlockEntry, addr string, now time.Time) bool {
	a := record.BareAddr(addr)
	for _, e := range entries {
		if !e.Range.IsValid() && e.Addr == a && (e.Until.IsZero() || e.Until.After(now)) {
			return true
		}
	}
	return false
}

// move force-deletes the node's pods that use a volume it held and fenced (unless a pod opts
// out), and deletes those volumes' VolumeAttachments.
func (c *Controller) move(ctx context.Context, n *corev1.Node, st failover.State) (*failover.State, error) {
	next := st
	held := map[string]bool{}
	for _, f := range st.Fences {
		held[claim.Image{Pool: f.Pool, Namespace: f.Namespace, Image: f.Image}.String()] = true
	}
	pvs, err := c.heldVolumes(ctx, held)
	if err != nil {
		return nil, err
	}
	keep, err := c.deletePods(ctx, n, pvs)
	if err != nil {
		return nil, err
	}
	if err := c.deleteAttachments(ctx, n, pvs, keep); err != nil {
		return nil, err
	}
	next.Phase = failover.PhaseMoved
	if err := c.save(ctx, n, &next); err != nil {
		return nil, err
	}
	return &next, nil
}

// lift ends the failover: the whole-node entries lifted (on a reboot only), the taint this
// controller added removed, the state cleared.
func (c *Controller) lift(ctx context.Context, n *corev1.Node, id string, st failover.State, look *failover.Look) error {
	if st.Whole && look.Rebooted {
		cctx, cancel := context.WithTimeout(ctx, 4*c.cfg.CallTimeout)
		res, err := c.ceph.UnfenceNode(cctx, id, "the failover controller saw the node boot again", true)
		cancel()
		if err != nil && !errors.Is(err, claim.ErrNoClaim) {
			return fmt.Errorf("unfence --node %s: %w", n.Name, err)
		}
		if res != nil {
			c.event(n, corev1.EventTypeNormal, "FailoverUnfenced", "the node booted again: its whole-address entries lifted: %v", res.Lifted)
		}
	}
	// the taint this controller added, and the state, in one write
	if err := c.write(ctx, n, nil, func(m *corev1.Node) {
		if st.Tainted {
			setTaint(m, false, c.cfg.Now())
		}
	}); err != nil {
		return err
	}
	how := "its agent found every fenced mapping gone"
	if look.Rebooted {
		how = "it booted again"
	}
	c.event(n, corev1.EventTypeNormal, "FailoverLifted", "the node is back (%s): the taint this controller added is removed", how)
	c.cfg.Log.WithField("node", n.Name).Warn("failover: node back (" + how + "): lifted")
	return nil
}

// report logs and records a decision once, when it changes.
func (c *Controller) report(n *corev1.Node, log logrus.FieldLogger, d failover.Decision) {
	c.cfg.Metrics.decided(d.Step)
	key := d.Step.String() + "/" + d.Reason
	if c.said[n.Name] == key {
		return
	}
	c.said[n.Name] = key
	switch {
	case c.cfg.DryRun && d.Step != failover.Wait:
		c.event(n, corev1.EventTypeWarning, "FailoverDryRun", "would %s: %s", d.Step, d.Why)
		log.WithField("step", d.Step.String()).Warn("failover (dry run, nothing done): would " + d.Step.String() + ": " + d.Why)
	case d.Step == failover.Refuse:
		c.cfg.Metrics.refused("limit")
		c.event(n, corev1.EventTypeWarning, "FailoverLimited", "%s", d.Why)
		log.Error("failover refused: " + d.Why)
	case d.Step == failover.Stuck:
		c.event(n, corev1.EventTypeWarning, "FailoverStuck", "%s", d.Why)
		log.Warn("failover: " + d.Why)
	default:
		log.WithField("step", d.Step.String()).Info("failover: " + d.Why)
	}
}

func (c *Controller) event(n *corev1.Node, typ, reason, format string, args ...any) {
	if c.cfg.Events == nil {
		return
	}
	ref := &corev1.ObjectReference{Kind: "Node", Name: n.Name, UID: n.UID, APIVersion: "v1"}
	c.cfg.Events.Eventf(ref, typ, reason, format, args...)
}

// stateOf reads a node's failover state from its annotation.
func stateOf(n *corev1.Node) (failover.State, error) {
	var st failover.State
	v, ok := n.Annotations[failover.Annotation]
	if !ok || v == "" {
		return st, nil
	}
	if err := json.Unmarshal([]byte(v), &st); err != nil {
		return st, fmt.Errorf("its %s annotation is not a failover state (%v): left alone until it is removed or mended", failover.Annotation, err)
	}
	return st, nil
}

// save writes st as the node's annotation (nil removes it), as a compare-and-set on the state
// this step started from (n's): the node is read anew, and if another controller changed the
// state since, nothing is written and the round ends. The kubelet's writes in between are
// retried over.
func (c *Controller) save(ctx context.Context, n *corev1.Node, st *failover.State) error {
	return c.write(ctx, n, st, nil)
}

// write is save with change made to the node in the same write (a taint).
func (c *Controller) write(ctx context.Context, n *corev1.Node, st *failover.State, change func(*corev1.Node)) error {
	from, err := stateOf(n)
	if err != nil {
		return err
	}
	var last error
	for range 5 {
		cur, err := c.getNode(ctx, n.Name)
		if err != nil {
			return fmt.Errorf("record the failover state on node %s: %w", n.Name, err)
		}
		now, err := stateOf(cur)
		if err != nil {
			return err
		}
		if !sameState(now, from) {
			return fmt.Errorf("record the failover state on node %s: another controller changed it since (%s by %s): left to it", n.Name, now.Phase, now.By)
		}
		m := cur.DeepCopy()
		if m.Annotations == nil {
			m.Annotations = map[string]string{}
		}
		if change != nil {
			change(m) // first: it may complete st from the node as read now
		}
		if st == nil {
			delete(m.Annotations, failover.Annotation)
		} else {
			st.By = c.cfg.Identity
			b, err := json.Marshal(st)
			if err != nil {
				return err
			}
			m.Annotations[failover.Annotation] = string(b)
		}
		cctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
		out, err := c.kube.CoreV1().Nodes().Update(cctx, m, metav1.UpdateOptions{})
		cancel()
		if err == nil {
			*n = *out
			return nil
		}
		if !apierrors.IsConflict(err) {
			return fmt.Errorf("record the failover state on node %s: %w", n.Name, err)
		}
		last = err
	}
	return fmt.Errorf("record the failover state on node %s: the node kept changing: %w", n.Name, last)
}

// sameState compares two states as persisted.
func sameState(a, b failover.State) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

func (c *Controller) getNode(ctx context.Context, name string) (*corev1.Node, error) {
	cctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	defer cancel()
	return c.kube.CoreV1().Nodes().Get(cctx, name, metav1.GetOptions{})
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func containsFence(s []failover.Fenced, v failover.Fenced) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func addrs(fs []failover.Fenced) []string {
	var out []string
	for _, f := range fs {
		if !contains(out, f.Addr) {
			out = append(out, f.Addr)
		}
	}
	sort.Strings(out)
	return out
}
