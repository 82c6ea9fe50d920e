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
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
	"github.com/rbd-owner/rbd-owner/agent/state"
	"github.com/rbd-owner/rbd-owner/agent/version"
)

// Handler returns the v1 API (for tests that serve it on their own listener).
func (d *Daemon) Handler() http.Handler { return d.server().Handler }

func (d *Daemon) server() *http.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+api.PathMap, call(d.Map))
	mux.HandleFunc("POST "+api.PathUnmap, call(d.unmapCall))
	mux.HandleFunc("GET "+api.PathStatus, d.handleStatus)
	mux.HandleFunc("GET "+api.PathClaims, d.handleClaims)
	mux.HandleFunc("POST "+api.PathFence, call(d.Fence))
	mux.HandleFunc("POST "+api.PathRelease, call(d.releaseCall))
	mux.HandleFunc("POST "+api.PathOrphans, call(d.RemoveOrphans))
	return &http.Server{
		Handler:           d.authorize(mux),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if cred, err := peercred.FromConn(c); err == nil {
				return peercred.WithCred(ctx, cred)
			}
			return ctx
		},
		ErrorLog: nil,
	}
}

// authorize lets root and the rbd-owner group through; everyone else gets 403 and an audit entry.
func (d *Daemon) authorize(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cred, ok := peercred.FromContext(r.Context())
		var err error
		if !ok {
			err = errors.New("peer credentials unknown")
		} else {
			err = d.peers.Allow(cred)
		}
		if err != nil {
			d.audit.Record(audit.Entry{Event: audit.Denied, Result: audit.Refused, UID: cred.UID, PID: cred.PID, HasPeer: ok, Warning: true,
				Message: fmt.Sprintf("denied %s %s to uid %d pid %d: %v", r.Method, r.URL.Path, cred.UID, cred.PID, err)})
			writeError(w, &api.Error{Code: api.CodePermissionDenied,
				Message: fmt.Sprintf("uid %d may not use rbd-owner: %v (add the user to group rbd-owner)", cred.UID, err)})
			return
		}
		next.ServeHTTP(w, r)
	})
}

