package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/cephconn"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/metrics"
	"github.com/rbd-owner/rbd-owner/agent/nodestate"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
	"github.com/rbd-owner/rbd-owner/agent/server"
	"github.com/rbd-owner/rbd-owner/agent/state"
	"github.com/rbd-owner/rbd-owner/agent/version"
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

// routes is the API, call by call. Release is open to the CSI role for a node's own claims;
// with force it needs the admin role, which releaseCall checks once the body is read.
func (d *Daemon) routes() map[string]server.Route {
	return map[string]server.Route{
		api.PathMap:         {Method: http.MethodPost, Need: peercred.RoleCSI, Serve: server.Call(d.Map)},
		api.PathUnmap:       {Method: http.MethodPost, Need: peercred.RoleCSI, Serve: server.Call(d.unmapCall)},
		api.PathRelease:     {Method: http.MethodPost, Need: peercred.RoleCSI, Serve: server.Call(d.releaseCall)},
		api.PathStatus:      {Method: http.MethodGet, Need: peercred.RoleCSI, Serve: d.handleStatus},
		api.PathClaims:      {Method: http.MethodGet, Need: peercred.RoleCSI, Serve: d.handleClaims},
		api.PathOrphanList:  {Method: http.MethodGet, Need: peercred.RoleCSI, Serve: d.handleOrphans},
		api.PathFence:       {Method: http.MethodPost, Need: peercred.RoleAdmin, Serve: server.Call(d.Fence)},
		api.PathUnfence:     {Method: http.MethodPost, Need: peercred.RoleAdmin, Serve: server.Call(d.Unfence)},
		api.PathUnfenceNode: {Method: http.MethodPost, Need: peercred.RoleAdmin, Serve: server.Call(d.UnfenceNode)},
		api.PathOrphans:     {Method: http.MethodPost, Need: peercred.RoleAdmin, Serve: server.Call(d.RemoveOrphans)},
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
	ok, err := d.Release(ctx, req, peer)
	return api.ReleaseResponse{Released: ok}, err
}

func (d *Daemon) handleStatus(w http.ResponseWriter, r *http.Request) {
	server.WriteJSON(w, http.StatusOK, d.Status())
}

func (d *Daemon) handleClaims(w http.ResponseWriter, r *http.Request) {
	d.listClaims(w, r, false)
}

func (d *Daemon) handleOrphans(w http.ResponseWriter, r *http.Request) {
	d.listClaims(w, r, true)
}

// listClaims answers the claim records of a cluster's pools (?cluster=&pool=), each marked when
// its image is gone; onlyOrphans keeps just those.
func (d *Daemon) listClaims(w http.ResponseWriter, r *http.Request, onlyOrphans bool) {
	cl, err := d.cluster(r.URL.Query().Get("cluster"))
	if err != nil {
		server.WriteError(w, server.APIError(err))
		return
	}
	store, err := cl.claims(r.Context())
	if err != nil {
		server.WriteError(w, server.APIError(err))
		return
	}
	pool := r.URL.Query().Get("pool")
	if node := r.URL.Query().Get("node"); node != "" {
		d.listNodeHolds(w, r, cl, store, node, pool)
		return
	}
	if c, _ := server.CallerFrom(r.Context()); pool == "" && c.Role != peercred.RoleAdmin {
		// every pool's claims: a read of every claim in the cluster, not a call for the CSI role
		server.WriteError(w, server.APIError(server.Denied(d.audit, r.Method+" "+r.URL.Path+" of every pool", c,
			"listing the claims of every pool is an admin call: name a pool (--pool POOL), or run it as root or a member of rbd-owner-admin")))
		return
	}
	pools, err := cl.pools(r.Context(), pool)
	if err != nil {
		server.WriteError(w, server.APIError(err))
		return
	}
	out := []api.Claim{}
	for _, p := range pools {
		recs, err := store.List(r.Context(), p)
		if err != nil {
			if len(pools) > 1 && (errors.Is(err, cephconn.ErrPermission) || errors.Is(err, claim.ErrNotFound)) {
				continue // a pool the agent may not read is not one it claims in
			}
			server.WriteError(w, server.APIError(err))
			return
		}
		for i := range recs {
			orphan, err := store.IsOrphan(r.Context(), recs[i])
			if err != nil {
				// the claim is still worth showing; whether its image is gone is not known
				d.log.WithError(err).WithField("image", recs[i].Ref.String()).Warn("claims listing: could not tell whether the image is gone")
				if onlyOrphans {
					server.WriteError(w, server.APIError(err))
					return
				}
			}
			if onlyOrphans && !orphan {
				continue
			}
			c := apiClaim(cl.cfg.ID, &recs[i])
			c.Orphan = orphan
			out = append(out, *c)
		}
	}
	server.WriteJSON(w, http.StatusOK, out)
}

// listNodeHolds answers the claims that name node as a holder, cluster-wide (only in pool when
// one is named), found through node's heartbeats: what `fence --node` would fence.
func (d *Daemon) listNodeHolds(w http.ResponseWriter, r *http.Request, cl *cluster, store *claim.Store, node, pool string) {
	holds, errs := store.NodeHolds(r.Context(), node)
	if len(holds) == 0 && len(errs) > 0 {
		server.WriteError(w, server.APIError(fmt.Errorf("claims of node %s: %w", node, errors.Join(errs...))))
		return
	}
	for _, err := range errs {
		d.log.WithError(err).WithField("node", node).Warn("claims of a node: a place could not be read; the list may be short")
	}
	out := []api.Claim{}
	for _, h := range holds {
		if pool == "" || h.Record.Pool == pool {
			out = append(out, *apiClaim(cl.cfg.ID, &h.Record))
		}
	}
	server.WriteJSON(w, http.StatusOK, out)
}

// clusterClaims returns a configured cluster ("" for the only one) and its claim store,
// connecting when needed.
func (d *Daemon) clusterClaims(ctx context.Context, id string) (*cluster, *claim.Store, error) {
	cl, err := d.cluster(id)
	if err != nil {
		return nil, nil, err
	}
	store, err := cl.claims(ctx)
	if err != nil {
		return nil, nil, err
	}
	return cl, store, nil
}

// pools returns [pool], or every pool of the cluster when pool is "".
func (c *cluster) pools(ctx context.Context, pool string) ([]string, error) {
	if pool != "" {
		return []string{pool}, nil
	}
	store, err := c.claims(ctx)
	if err != nil {
		return nil, err
	}
	return store.Backend().Pools(ctx)
}

// RemoveOrphans removes the claims of deleted images (admin).
func (d *Daemon) RemoveOrphans(ctx context.Context, req api.OrphansRequest, peer *peercred.Cred) (*api.OrphansResponse, error) {
	cl, store, err := d.clusterClaims(ctx, req.Cluster)
	if err != nil {
		return nil, err
	}
	pools, err := cl.pools(ctx, req.Pool)
	if err != nil {
		return nil, err
	}
	out := &api.OrphansResponse{Removed: []string{}}
	for _, p := range pools {
		orphans, err := store.Orphans(ctx, p)
		if err != nil {
			if len(pools) > 1 && (errors.Is(err, cephconn.ErrPermission) || errors.Is(err, claim.ErrNotFound)) {
				continue
			}
			return nil, err
		}
		for _, o := range orphans {
			ok, err := store.RemoveOrphan(ctx, o.Ref)
			if err != nil {
				d.log.WithError(err).WithField("image", o.Ref.String()).Warn("orphan claim not removed")
				continue
			}
			if ok {
				out.Removed = append(out.Removed, o.Ref.String())
				d.audit.Record(audit.Entry{Event: audit.Release, Cluster: cl.cfg.ID, Pool: o.Pool, Namespace: o.Namespace, Image: o.Image,
					Epoch: o.Epoch, HasPeer: peer != nil, UID: uidOf(peer), PID: pidOf(peer),
					Message: fmt.Sprintf("removed the claim of deleted image %s", o.Ref)})
			}
		}
	}
	return out, nil
}

// Fence blocklists the mappings of an image's holders (admin).
func (d *Daemon) Fence(ctx context.Context, req api.ImageRequest, peer *peercred.Cred) (*api.FenceResponse, error) {
	if req.Node != "" {
		if req.Pool != "" || req.Image != "" {
			return nil, fmt.Errorf("%w: fence names an image or a node (--node), not both", errInvalid)
		}
		return d.fenceNode(ctx, req, peer)
	}
	t, err := d.target(req.Cluster, req.Ref())
	if err != nil {
		return nil, err
	}
	store, err := t.cl.claims(ctx)
	if err != nil {
		return nil, err
	}
	res, err := store.Fence(ctx, t.img)
	if err != nil {
		return nil, err
	}
	d.rememberPool(t.key)
	out := &api.FenceResponse{}
	for _, f := range res.Fences {
		out.FencedAddrs = append(out.FencedAddrs, f.Addr)
		d.metrics.Fenced(t.key.Cluster, metrics.CauseAdmin)
		if out.FencedAddr == "" {
			out.FencedAddr, out.Expires = f.Addr, f.Expires
		}
		d.audit.Record(audit.Entry{Event: audit.Fence, Cluster: t.key.Cluster, Pool: t.spec.Pool, Namespace: t.spec.Namespace, Image: t.spec.Image,
			Epoch: f.Epoch, OwnerNode: f.NodeID, HasPeer: peer != nil, UID: uidOf(peer), PID: pidOf(peer), Warning: true,
			Message: fmt.Sprintf("fenced %s, holder of %s, until %s", f.Described(), t.spec, f.Expires.Format(time.RFC3339))})
	}
	return out, nil
}

// Release drops a claim: with Force, a fenced dead owner's (admin); without, this node's own
// claim on an image it no longer maps.
func (d *Daemon) Release(ctx context.Context, req api.ImageRequest, peer *peercred.Cred) (bool, error) {
	t, err := d.target(req.Cluster, req.Ref())
	if err != nil {
		return false, err
	}
	store, err := t.cl.claims(ctx)
	if err != nil {
		return false, err
	}
	unlock, err := d.locks.lock(ctx, t.key)
	if err != nil {
		return false, err
	}
	defer unlock()
	if !req.Force {
		if m, ok := d.state.Get(t.key); ok {
			return false, fmt.Errorf("%w: %s is mapped here as %s: unmap it instead", errInvalid, t.spec, m.Device)
		}
		rec, err := store.Inspect(ctx, t.img)
		if err != nil {
			if errors.Is(err, claim.ErrNoClaim) {
				return false, nil
			}
			return false, err
		}
		h := rec.Holder(d.cfg.NodeID)
		if h == nil {
			return false, fmt.Errorf("%w: this node holds no claim on %s; an admin drops another node's with --force after fencing it", errInvalid, t.spec)
		}
		// the persisted state is not the kernel: after a lost state directory, or an adoption
		// whose state write failed, a device may be mapped with no state. Never drop the claim
		// of a device that may write.
		if dev, err := d.mappedHere(t, store.FSID(), h.ClientAddr); err != nil || dev != "" {
			if err != nil {
				return false, fmt.Errorf("release %s: could not check this node's devices, so the claim is kept: %w", t.spec, err)
			}
			return false, fmt.Errorf("%w: %s is mapped on this node as %s though the agent has no record of it; unmap that device first (rbd-owner unmap %s)", errInvalid, t.spec, dev, dev)
		}
		return store.Release(ctx, t.img, h.Epoch)
	}
	// the record as it was, for the audit trail: who is being released
	rec, err := store.Inspect(ctx, t.img)
	if err != nil && !errors.Is(err, claim.ErrNoClaim) {
		return false, fmt.Errorf("release --force %s: reading the claim: %w", t.spec, err)
	}
	d.rememberPool(t.key) // the freed claim keeps its fences: this node sweeps their pool
	ok, err := store.ForceRelease(ctx, t.img)
	if err != nil {
		return false, err
	}
	if ok && rec != nil {
		for _, h := range rec.Holders {
			d.audit.Record(audit.Entry{Event: audit.Release, Cluster: t.key.Cluster, Pool: t.spec.Pool, Namespace: t.spec.Namespace, Image: t.spec.Image,
				Epoch: h.Epoch, OwnerNode: h.NodeID, HasPeer: peer != nil, UID: uidOf(peer), PID: pidOf(peer), Warning: true,
				Message: fmt.Sprintf("force-released node %s's fenced claim on %s (epoch %d)", h.NodeID, t.spec, h.Epoch)})
		}
	}
	return ok, nil
}

// mappedHere names a device of this node that maps the image, or whose client is the claim's
// recorded one (clientAddr, may be ""); "" when there is none.
func (d *Daemon) mappedHere(t target, fsid, clientAddr string) (string, error) {
	devs, err := d.kernel.FindBySpec(t.spec, fsid)
	if err != nil {
		return "", err
	}
	if len(devs) > 0 {
		return devs[0].DevNode, nil
	}
	if clientAddr == "" {
		return "", nil
	}
	all, err := d.kernel.List()
	if err != nil {
		return "", err
	}
	for _, dv := range all {
		if dv.ClientAddr == clientAddr {
			return dv.DevNode, nil
		}
	}
	return "", nil
}

// Status is this node's view: clusters, devices (managed or not), claims held, problems.
func (d *Daemon) Status() api.Status {
	st := api.Status{Node: d.cfg.NodeID, Version: version.Version, Clusters: d.clusterStatuses(), Devices: []api.Device{},
		Problems: []string{}, ClaimsHeld: d.node.HeldCount()}
	for _, m := range d.state.All() {
		if m.Phase != state.Mapped {
			continue
		}
		ad := api.Device{Device: m.Device, Link: linkOf(m.Ref, m.FSID), Cluster: m.Cluster, FSID: m.FSID,
			Pool: m.Pool, Namespace: m.Namespace, Image: m.Image, Snapshot: m.Snap, ClientAddr: m.ClientAddr, Managed: true,
			Epoch: m.Epoch}
		var since time.Time
		if ad.Problem, since = d.node.Problem(m.Key); ad.Problem != "" && !since.IsZero() {
			ad.ProblemSince = &since
		}
		st.Devices = append(st.Devices, ad)
	}
	for _, u := range d.node.UnmanagedDevices() {
		st.Devices = append(st.Devices, unmanagedStatus(u))
	}
	for _, p := range d.node.Problems() {
		st.Problems = append(st.Problems, p.Key.String()+": "+p.Msg+sinceText(p.Since))
	}
	for _, dv := range st.Devices {
		if !dv.Managed {
			line := dv.Device + ": " + dv.Problem
			if dv.ProblemSince != nil {
				line += sinceText(*dv.ProblemSince)
			}
			st.Problems = append(st.Problems, line)
		}
	}
	if err, since := d.state.WriteFailure(); err != nil {
		st.Problems = append(st.Problems, d.stateWriteProblem(err)+sinceText(since))
	}
	st.Problems = append(st.Problems, d.skewProblems()...)
	sort.Strings(st.Problems)
	return st
}

// unmanagedStatus is an unmanaged device's entry in status.
func unmanagedStatus(u nodestate.Unmanaged) api.Device {
	dv := u.Dev
	ad := api.Device{Device: dv.DevNode, Cluster: u.Cluster, FSID: dv.ClusterFSID, Pool: dv.Pool, Namespace: dv.Namespace,
		Image: dv.Image, Snapshot: dv.Snap, ClientAddr: dv.ClientAddr, Problem: u.Problem()}
	if !u.Since.IsZero() {
		since := u.Since
		ad.ProblemSince = &since
	}
	if u.Verdict == claim.FenceIntruder && !u.FencedAt.IsZero() {
		until := u.FencedUntil
		ad.FencedUntil = &until
	}
	return ad
}

// clusterStatuses is each configured cluster's connection and this node's address toward it,
// by cluster id.
func (d *Daemon) clusterStatuses() []api.ClusterStatus {
	ids := make([]string, 0, len(d.clusters))
	for id := range d.clusters {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	ages := d.metrics.LivenessAges()
	out := []api.ClusterStatus{}
	for _, id := range ids {
		c := d.clusters[id]
		cs := api.ClusterStatus{ID: id}
		if age, ok := ages[id]; ok {
			cs.LivenessWriteAge = new(age.Seconds())
		}
		c.mu.Lock()
		switch {
		case c.store != nil:
			cs.Connected, cs.FSID = true, c.store.FSID()
		case c.lastErr != nil:
			cs.Error = c.lastErr.Error()
		default: // not tried yet, or the first attempt is under way
			cs.Connecting = true
		}
		c.mu.Unlock()
		var err error
		if cs.NodeAddr, err = d.addrs.SourceFor(c.cfg.Monitors); err != nil {
			msg := "node address toward the monitors unknown: " + err.Error()
			if cs.Error != "" {
				msg = cs.Error + "; " + msg
			}
			cs.Error = msg
		}
		out = append(out, cs)
	}
	return out
}

func (d *Daemon) statusLine() string {
	s := d.Status()
	return fmt.Sprintf("STATUS=%d devices, %d claims, %d problems", len(s.Devices), s.ClaimsHeld, len(s.Problems))
}

func apiClaim(clusterID string, r *claim.Record) *api.Claim {
	if r == nil {
		return nil
	}
	c := &api.Claim{Cluster: clusterID, ClusterFSID: r.ClusterFSID, Pool: r.Pool, Namespace: r.Namespace, Image: r.Image,
		ImageID: r.ImageID, Access: string(r.Access), Epoch: r.Epoch, Holders: []api.Holder{}}
	for _, h := range r.Holders {
		c.Holders = append(c.Holders, api.Holder{NodeID: h.NodeID, Hostname: h.Hostname, NodeAddr: h.NodeAddr, ClientAddr: h.ClientAddr,
			Device: h.Device, ReadOnly: h.ReadOnly, Epoch: h.Epoch, AcquiredAt: h.AcquiredAt, RenewedAt: h.RenewedAt,
			LeaseSeconds: h.LeaseSeconds, AgentVersion: h.AgentVersion, Fenced: h.Fenced})
	}
	for _, in := range r.Intruders {
		c.Intruders = append(c.Intruders, apiIntruder(in))
	}
	for _, f := range r.Fences {
		c.Fences = append(c.Fences, api.Fence{NodeID: f.NodeID, Addr: f.Addr, Epoch: f.Epoch, At: f.At, By: f.By, Expires: f.Expires,
			BootID: f.BootID, RenewedAt: f.RenewedAt, RenewedBy: f.RenewedBy, Gone: f.Gone, GoneAt: f.GoneAt})
	}
	return c
}
