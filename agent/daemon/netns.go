package daemon

import (
	"fmt"
	"os"
	"strconv"

	"github.com/rbd-owner/rbd-owner/agent/peercred"
)

// sameNetNS refuses a map asked for by a process in another network namespace than the agent's
// (ceph-csi's netNamespaceFilePath runs `nsenter --net=… rbd map`, for Multus networks). The
// kernel creates a mapping's client in the network namespace of the process that writes
// add_single_major: the agent's, so the mapping would not use the network the caller chose,
// and, worse, the client address recorded in the claim for fencing would be in a namespace the
// caller never sees. Entering the caller's namespace for the write would need setns() in the
// agent, which its unit's sandbox forbids (RestrictNamespaces=), so such a map is refused with
// what to do, rather than made somewhere else than asked. A caller without credentials (a test
// calling the daemon directly) is not checked.
func (d *Daemon) sameNetNS(peer *peercred.Cred) error {
	if peer == nil || peer.PID <= 0 {
		return nil
	}
	mine, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		return nil // no procfs view of namespaces: nothing to compare
	}
	theirs, err := os.Readlink("/proc/" + strconv.Itoa(peer.PID) + "/ns/net")
	if err != nil {
		return nil // the caller is gone or hidden from the agent: its map fails or succeeds on its own
	}
	if theirs != mine {
		return fmt.Errorf("%w: the caller (pid %d) runs in network namespace %s, the agent in %s: the kernel would make the mapping in the agent's namespace, not the caller's; rbd-owner does not map for callers in other network namespaces (for ceph-csi, leave netNamespaceFilePath unset for this cluster)",
			errInvalid, peer.PID, theirs, mine)
	}
	return nil
}
