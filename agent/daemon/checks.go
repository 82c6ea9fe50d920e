package daemon

import (
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
