// Package server is the agent's transport: the unix sockets (created, or passed by systemd),
// who is calling and with which role, the route table that decides what each role may call,
// and the API's JSON: bodies read, answers and errors written. It knows nothing of claims or
// devices; the daemon hands it the routes.
package server

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/fault"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
)

// The sockets a caller can come through.
const (
	SocketMain = "main" // a role by the peer's credentials
	SocketCSI  = "csi"  // the CSI role, whoever calls
)

// Caller is who is at the other end of one connection, decided once when it connects.
type Caller struct {
	Cred   peercred.Cred
	Known  bool // Cred was read from the socket (SO_PEERCRED)
	Role   peercred.Role
	Why    error // why Role is RoleNone
	Socket string
}

// CallerOf reads a connection's peer and gives it its role: on the CSI socket the CSI role,
// whoever it is; on the main socket what the peer's credentials allow under peers.
func CallerOf(c net.Conn, socket string, peers peercred.Policy) Caller {
	cl := Caller{Socket: socket}
	cred, err := peercred.FromConn(c)
	cl.Cred, cl.Known = cred, err == nil
	switch {
	case socket == SocketCSI:
		cl.Role = peercred.RoleCSI
	case err != nil:
		cl.Role, cl.Why = peercred.RoleNone, err
	default:
		cl.Role, cl.Why = peers.Role(cred)
	}
	return cl
}

type callerKey struct{}

// WithCaller is ctx carrying c (and its credentials, for peercred.FromContext).
func WithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(peercred.WithCred(ctx, c.Cred), callerKey{}, c)
}

// CallerFrom is the caller ctx carries.
func CallerFrom(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok
}

// Peer is c's credentials, for audit entries (nil when they could not be read).
func (c Caller) Peer() *peercred.Cred {
	if !c.Known {
		return nil
	}
	return &c.Cred
}

// ErrDenied is the kind of a refusal because the caller's role does not allow the call.
var ErrDenied = fault.ErrPermission

// NeedsAdmin is the message of a refusal for want of the admin role.
func NeedsAdmin(what string, c Caller) string {
	if c.Socket == SocketCSI {
		return fmt.Sprintf("%s needs the admin role; the CSI socket grants the CSI role only (use the main socket as root or a member of group rbd-owner-admin)", what)
	}
	return fmt.Sprintf("%s needs the admin role: uid %d has the %s role (root and members of group rbd-owner-admin are admins)", what, c.Cred.UID, c.Role)
}

// Denied records in al who was refused what, and returns the error to answer.
func Denied(al *audit.Log, what string, c Caller, msg string) error {
	al.Record(audit.Entry{Event: audit.Denied, Result: audit.Refused, UID: c.Cred.UID, PID: c.Cred.PID, HasPeer: c.Known, Warning: true,
		Message: fmt.Sprintf("denied %s to uid %d pid %d on the %s socket (%s role): %s", what, c.Cred.UID, c.Cred.PID, c.Socket, c.Role, msg)})
	return fmt.Errorf("%w: %s", ErrDenied, msg)
}

// RequireAdmin is nil for an admin caller of ctx, else the recorded refusal of what.
func RequireAdmin(ctx context.Context, al *audit.Log, what string) error {
	c, _ := CallerFrom(ctx) // a call whose caller is unknown is no admin's
	if c.Role >= peercred.RoleAdmin {
		return nil
	}
	return Denied(al, what, c, NeedsAdmin(what, c))
}

var errUnknownPeer = errors.New("peer credentials unknown")
