package saga

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/fault"
	"github.com/rbd-owner/rbd-owner/agent/image"
)

// TestRefusalIsData: a refusal carries the image, the holders, the kind, the retry time and the
// next steps for the caller's role and the policy; the message is the claim's facts followed by
// the same steps in one phrase, and a takeover that waits for a lease adds no advice.
func TestRefusalIsData(t *testing.T) {
	img := image.Ref{Pool: "rbd", Image: "img"}
	since := time.Date(2026, 12, 7, 6, 0, 0, 0, time.UTC)
	holder := claim.Holder{NodeID: "node-a", Hostname: "host-a", NodeAddr: "10.0.0.1", ClientAddr: "10.0.0.1:0/7", Epoch: 4, AcquiredAt: since}
	for _, tc := range []struct {
		name     string
		admin    bool
		policy   string
		held     claim.HeldError
		first    api.Step
		advice   string // "" when none
		retry    int64
		noReason bool
	}{
		{name: "admin, manual", admin: true, policy: config.TakeoverManual, held: claim.HeldError{Block: claim.BlockNoTakeover, Reason: "the request takes over only holds an admin fenced"},
			first: api.Step{Run: "rbd-owner fence --node node-a"}, advice: "if node node-a is dead: run `rbd-owner fence --node node-a`", noReason: true},
		{name: "CSI, manual", policy: config.TakeoverManual, held: claim.HeldError{Block: claim.BlockNoTakeover, Reason: "the request takes over only holds an admin fenced"},
			first: api.Step{Run: "rbd-owner fence --node node-a"}, advice: "this caller (CSI role) may not take it over under takeover_policy: manual", noReason: true},
		{name: "CSI, after-fence, not covered", policy: config.TakeoverAfterFence, held: claim.HeldError{Block: claim.BlockNotCovered, Reason: "node node-a's mapping (10.0.0.1:0/7) is on no blocklist entry"},
			first: api.Step{Run: "rbd-owner fence --node node-a"}, advice: "under takeover_policy: after-fence a map takes it over"},
		{name: "CSI, after-lease-expiry, lease live", policy: config.TakeoverAfterLeaseExpiry,
			held:  claim.HeldError{Block: claim.BlockLeaseLive, Takeover: true, Reason: "takeover refused while node node-a's lease is live", Leases: map[string]claim.LeaseView{"node-a": {RetryAfter: 11500 * time.Millisecond}}},
			first: api.Step{}, retry: 12},
		{name: "admin takeover, lease live", admin: true, policy: config.TakeoverManual,
			held:  claim.HeldError{Block: claim.BlockLeaseLive, Takeover: true, Reason: "takeover refused while node node-a's lease is live", Leases: map[string]claim.LeaseView{"node-a": {RetryAfter: time.Second}}},
			first: api.Step{Run: "rbd-owner map --takeover rbd/img"}, retry: 1},
	} {
		s := &Sagas{Config: &config.Config{TakeoverPolicy: tc.policy, Clusters: []config.Cluster{{ID: "lab"}}}}
		held := tc.held
		held.Image, held.Access, held.Epoch, held.Holders, held.BlockedBy = img, claim.RWO, 4, []claim.Holder{holder}, "node-a"
		wrapped := fmt.Errorf("acquire %s: %w", img, &held)
		err := s.refusal(Caller{Admin: tc.admin}, target{img: img, spec: img}, wrapped)
		var r *Refusal
		if !errors.As(err, &r) || !errors.Is(err, claim.ErrClaimedElsewhere) || fault.KindOf(err) != fault.ClaimedElsewhere {
			t.Fatalf("%s: %v is no refusal held elsewhere", tc.name, err)
		}
		e := &api.Error{Message: err.Error()}
		r.Details(e)
		if e.Image != "rbd/img" || e.Owner == nil || e.Owner.NodeID != "node-a" || len(e.Holders) != 1 || e.Holders[0].ClientAddr != "10.0.0.1:0/7" ||
			e.Block != held.Block.String() || e.RetryAfterSeconds != tc.retry || (e.Reason == "") != tc.noReason {
			t.Errorf("%s: details %+v", tc.name, e)
		}
		if len(e.NextSteps) == 0 || e.NextSteps[0].Run != tc.first.Run || e.NextSteps[0].Why == "" {
			t.Errorf("%s: next steps %+v, want first run %q", tc.name, e.NextSteps, tc.first.Run)
		}
		switch {
		case tc.advice == "" && (e.Advice != "" || err.Error() != wrapped.Error()):
			t.Errorf("%s: a takeover waiting for a lease is told more than its reason: %q", tc.name, err)
		case tc.advice != "" && (!strings.HasPrefix(e.Advice, tc.advice) || err.Error() != wrapped.Error()+"; "+e.Advice):
			t.Errorf("%s: message %q, want the facts then the advice starting %q", tc.name, err, tc.advice)
		}
		for _, st := range e.NextSteps {
			if strings.Contains(st.Run, "release --force") || strings.Contains(st.Why, "release --force") && held.Block != claim.BlockNoFenceAddr {
				t.Errorf("%s: a step asks for a release --force: %+v", tc.name, st)
			}
		}
	}
	// this node's own hold, fenced by an admin: released before it is mapped here again, said
	// in the words of before and as a step
	s := &Sagas{Config: &config.Config{Clusters: []config.Cluster{{ID: "lab"}}}}
	lost := fmt.Errorf("acquire %s: %w", img, &claim.LostError{Image: img, Epoch: 3, Why: "this node's hold was fenced by an admin", OwnFenced: true})
	err := s.refusal(Caller{}, target{img: img, spec: img}, lost)
	e := &api.Error{}
	if d, ok := err.(api.Detailer); ok {
		d.Details(e)
	}
	if !errors.Is(err, claim.ErrFenced) || err.Error() != "acquire rbd/img: claim on rbd/img at epoch 3 is lost: this node's hold was fenced by an admin; release it (rbd-owner release --force) before mapping again" ||
		e.Image != "rbd/img" || len(e.NextSteps) != 1 || e.NextSteps[0].Run != "rbd-owner release --force rbd/img" {
		t.Fatalf("own fenced hold: %q, details %+v", err, e)
	}
	// any other error is not a refusal
	if err := s.refusal(Caller{}, target{img: img}, claim.ErrFenced); !errors.Is(err, claim.ErrFenced) || errors.As(err, new(*Refusal)) {
		t.Fatalf("a lost claim became a refusal: %v", err)
	}
}