func peerOf(r *http.Request) *peercred.Cred {
	if c, ok := peercred.FromContext(r.Context()); ok {
		return &c
	}
	return nil
}

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
	_ = enc.Encode(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

func writeError(w http.ResponseWriter, e *api.Error) {
	writeJSON(w, api.HTTPStatus(e.Code), api.ErrorBody{Error: e})
}

// apiError turns an error into the API's code, message and owner.
func apiError(err error) *api.Error {
	e := &api.Error{Code: api.CodeInternal, Message: err.Error()}
	var held *claim.HeldError
	switch {
	case errors.As(err, &held):
		e.Code = api.CodeClaimedElsewhere
		o := held.Owner()
		e.Owner = &api.Owner{NodeID: o.NodeID, Hostname: o.Hostname, NodeAddr: o.NodeAddr, ClientAddr: o.ClientAddr, Epoch: o.Epoch,
			AcquiredAt: o.AcquiredAt, RenewedAt: o.RenewedAt, LeaseAge: held.Now.Sub(o.RenewedAt).Seconds(), Expired: o.Expired(held.Now)}
	case errors.Is(err, claim.ErrFenced), errors.Is(err, krbd.ErrFenced):
		e.Code = api.CodeFenced
	case errors.Is(err, errInvalid), errors.Is(err, claim.ErrInvalid), errors.Is(err, krbd.ErrInvalid), errors.Is(err, krbd.ErrUnsupported):
		e.Code = api.CodeInvalidArgument
	case errors.Is(err, claim.ErrNotFound), errors.Is(err, krbd.ErrNotFound), errors.Is(err, claim.ErrNoClaim):
		e.Code = api.CodeNotFound
	case errors.Is(err, claim.ErrBusy), errors.Is(err, krbd.ErrBusy):
		e.Code = api.CodeBusy
	case errors.Is(err, cephconn.ErrUnavailable), errors.Is(err, krbd.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded):
		e.Code = api.CodeClusterUnavailable
	case errors.Is(err, context.DeadlineExceeded):
		e.Code = api.CodeTimeout
	case errors.Is(err, cephconn.ErrPermission), errors.Is(err, krbd.ErrPermission):
		e.Code = api.CodePermissionDenied
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
	ok, err := d.Release(ctx, req, peer)
	return api.ReleaseResponse{Released: ok}, err
}

func (d *Daemon) handleStatus(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, d.Status())
}

func (d *Daemon) handleClaims(w http.ResponseWriter, r *http.Request) {
	cl, err := d.cluster(r.URL.Query().Get("cluster"))
	if err != nil {
		writeError(w, apiError(err))
		return
	}
	store, err := cl.claims()
	if err != nil {
		writeError(w, apiError(err))
		return
	}
	pools, err := cl.pools(r.URL.Query().Get("pool"))
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
		orphans, _ := store.Orphans(r.Context(), p)
		isOrphan := map[string]bool{}
		for _, o := range orphans {
			isOrphan[o.Image.String()] = true
		}
		for i := range recs {
			c := apiClaim(cl.cfg.ID, &recs[i])
			c.Orphan = isOrphan[recs[i].Image.String()]
			out = append(out, *c)
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// pools returns [pool], or every pool of the cluster when pool is "".
func (c *cluster) pools(pool string) ([]string, error) {
	if pool != "" {
		return []string{pool}, nil
	}
	c.mu.Lock()
	conn := c.conn
	c.mu.Unlock()
	if conn == nil {
		return nil, fmt.Errorf("cluster %s: %w", c.cfg.ID, cephconn.ErrUnavailable)
	}
	pools, err := conn.ListPools()
	return pools, cephconn.Classify(err, "list pools", "mon 'profile rbd'")
}

// RemoveOrphans removes the claims of deleted images (admin).
func (d *Daemon) RemoveOrphans(ctx context.Context, req api.OrphansRequest, peer *peercred.Cred) (*api.OrphansResponse, error) {
	cl, err := d.cluster(req.Cluster)
	if err != nil {
		return nil, err
	}
	store, err := cl.claims()
	if err != nil {
		return nil, err
	}
	pools, err := cl.pools(req.Pool)
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
			ok, err := store.RemoveOrphan(ctx, o.Image)
			if err != nil {
				d.log.WithError(err).WithField("image", o.Image.String()).Warn("orphan claim not removed")
				continue
			}
			if ok {
				out.Removed = append(out.Removed, o.Image.String())
				d.audit.Record(audit.Entry{Event: audit.Release, Cluster: cl.cfg.ID, Pool: o.Pool, Namespace: o.Namespace, Image: o.Name,
					Epoch: o.Epoch, HasPeer: peer != nil, UID: uidOf(peer), PID: pidOf(peer),
					Message: fmt.Sprintf("removed the claim of deleted image %s", o.Image)})
			}
		}
	}
	return out, nil
}

// Fence blocklists the mappings of an image's holders (admin).
func (d *Daemon) Fence(ctx context.Context, req api.ImageRequest, peer *peercred.Cred) (*api.FenceResponse, error) {
	t, err := d.target(req.Cluster, krbd.Spec{Pool: req.Pool, Namespace: req.Namespace, Image: req.Image})
	if err != nil {
		return nil, err
	}
	store, err := t.cl.claims()
	if err != nil {
		return nil, err
	}
	res, err := store.Fence(ctx, t.img)
	if err != nil {
		return nil, err
	}
	out := &api.FenceResponse{}
	for _, f := range res.Fences {
		out.FencedAddrs = append(out.FencedAddrs, f.Addr)
		if out.FencedAddr == "" {
			out.FencedAddr, out.Expires = f.Addr, f.Expires
		}
		d.audit.Record(audit.Entry{Event: audit.Fence, Cluster: t.key.Cluster, Pool: t.spec.Pool, Namespace: t.spec.Namespace, Image: t.spec.Image,
			Epoch: f.Epoch, OwnerNode: f.NodeID, HasPeer: peer != nil, UID: uidOf(peer), PID: pidOf(peer), Warning: true,
			Message: fmt.Sprintf("fenced node %s's mapping of %s: blocklisted %s until %s", f.NodeID, t.spec, f.Addr, f.Expires.Format(time.RFC3339))})
	}
	return out, nil
}

// Release drops a claim: with Force, a fenced dead owner's (admin); without, this node's own
// claim on an image it no longer maps.
func (d *Daemon) Release(ctx context.Context, req api.ImageRequest, peer *peercred.Cred) (bool, error) {
	t, err := d.target(req.Cluster, krbd.Spec{Pool: req.Pool, Namespace: req.Namespace, Image: req.Image})
	if err != nil {
		return false, err
	}
	store, err := t.cl.claims()
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
		return store.Release(ctx, t.img, h.Epoch)
	}
	rec, _ := store.Inspect(ctx, t.img)
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

// Status is this node's view: clusters, devices (managed or not), claims held, problems.
func (d *Daemon) Status() api.Status {
	st := api.Status{Node: d.cfg.NodeID, Version: version.Version, Clusters: []api.ClusterStatus{}, Devices: []api.Device{}, Problems: []string{}}
	ids := make([]string, 0, len(d.clusters))
	for id := range d.clusters {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		c := d.clusters[id]
		cs := api.ClusterStatus{ID: id}
		c.mu.Lock()
		if c.store != nil {
			cs.Connected, cs.FSID = true, c.store.FSID()
		} else if c.lastErr != nil {
			cs.Error = c.lastErr.Error()
		}
		c.mu.Unlock()
		cs.NodeAddr, _ = d.addrs.SourceFor(c.cfg.Monitors)
		st.Clusters = append(st.Clusters, cs)
	}
	mappings := d.state.All()
	for _, m := range mappings {
		if m.Claimed && (m.Phase == state.Mapped || m.Phase == state.Claimed) && !d.isLost(m.Key) {
			st.ClaimsHeld++
		}
		if m.Phase != state.Mapped {
			continue
		}
		st.Devices = append(st.Devices, api.Device{Device: m.Device, Link: linkOf(specOf(m), m.FSID), Cluster: m.Cluster, FSID: m.FSID,
			Pool: m.Pool, Namespace: m.Namespace, Image: m.Image, Snapshot: m.Snap, ClientAddr: m.ClientAddr, Managed: true,
			Epoch: m.Epoch, Problem: d.problem(m.Key)})
	}
	d.mu.Lock()
	for _, dv := range d.unmanaged {
		st.Devices = append(st.Devices, api.Device{Device: dv.DevNode, FSID: dv.ClusterFSID, Pool: dv.Pool, Namespace: dv.Namespace,
			Image: dv.Image, Snapshot: dv.Snap, ClientAddr: dv.ClientAddr, Problem: "mapped outside rbd-owner: no claim protects it"})
	}
	for k, p := range d.problems {
		st.Problems = append(st.Problems, k.String()+": "+p)
	}
	d.mu.Unlock()
	for _, dv := range st.Devices {
		if !dv.Managed {
			st.Problems = append(st.Problems, dv.Device+": "+dv.Problem)
		}
	}
	sort.Strings(st.Problems)
	return st
}

func (d *Daemon) statusLine() string {
	s := d.Status()
	return fmt.Sprintf("STATUS=%d devices, %d claims, %d problems", len(s.Devices), s.ClaimsHeld, len(s.Problems))
}

func apiClaim(clusterID string, r *claim.Record) *api.Claim {
	if r == nil {
		return nil
	}
	c := &api.Claim{Cluster: clusterID, ClusterFSID: r.ClusterFSID, Pool: r.Pool, Namespace: r.Namespace, Image: r.Name,
		ImageID: r.ImageID, Access: string(r.Access), Epoch: r.Epoch, Holders: []api.Holder{}}
	for _, h := range r.Holders {
		c.Holders = append(c.Holders, api.Holder{NodeID: h.NodeID, Hostname: h.Hostname, NodeAddr: h.NodeAddr, ClientAddr: h.ClientAddr,
			Device: h.Device, ReadOnly: h.ReadOnly, Epoch: h.Epoch, AcquiredAt: h.AcquiredAt, RenewedAt: h.RenewedAt,
			LeaseSeconds: h.LeaseSeconds, AgentVersion: h.AgentVersion, Fenced: h.Fenced})
	}
	return c
}

// listen takes the socket from systemd (rbd-owner.socket) or creates it: mode 0660, group
// rbd-owner.
func listen(path string, log *logrus.Logger) (net.Listener, error) {
	ls, err := activation.Listeners()
	if err != nil {
		return nil, fmt.Errorf("socket activation: %w", err)
	}
	for _, l := range ls {
		if l != nil {
			log.WithField("socket", l.Addr().String()).Info("using the socket systemd passed")
			return l, nil
		}
	}
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
		_ = os.Remove(path) // stale
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	gid := lookupGroup("rbd-owner")
	if gid < 0 {
		gid = 0
		log.Warn("group rbd-owner does not exist: only root can use the socket")
	}
	if err := os.Chown(path, 0, gid); err != nil {
		log.WithError(err).Warn("cannot give the socket to group rbd-owner")
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
