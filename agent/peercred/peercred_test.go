package peercred

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
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

func TestRole(t *testing.T) {
	proc := t.TempDir()
	write := func(pid, groups string) {
		_ = os.MkdirAll(filepath.Join(proc, pid), 0o755)
		_ = os.WriteFile(filepath.Join(proc, pid, "status"), []byte("Name:\tx\nGroups:\t"+groups+"\n"), 0o644)
	}
	write("10", "100 990 27")
	write("11", "100")
	write("12", "")
	write("14", "100 991")
	write("15", "990 991")
	p := Policy{CSIGroup: 990, AdminGroup: 991, ProcRoot: proc}
	for _, tc := range []struct {
		name string
		c    Cred
		want Role
	}{
		{"root", Cred{UID: 0, GID: 0, PID: 1}, RoleAdmin},
		{"root whose process is gone", Cred{UID: 0, GID: 0, PID: 13}, RoleAdmin},
		{"csi: primary group", Cred{UID: 1000, GID: 990, PID: 99}, RoleCSI},
		{"csi: supplementary group", Cred{UID: 1000, GID: 100, PID: 10}, RoleCSI},
		{"admin: primary group", Cred{UID: 1000, GID: 991, PID: 99}, RoleAdmin},
		{"admin: supplementary group", Cred{UID: 1000, GID: 100, PID: 14}, RoleAdmin},
		{"member of both", Cred{UID: 1000, GID: 100, PID: 15}, RoleAdmin},
		{"not a member", Cred{UID: 1000, GID: 100, PID: 11}, RoleNone},
		{"no groups", Cred{UID: 1000, GID: 100, PID: 12}, RoleNone},
		{"process gone: refused", Cred{UID: 1000, GID: 100, PID: 13}, RoleNone},
	} {
		got, err := p.Role(tc.c)
		if got != tc.want {
			t.Errorf("%s: role %v, want %v (err %v)", tc.name, got, tc.want, err)
		}
		if (got == RoleNone) != (err != nil) || (err != nil && !errors.Is(err, ErrDenied)) {
			t.Errorf("%s: err %v with role %v", tc.name, err, got)
		}
	}
	if r, err := (Policy{AdminGroup: -1, CSIGroup: -1}).Role(Cred{UID: 5, GID: 5}); r != RoleNone || !errors.Is(err, ErrDenied) {
		t.Errorf("no group configured: %v %v", r, err)
	}
	if r, _ := (Policy{AdminGroup: -1, CSIGroup: 990, ProcRoot: proc}).Role(Cred{UID: 5, GID: 991, PID: 13}); r != RoleNone {
		t.Errorf("admin group not configured: gid 991 got %v", r)
	}
}

// TestNetNSOfAPeerInAnotherNamespace: the server end of a connection made from another network
// namespace carries that namespace's cookie; one made from ours carries ours.
func TestNetNSOfAPeerInAnotherNamespace(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to make a network namespace")
	}
	own := OwnNetNS()
	if own == 0 {
		t.Skip("the kernel has no SO_NETNS_COOKIE")
	}
	path := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	peerNS := func(dial func() (net.Conn, error)) uint64 {
		t.Helper()
		type res struct {
			c   Cred
			err error
		}
		got := make(chan res, 1)
		go func() {
			c, err := l.Accept()
			if err != nil {
				got <- res{err: err}
				return
			}
			defer c.Close()
			cr, err := FromConn(c)
			got <- res{cr, err}
		}()
		c, err := dial()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		r := <-got
		if r.err != nil {
			t.Fatal(r.err)
		}
		return r.c.NetNS
	}
	if ns := peerNS(func() (net.Conn, error) { return net.Dial("unix", path) }); ns != own {
		t.Fatalf("a peer in our namespace: cookie %d, ours %d", ns, own)
	}
	other := peerNS(func() (net.Conn, error) {
		type res struct {
			c   net.Conn
			err error
		}
		ch := make(chan res, 1)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
			if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
				ch <- res{err: err}
				return
			}
			c, err := net.Dial("unix", path)
			ch <- res{c, err}
		}()
		r := <-ch
		return r.c, r.err
	})
	if other == 0 || other == own {
		t.Fatalf("a peer in another namespace: cookie %d, ours %d", other, own)
	}
}
