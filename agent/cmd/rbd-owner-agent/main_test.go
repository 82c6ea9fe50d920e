package main

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/rbd-owner/rbd-owner/agent/cephconn"
	"github.com/rbd-owner/rbd-owner/agent/internal/agentflags"
)

// TestMain lets a test run this binary as the agent itself: RBD_OWNER_AGENT_TEST_ARGS holds
// its arguments, one a line.
func TestMain(m *testing.M) {
	if args := os.Getenv("RBD_OWNER_AGENT_TEST_ARGS"); args != "" {
		os.Args = append([]string{"rbd-owner-agent"}, strings.Split(args, "\n")...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestConfigErrorIsOneLine: `rbd-owner daemon` with a config it refuses prints the config's
// one-line error once, as `rbd-owner check-config` does, and exits 1; under the journal the
// line is at error priority.
func TestConfigErrorIsOneLine(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	doc := "node_id: node-a\nstate_dir: " + dir + "\nclusters: []\nlease_duraton: 30s\n"
	if err := os.WriteFile(cfg, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	line := "rbd-owner daemon: config " + cfg + ": line 4: lease_duraton: unknown key; did you mean lease_duration?\n"
	for _, journal := range []bool{false, true} {
		stderr, err := os.Create(filepath.Join(dir, fmt.Sprintf("stderr-%v", journal)))
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "RBD_OWNER_AGENT_TEST_ARGS=daemon\n--config="+cfg, "JOURNAL_STREAM=")
		want := line
		if journal {
			// what systemd sets for a service whose stderr is the journal: the stream's device and inode
			var st syscall.Stat_t
			if err := syscall.Fstat(int(stderr.Fd()), &st); err != nil {
				t.Fatal(err)
			}
			cmd.Env = append(cmd.Env, fmt.Sprintf("JOURNAL_STREAM=%d:%d", st.Dev, st.Ino))
			want = "<3>" + line
		}
		cmd.Stderr = stderr
		err = cmd.Run()
		stderr.Close()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Errorf("journal %v: the agent ended with %v, want exit status 1", journal, err)
		}
		got, _ := os.ReadFile(stderr.Name())
		if string(got) != want {
			t.Errorf("journal %v: stderr\n%q\nwant\n%q", journal, got, want)
		}
	}
}

// TestJournalPriorities: under the journal each log line starts with its level's syslog
// priority, which journald takes and removes.
func TestJournalPriorities(t *testing.T) {
	var buf bytes.Buffer
	log := logrus.New()
	log.SetOutput(&buf)
	log.SetFormatter(journalFormatter{&logrus.TextFormatter{DisableTimestamp: true}})
	log.Error("e")
	log.Warn("w")
	log.Info("i")
	want := "<3>level=error msg=e\n<4>level=warning msg=w\n<6>level=info msg=i\n"
	if buf.String() != want {
		t.Errorf("log:\n%q\nwant\n%q", buf.String(), want)
	}
	if p := priorityPrefix(false, logrus.ErrorLevel); p != "" {
		t.Errorf("not under the journal: prefix %q, want none", p)
	}
}

// TestLibradosVersion: `rbd-owner-agent librados-version` prints the Ceph release of the
// librados it loads, one line, and exits 0: what `rbd-owner check-config` asks it.
func TestLibradosVersion(t *testing.T) {
	release := cephconn.LibradosRelease()
	if release == "" {
		t.Skip("this machine's librados does not say its release")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "RBD_OWNER_AGENT_TEST_ARGS="+agentflags.LibradosVersion)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil || string(out) != release+"\n" {
		t.Fatalf("librados-version: %v, stdout %q, stderr %q; want %q", err, out, stderr.String(), release+"\n")
	}
}

// TestRefusalIsTheUnitsStatus (issue 52): the agent that stops on an error (a config it refuses)
// sends systemd that one line as the unit's Status (STATUS=, which `systemctl status rbd-owner`
// shows and keeps while the unit stays failed) before it exits, and writes it last on stderr.
func TestRefusalIsTheUnitsStatus(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte("node_id: node-a\nstate_dir: "+dir+"\nclusters: []\nlease_duraton: 30s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "RBD_OWNER_AGENT_TEST_ARGS=daemon\n--config="+cfg, "JOURNAL_STREAM=", "NOTIFY_SOCKET="+sock)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err == nil {
		t.Fatal("the agent started with a config it must refuse")
	}
	line := "rbd-owner daemon: config " + cfg + ": line 4: lease_duraton: unknown key; did you mean lease_duration?"
	if !strings.HasSuffix(stderr.String(), line+"\n") {
		t.Errorf("stderr %q does not end with the agent's line %q", stderr.String(), line)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	var msgs []string
	buf := make([]byte, 4096)
	for {
		n, err := conn.Read(buf)
		if err != nil {
			break
		}
		msgs = append(msgs, string(buf[:n]))
		_ = conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	}
	if len(msgs) == 0 || msgs[len(msgs)-1] != "STATUS="+line {
		t.Errorf("notify messages %q, want the last to be %q", msgs, "STATUS="+line)
	}
}
