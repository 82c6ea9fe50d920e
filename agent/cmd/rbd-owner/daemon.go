package main

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// agentPath is where the packages install the agent program.
var agentPath = "/usr/lib/rbd-owner/rbd-owner-agent"

// runDaemon replaces this process with the agent (agent/cmd/rbd-owner-agent): rbd-owner-agent
// beside this binary (as `make build` leaves them in bin/), else the packaged one. The agent is the one
// program that links the Ceph libraries; loading them costs a process ~0.5 s on a slow machine,
// which the CLI (a static binary) no longer pays on every call. exec keeps the process id, so
// systemd's notify and watchdog (NotifyAccess=main) and socket activation (LISTEN_PID) see the
// same process as before.
func runDaemon(args []string) error {
	path := agentPath
	if self, err := os.Executable(); err == nil {
		if near := filepath.Join(filepath.Dir(self), "rbd-owner-agent"); isExecutable(near) {
			path = near
		}
	}
	if !isExecutable(path) {
		return fmt.Errorf("the agent program %s is missing (reinstall the package)", path)
	}
	err := syscall.Exec(path, append([]string{"rbd-owner-agent", "daemon"}, args...), os.Environ()) //nolint:gosec // the installed agent, or the one beside this program; the arguments are the caller's own
	return fmt.Errorf("start the agent %s: %w", path, err)
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}
