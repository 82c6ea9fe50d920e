package peercred

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

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
	unknown := errors.New("SO_PEERGROUPS: protocol not available")
	p := Policy{CSIGroup: 990, AdminGroup: 991}
	for _, tc := range []struct {
		name string
		c    Cred
		want Role
	}{
		{"root", Cred{UID: 0, GID: 0, PID: 1}, RoleAdmin},
		{"root whose groups are unknown", Cred{UID: 0, GID: 0, PID: 13, GroupsErr: unknown}, RoleAdmin},
		{"csi: primary group", Cred{UID: 1000, GID: 990, PID: 99}, RoleCSI},
		{"csi: supplementary group", Cred{UID: 1000, GID: 100, PID: 10, Groups: []int{100, 990, 27}}, RoleCSI},
		{"admin: primary group", Cred{UID: 1000, GID: 991, PID: 99}, RoleAdmin},
		{"admin: supplementary group", Cred{UID: 1000, GID: 100, PID: 14, Groups: []int{100, 991}}, RoleAdmin},
		{"member of both", Cred{UID: 1000, GID: 100, PID: 15, Groups: []int{990, 991}}, RoleAdmin},
		{"not a member", Cred{UID: 1000, GID: 100, PID: 11, Groups: []int{100}}, RoleNone},
		{"no groups", Cred{UID: 1000, GID: 100, PID: 12}, RoleNone},
		{"groups unknown: refused", Cred{UID: 1000, GID: 100, PID: 13, GroupsErr: unknown}, RoleNone},
		{"groups unknown: no role from the primary group either", Cred{UID: 1000, GID: 990, PID: 13, GroupsErr: unknown}, RoleNone},
		{"groups unknown: not admin by the primary group", Cred{UID: 1000, GID: 991, PID: 13, GroupsErr: unknown}, RoleNone},
	} {
		got, err := p.Role(tc.c)
		if got != tc.want {
			t.Errorf("%s: role %v, want %v (err %v)", tc.name, got, tc.want, err)
		}
		if (got == RoleNone) != (err != nil) || (err != nil && !errors.Is(err, ErrDenied)) {
			t.Errorf("%s: err %v with role %v", tc.name, err, got)
		}
		if tc.c.GroupsErr != nil && err != nil && !strings.Contains(err.Error(), unknown.Error()) {
			t.Errorf("%s: the refusal does not say why the groups are unknown: %v", tc.name, err)
		}
	}
	if r, err := (Policy{AdminGroup: -1, CSIGroup: -1}).Role(Cred{UID: 5, GID: 5}); r != RoleNone || !errors.Is(err, ErrDenied) {
		t.Errorf("no group configured: %v %v", r, err)
	}
	if r, _ := (Policy{AdminGroup: -1, CSIGroup: 990}).Role(Cred{UID: 5, GID: 991, Groups: []int{991}}); r != RoleNone {
		t.Errorf("admin group not configured: gid 991 got %v", r)
	}
}

