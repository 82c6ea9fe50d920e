// Package nodestate is what this node's agent knows of its own node, beyond the mappings the
// state file records: what is wrong and since when, which claims it has lost, the devices
// mapped behind its back and their verdicts, the fences it keeps, its self-fences on lost
// mappings, where its heartbeat fails, and other nodes' clock skews. One lock guards it all;
// the daemon's loops, sagas, status and metrics read and change it only through these
// methods. Nothing here talks to a cluster or the kernel.
//
// What this node has mapped and claimed is the persisted record (package state, its own
// lock); Node answers from it which claims are held here.
package nodestate

import (
	"sort"
	"sync"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/state"
)

// Node is the actual state of this node's world, as its agent last saw it.
type Node struct {
	mappings *state.Store

	mu         sync.Mutex
	problems   map[state.Key]Problem
	lost       map[state.Key]bool
	selfFences map[state.Key]SelfFence
	unmanaged  map[int]Unmanaged
	skews      map[string]Skew
	kept       map[string]KeptFences
	failing    map[string]bool // heartbeat places ("cluster/pool/ns") whose last write failed
}

// New is the node whose persisted mappings are in mappings.
func New(mappings *state.Store) *Node {
	return &Node{
		mappings: mappings,
		problems: map[state.Key]Problem{}, lost: map[state.Key]bool{}, selfFences: map[state.Key]SelfFence{},
		unmanaged: map[int]Unmanaged{}, skews: map[string]Skew{}, kept: map[string]KeptFences{}, failing: map[string]bool{},
	}
}

// Holds says whether a persisted mapping stands for a claim this node holds (it may have lost
// it since: IsLost): a claimed image, claimed or mapped.
func Holds(m state.Mapping) bool {
	return m.Claimed && (m.Phase == state.Mapped || m.Phase == state.Claimed)
}

// Held lists the claims this node holds in cluster ("" for every cluster), lost ones included.
func (n *Node) Held(cluster string) []state.Mapping {
	var out []state.Mapping
	for _, m := range n.mappings.All() {
		if Holds(m) && (cluster == "" || m.Cluster == cluster) {
			out = append(out, m)
		}
	}
	return out
}

// HeldCount is the number of claims this node holds and has not lost.
func (n *Node) HeldCount() int {
	held := 0
	for _, m := range n.Held("") {
		if !n.IsLost(m.Key) {
			held++
		}
	}
	return held
}

// Problem is what is wrong with one image's mapping or claim, and since when something has
// been (the message may change while the trouble lasts; Since is when it began).
type Problem struct {
	Key   state.Key
	Msg   string
	Since time.Time
}

// SetProblem records what is wrong with k, or ("") that nothing is any more, which also ends a
// lost claim's note.
func (n *Node) SetProblem(k state.Key, msg string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if msg == "" {
		delete(n.problems, k)
		delete(n.lost, k)
		return
	}
	n.noteProblemLocked(k, msg)
}

func (n *Node) noteProblemLocked(k state.Key, msg string) {
	old, had := n.problems[k]
	if !had {
		old.Since = time.Now()
	}
	n.problems[k] = Problem{Key: k, Msg: msg, Since: old.Since}
}

// Problem is k's problem ("" when it has none), and since when (zero then).
func (n *Node) Problem(k state.Key) (string, time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	p := n.problems[k]
	return p.Msg, p.Since
}

// Problems lists every image's problem, in key order.
func (n *Node) Problems() []Problem {
	n.mu.Lock()
	out := make([]Problem, 0, len(n.problems))
	for _, p := range n.problems {
		out = append(out, p)
	}
	n.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Key.String() < out[j].Key.String() })
	return out
}

// SetLost records that this node's claim on k is gone (fenced or taken over), why being its
// problem; it says whether the claim was not known lost before.
func (n *Node) SetLost(k state.Key, why string) (first bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	first = !n.lost[k]
	n.noteProblemLocked(k, why)
	n.lost[k] = true
	return first
}

// IsLost says whether this node knows its claim on k is gone.
func (n *Node) IsLost(k state.Key) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.lost[k]
}

// SelfFence is the blocklist entry this node made for its own lost mapping: Until is when it
// ends as the monitors recorded it, on their clock; At is when it was made, on this node's.
type SelfFence struct {
	Addr, Device string
	Until, At    time.Time
}

// NoteSelfFence records the self-fence of k's lost mapping.
func (n *Node) NoteSelfFence(k state.Key, f SelfFence) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.selfFences[k] = f
}

// SelfFenceOf is the self-fence last made for k's lost mapping.
func (n *Node) SelfFenceOf(k state.Key) (SelfFence, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	f, ok := n.selfFences[k]
	return f, ok
}

// SetPlaceFailing records whether the last heartbeat in a cluster's pool and namespace failed.
func (n *Node) SetPlaceFailing(cluster, pool, ns string, failing bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	k := cluster + "/" + pool + "/" + ns
	if failing {
		n.failing[k] = true
	} else {
		delete(n.failing, k)
	}
}

// PlaceFailing says whether the last heartbeat in a cluster's pool and namespace failed.
func (n *Node) PlaceFailing(cluster, pool, ns string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.failing[cluster+"/"+pool+"/"+ns]
}

// Counts is how many images have a problem and how many devices are unmanaged.
func (n *Node) Counts() (problems, unmanaged int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.problems), len(n.unmanaged)
}
