package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/image"
)

// TestRemoveOrphansPrintsWhatItKept: claims --remove-orphans prints each orphan removed and each
// kept with why and the next step; --force asks the agent to remove those too, and is for
// --remove-orphans only.
func TestRemoveOrphansPrintsWhatItKept(t *testing.T) {
	resp := api.OrphansResponse{Removed: []string{"rbd/free"}, Kept: []api.KeptOrphan{{Image: "rbd/held", HeldBy: []string{"node-a"},
		Why:      "its image is gone by name, but its claim is still held by node node-a (epoch 3): an image only renamed or moved to the trash keeps its data",
		NextStep: "check that rbd/held is really deleted, then `rbd-owner claims --remove-orphans --force --pool rbd`"}}}
	sock, seen := serve(t, 200, resp)
	code, out, errs := cli("--socket", sock, "claims", "--remove-orphans", "--pool", "rbd")
	want := "removed the orphaned claim of rbd/free\n" +
		"KEPT the orphaned claim of rbd/held: " + resp.Kept[0].Why + "; next: " + resp.Kept[0].NextStep + "\n" +
		"1 orphaned claims removed, 1 kept\n"
	if code != exitOK || out != want || errs != "" {
		t.Fatalf("exit %d, stdout %q, stderr %q; want stdout %q", code, out, errs, want)
	}
	if code, out, _ := cli("--socket", sock, "claims", "--remove-orphans", "--force", "--json"); code != exitOK || !strings.Contains(out, `"kept": [`) || !strings.Contains(out, `"next_step": "check that`) {
		t.Fatalf("--json: exit %d, stdout %q", code, out)
	}
	for i, force := range []bool{false, true} {
		var req api.OrphansRequest
		if err := json.Unmarshal([]byte(strings.SplitN((*seen)[i], " ", 3)[2]), &req); err != nil || req.Force != force {
			t.Errorf("request %d: %q (%v), want force %v", i, (*seen)[i], err, force)
		}
	}
	for _, tc := range []struct {
		args []string
		err  string
	}{
		{[]string{"claims", "--force"}, "rbd-owner claims: --force is for claims --remove-orphans"},
		{[]string{"claims", "--remove-orphans", "--force", "--node", "node-a"}, "rbd-owner claims: --remove-orphans removes the orphans of a pool (--pool) or of every pool, not of a node (--node)"},
	} {
		code, out, errs := cli(append([]string{"--socket", sock}, tc.args...)...)
		if code != exitUsage || out != "" || !strings.HasPrefix(errs, tc.err+"\n") {
			t.Errorf("%q: exit %d stdout %q stderr %q; want exit 2 and %q", tc.args, code, out, errs, tc.err)
		}
	}
	if len(*seen) != 2 {
		t.Errorf("a usage error reached the agent: %q", *seen)
	}
}

// TestFenceNodeWithNothingLeftSucceeds: a node's fence that finds every hold its heartbeats list
// taken over or released prints the agent's note and exits 0 (a script may run it twice).
func TestFenceNodeWithNothingLeftSucceeds(t *testing.T) {
	note := "nothing of node node-a is held any more: its holds were taken over or released (its heartbeats list 1 images, none of whose claims names it as a holder); nothing fenced"
	sock, _ := serve(t, 200, api.FenceResponse{Node: "node-a", Note: note, NoLongerHeld: []image.Ref{{Pool: "rbd", Image: "one"}}})
	code, out, errs := cli("--socket", sock, "fence", "--node", "node-a")
	if code != exitOK || out != note+"\n" || errs != "" {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errs)
	}
	code, out, _ = cli("--socket", sock, "fence", "--node", "node-a", "--json")
	var got api.FenceResponse
	if err := json.Unmarshal([]byte(out), &got); code != exitOK || err != nil || got.Note != note || len(got.NoLongerHeld) != 1 || got.NoLongerHeld[0].Image != "one" {
		t.Fatalf("--json: exit %d, stdout %q (%v)", code, out, err)
	}
}
