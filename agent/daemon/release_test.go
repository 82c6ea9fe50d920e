package daemon

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/fault"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
)

// TestReleaseKeepsTheClaimOfAMappedDevice: release without force looked only at the persisted
// state. With the state entry gone (a lost state directory, or an adoption whose state write
// failed) but the device still mapped, it dropped the claim of a device that may write; now it
// refuses, naming the device, and the claim stays. Once the device is gone it releases.
func TestReleaseKeepsTheClaimOfAMappedDevice(t *testing.T) {
	c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000035")
	never := make(chan time.Time) // no reconcile round: it would adopt the device again
	n := startMemDaemonWith(t, func(o *Options) {
		o.Ticker = func(loop string, every time.Duration) (<-chan time.Time, func()) {
			if loop == "reconcile" {
				return never, func() {}
			}
			tk := time.NewTicker(every)
			return tk.C, tk.Stop
		}
	}, c)
	defer n.stop()
	resp := n.mapImage(t, c, "r")
	ms := n.d.state.All()
	if len(ms) != 1 {
		t.Fatalf("state: %+v", ms)
	}
	epoch := ms[0].Epoch
	if err := n.d.state.Delete(ms[0].Key); err != nil { // the state is lost, the device is not
		t.Fatal(err)
	}
	req := api.ImageRequest{Cluster: "c1", Pool: "rbd", Image: "r"}
	ok, err := n.d.admin.Release(context.Background(), req, nil)
	if ok || !fault.Is(err, fault.Invalid) || !strings.Contains(err.Error(), resp.Device) {
		t.Fatalf("release of a claim whose device is mapped: %v %v, want refused naming %s", ok, err, resp.Device)
	}
	rec, err := claim.NewStoreOn(c.M, claim.Config{Node: claim.Node{ID: "reader"}})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := rec.Inspect(context.Background(), claim.Image{Pool: "rbd", Image: "r"}); err != nil || r.Holder("node-m") == nil {
		t.Fatalf("the claim was dropped: %+v %v", r, err)
	}
	dev, err := n.d.kernel.FindByPath(resp.Device)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.d.kernel.UnmapDevice(context.Background(), dev, krbdForce); err != nil {
		t.Fatal(err)
	}
	if _, err := n.d.admin.Release(context.Background(), req, &peercred.Cred{UID: 4242, PID: 77}); err != nil {
		t.Fatalf("release once the device is gone: %v", err)
	}
	if r, err := rec.Inspect(context.Background(), claim.Image{Pool: "rbd", Image: "r"}); err != nil || r.Holder("node-m") != nil {
		t.Fatalf("the claim of a device that is gone was kept: %+v %v", r, err)
	}
	// a person's release of a claim is in the audit trail, with the caller (it was not)
	var rel []audit.Entry
	for _, e := range n.audited(audit.Release) {
		if e.Image == "r" && e.Device == "" {
			rel = append(rel, e)
		}
	}
	if len(rel) != 1 || rel[0].OwnerNode != "node-m" || rel[0].Epoch != epoch || rel[0].UID != 4242 || !rel[0].HasPeer {
		t.Fatalf("audit entries of the release: %+v, want one naming node-m, epoch %d and uid 4242", rel, epoch)
	}
}

var krbdForce = krbd.UnmapOptions{Force: true}
