package saga

import (
	"fmt"
	"os"
	"strconv"

	"github.com/rbd-owner/rbd-owner/agent/fault"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
)

// SameNetNS refuses a map asked for by a process in another network namespace than the agent's
// (ceph-csi's netNamespaceFilePath runs `nsenter --net=… rbd map`, for Multus networks). The
// kernel creates a mapping's client in the network namespace of the process that writes
// add_single_major: the agent's, so the mapping would not use the network the caller chose,
// and the client address recorded in the claim for fencing would be one of a namespace the
// caller never sees. Entering the caller's namespace for the write would need setns() in the
// agent, which its unit's sandbox forbids (RestrictNamespaces=yes), so such a map is refused
// with what to do rather than made somewhere else than asked.
//
// The caller's namespace is the one its socket lives in (SO_NETNS_COOKIE, Linux 5.14 and
// later: no access to the caller's /proc entry needed, which the sandboxed agent may lack);
// on older kernels, /proc/PID/ns/net when readable. A caller without credentials (a test
// calling the daemon directly) is not checked.
func SameNetNS(peer *peercred.Cred) error {
	if peer == nil {
		return nil
	}
	refuse := func(theirs, mine string) error {
		return fmt.Errorf("%w: the caller (pid %d) runs in another network namespace (%s) than the agent (%s): the kernel would make the mapping in the agent's namespace, not the caller's; rbd-owner does not map for callers in other network namespaces (for ceph-csi, leave netNamespaceFilePath unset for this cluster)",
			fault.ErrInvalid, peer.PID, theirs, mine)
	}
	if own := peercred.OwnNetNS(); own != 0 && peer.NetNS != 0 {
		if own != peer.NetNS {
			return refuse(fmt.Sprintf("cookie %d", peer.NetNS), fmt.Sprintf("cookie %d", own))
		}
		return nil
	}
	if peer.PID <= 0 {
		return nil
	}
	mine, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		return nil // no procfs view of namespaces: nothing to compare
	}
	theirs, err := os.Readlink("/proc/" + strconv.Itoa(peer.PID) + "/ns/net")
	if err != nil {
		return nil // an older kernel and no view of the caller: its map goes on (docs/kubernetes.md)
	}
	if theirs != mine {
		return refuse(theirs, mine)
	}
	return nil
}
