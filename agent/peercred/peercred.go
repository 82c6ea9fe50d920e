// Package peercred identifies the process at the other end of a unix socket (SO_PEERCRED)
// and decides what it may do (its Role): uid 0 or group rbd-owner-admin is an admin, group
// rbd-owner has the CSI role.
package peercred

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/rbd-owner/rbd-owner/agent/fault"
)

// Cred is what the kernel says about a peer, as of when it connected.
type Cred struct {
	UID, GID, PID int
	// NetNS is the cookie of the peer's network namespace (0 when the kernel cannot say,
	// before Linux 5.14): a unix socket's server end lives in the connecting process's
	// network namespace, so SO_NETNS_COOKIE on it names the caller's.
	NetNS uint64
}

// OwnNetNS is the cookie of this process's network namespace (0 when the kernel cannot say).
func OwnNetNS() uint64 {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0
	}
	defer unix.Close(fd)
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
		ucred *unix.Ucred
		gerr  error
		netns uint64
	)
	if err := raw.Control(func(fd uintptr) {
		ucred, gerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		if c, err := unix.GetsockoptUint64(int(fd), unix.SOL_SOCKET, unix.SO_NETNS_COOKIE); err == nil {
			netns = c
		}
	}); err != nil {
		return Cred{}, fmt.Errorf("peer credentials: %w", err)
	}
	if gerr != nil {
		return Cred{}, fmt.Errorf("peer credentials: SO_PEERCRED: %w", gerr)
	}
	return Cred{UID: int(ucred.Uid), GID: int(ucred.Gid), PID: int(ucred.Pid), NetNS: netns}, nil
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
	// ProcRoot is where /proc is ("" means /proc); the peer's supplementary groups are read
	// from ProcRoot/PID/status.
	ProcRoot string
}

// ErrDenied is returned by Role for a peer that may not call at all.
var ErrDenied = fault.New(fault.PermissionDenied, "not root and not in group rbd-owner or rbd-owner-admin")

// Role says what the peer may do. A peer that may do nothing gets RoleNone and an error that
// wraps ErrDenied (and says so when its groups could not be read: it is then refused).
func (p Policy) Role(c Cred) (Role, error) {
	if c.UID == 0 {
		return RoleAdmin, nil
	}
	if p.AdminGroup < 0 && p.CSIGroup < 0 {
		return RoleNone, ErrDenied
	}
	groups := []int{c.GID}
	extra, err := p.groupsOf(c.PID)
	groups = append(groups, extra...)
	best := RoleNone
	for _, g := range groups {
		switch {
		case p.AdminGroup >= 0 && g == p.AdminGroup:
			return RoleAdmin, nil
		case p.CSIGroup >= 0 && g == p.CSIGroup:
			best = RoleCSI
		}
	}
	if best != RoleNone {
		// a CSI member whose other groups could not be read is still a CSI member; it is
		// never raised to admin on a guess
		return best, nil
	}
	if err != nil {
		return RoleNone, fmt.Errorf("%w (its groups are unreadable: %v)", ErrDenied, err)
	}
	return RoleNone, ErrDenied
}

// groupsOf reads the supplementary groups of a process from /proc/PID/status.
func (p Policy) groupsOf(pid int) ([]int, error) {
	root := p.ProcRoot
	if root == "" {
		root = "/proc"
	}
	f, err := os.Open(filepath.Join(root, strconv.Itoa(pid), "status"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "Groups:")
		if !ok {
			continue
		}
		var out []int
		for _, g := range strings.Fields(rest) {
			n, err := strconv.Atoi(g)
			if err != nil {
				return nil, fmt.Errorf("bad Groups line %q", sc.Text())
			}
			out = append(out, n)
		}
		return out, nil
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return nil, errors.New("no Groups line")
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
