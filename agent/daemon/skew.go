package daemon

import (
	"fmt"
	"sort"
	"time"
)

// skew is how far another node's clock was seen off this node's.
type skew struct {
	cluster, node string
	by            time.Duration // positive: that node's clock is ahead
	seen          time.Time     // when it was last seen
	since         time.Time     // when it was first seen (while it lasts)
}

// skewReportEvery bounds how often one node's skew is logged again when it has not changed.
const skewReportEvery = 10 * time.Minute

// noteSkew hears from the claim store that a holder's heartbeat, just seen to change, carries
// a timestamp off this node's clock. No decision depends on it (leases are judged on this
// node's own clock); people are told, in status and the journal.
// A skew of 0 says that node's clock is fine now: its report ends at once.
func (d *Daemon) noteSkew(cluster, node string, by time.Duration) {
	key := cluster + "/" + node
	d.mu.Lock()
	old, had := d.skews[key]
	if by == 0 {
		delete(d.skews, key)
		d.mu.Unlock()
		if had {
			d.log.WithField("cluster", cluster).WithField("node", node).Info("clock skew gone: node " + node + "'s clock agrees with this node's again")
		}
		return
	}
	since := time.Now()
	if had {
		since = old.since
	}
	d.skews[key] = skew{cluster: cluster, node: node, by: by, seen: time.Now(), since: since}
	d.mu.Unlock()
	if had && (old.by-by).Abs() < time.Second && time.Since(old.seen) < skewReportEvery {
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
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for key, s := range d.skews {
		if time.Since(s.seen) > skewReportEvery {
			delete(d.skews, key)
			continue
		}
		out = append(out, skewText(s.node, s.by)+" (cluster "+s.cluster+")"+sinceText(s.since))
	}
	sort.Strings(out)
	return out
}
