package abortdump

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
)

// childEnv makes the test binary the child of TestSIGABRTWritesTheDump: it watches for SIGABRT
// into the directory the variable names, sends itself SIGABRT and waits to be ended by it.
const childEnv = "ABORTDUMP_TEST_CHILD_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(childEnv); dir != "" {
		log := logrus.New()
		log.SetOutput(os.Stderr)
		log.SetFormatter(&logrus.TextFormatter{DisableTimestamp: true})
		Watch(dir, log)
		parked := make(chan struct{})
		go parkedForTheDump(parked)
		<-parked
		if err := syscall.Kill(os.Getpid(), syscall.SIGABRT); err != nil {
			os.Exit(100)
		}
		for {
			time.Sleep(time.Hour) // the handler exits the process
		}
	}
	os.Exit(m.Run())
}

// parkedForTheDump is a goroutine the dump must show.
func parkedForTheDump(parked chan<- struct{}) {
	close(parked)
	select {}
}

// TestSIGABRTWritesTheDump: a process that gets SIGABRT (systemd's watchdog abort) writes every
// goroutine's stack to a file in the state directory, logs one error line naming the file
// instead of printing the stacks, and exits with a non-zero status.
func TestSIGABRTWritesTheDump(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // only against a hang
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != ExitCode {
		t.Fatalf("the child ended with %v, want exit status %d; stderr:\n%s", err, ExitCode, stderr.String())
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	hidden, _ := filepath.Glob(filepath.Join(dir, ".*"))
	if len(files) != 1 || len(hidden) != 0 {
		t.Fatalf("the directory holds %q and %q, want one dump and no temporary file", files, hidden)
	}
	dump := files[0]
	want := `level=error msg="watchdog abort (SIGABRT): goroutine dump in ` + dump +
		`; the agent exits and systemd restarts it (mapped devices stay mapped); keep the file for a bug report"` + "\n"
	if stderr.String() != want {
		t.Errorf("stderr:\n%q\nwant one line:\n%q", stderr.String(), want)
	}
	if !regexp.MustCompile(`/goroutines-\d{8}T\d{6}Z\.txt$`).MatchString(dump) {
		t.Errorf("dump file %s: want goroutines-<UTC time>.txt", dump)
	}
	fi, err := os.Stat(dump)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("dump file: %v, mode %v; want 0600", err, fi.Mode())
	}
	b, _ := os.ReadFile(dump)
	for _, s := range []string{"every goroutine's stack at", "goroutine ", "abortdump.parkedForTheDump", "abortdump.TestMain"} {
		if !strings.Contains(string(b), s) {
			t.Errorf("the dump does not have %q:\n%s", s, b)
		}
	}
}

// TestKeepsTheNewest: each dump is its own file named by its time; only the newest Keep stay,
// and other files in the directory are left alone.
func TestKeepsTheNewest(t *testing.T) {
	dir := t.TempDir()
	other := filepath.Join(dir, "mappings.json")
	if err := os.WriteFile(other, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 12, 2, 5, 0, 0, 0, time.FixedZone("CET", 3600))
	var paths []string
	for i := range Keep + 3 {
		p, err := Write(dir, t0.Add(time.Duration(i)*time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	if want := filepath.Join(dir, "goroutines-20261202T040000Z.txt"); paths[0] != want {
		t.Errorf("first dump %s, want %s (UTC)", paths[0], want)
	}
	left, _ := filepath.Glob(filepath.Join(dir, "goroutines-*.txt"))
	if len(left) != Keep || left[0] != paths[3] || left[Keep-1] != paths[len(paths)-1] {
		t.Errorf("left %q, want the newest %d of %q", left, Keep, paths)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("another file of the state directory was touched: %v", err)
	}
}

// TestNoDumpSaysWhy: when the dump cannot be written, the one line says so, with the error.
func TestNoDumpSaysWhy(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "absent")
	var buf bytes.Buffer
	log := logrus.New()
	log.SetOutput(&buf)
	log.SetFormatter(&logrus.TextFormatter{DisableTimestamp: true, DisableQuote: true})
	OnAbort(dir, log, time.Now())
	want := regexp.MustCompile("^level=error msg=watchdog abort \\(SIGABRT\\): no goroutine dump: open " + regexp.QuoteMeta(dir) +
		`/\.goroutines-\d+\.tmp: no such file or directory; the agent exits and systemd restarts it \(mapped devices stay mapped\)\n$`)
	if !want.MatchString(buf.String()) {
		t.Errorf("log:\n%q\nwant one line matching:\n%s", buf.String(), want)
	}
}
