// Package peercred identifies the process at the other end of a unix socket (SO_PEERCRED)
// and decides whether it may use the agent: uid 0, or a member of the agent's group.
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
)

// Cred is what the kernel says about a peer, as of when it connected.
type Cred struct {
	UID, GID, PID int
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
	)
	if err := raw.Control(func(fd uintptr) {
		ucred, gerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return Cred{}, fmt.Errorf("peer credentials: %w", err)
	}
	if gerr != nil {
		return Cred{}, fmt.Errorf("peer credentials: SO_PEERCRED: %w", gerr)
	}
	return Cred{UID: int(ucred.Uid), GID: int(ucred.Gid), PID: int(ucred.Pid)}, nil
}

// Policy says who may call: root, and members of Group (a gid; -1 for none).
type Policy struct {
	Group int
	// ProcRoot is where /proc is ("" means /proc); the peer's supplementary groups are read
	// from ProcRoot/PID/status.
	ProcRoot string
}

// ErrDenied is returned by Allow for a peer that may not call.
var ErrDenied = errors.New("not root and not in the rbd-owner group")

// Allow says whether the peer may call.
func (p Policy) Allow(c Cred) error {
	if c.UID == 0 {
		return nil
	}
	if p.Group < 0 {
		return ErrDenied
	}
	if c.GID == p.Group {
		return nil
	}
	groups, err := p.groupsOf(c.PID)
	if err != nil {
		return fmt.Errorf("%w (its groups are unreadable: %v)", ErrDenied, err)
	}
	for _, g := range groups {
		if g == p.Group {
			return nil
		}
	}
	return ErrDenied
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
