package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/rbd-owner/rbd-owner/agent/internal/agentflags"
)

// agentPath is where the packages install the agent program.
var agentPath = agentflags.Path

func daemonCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "daemon [--config PATH]",
		GroupID: groupAgent,
		Short:   "Run the node agent (systemd's rbd-owner.service runs it)",
		Long: `Run the node agent in the foreground: it becomes the agent program
/usr/lib/rbd-owner/rbd-owner-agent (the one part of rbd-owner linked with the Ceph libraries),
in the same process, with its arguments. rbd-owner.service runs it under systemd, with socket
activation (rbd-owner.socket), notify and a watchdog; start it by hand only to debug.`,
		Example: `  systemctl status rbd-owner
  rbd-owner daemon --config /etc/rbd-owner/config.yaml`,
		DisableFlagsInUseLine: true,
		// the agent parses its own arguments
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, arg := range args {
				if arg == "--" {
					break
				}
				if arg == "-h" || arg == "--help" {
					return cmd.Help()
				}
			}
			return runDaemon(withoutSocket(args))
		},
	}
	// documented here from the agent's own definitions, parsed by the agent
	cmd.Flags().AddGoFlagSet(agentflags.New(&agentflags.Args{}, io.Discard))
	return cmd
}

// withoutSocket is the agent's arguments: the line's, without the global --socket (which names
// the socket the CLI calls; the agent's are in its config), as before the command's name.
func withoutSocket(args []string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		switch {
		case args[i] == "--":
			return append(out, args[i:]...)
		case args[i] == "--socket" && i+1 < len(args):
			i++
		case !strings.HasPrefix(args[i], "--socket="):
			out = append(out, args[i])
		}
	}
	return out
}

// runDaemon replaces this process with the agent (agent/cmd/rbd-owner-agent, as agentProgram
// finds it). The agent is the one program that links the Ceph libraries; loading them costs a
// process ~0.5 s on a slow machine, which the CLI (a static binary) no longer pays on every call.
// exec keeps the process id, so systemd's notify and watchdog (NotifyAccess=main) and socket
// activation (LISTEN_PID) see the same process as before.
func runDaemon(args []string) error {
	path, err := agentProgram()
	if err != nil {
		return err
	}
	err = syscall.Exec(path, append([]string{"rbd-owner-agent", "daemon"}, args...), os.Environ()) //nolint:gosec // the installed agent, or the one beside this program; the arguments are the caller's own
	return fmt.Errorf("start the agent %s: %w", path, err)
}

// agentProgram is the agent program's path: rbd-owner-agent beside this binary (as `make build`
// leaves them in bin/), else the packaged one (agentPath); an error when neither is there.
func agentProgram() (string, error) {
	path := agentPath
	if self, err := os.Executable(); err == nil {
		if near := filepath.Join(filepath.Dir(self), "rbd-owner-agent"); isExecutable(near) {
			path = near
		}
	}
	if !isExecutable(path) {
		return "", fmt.Errorf("the agent program %s is missing (reinstall the package)", path)
	}
	return path, nil
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}
