package daemon

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/image"
	"github.com/rbd-owner/rbd-owner/agent/internal/agenttest"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// TestStatusListsEachProblemOnceByItsDevice: a mapped device's problem is listed once, as the
// line its data makes (api.Device.ProblemLine, what the CLI looks for), and a claim's problem
// with no device here is listed by its claim.
func TestStatusListsEachProblemOnceByItsDevice(t *testing.T) {
	c := newMemCluster("c1", "rbd", "fsid-status-lines")
	n := envNode(agenttest.NewEnv(t, agenttest.Memory(c)), nil)
	n.manualTicks("reconcile", "renew c1") // no round clears the problems set below
	n.start()
	n.run()
	addImage(n, c, "img1")
	if _, err := n.d.Map(context.Background(), api.MapRequest{Cluster: "c1", Pool: "rbd", Image: "img1"}, nil); err != nil {
		t.Fatal(err)
	}
	mapped := state.Key{Cluster: "c1", Ref: image.Ref{Pool: "rbd", Image: "img1"}}
	other := state.Key{Cluster: "c1", Ref: image.Ref{Pool: "rbd", Image: "img12"}}
	n.d.node.SetProblem(mapped, "lease not renewed: a test")
	n.d.node.SetProblem(other, "lease not renewed: a test")
	st := n.d.Status()
	var line string
	for _, dv := range st.Devices {
		if dv.Image == "img1" {
			line = dv.ProblemLine()
		}
	}
	if line == "" || len(st.Problems) != 2 || !slices.Contains(st.Problems, line) ||
		!slices.ContainsFunc(st.Problems, func(p string) bool { return strings.HasPrefix(p, "c1:rbd/img12: lease not renewed: a test (since ") }) {
		t.Fatalf("device line %q, problems %q", line, st.Problems)
	}
}
