// Command rbd-shim is rbd-owner's drop-in `rbd` (installed as /usr/lib/rbd-owner/bin/rbd) and
// drop-in `rbd-nbd` (/usr/lib/rbd-owner/bin/rbd-nbd, a link to the same binary): put that
// directory first on a CSI plugin's PATH and its krbd map, unmap and device list go through the
// agent, a map or attach through nbd (or any device type but krbd) is refused, and every other
// command runs Ceph's rbd or rbd-nbd unchanged. See package shim.
package main

import (
	"os"

	"github.com/rbd-owner/rbd-owner/agent/shim"
)

func main() {
	os.Exit(shim.Main(os.Args[0], os.Args[1:], shim.FromEnvironment()))
}
