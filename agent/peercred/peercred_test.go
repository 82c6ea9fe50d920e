package peercred

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
)

func TestFromConnSeesThisProcess(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := net.Dial("unix", sock)
		if err == nil {
			defer c.Close()
			_, _ = c.Read(make([]byte, 1))
		}
	}()
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cred, err := FromConn(c)
	if err != nil {
		t.Fatal(err)
	}
	if cred.PID != os.Getpid() || cred.UID != os.Getuid() || cred.GID != os.Getgid() {
		t.Fatalf("cred %+v, want pid %d uid %d gid %d", cred, os.Getpid(), os.Getuid(), os.Getgid())
	}
}

func TestAllow(t *testing.T) {
	proc := t.TempDir()
	write := func(pid, groups string) {
		_ = os.MkdirAll(filepath.Join(proc, pid), 0o755)
		_ = os.WriteFile(filepath.Join(proc, pid, "status"), []byte("Name:\tx\nGroups:\t"+groups+"\n"), 0o644)
	}
	write("10", "100 990 27")
	write("11", "100")
	write("12", "")
	p := Policy{Group: 990, ProcRoot: proc}
	for _, tc := range []struct {
		c  Cred
		ok bool
	}{
		{Cred{UID: 0, GID: 0, PID: 1}, true},
		{Cred{UID: 1000, GID: 990, PID: 99}, true},  // primary group
		{Cred{UID: 1000, GID: 100, PID: 10}, true},  // supplementary group
		{Cred{UID: 1000, GID: 100, PID: 11}, false}, // not a member
		{Cred{UID: 1000, GID: 100, PID: 12}, false}, // no groups
		{Cred{UID: 1000, GID: 100, PID: 13}, false}, // process gone: refuse
	} {
		err := p.Allow(tc.c)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrDenied)) {
			t.Errorf("%+v: %v, want ok=%v", tc.c, err, tc.ok)
		}
	}
	if err := (Policy{Group: -1}).Allow(Cred{UID: 5, GID: 5}); !errors.Is(err, ErrDenied) {
		t.Errorf("no group configured: %v", err)
	}
}
