package claim

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"
)

// A swap mark guards the one bare remove of the protocol. Before the hold a fence protects is
// written, a short entry of that fence may be removed and added again with nothing else cutting
// its client (swapBare in enforce.go): nobody writes beside the fenced client yet. That holds only
// while no other claim of the image lands between the remove and the add: two claimers of a free
// record (or two takers of one dead hold) may both decide to remove, and the second's remove may
// land after the first claimed and mapped (model/fence.pml, swap-after-claim). So an Acquire that
// would remove an entry first writes a SwapMark into the record with a compare-and-set on the
// version it decided on, then removes and adds, then claims (the claim's write drops the mark):
//   - a claim decided on an older version loses its compare-and-set to the mark;
//   - a claimer that reads the mark refuses (busy, retry) while the mark lives;
//   - a record with a mark is written in format SwapFormat, which agents from before the mark
//     refuse to read (they fail closed for those seconds).
//
// Recovery: a claimer that stops between its mark and its claim leaves the mark and, perhaps,
// the entry removed with no claim written (the state before the fence: no second writer). Each
// other node judges the mark on its own monotonic clock from its first sight of it, and after
// swapMarkLife decides over it as if there were none (a missing entry is then added whole, by
// renewDue, before any claim); the next write of the record drops it. The marker itself removes
// only within swapMarkLife/2 of writing the mark, on its own clock, and drops a mark it leaves
// behind when its Acquire fails.

// swapMarkLife is how long a mark is honoured, from each observer's first sight of it.
const swapMarkLife = 2 * time.Minute

// errNeedsMark: a bare remove is needed, and this call has no mark in the record for it.
type errNeedsMark struct{ addr string }

func (e errNeedsMark) Error() string {
	return fmt.Sprintf("the entry %s must be removed and added again before the claim, under a swap mark", e.addr)
}

// swapSighting is this store's first sight (Mono) of an image's mark, by token.
type swapSighting struct {
	token string
	first time.Duration
}

// swapBusyError is the refusal of a claim beside another claimer's swap.
func swapBusyError(img Image, m *SwapMark, left time.Duration) error {
	return fmt.Errorf("%w: node %s is adding the blocklist entry %v again before its claim of %s (a removal and an add); retry in a few seconds (its mark is honoured for %s more)",
		ErrBusy, m.Node, m.Addrs, img, left.Round(time.Second))
}

// newSwapToken is a random token for one Acquire call's mark.
func newSwapToken() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// needsMark finds, in err, the bare remove an attempt needed (see errNeedsMark).
func needsMark(err error) (string, bool) {
	var nm errNeedsMark
	if errors.As(err, &nm) {
		return nm.addr, true
	}
	return "", false
}
