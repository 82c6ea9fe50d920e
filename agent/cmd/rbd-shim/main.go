// Command rbd-shim is rbd-owner's drop-in `rbd` (installed as /usr/lib/rbd-owner/bin/rbd): put
// that directory first on a CSI plugin's PATH and its krbd map, unmap and device list go through
// the agent; every other rbd command runs Ceph's rbd unchanged. See package shim.
package main

import (
	"os"

	"github.com/rbd-owner/rbd-owner/agent/shim"
)

func main() {
	os.Exit(shim.Run(os.Args[1:], shim.FromEnvironment()))
}