// connected returns the server's end of a connection this process made to a fresh listener.
func connected(t *testing.T) net.Conn {
	t.Helper()
	l, addr := listen(t)
	c, err := net.Dial("unix", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestFromConnReadsTheGroupsFromTheSocket: the peer's supplementary groups come from the
// socket (SO_PEERGROUPS): this process's own, as os.Getgroups says, for a connection it made.
func TestFromConnReadsTheGroupsFromTheSocket(t *testing.T) {
	cred, err := FromConn(connected(t))
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.Getgroups()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(want)
	got := slices.Sorted(slices.Values(cred.Groups))
	if cred.GroupsErr != nil || !slices.Equal(got, want) {
		t.Fatalf("groups %v (%v), want this process's %v", got, cred.GroupsErr, want)
	}
	if os.Getuid() != 0 {
		return
	}
	// as root: a connecting thread with groups of its own, exactly those
	l, addr := listen(t)
	set := []int{7, 4242, 99, 60001}
	dialed := make(chan error, 1)
	dialAs(addr, 1000, 1000, set, dialed, nil)
	if err := <-dialed; err != nil {
		t.Fatal(err)
	}
	cred = acceptCred(t, l)
	if got, want := slices.Sorted(slices.Values(cred.Groups)), slices.Sorted(slices.Values(set)); cred.GroupsErr != nil || !slices.Equal(got, want) {
		t.Fatalf("a thread in groups %v: read %v (%v)", want, got, cred.GroupsErr)
	}
}

// TestPeerGroupsGrowsTheBuffer: on ERANGE the kernel says how much the groups need; the read is
// made again with that much.
func TestPeerGroupsGrowsTheBuffer(t *testing.T) {
	old := getsockoptGroups
	t.Cleanup(func() { getsockoptGroups = old })
	const n = 1000
	calls := 0
	getsockoptGroups = func(_ int, buf []uint32) (int, error) {
		calls++
		if len(buf) < n {
			return 4 * n, unix.ERANGE
		}
		for i := range n {
			buf[i] = uint32(i + 1)
		}
		return 4 * n, nil
	}
	g, err := peerGroups(-1)
	if err != nil || len(g) != n || g[0] != 1 || g[n-1] != n || calls != 2 {
		t.Fatalf("%d groups (%v) in %d calls", len(g), err, calls)
	}
}

// TestGroupsUnavailableRefuses: where the kernel cannot say (ENOPROTOOPT: before Linux 4.13),
// FromConn still gives the uid and pid, with the reason the groups are unknown, and Role
// gives such a peer no role from any group, never a guess from /proc.
func TestGroupsUnavailableRefuses(t *testing.T) {
	old := getsockoptGroups
	t.Cleanup(func() { getsockoptGroups = old })
	getsockoptGroups = func(int, []uint32) (int, error) { return 0, unix.ENOPROTOOPT }
	cred, err := FromConn(connected(t))
	if err != nil {
		t.Fatal(err)
	}
	if cred.PID != os.Getpid() || cred.UID != os.Getuid() || cred.Groups != nil || !errors.Is(cred.GroupsErr, unix.ENOPROTOOPT) ||
		!strings.Contains(cred.GroupsErr.Error(), "Linux 4.13") {
		t.Fatalf("cred %+v (groups: %v)", cred, cred.GroupsErr)
	}
	// a non-root peer in both groups by its primary gid and all of its groups
	cred.UID, cred.GID = 1000, 990
	r, err := (Policy{CSIGroup: 990, AdminGroup: 991}).Role(cred)
	if r != RoleNone || !errors.Is(err, ErrDenied) || !strings.Contains(err.Error(), "SO_PEERGROUPS, Linux 4.13 or later") {
		t.Fatalf("groups unavailable: role %v (%v), want none naming the kernel requirement", r, err)
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

var listeners atomic.Int64

// listen listens on a fresh abstract unix socket (no file mode stands in a peer's way).
func listen(t *testing.T) (net.Listener, string) {
	t.Helper()
	addr := fmt.Sprintf("@rbd-owner-peercred-test-%d-%d", os.Getpid(), listeners.Add(1))
	l, err := net.Listen("unix", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, addr
}

// dialAs connects to addr from a thread that has first taken uid, gid and groups for itself
// alone (unix.Setgroups and the raw setres*id calls change one thread's credentials, unlike
// syscall.Setuid), and holds the connection until the other end closes it; then it closes
// done. The thread is not the main thread, whose credentials are the ones /proc/PID/status
// shows. Needs root.
func dialAs(addr string, uid, gid int, groups []int, dialed chan<- error, done chan<- struct{}) {
	go onDisposableThread(func() {
		if done != nil {
			defer close(done)
		}
		if err := unix.Setgroups(groups); err != nil {
			dialed <- fmt.Errorf("setgroups: %w", err)
			return
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(gid), uintptr(gid), uintptr(gid)); e != 0 {
			dialed <- fmt.Errorf("setresgid: %w", e)
			return
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(uid), uintptr(uid), uintptr(uid)); e != 0 {
			dialed <- fmt.Errorf("setresuid: %w", e)
			return
		}
		c, err := net.Dial("unix", addr)
		dialed <- err
		if err == nil {
			_, _ = c.Read(make([]byte, 1)) // until the other end closes
			c.Close()
		}
	})
}

// onDisposableThread runs f locked to a thread that ends with it and is not the main thread
// (whose credentials /proc/PID/status shows, and which Go never ends): f may change that
// thread's credentials.
func onDisposableThread(f func()) {
	runtime.LockOSThread()
	if unix.Gettid() == unix.Getpid() {
		// the main thread: hold it, so that the goroutine below runs on another one
		done := make(chan struct{})
		go func() {
			defer close(done)
			onDisposableThread(f)
		}()
		<-done
		runtime.UnlockOSThread()
		return
	}
	f() // never unlocked: the thread and its credentials end with this goroutine
}

// acceptCred accepts one connection and returns what FromConn says of its peer; the
// connection is closed at the end of the test.
func acceptCred(t *testing.T, l net.Listener) Cred {
	t.Helper()
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	cred, err := FromConn(c)
	if err != nil {
		t.Fatal(err)
	}
	return cred
}

// procGroups is the Groups line of process pid's /proc entry.
func procGroups(t *testing.T, pid int) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Groups:"); ok {
			return strings.Fields(rest)
		}
	}
	t.Fatalf("no Groups line in /proc/%d/status", pid)
	return nil
}

// childEnv names the socket a child of TestRoleFromTheConnectorsGroupsNotProc connects to,
// and the groups its connecting thread takes ("4242,4243" or "").
const childEnv, childGroupsEnv = "RBD_OWNER_PEERCRED_TEST_DIAL", "RBD_OWNER_PEERCRED_TEST_GROUPS"

// TestPeerChild is the child of TestRoleFromTheConnectorsGroupsNotProc: a process whose main
// thread keeps the groups it was started with (what /proc/PID/status shows) while another of
// its threads, in other groups as uid 1000, connects; it exits when the parent closes its end
// of the connection.
func TestPeerChild(t *testing.T) {
	addr := os.Getenv(childEnv)
	if addr == "" {
		t.Skip("run by TestRoleFromTheConnectorsGroupsNotProc")
	}
	var groups []int
	for _, g := range strings.FieldsFunc(os.Getenv(childGroupsEnv), func(r rune) bool { return r == ',' }) {
		n, err := strconv.Atoi(g)
		if err != nil {
			t.Fatal(err)
		}
		groups = append(groups, n)
	}
	dialed, done := make(chan error, 1), make(chan struct{})
	dialAs(addr, 1000, 1000, groups, dialed, done)
	if err := <-dialed; err != nil {
		t.Fatal(err)
	}
	<-done
}

// startChild runs TestPeerChild as a process started in procGroups whose connecting thread
// takes threadGroups; it returns the Cred of the child's connection, the child, and a function
// that closes the connection (the child then exits) and waits for the child.
func startChild(t *testing.T, l net.Listener, addr string, procGroups []uint32, threadGroups string) (Cred, *exec.Cmd, func()) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestPeerChild$")
	cmd.Env = append(os.Environ(), childEnv+"="+addr, childGroupsEnv+"="+threadGroups)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 0, Gid: 0, Groups: procGroups}}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	type res struct {
		c   net.Conn
		err error
	}
	got := make(chan res, 1)
	go func() {
		c, err := l.Accept()
		got <- res{c, err}
	}()
	var conn net.Conn
	select {
	case r := <-got:
		if r.err != nil {
			_ = cmd.Process.Kill()
			t.Fatal(r.err)
		}
		conn = r.c
	case err := <-exited:
		t.Fatalf("the child exited before it connected: %v\n%s", err, out.String())
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("the child did not connect within 30s\n%s", out.String())
	}
	var once bool
	stop := func() {
		if once {
			return
		}
		once = true
		conn.Close()
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("the child: %v\n%s", err, out.String())
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("the child did not exit within 30s of its connection's end\n%s", out.String())
		}
	}
	t.Cleanup(stop)
	cred, err := FromConn(conn)
	if err != nil {
		t.Fatal(err)
	}
	if cred.PID != cmd.Process.Pid || cred.UID != 1000 {
		t.Fatalf("the child's peer: %+v, want pid %d uid 1000", cred, cmd.Process.Pid)
	}
	return cred, cmd, stop
}

