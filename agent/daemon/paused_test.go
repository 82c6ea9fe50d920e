package daemon

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ceph/go-ceph/rados"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/cephconn"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/internal/agenttest"
	"github.com/rbd-owner/rbd-owner/agent/internal/cephtest"
	"github.com/rbd-owner/rbd-owner/agent/krbd/fakekernel"
)

// TestPausedOSDDoesNotStopTheOtherClustersRenewals runs the agent against two real clusters,
// the shared test cluster and one of the test's own, and pauses the private cluster's OSD: while
// a renewal on it is blocked, the shared cluster's claim keeps being renewed (its renewed_at
// moves in RADOS), the watchdog keeps being fed, and status names the paused cluster.
func TestPausedOSDDoesNotStopTheOtherClustersRenewals(t *testing.T) {
	priv := cephtest.StartPrivate(t)
	privAdmin, err := cephconn.Connect(priv.Admin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(privAdmin.Shutdown) // after the image's own cleanup, which uses it
	privFSID, err := privAdmin.GetFSID()
	if err != nil {
		t.Fatal(err)
	}
	shared := cephtest.Options(t)
	sharedMon := cephtest.MonitorV1(t)
	k, err := fakekernel.New(t.TempDir(), fakekernel.Options{FSID: agenttest.LiveFSID(t), MonitorFSIDs: map[string]string{priv.Monitor: privFSID}})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{cephtest.Secret(t), priv.Secret} {
		if err := k.AddUser(shared.User, s); err != nil {
			t.Fatal(err)
		}
	}
	k.AddPool(cephtest.Pool)
	fastImg := cephtest.Image(t, cephtest.AdminConn(t), "")
	slowImg := privateImage(t, privAdmin)
	k.AddImage(cephtest.Pool, "", fastImg, 16<<20)
	k.AddImage(cephtest.Pool, "", slowImg, 16<<20)

	env := agenttest.NewEnv(t, agenttest.Live(), agenttest.Node("node-p"), agenttest.OnKernel(k))
	env.Config = testConfig(t, "node-p", 300*time.Millisecond,
		config.Cluster{ID: "shared", Monitors: []string{sharedMon}, User: shared.User, Keyring: shared.Keyring},
		config.Cluster{ID: "paused", Monitors: []string{priv.Monitor}, User: priv.Options.User, Keyring: priv.Options.Keyring})
	env.Config.MapTimeout = config.Duration(20 * time.Second)
	env.Watchdog, env.Poll, env.Log = 2*time.Second, 10*time.Millisecond, quietLog()
	n := envNode(env, nil)
	count := n.count
	n.start()
	d := n.d
	defer priv.ResumeOSD(t) // let the blocked calls end before the node is stopped
	n.run()
	for _, r := range []api.MapRequest{
		{Cluster: "shared", Pool: cephtest.Pool, Image: fastImg, Requester: "test"},
		{Cluster: "paused", Pool: cephtest.Pool, Image: slowImg, Requester: "test"},
	} {
		if _, err := d.Map(context.Background(), r, nil); err != nil {
			t.Fatalf("map %s on %s: %v", r.Image, r.Cluster, err)
		}
	}
	observer := claimStore(t)
	// the shared cluster's lease is this node's heartbeat object in the image's pool: each
	// renewal gives it a new version
	heartbeatVersion := func() uint64 {
		_, v, err := observer.Backend().Read(context.Background(), claim.Image{Pool: cephtest.Pool}, claim.HeartbeatPrefix+"node-p")
		if err != nil {
			return 0
		}
		return v
	}
	priv.PauseOSD(t)
	// causality: a renewal on the paused cluster has started and not ended
	waitFor(t, "a renewal blocked on the paused OSD", func() bool {
		for _, p := range d.Status().Problems {
			if strings.Contains(p, "paused:rbd/"+slowImg) && strings.Contains(p, "cluster paused") {
				return true
			}
		}
		return false
	})
	p0 := count("WATCHDOG=1")
	for range 2 {
		prev := heartbeatVersion()
		waitFor(t, "a renewal of this node's lease on the shared cluster, in RADOS", func() bool { return heartbeatVersion() > prev })
	}
	waitFor(t, "2 watchdog pings", func() bool { return count("WATCHDOG=1") >= p0+2 })
}

// privateImage creates an image in a private cluster (removed with the cluster).
func privateImage(t *testing.T, admin *rados.Conn) string {
	t.Helper()
	return cephtest.Image(t, admin, "")
}
