package cephtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/cephconn"
)

// Private is a Ceph cluster of one test's own (tests/ceph/up in a temporary directory), for
// tests that stall it: pausing the shared cluster's OSD would stall every other package's tests.
// It is stopped and removed when the test ends.
type Private struct {
	Dir     string
	Options cephconn.Options // as the agent's least-privilege user
	Admin   cephconn.Options // as client.admin
	Monitor string           // msgr1 monitor address (the kernel's and the agent's form)
	Secret  string           // the agent user's base64 key
	osdPID  int
}

var privateSeq atomic.Int32

// StartPrivate starts a private cluster (about 3 seconds). Like the shared cluster's tests it
// is skipped without RBD_OWNER_TEST_CEPH_CONF (the sign that Ceph is installed and `make test`
// runs), and it needs root.
func StartPrivate(t testing.TB) *Private {
	t.Helper()
	Options(t) // skip (or fail under make test) exactly like the shared cluster's tests
	if os.Getuid() != 0 {
		t.Skip("a private test cluster needs root")
	}
	up, down := repoFile(t, "tests/ceph/up"), repoFile(t, "tests/ceph/down")
	dir := filepath.Join(t.TempDir(), "ceph")
	// An address of this process's own in 127/8 (every one of them is on lo), so that test
	// processes running at once (go test runs packages in parallel; CI and a developer share a
	// machine) never meet on a port; the ports only move per call, past the OSD's range of 100.
	pid := os.Getpid()
	ip := fmt.Sprintf("127.%d.%d.%d", 64+(pid>>16)&63, (pid>>8)&255, 1+(pid&255)%254)
	base := 40000 + int(privateSeq.Add(1)%20)*200
	cmd := exec.Command(up, dir, strconv.Itoa(base), strconv.Itoa(base+10))
	cmd.Env = append(os.Environ(), "BIND_IP="+ip)
	out, err := cmd.CombinedOutput()
	p := &Private{Dir: dir}
	t.Cleanup(func() {
		if p.osdPID > 0 {
			_ = syscall.Kill(p.osdPID, syscall.SIGCONT) // let a paused OSD go before it is stopped
		}
		if out, err := exec.Command(down, dir, "--purge").CombinedOutput(); err != nil {
			t.Errorf("tests/ceph/down %s: %v\n%s", dir, err, out)
		}
	})
	if err != nil {
		// the daemons log to files: show their last lines too
		logs, _ := filepath.Glob(filepath.Join(dir, "log", "*.log"))
		for _, l := range logs {
			if data, rerr := os.ReadFile(l); rerr == nil {
				lines := strings.Split(strings.TrimSpace(string(data)), "\n")
				out = fmt.Appendf(out, "--- %s (last lines)\n%s\n", l, strings.Join(lines[max(0, len(lines)-8):], "\n"))
			}
		}
		t.Fatalf("tests/ceph/up %s (bind %s, ports %d/%d): %v\n%s", dir, ip, base, base+10, err, out)
	}
	env := map[string]string{}
	data, err := os.ReadFile(filepath.Join(dir, "env"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(strings.TrimPrefix(line, "export "), "="); ok {
			env[k] = v
		}
	}
	p.Options = cephconn.Options{User: env["RBD_OWNER_TEST_USER"], Keyring: env["RBD_OWNER_TEST_KEYRING"],
		ConfFile: env["RBD_OWNER_TEST_CEPH_CONF"], Timeout: 10 * time.Second}
	p.Admin = p.Options
	p.Admin.User, p.Admin.Keyring = "admin", env["RBD_OWNER_TEST_ADMIN_KEYRING"]
	p.Monitor = monitorV1Of(t, p.Options.ConfFile)
	p.Secret = secretOf(t, p.Options.Keyring)
	pidText, err := os.ReadFile(filepath.Join(dir, "run", "osd.0.pid"))
	if err != nil {
		t.Fatal(err)
	}
	if p.osdPID, err = strconv.Atoi(strings.TrimSpace(string(pidText))); err != nil || p.osdPID <= 1 {
		t.Fatalf("osd pid file holds %q: not a process id", pidText)
	}
	return p
}

// PauseOSD stops the OSD process (SIGSTOP): every OSD operation waits until it resumes or the
// client's own timeout runs out. The store lives in memory, so the OSD is paused, never
// restarted.
func (p *Private) PauseOSD(t testing.TB) {
	t.Helper()
	if err := syscall.Kill(p.osdPID, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
}

// ResumeOSD continues a paused OSD.
func (p *Private) ResumeOSD(t testing.TB) {
	t.Helper()
	if err := syscall.Kill(p.osdPID, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
}

// repoFile finds a file of the repository from the test's directory upwards.
func repoFile(t testing.TB, rel string) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, rel)); err == nil {
			return filepath.Join(dir, rel)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("%s not found above the test's directory", rel)
		}
		dir = parent
	}
}
