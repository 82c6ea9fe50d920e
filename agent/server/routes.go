package server

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
)

// Route is one call of the API: its method, the least role it needs, and its handler.
type Route struct {
	Method string
	Need   peercred.Role
	Serve  http.HandlerFunc
}

// Handler checks the caller's role against the route of the request's path and answers every
// error, an unknown path and a wrong method included, as the contract's JSON error. Refusals
// are recorded in al.
func Handler(routes map[string]Route, al *audit.Log) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		what := r.Method + " " + r.URL.Path
		c, ok := CallerFrom(r.Context())
		if !ok {
			c = Caller{Role: peercred.RoleNone, Why: errUnknownPeer}
		}
		if c.Role == peercred.RoleNone {
			if c.Why == nil {
				c.Why = peercred.ErrDenied
			}
			WriteError(w, APIError(Denied(al, what, c, fmt.Sprintf("uid %d may not use rbd-owner: %v (add the user to group rbd-owner, or rbd-owner-admin for admin calls)", c.Cred.UID, c.Why))))
			return
		}
		rt, ok := routes[r.URL.Path]
		if !ok {
			WriteError(w, &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("no such call: %s (this agent serves the v1 API)", what)})
			return
		}
		if r.Method != rt.Method {
			w.Header().Set("Allow", rt.Method)
			WriteJSON(w, http.StatusMethodNotAllowed, api.ErrorBody{Error: &api.Error{Code: api.CodeInvalidArgument,
				Message: fmt.Sprintf("%s: method not allowed, use %s", what, rt.Method)}})
			return
		}
		if c.Role < rt.Need {
			WriteError(w, APIError(Denied(al, what, c, NeedsAdmin(what, c))))
			return
		}
		rt.Serve(w, r)
	})
}

// New is the HTTP server of one socket (SocketMain or SocketCSI): h, with each connection's
// caller decided as it connects (CallerOf under peers).
func New(h http.Handler, socket string, peers peercred.Policy) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return WithCaller(ctx, CallerOf(c, socket, peers))
		},
	}
}
