// Package failover is the failover controller's decision (issue 53): when a Kubernetes node is
// dead for both of its failure detectors, fence its holds, then let Kubernetes move its pods at
// once; when it comes back, lift what was done. It is pure: what the controller saw goes in, the
// next step comes out; the controller (agent/failoverctl) does the I/O.
//
// A node's failover is persisted on its Node object (State, the annotation Annotation) so that a
// standby that becomes the leader finishes what the last leader started. Each phase names how it
// is finished:
//   - fencing: the node was declared dead; finished by fencing its holds again (fence --node is
//     idempotent) until every entry is read back in force from the cluster's blocklist;
//   - fenced: every entry was read back in force; finished by tainting the node out-of-service
//     in the same write as the next phase;
//   - tainted: finished by force-deleting its pods that use a volume it held and deleting those
//     volumes' VolumeAttachments (each idempotent);
//   - moved: all of that is done; finished by the node's return: a new boot, or its agent
//     reporting every fenced mapping gone. Then the whole-node entries are lifted (only on a
//     new boot) and the taint this controller added is removed.
//
// Nothing on the Kubernetes side happens before the fence is in force: the fence, not the lease,
// is what makes another node's map safe.
package failover

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Annotation is the Node annotation that holds a node's failover State (JSON).
const Annotation = "rbd-owner.io/failover"

// NodeIDAnnotation is the Node annotation that names its rbd-owner node_id when it is neither its machine id
// (the agent's default) nor its name.
const NodeIDAnnotation = "rbd-owner.io/node-id"

// OptOut is the pod annotation that keeps a pod from being force-deleted (value "true"): its
// node is still fenced and tainted.
const OptOut = "rbd-owner.io/no-failover"

// Phase is how far a node's failover went (see the package comment).
type Phase string

// The phases, in their order.
const (
	PhaseNone    Phase = ""
	PhaseFencing Phase = "fencing"
	PhaseFenced  Phase = "fenced"
	PhaseTainted Phase = "tainted"
	PhaseMoved   Phase = "moved"
)

// State is a node's failover as persisted on its Node.
type State struct {
	Phase Phase `json:"phase"`
	// Since is when the node was declared dead (the controller's wall clock): for people and
	// for the fleet's limit.
	Since time.Time `json:"since"`
	// By is the controller (pod) that wrote the state last.
	By string `json:"by,omitempty"`
	// AgentID is the node's rbd-owner node_id (its machine id unless configured), as found by
	// its heartbeats when it was declared dead: every later step acts under it.
	AgentID string `json:"agent_id,omitempty"`
	// KubeletBootID is the node's boot id as its kubelet last reported it before the decision;
	// HeartbeatBootIDs the boot ids in its agent's heartbeats. Another one later is a reboot.
	KubeletBootID    string   `json:"kubelet_boot_id,omitempty"`
	HeartbeatBootIDs []string `json:"heartbeat_boot_ids,omitempty"`
	// Fences are the holds fenced, each with the blocklist entry that cuts it.
	Fences []Fenced `json:"fences,omitempty"`
	// Whole is set when some fence is of the node's whole address (no client recorded).
	Whole bool `json:"whole,omitempty"`
	// Tainted: this controller added the out-of-service taint (one already there is not its
	// own, and is never removed by it).
	Tainted bool `json:"tainted,omitempty"`
}

// Fenced is one hold fenced: its image and the address blocklisted (its mapping's client, or
// the node's whole address, ip:0/0, where no client was recorded).
type Fenced struct {
	Pool      string `json:"pool"`
	Namespace string `json:"namespace,omitempty"`
	Image     string `json:"image"`
	Addr      string `json:"addr"`
}

// Config holds the decision's settings.
type Config struct {
	// KubeletGrace: how long the node's kubelet lease must be seen unchanged (its kubelet
	// renews every 10 s by default).
	KubeletGrace time.Duration
	// AgentGrace: how long the node's rbd-owner heartbeats must be seen unchanged in every
	// place (its agent renews at least every 10 s).
	AgentGrace time.Duration
	// MaxNodes and MaxFraction limit the nodes declared dead within Window: a control-plane or
	// cluster-wide outage must never fence the fleet. Both apply (MaxFraction 0: only MaxNodes).
	MaxNodes    int
	MaxFraction float64
	Window      time.Duration
}

