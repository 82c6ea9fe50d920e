package daemon

import (
	"sync"

	"github.com/rbd-owner/rbd-owner/agent/claim"
)

// unsettledHolds are the holds of this node that its heartbeats list, that the state does not
// name (it was rebuilt), and that the rebuild could not settle (settleHold): a device mapped here
// not adopted, a release that failed. This node still holds those claims, so their places'
// heartbeats go on (heartbeats.sync), and the renew round tries to settle them again
// (resettle) until none is left. Owned by the daemon; safe for concurrent use.
type unsettledHolds struct {
	mu     sync.Mutex
	holds  map[string]map[claim.Image]string // cluster → image → why not settled
	unread map[string]bool                   // clusters whose listed holds could not be read yet
}

// unlisted records whether cluster's listed holds are still to be read (settleCluster).
func (u *unsettledHolds) unlisted(cluster string, yes bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if !yes {
		delete(u.unread, cluster)
		return
	}
	if u.unread == nil {
		u.unread = map[string]bool{}
	}
	u.unread[cluster] = true
}

// pending says whether cluster has holds not settled, or not read yet.
func (u *unsettledHolds) pending(cluster string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.holds[cluster]) > 0 || u.unread[cluster]
}

// note records img's hold on cluster as not settled (why) or settled (why ""); a hold not
// settled stays listed in this node's heartbeat.
func (u *unsettledHolds) note(cluster string, img claim.Image, why string, store *claim.Store) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if why == "" {
		delete(u.holds[cluster], img)
		return
	}
	if u.holds == nil {
		u.holds = map[string]map[claim.Image]string{}
	}
	if u.holds[cluster] == nil {
		u.holds[cluster] = map[claim.Image]string{}
	}
	u.holds[cluster][img] = why
	store.NoteHold(img, true)
}

// why says why img's hold on cluster is not settled ("" when it is).
func (u *unsettledHolds) why(cluster string, img claim.Image) string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.holds[cluster][img]
}

// images are the holds of cluster not settled.
func (u *unsettledHolds) images(cluster string) []claim.Image {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []claim.Image
	for img := range u.holds[cluster] {
		out = append(out, img)
	}
	return out
}

// places are the places of cluster where a hold is not settled.
func (u *unsettledHolds) places(cluster string) map[place]bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := map[place]bool{}
	for img := range u.holds[cluster] {
		out[place{img.Pool, img.Namespace}] = true
	}
	return out
}

// isUnread says whether cluster's listed holds are still to be read (unlisted).
func (u *unsettledHolds) isUnread(cluster string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.unread[cluster]
}
