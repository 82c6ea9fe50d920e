// Package admin is the agent's operations on the cluster's claims that are not a map or an
// unmap of this node: fencing an image's holders or a whole node, lifting fences, releasing a
// claim (this node's own, or a fenced dead owner's by force), listing claims, and removing the
// claims of deleted images. Each is one call of the API; the route decides who may make it.
// Every change is audited with the caller's credentials.
package admin

import (
	"context"
	"fmt"

	"github.com/sirupsen/logrus"

	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/fault"
	"github.com/rbd-owner/rbd-owner/agent/image"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/metrics"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// Agent is what the admin calls need of the running agent.
type Agent interface {
	// Cluster is the id of a configured cluster ("" for the only one); an unknown one is
	// invalid input.
	Cluster(id string) (string, error)
	// Claims is a configured cluster's claim store, connecting when needed.
	Claims(ctx context.Context, id string) (*claim.Store, error)
	// Pools is [pool], or every pool of the cluster when pool is "".
	Pools(ctx context.Context, id, pool string) ([]string, error)
	// LockImage waits for an image's lock, the one its map and unmap hold, until ctx ends.
	LockImage(ctx context.Context, k state.Key) (unlock func(), err error)
	// RememberPool makes this node a sweeper of k's pool, so that the fences of its claims are
	// kept even once nothing of it is mapped here.
	RememberPool(k state.Key)
}

// Admin runs the admin calls of one node's agent.
type Admin struct {
	Agent   Agent
	NodeID  string
	Kernel  *krbd.Client
	State   *state.Store
	Audit   *audit.Log
	Metrics *metrics.Metrics
	Log     *logrus.Logger
}

// target is a validated image on a configured cluster.
type target struct {
	cluster string
	spec    image.Ref
	key     state.Key
	img     claim.Image
}

func (a *Admin) target(clusterID string, spec image.Ref) (target, error) {
	if err := spec.Validate(); err != nil {
		return target{}, fmt.Errorf("%w: %w", fault.ErrInvalid, err)
	}
	id, err := a.Agent.Cluster(clusterID)
	if err != nil {
		return target{}, err
	}
	return target{cluster: id, spec: spec, key: state.Key{Cluster: id, Ref: spec}, img: spec.Head()}, nil
}

// targetStore is target and its cluster's claim store.
func (a *Admin) targetStore(ctx context.Context, clusterID string, spec image.Ref) (target, *claim.Store, error) {
	t, err := a.target(clusterID, spec)
	if err != nil {
		return t, nil, err
	}
	store, err := a.Agent.Claims(ctx, t.cluster)
	return t, store, err
}

// clusterStore is a configured cluster's id and claim store.
func (a *Admin) clusterStore(ctx context.Context, clusterID string) (string, *claim.Store, error) {
	id, err := a.Agent.Cluster(clusterID)
	if err != nil {
		return "", nil, err
	}
	store, err := a.Agent.Claims(ctx, id)
	return id, store, err
}
