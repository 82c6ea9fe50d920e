package saga

import (
	"fmt"
	"strings"
	"testing"

	"github.com/rbd-owner/rbd-owner/agent/state"
)

// TestDecideResume: what recovery does to each persisted phase, for every device found or not
// and every view of this node's claim. Each row of a grid is a claim view (unread, held,
// recorded, lost, absent, unreadable); its columns are the plan with the device found and not.
func TestDecideResume(t *testing.T) {
	views := []claimView{claimUnread, claimHeld, claimRecorded, claimLost, claimAbsent, claimUnreadable}
	type grid [6][2]resumePlan // [view][found, not found]
	cases := []struct {
		name string
		in   resumeInput
		want grid
	}{
		{"claiming", resumeInput{Phase: state.Claiming, Claimed: true}, grid{
			{planReadClaim, planReadClaim}, // the hold is read first
			{planRecord, planUndo},         // held: the device recorded, or the claim released
			{planAdopt, planUndo},          // recorded: the device adopted
			{planRemoveDevice, planDrop},   // lost at the record: the device removed
			{planLeaveDevice, planDrop},    // no hold of this node: not its device
			{planRetry, planRetry},         // unreadable: kept, tried again
		}},
		{"claiming snapshot", resumeInput{Phase: state.Claiming, Claimed: false}, grid{
			{planReadClaim, planReadClaim},
			{planRecord, planUndo},
			{planAdopt, planUndo},
			{planRemoveDevice, planDrop},
			{planLeaveDevice, planDrop},
			{planRetry, planRetry},
		}},
		{"claimed", resumeInput{Phase: state.Claimed, Claimed: true}, grid{
			{planRecord, planUndo}, // the record step is the claim's check; Release checks the hold
			{planRecord, planUndo},
			{planAdopt, planUndo},
			{planRemoveDevice, planUndo},
			{planRemoveDevice, planUndo},
			{planRetry, planUndo},
		}},
		{"mapped", resumeInput{Phase: state.Mapped, Claimed: true, Addressed: true}, grid{
			{planKeep, planDeviceLost},
			{planKeep, planDeviceLost},
			{planKeep, planDeviceLost},
			{planKeepFenced, planDeviceLost}, // taken or fenced: kept blocklisted
			{planKeep, planDeviceLost},       // the record vanished: not cut off
			{planKeep, planDeviceLost},
		}},
		{"mapped, fenced lately", resumeInput{Phase: state.Mapped, Claimed: true, Addressed: true, SelfFenced: true}, grid{
			{planKeep, planDeviceLost},
			{planKeep, planDeviceLost},
			{planKeep, planDeviceLost},
			{planKeep, planDeviceLost},
			{planKeep, planDeviceLost},
			{planKeep, planDeviceLost},
		}},
		{"mapped, no client address", resumeInput{Phase: state.Mapped, Claimed: true}, grid{
			{planKeep, planDeviceLost},
			{planKeep, planDeviceLost},
			{planKeep, planDeviceLost},
			{planKeep, planDeviceLost}, // it could not be fenced alone
			{planKeep, planDeviceLost},
			{planKeep, planDeviceLost},
		}},
		{"unmapping", resumeInput{Phase: state.Unmapping, Claimed: true, Addressed: true}, grid{
			{planUnmap, planUndo}, // the device removed first; Release checks the hold
			{planUnmap, planUndo},
			{planUnmap, planUndo},
			{planUnmap, planUndo},
			{planUnmap, planUndo},
			{planUnmap, planUndo},
		}},
		{"unmapping snapshot", resumeInput{Phase: state.Unmapping, Claimed: false, Addressed: true}, grid{
			{planUnmap, planDrop},
			{planUnmap, planDrop},
			{planUnmap, planDrop},
			{planUnmap, planDrop},
			{planUnmap, planDrop},
			{planUnmap, planDrop},
		}},
		{"unknown phase", resumeInput{Phase: "bogus", Claimed: true}, grid{
			{planKeep, planKeep},
			{planKeep, planKeep},
			{planKeep, planKeep},
			{planKeep, planKeep},
			{planKeep, planKeep},
			{planKeep, planKeep},
		}},
	}
	for _, c := range cases {
		for i, v := range views {
			for j, found := range []bool{true, false} {
				in := c.in
				in.Configured, in.Device, in.Claim = true, found, v
				if got := decideResume(in); got != c.want[i][j] {
					t.Errorf("%s, device found %v, claim %s: plan %s, want %s", c.name, found, v, got, c.want[i][j])
				}
				// a cluster no longer configured: left alone, whatever else is known
				in.Configured = false
				if got := decideResume(in); got != planLeaveAlone {
					t.Errorf("%s, device found %v, claim %s, cluster gone: plan %s, want %s", c.name, found, v, got, planLeaveAlone)
				}
			}
		}
	}
}

// TestDecideResumeEnds: following the plans, with each step's possible answers, every
// phase ends (a plan that drops, keeps or retries) within a few steps: Resume's loop ends.
func TestDecideResumeEnds(t *testing.T) {
	terminal := map[resumePlan]bool{planLeaveAlone: true, planKeep: true, planRetry: true, planAdopt: true, planRemoveDevice: true,
		planLeaveDevice: true, planUndo: true, planDrop: true, planDeviceLost: true, planKeepFenced: true}
	// next are the inputs a step may leave (its possible answers)
	next := func(in resumeInput, p resumePlan) []resumeInput {
		var out []resumeInput
		switch p {
		case planReadClaim:
			for _, v := range []claimView{claimHeld, claimAbsent, claimUnreadable} {
				n := in
				n.Claim = v
				out = append(out, n)
			}
		case planRecord:
			for _, v := range []claimView{claimRecorded, claimLost, claimUnreadable} {
				n := in
				n.Claim = v
				out = append(out, n)
			}
		case planUnmap:
			n := in
			n.Device = false
			out = append(out, n)
		}
		return out
	}
	var walk func(in resumeInput, path []string)
	walk = func(in resumeInput, path []string) {
		p := decideResume(in)
		path = append(path, p.String())
		if len(path) > 4 {
			t.Fatalf("%+v: no end after %s", in, strings.Join(path, " → "))
		}
		if terminal[p] {
			return
		}
		steps := next(in, p)
		if len(steps) == 0 {
			t.Fatalf("%+v: plan %s neither ends nor moves on", in, p)
		}
		for _, n := range steps {
			walk(n, path)
		}
	}
	for _, ph := range []state.Phase{state.Claiming, state.Claimed, state.Mapped, state.Unmapping} {
		for _, found := range []bool{true, false} {
			for _, claimed := range []bool{true, false} {
				walk(resumeInput{Phase: ph, Configured: true, Claimed: claimed, Addressed: ph == state.Mapped, Device: found}, nil)
			}
		}
	}
	if got := fmt.Sprint(planKeepFenced, " ", claimUnreadable); got != "keep-fenced unreadable" {
		t.Errorf("names: %q", got)
	}
}
