// Package agentflags defines the command line of the agent program (agent/cmd/rbd-owner-agent):
// the program parses its arguments with it, and its manual page rbd-owner-agent(8) and the
// `rbd-owner daemon` command's help list the flags from it, so that the three cannot differ. It
// links no Ceph library, unlike the agent.
package agentflags

import (
	"flag"
	"io"

	"github.com/rbd-owner/rbd-owner/agent/config"
)

// Path is where the packages install the agent program.
const Path = "/usr/lib/rbd-owner/rbd-owner-agent"

// Name names the flag set in the flag package's messages: the command as systemd runs it.
const Name = "rbd-owner daemon"

// Command is the word the agent's arguments may start with (`rbd-owner daemon` passes it on);
// the agent skips it.
const Command = "daemon"

// LibradosVersion is the word that, as the agent's only argument, makes it print the Ceph
// release of the librados it loads (one line, "16.2.15") and exit 0, or exit ExitFailure when
// the library does not say: `rbd-owner check-config`, which links nothing of Ceph's, asks it
// which key types this node's librados reads.
const LibradosVersion = "librados-version"

// The agent's exit statuses, but for a SIGABRT's (abortdump.ExitCode).
const (
	// ExitFailure: it could not start, or stopped on an error.
	ExitFailure = 1
	// ExitUsage: its arguments are wrong (the flag package has said what is wrong).
	ExitUsage = 2
)

// Args are the agent's arguments.
type Args struct {
	// Config is the config file's path.
	Config string
}

// New returns the agent's flag set, which fills a when it parses; it reports its errors and
// its usage (-h) to w.
func New(a *Args, w io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(Name, flag.ContinueOnError)
	fs.SetOutput(w)
	fs.StringVar(&a.Config, "config", config.DefaultPath, "the config file's `PATH`")
	return fs
}
