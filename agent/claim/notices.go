package claim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/claim/record"
)

// noticeBox is the notices sub-protocol: a note left in a node's notice object when another
// node changed its hold (a takeover, a fence, a force release), so that its agent looks at
// once rather than at its slow check; and this node's own notices, read and cleared. Notices
// that could not be written wait here, under their own lock, for RetryNotices.
type noticeBox struct {
	b    Backend
	self string
	now  func() time.Time

	mu      sync.Mutex
	pending []pendingNotice
}

// leave leaves a notice of what was done to each holder of img, this node included (an admin
// may fence this node's own hold from it), and returns the errors (the change itself is done).
// A notice that could not be written is kept and tried again by RetryNotices; one lost all
// the same (this process ends first) is made up for by the holder's slow check.
func (n *noticeBox) leave(ctx context.Context, img Image, what string, holds map[string]uint64) []error {
	var errs []error
	nodes := make([]string, 0, len(holds))
	for n := range holds {
		nodes = append(nodes, n)
	}
	sort.Strings(nodes)
	for _, node := range nodes {
		v, err := json.Marshal(Notice{Image: img.Image, Epoch: holds[node], What: what, By: n.self, At: n.now().UTC()})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		p := pendingNotice{img: img, node: node, value: v}
		if err := n.write(ctx, p); err != nil {
			n.mu.Lock()
			if len(n.pending) < maxPendingNotices {
				n.pending = append(n.pending, p)
			}
			n.mu.Unlock()
			errs = append(errs, err)
		}
	}
	return errs
}

// pendingNotice is a notice not written yet.
type pendingNotice struct {
	img   Image
	node  string
	value []byte
}

// maxPendingNotices bounds the notices kept for another try.
const maxPendingNotices = 4096

func (n *noticeBox) write(ctx context.Context, p pendingNotice) error {
	if _, err := n.b.SetKeys(ctx, p.img, record.NoticeObject(p.node), map[string][]byte{p.img.Image: p.value}); err != nil {
		return fmt.Errorf("tell node %s that its hold on %s changed: %w", p.node, p.img, err)
	}
	return nil
}

// retry tries again to write the notices that could not be written, and returns how
// many are still pending and the errors of this try.
func (n *noticeBox) retry(ctx context.Context) (int, []error) {
	n.mu.Lock()
	todo := n.pending
	n.pending = nil
	n.mu.Unlock()
	var left []pendingNotice
	var errs []error
	for _, p := range todo {
		if ctx.Err() != nil {
			left = append(left, p)
			continue
		}
		if err := n.write(ctx, p); err != nil {
			left = append(left, p)
			errs = append(errs, err)
		}
	}
	n.mu.Lock()
	n.pending = append(left, n.pending...)
	still := len(n.pending)
	n.mu.Unlock()
	return still, errs
}

// read reads this node's notices in a pool and namespace, and the notice object's version
// (for ClearNotices); none when there is no notice object.
func (n *noticeBox) read(ctx context.Context, pool, namespace string) ([]Notice, uint64, error) {
	loc := Image{Pool: pool, Namespace: namespace}
	kv, ver, err := n.b.ReadKeys(ctx, loc, record.NoticeObject(n.self), nil)
	if err != nil {
		return nil, 0, fmt.Errorf("read this node's notices in %s: %w", record.PoolNS(loc), err)
	}
	out := make([]Notice, 0, len(kv))
	for k, v := range kv {
		nt := Notice{Image: k}
		if err := json.Unmarshal(v, &nt); err != nil || nt.Image != k {
			nt = Notice{Image: k, What: "changed (its notice is unreadable)"} // epoch 0: checked whatever the epoch
		}
		out = append(out, nt)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Image < out[j].Image })
	return out, ver, nil
}

// clear removes handled notices, only if the notice object is still at version ver (a
// notice written since is read at the next round).
func (n *noticeBox) clear(ctx context.Context, pool, namespace string, images []string, ver uint64) error {
	if len(images) == 0 {
		return nil
	}
	loc := Image{Pool: pool, Namespace: namespace}
	err := n.b.RemoveKeys(ctx, loc, record.NoticeObject(n.self), images, ver)
	if err != nil && !errors.Is(err, ErrConflict) {
		return fmt.Errorf("clear this node's notices in %s: %w", record.PoolNS(loc), err)
	}
	return nil
}

// Notice is one notice of a changed hold.
type Notice struct {
	Image string    `json:"image"`
	Epoch uint64    `json:"epoch"` // the hold's epoch (the node's fencing token) that was changed
	What  string    `json:"what"`  // "taken over", "fenced", "force-released"
	By    string    `json:"by"`
	At    time.Time `json:"at"`
}
