package daemon

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
	"github.com/rbd-owner/rbd-owner/agent/server"
)

// TestMapFromAnotherNetworkNamespaceIsRefused: a caller in another network namespace (ceph-csi's
// netNamespaceFilePath) is refused with what to do; a caller in the agent's own is served.
func TestMapFromAnotherNetworkNamespaceIsRefused(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to make a network namespace")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("no unshare")
	}
	c := newMemCluster("c1", "rbd", "fsid-netns")
	n := startMemDaemon(t, c)
	t.Cleanup(func() { n.stop() })
	addImage(n, c, "img")
	// a process in a network namespace of its own, standing in for `nsenter --net=… rbd map`
	cmd := exec.Command("unshare", "--net", "sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Skipf("unshare --net: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	waitFor(t, "the process to enter its namespace", func() bool {
		a, _ := os.Readlink("/proc/self/ns/net")
		b, err := os.Readlink("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/ns/net")
		return err == nil && a != b
	})
	req := api.MapRequest{Cluster: "c1", Pool: "rbd", Image: "img"}
	_, err := n.d.Map(context.Background(), req, &peercred.Cred{PID: cmd.Process.Pid})
	if e := server.APIError(err); e.Code != api.CodeInvalidArgument || !strings.Contains(e.Message, "network namespace") || !strings.Contains(e.Message, "netNamespaceFilePath") {
		t.Fatalf("map from another namespace: %+v", e)
	}
	// the socket's own namespace (SO_NETNS_COOKIE) decides when the kernel tells it, whatever
	// the caller's /proc entry says
	if own := peercred.OwnNetNS(); own != 0 {
		_, err := n.d.Map(context.Background(), req, &peercred.Cred{PID: os.Getpid(), NetNS: own + 1})
		if e := server.APIError(err); e.Code != api.CodeInvalidArgument || !strings.Contains(e.Message, "network namespace") {
			t.Fatalf("map from a socket in another namespace: %+v", e)
		}
	}
	if devs, _ := n.d.kernel.List(); len(devs) != 0 {
		t.Fatal("a device was made")
	}
	if _, err := n.d.Map(context.Background(), req, &peercred.Cred{PID: os.Getpid(), NetNS: peercred.OwnNetNS()}); err != nil {
		t.Fatalf("map from the agent's own namespace: %v", err)
	}
}
