// Package peercred identifies the process at the other end of a unix socket (SO_PEERCRED,
// SO_PEERGROUPS: what the kernel recorded when it connected) and decides what it may do (its
// Role): uid 0 or group rbd-owner-admin is an admin, group rbd-owner has the CSI role.
package peercred

import (
	"context"
	"errors"
	"fmt"
	"net"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rbd-owner/rbd-owner/agent/fault"
)

// Cred is what the kernel says about a peer, as of when it connected.
type Cred struct {
	UID, GID, PID int
	// Groups are the peer's supplementary groups when it connected (SO_PEERGROUPS, Linux 4.13
	// and later), never read from /proc afterwards: a PID can be reused by then.
	Groups []int
	// GroupsErr says why Groups could not be read (nil when they were): no group then gives
	// the peer a role.
	GroupsErr error
	// NetNS is the cookie of the peer's network namespace (0 when the kernel cannot say,
	// before Linux 5.14): a unix socket's server end lives in the connecting process's
	// network namespace, so SO_NETNS_COOKIE on it names the caller's.
	NetNS uint64
}

// UID is c's uid, or -1 when there are no credentials (c nil): audit entries' form.
func UID(c *Cred) int {
	if c == nil {
		return -1
	}
	return c.UID
}

// PID is c's pid, or -1 when there are no credentials (c nil).
func PID(c *Cred) int {
	if c == nil {
		return -1
	}
	return c.PID
}

// OwnNetNS is the cookie of this process's network namespace (0 when the kernel cannot say).
func OwnNetNS() uint64 {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0
	}
	defer func() { _ = unix.Close(fd) }() // a probe: nothing was done with it
	c, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if err != nil {
		return 0
	}
	return c
}

// FromConn reads the peer's credentials from a unix socket connection.
func FromConn(c net.Conn) (Cred, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return Cred{}, fmt.Errorf("peer credentials: %T is not a unix socket", c)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return Cred{}, fmt.Errorf("peer credentials: %w", err)
	}
	var (
		ucred          *unix.Ucred
		uerr, groupErr error
		groups         []int
		netns          uint64
	)
	if err := raw.Control(func(fd uintptr) {
		ucred, uerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		groups, groupErr = peerGroups(int(fd))
		if c, err := unix.GetsockoptUint64(int(fd), unix.SOL_SOCKET, unix.SO_NETNS_COOKIE); err == nil {
			netns = c
		}
	}); err != nil {
		return Cred{}, fmt.Errorf("peer credentials: %w", err)
	}
	if uerr != nil {
		return Cred{}, fmt.Errorf("peer credentials: SO_PEERCRED: %w", uerr)
	}
	cred := Cred{UID: int(ucred.Uid), GID: int(ucred.Gid), PID: int(ucred.Pid), Groups: groups, NetNS: netns}
	if groupErr != nil {
		cred.Groups, cred.GroupsErr = nil, fmt.Errorf("the caller's supplementary groups cannot be read from the socket "+
			"(SO_PEERGROUPS, Linux 4.13 or later): %w", groupErr)
	}
	return cred, nil
}

// getsockoptGroups is getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS) into buf: the bytes written,
// or on ERANGE the bytes the peer's groups need. A test replaces it.
var getsockoptGroups = func(fd int, buf []uint32) (int, error) {
	size := uint32(4 * len(buf))
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_PEERGROUPS,
		uintptr(unsafe.Pointer(unsafe.SliceData(buf))), uintptr(unsafe.Pointer(&size)), 0) //nolint:gosec // x/sys/unix has no SO_PEERGROUPS call: the raw getsockopt takes addresses
	if e != 0 {
		return int(size), e
	}
	return int(size), nil
}

// peerGroups reads the supplementary groups the peer of a connected unix socket had when it
// connected (an array of gid_t; the buffer grows when the kernel says it is too small).
func peerGroups(fd int) ([]int, error) {
	buf := make([]uint32, 64)
	for range 4 {
		n, err := getsockoptGroups(fd, buf)
		if errors.Is(err, unix.ERANGE) && n > 4*len(buf) {
			buf = make([]uint32, (n+3)/4)
			continue
		}
		if err != nil {
			return nil, err
		}
		if n < 0 || n > 4*len(buf) || n%4 != 0 {
			return nil, fmt.Errorf("SO_PEERGROUPS returned %d bytes", n)
		}
		out := make([]int, n/4)
		for i := range out {
			out[i] = int(buf[i])
		}
		return out, nil
	}
	return nil, errors.New("SO_PEERGROUPS: the buffer never was large enough")
}

// Role is what a caller may do. Each API route names the least role it needs.
type Role int

const (
	// RoleNone may do nothing: every call is refused with 403 and audited.
	RoleNone Role = iota
	// RoleCSI may map, unmap, release its own claims and read status, claims, orphans and
	// metrics: what a CSI node plugin needs, and nothing that acts on another node.
	RoleCSI
	// RoleAdmin may also fence, release with force and remove orphaned claims.
	RoleAdmin
)

func (r Role) String() string {
	switch r {
	case RoleCSI:
		return "csi"
	case RoleAdmin:
		return "admin"
	}
	return "none"
}

// Policy gives a role to a caller on the main socket by its credentials: uid 0 or a member of
// AdminGroup is an admin, a member of CSIGroup has the CSI role, anyone else none. (The CSI
// socket grants the CSI role whoever calls: that is the daemon's choice, not the policy's.)
type Policy struct {
	AdminGroup int // gid of rbd-owner-admin; -1 for none
	CSIGroup   int // gid of rbd-owner; -1 for none
}

// ErrDenied is returned by Role for a peer that may not call at all.
var ErrDenied = fault.New(fault.PermissionDenied, "not root and not in group rbd-owner or rbd-owner-admin")

// Role says what the peer may do, from the credentials it had when it connected (Cred: uid,
// gid and supplementary groups as the kernel recorded them on the socket). A peer that may do
// nothing gets RoleNone and an error that wraps ErrDenied. A peer whose supplementary groups
// are unknown (Cred.GroupsErr) gets no role from any group: it is refused unless it is root.
func (p Policy) Role(c Cred) (Role, error) {
	if c.UID == 0 {
		return RoleAdmin, nil
	}
	if p.AdminGroup < 0 && p.CSIGroup < 0 {
		return RoleNone, ErrDenied
	}
	if c.GroupsErr != nil {
		return RoleNone, fmt.Errorf("%w: %v", ErrDenied, c.GroupsErr)
	}
	best := RoleNone
	for _, g := range append([]int{c.GID}, c.Groups...) {
		switch {
		case p.AdminGroup >= 0 && g == p.AdminGroup:
			return RoleAdmin, nil
		case p.CSIGroup >= 0 && g == p.CSIGroup:
			best = RoleCSI
		}
	}
	if best != RoleNone {
		return best, nil
	}
	return RoleNone, ErrDenied
}

type ctxKey struct{}

// WithCred stores a peer's credentials in a context (http.Server.ConnContext).
func WithCred(ctx context.Context, c Cred) context.Context {
	return context.WithValue(ctx, ctxKey{}, c)
}

// FromContext returns the credentials stored by WithCred.
func FromContext(ctx context.Context) (Cred, bool) {
	c, ok := ctx.Value(ctxKey{}).(Cred)
	return c, ok
}
