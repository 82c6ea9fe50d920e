package nodestate

import (
	"sort"
	"time"
)

// Skew is how far another node's clock was seen off this node's.
type Skew struct {
	Cluster, Node string
	By            time.Duration // positive: that node's clock is ahead
	Seen          time.Time     // when it was last seen
	Since         time.Time     // when it was first seen (while it lasts)
}

// NoteSkew records a skew of node's clock (0: it is fine now, and its note ends); it returns
// the note before (had).
func (n *Node) NoteSkew(cluster, node string, by time.Duration) (old Skew, had bool) {
	key := cluster + "/" + node
	n.mu.Lock()
	defer n.mu.Unlock()
	old, had = n.skews[key]
	if by == 0 {
		delete(n.skews, key)
		return old, had
	}
	since := time.Now()
	if had {
		since = old.Since
	}
	n.skews[key] = Skew{Cluster: cluster, Node: node, By: by, Seen: time.Now(), Since: since}
	return old, had
}

// Skews lists the skews seen within the last within, by cluster and node; older ones are
// dropped.
func (n *Node) Skews(within time.Duration) []Skew {
	n.mu.Lock()
	var out []Skew
	for key, s := range n.skews {
		if time.Since(s.Seen) > within {
			delete(n.skews, key)
			continue
		}
		out = append(out, s)
	}
	n.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Cluster+"/"+out[i].Node < out[j].Cluster+"/"+out[j].Node })
	return out
}