// Defaults are a grace of two renewals of each detector (the kubelet renews its lease every 10 s,
// the agent its heartbeats every renew_interval, at most 10 s): a node is fenced about 20 s
// after both stopped. A slow node fenced needlessly loses its pods' writes (EIO) and has them
// moved, which is what a dead one gets; two writers are never the price.
var Defaults = Config{KubeletGrace: 20 * time.Second, AgentGrace: 20 * time.Second, MaxNodes: 1, MaxFraction: 0.5, Window: 15 * time.Minute}

// Validate says what is wrong with c, in one line.
func (c Config) Validate() error {
	switch {
	case c.KubeletGrace < 11*time.Second:
		return fmt.Errorf("kubelet grace %s: at least 11 s (the kubelet renews its lease every 10 s)", c.KubeletGrace)
	case c.AgentGrace < 11*time.Second:
		return fmt.Errorf("agent grace %s: at least 11 s (an agent renews its heartbeats up to every 10 s)", c.AgentGrace)
	case c.MaxNodes < 1:
		return fmt.Errorf("max nodes %d: at least 1", c.MaxNodes)
	case c.MaxFraction < 0 || c.MaxFraction > 1:
		return fmt.Errorf("max fraction %g: between 0 and 1", c.MaxFraction)
	case c.Window <= 0:
		return fmt.Errorf("window %s: more than 0", c.Window)
	}
	return nil
}

// Look is what the controller saw of one node in one round.
type Look struct {
	// KubeletStill and AgentStill: how long the kubelet lease's and the heartbeats' marks have
	// been seen unchanged, on the controller's monotonic clock, counted from its first look.
	KubeletStill, AgentStill time.Duration
	// AgentRead: the node's heartbeats were read in every place of the cluster (a place that
	// could not be read is not a silent one).
	AgentRead bool
	// Holds: the holds the node has, as found (HoldsRead: every place was read); Unrecorded:
	// how many of them record no mapping's client (their fence would be the node's whole
	// address, which this controller does not make: model/failover.pml, failover-node-scope).
	Holds      int
	HoldsRead  bool
	Unrecorded int
	// InForce: every fence of the state is read back from the cluster's blocklist, in force.
	InForce bool
	// Rebooted: the node reports a boot id other than the state's (its kubelet, or a
	// heartbeat); FencesEnded: every fence of the state has ended in its claim (the node's agent
	// found the mapping gone, or a keeper saw the reboot).
	Rebooted    bool
	FencesEnded bool
	// DeclaredRecently: other nodes declared dead within the window; Nodes: nodes in the cluster.
	DeclaredRecently int
	Nodes            int
}

// Step is what to do next with one node.
type Step int

// The steps.
const (
	Wait    Step = iota // nothing to do now; Why says why
	Refuse              // the node is dead, but a limit stops its failover; Why says which
	Declare             // write PhaseFencing: the node is dead for both detectors
	Fence               // fence its holds (again) and read the entries back
	Advance             // the entries are in force: write PhaseFenced
	Taint               // taint the node out-of-service, and write PhaseTainted, in one write
	Move                // force-delete its pods, delete the VolumeAttachments, write PhaseMoved
	Lift                // the node is back: lift its whole-node entries (on a reboot), remove the taint
	Stuck               // the node is back but a whole-node fence can be lifted only on a reboot
)

var stepNames = []string{"wait", "refuse", "declare", "fence", "advance", "taint", "move", "lift", "stuck"}

func (s Step) String() string {
	if int(s) < len(stepNames) {
		return stepNames[s]
	}
	return fmt.Sprintf("step(%d)", int(s))
}

// Decision is the next step and why: Reason names the rule that chose it (stable, for logs and
// metrics: a report is made when it changes), Why says it for a person, with the figures.
type Decision struct {
	Step   Step
	Reason string
	Why    string
}

