package main

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestMain lets a test run this binary as the CLI itself (RBD_OWNER_TEST_MAIN=1). Neither it
// nor the tests run whatever agent this machine has installed (check-config asks the agent its
// librados's release): a test that wants one gives its own.
func TestMain(m *testing.M) {
	agentPath = "/nonexistent/rbd-owner-agent"
	if os.Getenv("RBD_OWNER_TEST_MAIN") == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// TestDaemonExecsTheAgent: `rbd-owner daemon ARGS` becomes the agent program beside it, in
// the same process (systemd's MainPID, LISTEN_PID and NOTIFY_SOCKET stay right), with the
// arguments and the environment passed on; without an agent program it says which is missing.
func TestDaemonExecsTheAgent(t *testing.T) {
	dir := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cliPath := filepath.Join(dir, "rbd-owner")
	copyFile(t, self, cliPath)
	cmd := exec.Command(cliPath, "daemon", "--config", "/etc/x.yaml")
	cmd.Env = append(os.Environ(), "RBD_OWNER_TEST_MAIN=1", "LISTEN_FDS=1")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "rbd-owner-agent is missing") {
		t.Fatalf("without an agent program: %v: %s", err, out)
	}

	agent := "#!/bin/sh\necho \"pid=$$ args=$* listen_fds=$LISTEN_FDS\"\n"
	if err := os.WriteFile(filepath.Join(dir, "rbd-owner-agent"), []byte(agent), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd = exec.Command(cliPath, "daemon", "--config", "/etc/x.yaml")
	cmd.Env = append(os.Environ(), "RBD_OWNER_TEST_MAIN=1", "LISTEN_FDS=1")
	out, err = cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	want := "pid=" + strconv.Itoa(cmd.Process.Pid) + " args=daemon --config /etc/x.yaml listen_fds=1"
	if strings.TrimSpace(string(out)) != want {
		t.Fatalf("the agent ran as %q, want %q", strings.TrimSpace(string(out)), want)
	}

	// the global --socket is the CLI's, before the command's name or after it; -config is the
	// flag package's form of --config, which the agent parses
	cmd = exec.Command(cliPath, "--socket", "/run/x.sock", "daemon", "-config", "/etc/x.yaml", "--socket=/y")
	cmd.Env = append(os.Environ(), "RBD_OWNER_TEST_MAIN=1")
	if out, err = cmd.Output(); err != nil || !strings.Contains(string(out), " args=daemon --config /etc/x.yaml listen_fds=\n") {
		t.Fatalf("with --socket: %v: %q", err, out)
	}
	// its help is the CLI's, without the agent
	cmd = exec.Command(cliPath, "daemon", "--help")
	cmd.Env = append(os.Environ(), "RBD_OWNER_TEST_MAIN=1")
	if out, err = cmd.Output(); err != nil || !strings.Contains(string(out), "Usage:\n  rbd-owner daemon [--config PATH]\n") {
		t.Fatalf("daemon --help: %v: %q", err, out)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