// TestRoleFromTheConnectorsGroupsNotProc (hole 6): a caller's role comes from the groups it
// had when it connected, as the kernel recorded them on the socket, never from its PID's
// /proc entry read afterwards (which a reused PID fills with another process's groups). Each
// case is a peer whose PID's /proc entry says something else than the connecting thread had,
// or is gone; the old reading of /proc/PID/status refuses the members and makes the
// non-member an admin.
func TestRoleFromTheConnectorsGroupsNotProc(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to give a thread other credentials")
	}
	if os.Getenv(childEnv) != "" {
		t.Skip("this is the child")
	}
	p := Policy{CSIGroup: 4242, AdminGroup: 4243}
	if g := procGroups(t, os.Getpid()); slices.Contains(g, "4242") || slices.Contains(g, "4243") {
		t.Fatalf("this process is already in group 4242 or 4243: %v", g)
	}

	// a thread of this process in rbd-owner, a group /proc/PID/status does not list
	l, addr := listen(t)
	dialed := make(chan error, 1)
	dialAs(addr, 1000, 1000, []int{4242}, dialed, nil)
	if err := <-dialed; err != nil {
		t.Fatal(err)
	}
	if r, err := p.Role(acceptCred(t, l)); r != RoleCSI || err != nil {
		t.Errorf("a peer in group 4242 (not in /proc): role %v (%v), want csi", r, err)
	}
	// the same with more groups than a first guess at the buffer holds, 4242 the last
	many := make([]int, 0, 300)
	for g := 20000; g < 20299; g++ {
		many = append(many, g)
	}
	dialAs(addr, 1000, 1000, append(many, 4242), dialed, nil)
	if err := <-dialed; err != nil {
		t.Fatal(err)
	}
	if r, err := p.Role(acceptCred(t, l)); r != RoleCSI || err != nil {
		t.Errorf("a peer in 300 groups, 4242 the last: role %v (%v), want csi", r, err)
	}

	// a process whose /proc entry lists rbd-owner-admin; the thread that connected was in no group
	cred, child, _ := startChild(t, l, addr, []uint32{4243}, "")
	if g := procGroups(t, child.Process.Pid); !slices.Equal(g, []string{"4243"}) {
		t.Fatalf("the child's /proc entry lists groups %v, want [4243]", g)
	}
	if r, err := p.Role(cred); r != RoleNone || !errors.Is(err, ErrDenied) {
		t.Errorf("a peer in no group whose PID's /proc entry lists 4243: role %v (%v), want none", r, err)
	}

	// a member whose process is gone by the time its role is decided (its PID free for reuse)
	cred, child, stop := startChild(t, l, addr, nil, "4242")
	stop()
	if _, err := os.Stat("/proc/" + strconv.Itoa(child.Process.Pid)); err == nil {
		t.Logf("pid %d was reused already", child.Process.Pid)
	}
	if r, err := p.Role(cred); r != RoleCSI || err != nil {
		t.Errorf("a peer in group 4242 whose process has exited: role %v (%v), want csi", r, err)
	}
}