// Decide is the whole rule: from a node's persisted state and this round's look, the next step.
func Decide(c Config, st State, l Look) Decision {
	switch st.Phase {
	case PhaseFencing:
		if l.InForce {
			return Decision{Advance, "in-force", "every entry of the fence is in force on the cluster's blocklist"}
		}
		return Decision{Fence, "fencing", "declared dead: its holds are fenced until every entry is read back in force"}
	case PhaseFenced:
		return Decision{Taint, "fenced", "fenced: the node is tainted out-of-service"}
	case PhaseTainted:
		return Decision{Move, "tainted", "fenced and tainted: its pods that use a fenced volume and their volume attachments are deleted"}
	case PhaseMoved:
		switch {
		case l.Rebooted:
			return Decision{Lift, "rebooted", "the node rebooted: its fenced clients are gone"}
		case l.FencesEnded && !st.Whole:
			return Decision{Lift, "mappings-gone", "the node's agent found every fenced mapping gone"}
		case l.FencesEnded:
			return Decision{Stuck, "whole-fence-stays", "its fenced mappings are gone, but a fence of its whole address stays until the node reboots (or an admin runs `rbd-owner unfence --node`)"}
		case l.KubeletStill < c.KubeletGrace:
			return Decision{Wait, "back-mapped", "back (its kubelet renews), with its fenced mappings still there: its kubelet unstages them through the CSI node plugin, which must tolerate the out-of-service taint (packaging/kubernetes adds that); the fence and the taint stay until then"}
		}
		return Decision{Wait, "moved", "fenced and moved: the fence and the taint stay until the node reboots or its agent reports the fenced mappings gone"}
	case PhaseNone:
	default:
		return Decision{Wait, "unknown-phase", fmt.Sprintf("unknown phase %q on the node: left alone", st.Phase)}
	}
	switch {
	case l.KubeletStill < c.KubeletGrace:
		return Decision{Wait, "kubelet-renews", fmt.Sprintf("its kubelet renews (lease unchanged for %s of %s)", l.KubeletStill.Round(time.Second), c.KubeletGrace)}
	case !l.AgentRead:
		return Decision{Wait, "heartbeats-unread", "its kubelet is silent, but its agent's heartbeats could not all be read: nothing is done blind"}
	case l.AgentStill < c.AgentGrace:
		return Decision{Wait, "agent-renews", fmt.Sprintf("its kubelet is silent, but its agent renews (heartbeats unchanged for %s of %s): Kubernetes' own checks apply", l.AgentStill.Round(time.Second), c.AgentGrace)}
	case !l.HoldsRead:
		return Decision{Wait, "holds-unread", "dead for both detectors, but its holds could not all be read: nothing is done blind"}
	case l.Holds == 0:
		return Decision{Wait, "no-holds", "dead for both detectors, but it holds no claim: left to Kubernetes"}
	case l.Unrecorded > 0:
		return Decision{Refuse, "unrecorded", fmt.Sprintf("dead for both detectors, but %d of its holds record no mapping's client: their fence would be its whole address, which only an admin makes (`rbd-owner fence --node`)", l.Unrecorded)}
	}
	if lim := c.limit(l.Nodes); l.DeclaredRecently+1 > lim {
		return Decision{Refuse, "limit", fmt.Sprintf("dead for both detectors, but %d nodes were declared dead within %s, and at most %d may be (max nodes %d, max fraction %g of %d nodes): a wider outage is not fenced",
			l.DeclaredRecently, c.Window, lim, c.MaxNodes, c.MaxFraction, l.Nodes)}
	}
	return Decision{Declare, "dead", fmt.Sprintf("its kubelet lease unchanged for %s and its agent's heartbeats for %s, holding %d claims", l.KubeletStill.Round(time.Second), l.AgentStill.Round(time.Second), l.Holds)}
}

// limit is how many nodes may be declared dead within the window, of n.
func (c Config) limit(n int) int {
	lim := c.MaxNodes
	if c.MaxFraction > 0 {
		if f := int(c.MaxFraction * float64(n)); f < lim {
			lim = f
		}
	}
	return lim
}

// Watch remembers, per key, the last mark seen and since when (the controller's monotonic
// clock): how long a detector has been still, from the first look. A new leader starts with
// an empty watch, so it waits a whole grace before it declares anything.
type Watch struct {
	seen map[string]seen
}

type seen struct {
	mark  string
	since time.Duration
}

// NewWatch returns a watch with nothing seen.
func NewWatch() *Watch { return &Watch{seen: map[string]seen{}} }

// Still records mark under key at now and returns how long it has been unchanged (0 at the
// first look and at every change).
func (w *Watch) Still(key, mark string, now time.Duration) time.Duration {
	s, ok := w.seen[key]
	if !ok || s.mark != mark {
		s = seen{mark: mark, since: now}
		w.seen[key] = s
	}
	return now - s.since
}

// Forget drops what was seen under keys not in keep (nodes gone from the cluster).
func (w *Watch) Forget(keep func(key string) bool) {
	for k := range w.seen {
		if !keep(k) {
			delete(w.seen, k)
		}
	}
}

// JoinMarks is one mark for several places' marks: it changes when any of them does, or when a
// place appears or goes.
func JoinMarks(marks []string) string {
	m := append([]string(nil), marks...)
	sort.Strings(m)
	return strings.Join(m, "|")
}
