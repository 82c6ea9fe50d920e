package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	"github.com/coreos/go-systemd/v22/activation"
	"github.com/sirupsen/logrus"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/cephconn"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/fault"
	"github.com/rbd-owner/rbd-owner/agent/metrics"
	"github.com/rbd-owner/rbd-owner/agent/nodestate"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
	"github.com/rbd-owner/rbd-owner/agent/state"
	"github.com/rbd-owner/rbd-owner/agent/version"
)

// Handler returns the v1 API (for tests that serve it on their own listener). Requests reach
// it with the caller that ConnContext put in their context; without one they are refused.
func (d *Daemon) Handler() http.Handler { return d.handler() }

// servers returns the HTTP servers of the main socket (a role by the peer's credentials) and of
// the CSI socket (the CSI role, whoever calls). Both serve the same routes.
func (d *Daemon) servers() (main, csi *http.Server) {
	h := d.handler()
	mk := func(socket string) *http.Server {
		return &http.Server{
			Handler:           h,
			ReadHeaderTimeout: 10 * time.Second,
			ReadTimeout:       30 * time.Second,
			IdleTimeout:       2 * time.Minute,
			ConnContext: func(ctx context.Context, c net.Conn) context.Context {
				return withCaller(ctx, d.callerOf(c, socket))
			},
		}
	}
	return mk(socketMain), mk(socketCSI)
}

const (
	socketMain = "main"
	socketCSI  = "csi"
)

// caller is who is at the other end of one connection, decided once when it connects.
type caller struct {
	cred   peercred.Cred
	known  bool // cred was read from the socket (SO_PEERCRED)
	role   peercred.Role
	why    error // why role is RoleNone
	socket string
}

// callerOf reads a connection's peer and gives it its role: on the CSI socket the CSI role,
// whoever it is; on the main socket what the peer's credentials allow.
func (d *Daemon) callerOf(c net.Conn, socket string) caller {
	cl := caller{socket: socket}
	cred, err := peercred.FromConn(c)
	cl.cred, cl.known = cred, err == nil
	switch {
	case socket == socketCSI:
		cl.role = peercred.RoleCSI
	case err != nil:
		cl.role, cl.why = peercred.RoleNone, err
	default:
		cl.role, cl.why = d.peers.Role(cred)
	}
	return cl
}

type callerKey struct{}

func withCaller(ctx context.Context, c caller) context.Context {
	return context.WithValue(peercred.WithCred(ctx, c.cred), callerKey{}, c)
}

func callerFrom(ctx context.Context) (caller, bool) {
	c, ok := ctx.Value(callerKey{}).(caller)
	return c, ok
}

// route is one call of the API: its method, the least role it needs, and its handler.
type route struct {
	method string
	need   peercred.Role
	serve  http.HandlerFunc
}

// routes is the API, call by call. Release is open to the CSI role for a node's own claims;
// with force it needs the admin role, which releaseCall checks once the body is read.
func (d *Daemon) routes() map[string]route {
	return map[string]route{
		api.PathMap:         {http.MethodPost, peercred.RoleCSI, call(d.Map)},
		api.PathUnmap:       {http.MethodPost, peercred.RoleCSI, call(d.unmapCall)},
		api.PathRelease:     {http.MethodPost, peercred.RoleCSI, call(d.releaseCall)},
		api.PathStatus:      {http.MethodGet, peercred.RoleCSI, d.handleStatus},
		api.PathClaims:      {http.MethodGet, peercred.RoleCSI, d.handleClaims},
		api.PathOrphanList:  {http.MethodGet, peercred.RoleCSI, d.handleOrphans},
		api.PathFence:       {http.MethodPost, peercred.RoleAdmin, call(d.Fence)},
		api.PathUnfence:     {http.MethodPost, peercred.RoleAdmin, call(d.Unfence)},
		api.PathUnfenceNode: {http.MethodPost, peercred.RoleAdmin, call(d.UnfenceNode)},
		api.PathOrphans:     {http.MethodPost, peercred.RoleAdmin, call(d.RemoveOrphans)},
		api.PathMetrics:     {http.MethodGet, peercred.RoleCSI, d.metrics.Handler().ServeHTTP},
	}
}

// handler checks the caller's role against the route and answers every error, an unknown path
// and a wrong method included, as the contract's JSON error.
func (d *Daemon) handler() http.Handler {
	routes := d.routes()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, ok := callerFrom(r.Context())
		if !ok {
			c = caller{role: peercred.RoleNone, why: errors.New("peer credentials unknown")}
		}
		if c.role == peercred.RoleNone {
			if c.why == nil {
				c.why = peercred.ErrDenied
			}
			d.deny(w, r.Method+" "+r.URL.Path, c, fmt.Sprintf("uid %d may not use rbd-owner: %v (add the user to group rbd-owner, or rbd-owner-admin for admin calls)", c.cred.UID, c.why))
			return
		}
		rt, ok := routes[r.URL.Path]
		if !ok {
			writeError(w, &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("no such call: %s %s (this agent serves the v1 API)", r.Method, r.URL.Path)})
			return
		}
		if r.Method != rt.method {
			w.Header().Set("Allow", rt.method)
			writeJSON(w, http.StatusMethodNotAllowed, api.ErrorBody{Error: &api.Error{Code: api.CodeInvalidArgument,
				Message: fmt.Sprintf("%s %s: method not allowed, use %s", r.Method, r.URL.Path, rt.method)}})
			return
		}
		if c.role < rt.need {
			d.deny(w, r.Method+" "+r.URL.Path, c, needsAdmin(r.Method+" "+r.URL.Path, c))
			return
		}
		rt.serve(w, r)
	})
}

