package daemon

import (
	"context"
	"fmt"
	"net"
	"net/http"

	"github.com/rbd-owner/rbd-owner/agent/admin"
	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
	"github.com/rbd-owner/rbd-owner/agent/server"
)

// Handler returns the v1 API (for tests that serve it on their own listener). Requests reach
// it with the caller that server.WithCaller put in their context; without one they are refused.
func (d *Daemon) Handler() http.Handler { return server.Handler(d.routes(), d.audit) }

// servers returns the HTTP servers of the main socket (a role by the peer's credentials) and of
// the CSI socket (the CSI role, whoever calls). Both serve the same routes.
func (d *Daemon) servers() (main, csi *http.Server) {
	h := d.Handler()
	return server.New(h, server.SocketMain, d.peers), server.New(h, server.SocketCSI, d.peers)
}

// listeners returns the main socket and the CSI socket (nil when the config has none): those in
// Options, else those systemd passed, else sockets made at the configured paths.
func (d *Daemon) listeners() (main, csi net.Listener, err error) {
	return server.Sockets{Main: d.cfg.Socket, CSI: d.cfg.CSISocket, MainL: d.opts.Listener, CSIL: d.opts.CSIListener, Log: d.log}.Listeners()
}

// routes is the API, call by call: each route names the least role it needs. Release and the
// claims listing are open to the CSI role for what concerns it (a node's own claims, one pool);
// a forced release and a listing of every pool need the admin role, which their calls check
// once the request is read.
func (d *Daemon) routes() map[string]server.Route {
	return map[string]server.Route{
		api.PathMap:         {Method: http.MethodPost, Need: peercred.RoleCSI, Serve: server.Call(d.Map)},
		api.PathUnmap:       {Method: http.MethodPost, Need: peercred.RoleCSI, Serve: server.Call(d.unmapCall)},
		api.PathRelease:     {Method: http.MethodPost, Need: peercred.RoleCSI, Serve: server.Call(d.releaseCall)},
		api.PathStatus:      {Method: http.MethodGet, Need: peercred.RoleCSI, Serve: d.handleStatus},
		api.PathClaims:      {Method: http.MethodGet, Need: peercred.RoleCSI, Serve: server.Get(d.claimsCall(false))},
		api.PathOrphanList:  {Method: http.MethodGet, Need: peercred.RoleCSI, Serve: server.Get(d.claimsCall(true))},
		api.PathFence:       {Method: http.MethodPost, Need: peercred.RoleAdmin, Serve: server.Call(d.admin.Fence)},
		api.PathUnfence:     {Method: http.MethodPost, Need: peercred.RoleAdmin, Serve: server.Call(d.admin.Unfence)},
		api.PathUnfenceNode: {Method: http.MethodPost, Need: peercred.RoleAdmin, Serve: server.Call(d.admin.UnfenceNode)},
		api.PathOrphans:     {Method: http.MethodPost, Need: peercred.RoleAdmin, Serve: server.Call(d.admin.RemoveOrphans)},
		api.PathMetrics:     {Method: http.MethodGet, Need: peercred.RoleCSI, Serve: d.metrics.Handler().ServeHTTP},
	}
}

func (d *Daemon) unmapCall(ctx context.Context, req api.UnmapRequest, peer *peercred.Cred) (api.UnmapResponse, error) {
	if req.Device == "" && (req.Pool == "" || req.Image == "") {
		return api.UnmapResponse{}, fmt.Errorf("%w: name an image (pool and image) or a device", errInvalid)
	}
	ok, err := d.Unmap(ctx, req, peer)
	return api.UnmapResponse{Unmapped: ok}, err
}

func (d *Daemon) releaseCall(ctx context.Context, req api.ImageRequest, peer *peercred.Cred) (api.ReleaseResponse, error) {
	if req.Force {
		if err := server.RequireAdmin(ctx, d.audit, "POST "+api.PathRelease+" with force"); err != nil {
			return api.ReleaseResponse{}, err
		}
	}
	ok, err := d.admin.Release(ctx, req, peer)
	return api.ReleaseResponse{Released: ok}, err
}

func (d *Daemon) handleStatus(w http.ResponseWriter, _ *http.Request) {
	server.WriteJSON(w, http.StatusOK, d.Status())
}

// claimsCall lists claims (GET ?cluster=&pool=&node=), only orphans with onlyOrphans. The
// claims of every pool are a read of every claim in the cluster: an admin call.
func (d *Daemon) claimsCall(onlyOrphans bool) func(*http.Request) ([]api.Claim, error) {
	return func(r *http.Request) ([]api.Claim, error) {
		q := r.URL.Query()
		cq := admin.ClaimsQuery{Cluster: q.Get("cluster"), Pool: q.Get("pool"), Node: q.Get("node"), OnlyOrphans: onlyOrphans}
		if c, _ := server.CallerFrom(r.Context()); c.Role != peercred.RoleAdmin {
			cq.EveryPool = func() error {
				return server.Denied(d.audit, r.Method+" "+r.URL.Path+" of every pool", c,
					"listing the claims of every pool is an admin call: name a pool (--pool POOL), or run it as root or a member of rbd-owner-admin")
			}
		}
		return d.admin.Claims(r.Context(), cq)
	}
}
