package failover

import (
	"strings"
	"testing"
	"time"
)

func dead() Look {
	return Look{KubeletStill: time.Minute, AgentStill: time.Minute, AgentRead: true, Holds: 2, HoldsRead: true, Nodes: 3}
}

func TestDecide(t *testing.T) {
	c := Defaults
	for _, tc := range []struct {
		name string
		st   State
		look func(*Look)
		want Step
		why  string
	}{
		{"dead for both detectors, holding claims", State{}, nil, Declare, "kubelet lease unchanged"},
		{"kubelet renews (cut off from the cluster only)", State{}, func(l *Look) { l.KubeletStill = 19 * time.Second }, Wait, "kubelet renews"},
		{"agent renews (cut off from the API server only)", State{}, func(l *Look) { l.AgentStill = 5 * time.Second }, Wait, "agent renews"},
		{"heartbeats not all read", State{}, func(l *Look) { l.AgentRead = false }, Wait, "could not all be read"},
		{"holds not all read", State{}, func(l *Look) { l.HoldsRead = false }, Wait, "holds could not all be read"},
		{"holds nothing", State{}, func(l *Look) { l.Holds = 0 }, Wait, "left to Kubernetes"},
		{"one node declared within the window already", State{}, func(l *Look) { l.DeclaredRecently = 1; l.Nodes = 10 }, Refuse, "at most 1 may be"},
		{"a fraction of a small cluster", State{}, func(l *Look) { l.Nodes = 1 }, Refuse, "max fraction"},
		{"fencing: entries not read back yet", State{Phase: PhaseFencing}, nil, Fence, "read back in force"},
		{"fencing: in force", State{Phase: PhaseFencing}, func(l *Look) { l.InForce = true }, Advance, "in force"},
		{"fencing finishes even if the node renews again", State{Phase: PhaseFencing}, func(l *Look) { l.KubeletStill, l.AgentStill = 0, 0 }, Fence, ""},
		{"fenced: taint", State{Phase: PhaseFenced}, nil, Taint, "tainted"},
		{"tainted: move", State{Phase: PhaseTainted}, nil, Move, "deleted"},
		{"a hold with no client recorded", State{}, func(l *Look) { l.Unrecorded = 1 }, Refuse, "whole address"},
		{"moved: not back", State{Phase: PhaseMoved}, nil, Wait, "stay until"},
		{"moved: back, the mappings not gone yet", State{Phase: PhaseMoved}, func(l *Look) { l.KubeletStill, l.AgentStill = 0, 0 }, Wait, "must tolerate the out-of-service taint"},
		{"moved: rebooted", State{Phase: PhaseMoved}, func(l *Look) { l.Rebooted = true }, Lift, "rebooted"},
		{"moved: fenced mappings gone", State{Phase: PhaseMoved}, func(l *Look) { l.FencesEnded = true }, Lift, "gone"},
		{"moved: mappings gone but a whole-address fence", State{Phase: PhaseMoved, Whole: true}, func(l *Look) { l.FencesEnded = true }, Stuck, "whole address"},
		{"moved: whole-address fence, rebooted", State{Phase: PhaseMoved, Whole: true}, func(l *Look) { l.Rebooted = true }, Lift, ""},
		{"unknown phase", State{Phase: "later"}, nil, Wait, "unknown phase"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := dead()
			if tc.look != nil {
				tc.look(&l)
			}
			d := Decide(c, tc.st, l)
			if d.Step != tc.want || !strings.Contains(d.Why, tc.why) {
				t.Fatalf("Decide = %s (%s), want %s (…%s…)", d.Step, d.Why, tc.want, tc.why)
			}
		})
	}
}

// Nothing on Kubernetes before the fence is in force: from no state, no sequence of looks
// reaches Move without passing Fence and Advance (the decision is a function of the persisted
// phase: the phases are the order).
func TestMoveOnlyAfterTheFenceIsInForce(t *testing.T) {
	for _, st := range []State{{}, {Phase: PhaseFencing}} {
		for _, inForce := range []bool{false, true} {
			l := dead()
			l.InForce = inForce
			if d := Decide(Defaults, st, l); d.Step == Move || d.Step == Taint {
				t.Fatalf("phase %q, in force %v: Move", st.Phase, inForce)
			}
		}
	}
}

func TestWatchCountsFromTheFirstLook(t *testing.T) {
	w := NewWatch()
	if got := w.Still("n", "a", 10*time.Second); got != 0 {
		t.Fatalf("first look: still %s, want 0", got)
	}
	if got := w.Still("n", "a", 25*time.Second); got != 15*time.Second {
		t.Fatalf("still %s, want 15s", got)
	}
	if got := w.Still("n", "b", 30*time.Second); got != 0 {
		t.Fatalf("a new mark: still %s, want 0", got)
	}
	w.Forget(func(string) bool { return false })
	if got := w.Still("n", "b", 40*time.Second); got != 0 {
		t.Fatalf("after forgetting: still %s, want 0", got)
	}
	if JoinMarks([]string{"b", "a"}) != JoinMarks([]string{"a", "b"}) || JoinMarks([]string{"a"}) == JoinMarks([]string{"a", "b"}) {
		t.Fatal("JoinMarks: order matters or a place's arrival does not")
	}
}

func TestConfigValidate(t *testing.T) {
	if err := Defaults.Validate(); err != nil {
		t.Fatal(err)
	}
	bad := Defaults
	bad.KubeletGrace = 5 * time.Second
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "kubelet grace") {
		t.Fatalf("a 5 s kubelet grace: %v", err)
	}
}