// needsAdmin is the message of a refusal for want of the admin role.
func needsAdmin(what string, c caller) string {
	if c.socket == socketCSI {
		return fmt.Sprintf("%s needs the admin role; the CSI socket grants the CSI role only (use the main socket as root or a member of group rbd-owner-admin)", what)
	}
	return fmt.Sprintf("%s needs the admin role: uid %d has the %s role (root and members of group rbd-owner-admin are admins)", what, c.cred.UID, c.role)
}

// deny answers 403 and records who was refused what.
func (d *Daemon) deny(w http.ResponseWriter, what string, c caller, msg string) {
	writeError(w, apiError(d.denied(what, c, msg)))
}

// denied records who was refused what, and returns the error to answer.
func (d *Daemon) denied(what string, c caller, msg string) error {
	d.audit.Record(audit.Entry{Event: audit.Denied, Result: audit.Refused, UID: c.cred.UID, PID: c.cred.PID, HasPeer: c.known, Warning: true,
		Message: fmt.Sprintf("denied %s to uid %d pid %d on the %s socket (%s role): %s", what, c.cred.UID, c.cred.PID, c.socket, c.role, msg)})
	return fmt.Errorf("%w: %s", errDenied, msg)
}

// peerOf is the caller's credentials, for audit entries (nil when they could not be read).
func peerOf(r *http.Request) *peercred.Cred {
	if c, ok := callerFrom(r.Context()); ok && c.known {
		return &c.cred
	}
	return nil
}

// errDenied: the caller's role does not allow the call.
var errDenied = fault.ErrPermission

// decode reads a size-limited JSON body and refuses unknown fields and trailing data.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	r.Body = http.MaxBytesReader(w, r.Body, api.MaxBodyBytes)
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil && dec.More() {
		err = errors.New("trailing data after the JSON object")
	}
	if err == nil {
		if _, rerr := io.Copy(io.Discard, r.Body); rerr != nil {
			err = rerr
		}
	}
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			err = fmt.Errorf("request body larger than %d bytes", api.MaxBodyBytes)
		}
		writeError(w, &api.Error{Code: api.CodeInvalidArgument, Message: "bad request body: " + err.Error()})
		return false
	}
	return true
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		// only a type that cannot be encoded gets here: a bug, answered as one
		status, buf = http.StatusInternalServerError, bytes.Buffer{}
		fmt.Fprintf(&buf, `{"error":{"code":%q,"message":%q}}`+"\n", api.CodeInternal, "encoding the answer: "+err.Error())
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	// a write error means the caller has gone; there is no one left to tell
	_, _ = w.Write(buf.Bytes())
}

func writeError(w http.ResponseWriter, e *api.Error) {
	writeJSON(w, api.HTTPStatus(e.Code), api.ErrorBody{Error: e})
}

// apiError turns an error into the API's code (by its kind, package fault), message and owner.
func apiError(err error) *api.Error {
	e := &api.Error{Code: api.CodeOf(fault.KindOf(err)), Message: err.Error()}
	var held *claim.HeldError
	if errors.As(err, &held) {
		o := held.Owner()
		lv := held.Leases[o.NodeID]
		e.Owner = &api.Owner{NodeID: o.NodeID, Hostname: o.Hostname, NodeAddr: o.NodeAddr, ClientAddr: o.ClientAddr, Epoch: o.Epoch,
			AcquiredAt: o.AcquiredAt, RenewedAt: o.RenewedAt, LeaseAge: lv.Unchanged.Seconds(), Expired: lv.Expired}
		if d := held.RetryAfter(); d > 0 {
			e.RetryAfterSeconds = int64((d + time.Second - 1) / time.Second)
		}
	}
	return e
}

