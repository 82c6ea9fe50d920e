package daemon

import (
	"context"
	"testing"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// TestAMappedDeviceIsAnsweredOnlyOnceItsClaimNamesIt: the map's record and persist run
// together, so an agent killed after the persist ("mapped") and before the record leaves a
// claim that names no client. A takeover would then fence the whole node (ip:0/0) while the
// device may be in use. The device is handed over again only once the claim names its client
// (alreadyMapped records it first), and the renewals' claim check records it meanwhile
// (docs/safety.md, invariant 7).
func TestAMappedDeviceIsAnsweredOnlyOnceItsClaimNamesIt(t *testing.T) {
	for _, via := range []string{"answer", "renewals"} {
		t.Run(via, func(t *testing.T) {
			c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000071")
			n := crashedMap(t, c, "v", "record-send")
			key := state.Key{Cluster: "c1", Ref: claimRef(c, "v")}
			devs, err := n.d.kernel.List()
			if err != nil || len(devs) != 1 {
				t.Fatalf("devices after the crash: %v %v", devs, err)
			}
			if m, _ := n.d.state.Get(key); m.Phase != state.Mapped || m.ClientAddr != devs[0].ClientAddr {
				t.Fatalf("state after the crash: %+v, want phase mapped with %s (persist ran beside the record)", m, devs[0].ClientAddr)
			}
			img := claim.Image{Pool: "rbd", Image: "v"}
			reader := claimReader(t, c)
			if rec, err := reader.Inspect(context.Background(), img); err != nil || rec.Holder("node-m") == nil || rec.Holder("node-m").ClientAddr != "" {
				t.Fatalf("claim after the crash: %+v %v, want node-m's hold with no client recorded", rec, err)
			}
			switch via {
			case "answer":
				resp, err := n.d.Map(context.Background(), api.MapRequest{Cluster: c.ID, Pool: c.Pool, Image: "v"}, nil)
				if err != nil || !resp.AlreadyMapped || resp.Device != devs[0].DevNode {
					t.Fatalf("map again: %+v %v, want %s already mapped", resp, err, devs[0].DevNode)
				}
				if resp.Claim == nil || len(resp.Claim.Holders) != 1 || resp.Claim.Holders[0].ClientAddr != devs[0].ClientAddr {
					t.Fatalf("the answer's claim: %+v, want it to name %s", resp.Claim, devs[0].ClientAddr)
				}
			case "renewals":
				n.d.renewer.round(context.Background(), n.d.clusters["c1"])
			}
			rec, err := reader.Inspect(context.Background(), img)
			if err != nil {
				t.Fatal(err)
			}
			if h := rec.Holder("node-m"); h == nil || h.ClientAddr != devs[0].ClientAddr || h.Device != devs[0].DevNode {
				t.Fatalf("claim after the %s: %+v, want node-m naming %s (%s)", via, rec.Holders, devs[0].ClientAddr, devs[0].DevNode)
			}
			assertDeviceKept(t, n, devs[0])
		})
	}
}

// assertDeviceKept fails unless dv is still mapped, as the same client.
func assertDeviceKept(t *testing.T, n *memDaemon, dv krbd.Device) {
	t.Helper()
	cur, err := n.d.kernel.ReadDevice(dv.ID)
	if err != nil || cur.ClientAddr != dv.ClientAddr {
		t.Fatalf("device %s after the repair: %+v %v, want it kept", dv.DevNode, cur, err)
	}
}
