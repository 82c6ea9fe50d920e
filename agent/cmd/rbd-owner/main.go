// Command rbd-owner is the node agent (`rbd-owner daemon`) and its command-line client
// (every other subcommand). See README.md and the product contract for the CLI.
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/rbd-owner/rbd-owner/agent/version"
)

// Exit codes from the product contract.
const (
	exitOK          = 0
	exitFailed      = 1
	exitUsage       = 2
	exitClaimed     = 3
	exitUnreachable = 4
)

const usage = `usage: rbd-owner <command> [flags]

commands:
  daemon    run the node agent
  map       map an image (claiming it first)
  unmap     unmap an image or /dev/rbdN (releasing its claim)
  status    this node's devices and claims
  claims    the claims of a pool, cluster-wide
  fence     blocklist the owner's mapping of an image (admin)
  release   drop a dead owner's claim (admin, after fence)
  version   print the version
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case "version", "--version":
		fmt.Fprintf(stdout, "rbd-owner %s\n", version.Version)
		return exitOK
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return exitOK
	case "daemon", "map", "unmap", "status", "claims", "fence", "release":
		fmt.Fprintf(stderr, "rbd-owner %s: not available in this build yet\n", args[0])
		return exitFailed
	default:
		fmt.Fprintf(stderr, "rbd-owner: unknown command %q\n%s", args[0], usage)
		return exitUsage
	}
}
