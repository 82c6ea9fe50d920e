package daemon

import (
	"sort"
	"sync"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/state"
)

// takeoverWatches are the images a map was refused for because another node holds them. The
// claim store trusts an observation of a holder only while it is looked at again at least once
// a lease; a caller that retries less often (kubelet backs off to two minutes, a person reads
// the refusal and then asks again with takeover) would start a new watch at every retry and
// wait a whole lease each time. So the agent keeps watching such an image itself, one read of
// the claim and of each holder's heartbeat per renew interval, for watchFor after the last
// refusal: real looks, taken often enough, that a later takeover (by an admin, or by the policy)
// can rely on.
type takeoverWatches struct {
	mu    sync.Mutex
	until map[state.Key]time.Time
}

// watchFor is how long an image is watched after the last refused map: longer than any
// caller's backoff between retries (kubelet's is at most about two minutes).
func watchFor(lease time.Duration) time.Duration { return max(5*time.Minute, 3*lease) }

func (w *takeoverWatches) add(k state.Key, until time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.until == nil {
		w.until = map[state.Key]time.Time{}
	}
	w.until[k] = until
}

func (w *takeoverWatches) drop(k state.Key) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.until, k)
}

// due returns the images of a cluster still to watch at now, and forgets the others.
func (w *takeoverWatches) due(clusterID string, now time.Time) []state.Key {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []state.Key
	for k, until := range w.until {
		switch {
		case now.After(until):
			delete(w.until, k)
		case k.Cluster == clusterID:
			out = append(out, k)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}
