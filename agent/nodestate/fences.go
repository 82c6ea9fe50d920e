package nodestate

import (
	"sort"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/claim"
)

func sortUnmanaged(us []Unmanaged) {
	sort.Slice(us, func(i, j int) bool { return us[i].Dev.ID < us[j].Dev.ID })
}

// KeptFences is what NoteKept remembers of one claim's live fences, and when (At, on the
// agent's monotonic clock).
type KeptFences struct {
	Cluster string
	Place   string // the claim's pool and namespace
	Fences  []claim.KeptFence
	At      time.Duration
}

func keptKey(cluster string, img claim.Image) string { return cluster + "/" + img.String() }

// NoteKept remembers the live fences of img as last seen (none: forgets it).
func (n *Node) NoteKept(cluster string, img claim.Image, kf KeptFences) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(kf.Fences) == 0 {
		delete(n.kept, keptKey(cluster, img))
		return
	}
	n.kept[keptKey(cluster, img)] = kf
}

// KeepsFences says whether img's claim showed live fences at its last read.
func (n *Node) KeepsFences(cluster string, img claim.Image) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	_, ok := n.kept[keptKey(cluster, img)]
	return ok
}

// ForgetKeptIn drops the notes of the fences of the claims in a cluster's place that are not
// held (held: keptKey-style "cluster/image" names).
func (n *Node) ForgetKeptIn(cluster, place string, held map[string]bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for k, kf := range n.kept {
		if kf.Cluster == cluster && kf.Place == place && !held[k] {
			delete(n.kept, k)
		}
	}
}

// HeldName is how ForgetKeptIn's held names a claim.
func HeldName(cluster string, img claim.Image) string { return keptKey(cluster, img) }

// Kept lists the fences noted at or after since (older notes are dropped: of claims no longer
// seen).
func (n *Node) Kept(since time.Duration) []KeptFences {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []KeptFences
	for k, kf := range n.kept {
		if kf.At < since {
			delete(n.kept, k)
			continue
		}
		out = append(out, kf)
	}
	return out
}
