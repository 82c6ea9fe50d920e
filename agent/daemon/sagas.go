package daemon

import (
	"context"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/image"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
	"github.com/rbd-owner/rbd-owner/agent/saga"
	"github.com/rbd-owner/rbd-owner/agent/server"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// Map is the map call: the map saga (package saga) for the caller of ctx.
func (d *Daemon) Map(ctx context.Context, req api.MapRequest, peer *peercred.Cred) (*api.MapResponse, error) {
	return d.sagas.Map(ctx, req, d.sagaCaller(ctx, peer))
}

// Unmap is the unmap call: the unmap saga for the caller of ctx.
func (d *Daemon) Unmap(ctx context.Context, req api.UnmapRequest, peer *peercred.Cred) (bool, error) {
	return d.sagas.Unmap(ctx, req, d.sagaCaller(ctx, peer))
}

// sagaCaller is the caller of ctx as the sagas see it: its credentials, whether it is an admin,
// and how a refusal for want of the admin role is recorded. A call whose caller is unknown is
// no admin's.
func (d *Daemon) sagaCaller(ctx context.Context, peer *peercred.Cred) saga.Caller {
	c, _ := server.CallerFrom(ctx)
	return saga.Caller{Peer: peer, Admin: c.Role >= peercred.RoleAdmin,
		Denied: func(what string) error { return server.Denied(d.audit, what, c, server.NeedsAdmin(what, c)) }}
}

// sagaAgent is what the sagas use of this daemon: its clusters, the reconciler's handling of a
// device found gone, the takeover watches and the metrics' cluster label.
type sagaAgent struct{ d *Daemon }

var _ saga.Agent = sagaAgent{}

func (a sagaAgent) Cluster(id string) (saga.Cluster, error) {
	cl, err := a.d.cluster(id)
	if err != nil {
		return nil, err
	}
	return cl, nil
}

func (a sagaAgent) ClusterByFSID(fsid string) saga.Cluster {
	if cl := clusterByFSID(a.d.clusters, fsid); cl != nil {
		return cl
	}
	return nil
}

func (a sagaAgent) FencedMappingGone(ctx context.Context, store *claim.Store, m state.Mapping) {
	a.d.fences.fencedMappingGone(ctx, store, m)
}

func (a sagaAgent) WatchHeld(k state.Key, held bool) {
	if held {
		a.d.watches.add(k, time.Now().Add(watchFor(a.d.cfg.LeaseDuration.D())))
		return
	}
	a.d.watches.drop(k)
}

func (a sagaAgent) ClusterLabel(id string) string { return a.d.clusterLabel(id) }

// ID is the cluster's id in the config.
func (c *cluster) ID() string { return c.cfg.ID }

// MapOptions is how the kernel reaches the cluster, but for the secret (saga.Cluster).
func (c *cluster) MapOptions() krbd.MapOptions {
	return krbd.MapOptions{Monitors: c.cfg.Monitors, User: c.cfg.User, Extra: append([]string(nil), c.cfg.MapOptions...)}
}

// MapDefaults is the cluster's rbd_default_map_options for an image (saga.Cluster).
func (c *cluster) MapDefaults(ref image.Ref) (krbd.ClusterDefaults, error) { return c.mapDefaults(ref) }

// Secret is the agent's cephx key for the cluster, known once it has connected (saga.Cluster).
func (c *cluster) Secret() (string, error) { return c.secret() }

// Connected is the cluster's claim store when connected now; it never connects (saga.Cluster).
func (c *cluster) Connected() (*claim.Store, bool) {
	store, _, ok := c.connected()
	return store, ok
}
