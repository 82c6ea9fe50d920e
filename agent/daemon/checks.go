package daemon

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// Claim checks at fleet scale. A holder must learn within one renew interval that a claim of
// its own was taken over, fenced or force-released, but reading every claim every interval costs
// a read per claim per interval, forever. So a renewal round reads, per pool and namespace held
// in, this node's notice object (claim.Notice: whoever changes another node's hold leaves one),
// and reads a claim only when:
//   - a notice names it (with its epoch, or unreadably): the loss is seen within the interval;
//   - this process has not read it yet (at start, and a claim new to this node);
//   - its slow check is due: claim_check_interval since the last read, with a random part so
//     that claims mapped together are not all read in one round later (a claim object removed
//     by hand, or a notice lost to a crash, are found by it);
//   - its last read showed live fences this node keeps (re-blocklisted when due), or left a
//     problem or a lost claim: those are read every round, as before, and are few.
// A notice that cannot be read makes every claim of its place due: when in doubt, read.

// claimChecks remembers, per claim held, when (Mono) it is next due for a slow check.
type claimChecks struct {
	mu   sync.Mutex
	next map[state.Key]time.Duration
}

// due says whether m must be read this round, given the notices of its place.
func (c *claimChecks) due(m state.Mapping, now time.Duration, noticed bool, everyRound bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	next, seen := c.next[m.Key]
	return noticed || everyRound || !seen || now >= next
}

// checked records a read of m's claim at now: its next slow check is due in between
// three-quarters of every and every.
func (c *claimChecks) checked(k state.Key, now, every time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.next == nil {
		c.next = map[state.Key]time.Duration{}
	}
	c.next[k] = now + every - time.Duration(rand.Int64N(int64(every/4)+1)) //nolint:gosec // jitter that spreads reads, not a secret
}

// keep forgets the claims no longer held (keys not in held).
func (c *claimChecks) keep(held map[state.Key]bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.next {
		if !held[k] {
			delete(c.next, k)
		}
	}
}

// placeNotices is what a round read of this node's notices in one place.
type placeNotices struct {
	byImage map[string]claim.Notice
	ver     uint64
	failed  bool // unreadable: every claim of the place is due
}

// readNotices reads this node's notice object in every place of ms, at most renewConcurrency
// at once, each bounded by the renew interval.
func (r *renewer) readNotices(ctx context.Context, cl *cluster, store *claim.Store, ms []state.Mapping) map[place]*placeNotices {
	out := map[place]*placeNotices{}
	var places []place
	for _, m := range ms {
		p := place{m.Pool, m.Namespace}
		if out[p] == nil {
			out[p] = &placeNotices{}
			places = append(places, p)
		}
	}
	var mu sync.Mutex
	eachBounded(renewConcurrency, places, func(p place) {
		nctx, cancel := context.WithTimeout(ctx, r.every)
		ns, ver, err := store.Notices(nctx, p.pool, p.namespace)
		cancel()
		pn := &placeNotices{byImage: map[string]claim.Notice{}, ver: ver, failed: err != nil}
		if err != nil && ctx.Err() == nil {
			r.log.WithError(err).WithField("cluster", cl.cfg.ID).WithField("place", p.String()).Warn("notices not read: every claim held there is read this round instead")
		}
		for _, n := range ns {
			pn.byImage[n.Image] = n
		}
		mu.Lock()
		out[p] = pn
		mu.Unlock()
	})
	return out
}

// noticed says whether a notice names m's hold: its epoch, or none readable.
func (pn *placeNotices) noticed(m state.Mapping) bool {
	if pn == nil {
		return false
	}
	if pn.failed {
		return true
	}
	n, ok := pn.byImage[m.Image]
	return ok && (n.Epoch == 0 || n.Epoch == m.Epoch)
}

// clearNotices removes, in each place, the notices handled this round: those of claims read
// (whatever the read found: a lost claim is lost in this node's memory and state from then on),
// and those of holds this node no longer has. A notice written since the round's read stays.
func (r *renewer) clearNotices(ctx context.Context, cl *cluster, store *claim.Store, notices map[place]*placeNotices, read map[state.Key]bool, ms []state.Mapping) {
	held := map[place]map[string]state.Mapping{}
	for _, m := range ms {
		p := place{m.Pool, m.Namespace}
		if held[p] == nil {
			held[p] = map[string]state.Mapping{}
		}
		held[p][m.Image] = m
	}
	for p, pn := range notices {
		if pn == nil || pn.failed || len(pn.byImage) == 0 {
			continue
		}
		var done []string
		for img, n := range pn.byImage {
			m, ok := held[p][img]
			if !ok || read[m.Key] || (n.Epoch != 0 && n.Epoch != m.Epoch) {
				done = append(done, img)
			}
		}
		cctx, cancel := context.WithTimeout(ctx, r.every)
		err := store.ClearNotices(cctx, p.pool, p.namespace, done, pn.ver)
		cancel()
		if err != nil && ctx.Err() == nil {
			r.log.WithError(err).WithField("cluster", cl.cfg.ID).WithField("place", p.String()).Warn("notices not cleared: they are read again next round")
		}
	}
}