// call serves a POST call: decode the body (size-limited, no unknown fields), run f with the
// caller's credentials, answer its result or its error.
func call[Req, Resp any](f func(context.Context, Req, *peercred.Cred) (Resp, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req Req
		if !decode(w, r, &req) {
			return
		}
		resp, err := f(r.Context(), req, peerOf(r))
		if err != nil {
			writeError(w, apiError(err))
			return
		}
		writeJSON(w, http.StatusOK, resp)
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
	if c, _ := callerFrom(ctx); req.Force && c.role < peercred.RoleAdmin {
		what := "POST " + api.PathRelease + " with force"
		return api.ReleaseResponse{}, d.denied(what, c, needsAdmin(what, c))
	}
	ok, err := d.Release(ctx, req, peer)
	return api.ReleaseResponse{Released: ok}, err
}

func (d *Daemon) handleStatus(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, d.Status())
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
		writeError(w, apiError(err))
		return
	}
	store, err := cl.claims(r.Context())
	if err != nil {
		writeError(w, apiError(err))
		return
	}
	pool := r.URL.Query().Get("pool")
	if node := r.URL.Query().Get("node"); node != "" {
		d.listNodeHolds(w, r, cl, store, node, pool)
		return
	}
	if c, _ := callerFrom(r.Context()); pool == "" && c.role != peercred.RoleAdmin {
		// every pool's claims: a read of every claim in the cluster, not a call for the CSI role
		d.deny(w, r.Method+" "+r.URL.Path+" of every pool", c, "listing the claims of every pool is an admin call: name a pool (--pool POOL), or run it as root or a member of rbd-owner-admin")
		return
	}
	pools, err := cl.pools(r.Context(), pool)
	if err != nil {
		writeError(w, apiError(err))
		return
	}
	out := []api.Claim{}
	for _, p := range pools {
		recs, err := store.List(r.Context(), p)
		if err != nil {
			if len(pools) > 1 && (errors.Is(err, cephconn.ErrPermission) || errors.Is(err, claim.ErrNotFound)) {
				continue // a pool the agent may not read is not one it claims in
			}
			writeError(w, apiError(err))
			return
		}
		for i := range recs {
			orphan, err := store.IsOrphan(r.Context(), recs[i])
			if err != nil {
				// the claim is still worth showing; whether its image is gone is not known
				d.log.WithError(err).WithField("image", recs[i].Ref.String()).Warn("claims listing: could not tell whether the image is gone")
				if onlyOrphans {
					writeError(w, apiError(err))
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
	writeJSON(w, http.StatusOK, out)
}

// listNodeHolds answers the claims that name node as a holder, cluster-wide (only in pool when
// one is named), found through node's heartbeats: what `fence --node` would fence.
func (d *Daemon) listNodeHolds(w http.ResponseWriter, r *http.Request, cl *cluster, store *claim.Store, node, pool string) {
	holds, errs := store.NodeHolds(r.Context(), node)
	if len(holds) == 0 && len(errs) > 0 {
		writeError(w, apiError(fmt.Errorf("claims of node %s: %w", node, errors.Join(errs...))))
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
	writeJSON(w, http.StatusOK, out)
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

// listeners returns the main socket and the CSI socket (nil when the config has none): those in
// Options, else those systemd passed (rbd-owner.socket listens on both; they are told apart by
// path), else sockets the daemon creates: mode 0660, group rbd-owner.
func (d *Daemon) listeners() (main, csi net.Listener, err error) {
	main, csi = d.opts.Listener, d.opts.CSIListener
	wantCSI := d.cfg.CSISocket != "" && d.cfg.CSISocket != "none"
	if main == nil || (csi == nil && wantCSI) {
		passed, err := activation.Listeners()
		if err != nil {
			return nil, nil, fmt.Errorf("socket activation: %w", err)
		}
		for _, l := range passed {
			if l == nil {
				continue
			}
			switch addr := l.Addr().String(); {
			case addr == d.cfg.Socket && main == nil:
				main = l
			case addr == d.cfg.CSISocket && wantCSI && csi == nil:
				csi = l
			default:
				d.log.WithField("socket", addr).Warn("systemd passed a socket the config does not name; closing it")
				if err := l.Close(); err != nil {
					d.log.WithError(err).WithField("socket", addr).Warn("closing the unexpected socket")
				}
				continue
			}
			d.log.WithField("socket", l.Addr().String()).Info("using the socket systemd passed")
		}
	}
	if main == nil {
		if main, err = listen(d.cfg.Socket, d.log); err != nil {
			return nil, nil, err
		}
	}
	if csi == nil && wantCSI {
		if csi, err = listen(d.cfg.CSISocket, d.log); err != nil {
			main.Close()
			return nil, nil, err
		}
	}
	return main, csi, nil
}

// listen creates a socket at path: mode 0660, group rbd-owner, in a directory of mode 0755.
func listen(path string, log *logrus.Logger) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("socket %s: exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("socket %s: another agent is answering on it", path)
		}
		if err := os.Remove(path); err != nil { // stale
			return nil, fmt.Errorf("socket %s: removing the stale socket: %w", path, err)
		}
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	gid := lookupGroup("rbd-owner")
	if gid < 0 {
		gid = 0
		log.WithField("socket", path).Warn("group rbd-owner does not exist: only root can use the socket")
	}
	if err := os.Chown(path, 0, gid); err != nil {
		log.WithError(err).WithField("socket", path).Warn("cannot give the socket to group rbd-owner")
	}
	if err := os.Chmod(path, 0o660); err != nil {
		l.Close()
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	return l, nil
}

// lookupGroup returns the gid of a group, or -1.
func lookupGroup(name string) int {
	g, err := user.LookupGroup(name)
	if err != nil {
		return -1
	}
	gid, err := strconv.Atoi(g.Gid)
	if err != nil {
		return -1
	}
	return gid
}
