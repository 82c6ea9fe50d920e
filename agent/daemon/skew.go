package daemon

import (
	"fmt"
	"sort"
	"time"
)

// skewReportEvery bounds how often one node's skew is logged again when it has not changed.
const skewReportEvery = 10 * time.Minute

// noteSkew hears from the claim store that a holder's heartbeat, just seen to change, carries
// a timestamp off this node's clock. No decision depends on it (leases are judged on this
// node's own clock); people are told, in status and the journal.
// A skew of 0 says that node's clock is fine now: its report ends at once.
func (d *Daemon) noteSkew(cluster, node string, by time.Duration) {
	old, had := d.node.NoteSkew(cluster, node, by)
	if by == 0 {
		if had {
			d.log.WithField("cluster", cluster).WithField("node", node).Info("clock skew gone: node " + node + "'s clock agrees with this node's again")
		}
		return
	}
	if had && (old.By-by).Abs() < time.Second && time.Since(old.Seen) < skewReportEvery {
		return
	}
	d.log.WithField("cluster", cluster).WithField("node", node).WithField("skew", by.Round(time.Millisecond)).
		Warn(skewText(node, by) + " (leases do not depend on it: each node judges them on its own clock)")
}

func skewText(node string, by time.Duration) string {
	if by > 0 {
		return fmt.Sprintf("clock skew: node %s's clock is %s ahead of this node's", node, by.Round(time.Second))
	}
	return fmt.Sprintf("clock skew: node %s's clock is %s behind this node's", node, (-by).Round(time.Second))
}

// skewProblems lists the skews seen in the last skewReportEvery and not seen gone since, for
// status.
func (d *Daemon) skewProblems() []string {
	var out []string
	for _, s := range d.node.Skews(skewReportEvery) {
		out = append(out, skewText(s.Node, s.By)+" (cluster "+s.Cluster+")"+sinceText(s.Since))
	}
	sort.Strings(out)
	return out
}
