package daemon

import (
	"context"

	"github.com/rbd-owner/rbd-owner/agent/admin"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// adminAgent is what the admin calls (package admin) use of this daemon: its clusters, the
// images' locks and the pools it sweeps.
type adminAgent struct{ d *Daemon }

var _ admin.Agent = adminAgent{}

func (a adminAgent) Cluster(id string) (string, error) {
	cl, err := a.d.cluster(id)
	if err != nil {
		return "", err
	}
	return cl.cfg.ID, nil
}

func (a adminAgent) Claims(ctx context.Context, id string) (*claim.Store, error) {
	cl, err := a.d.cluster(id)
	if err != nil {
		return nil, err
	}
	return cl.Claims(ctx)
}

func (a adminAgent) Pools(ctx context.Context, id, pool string) ([]string, error) {
	if pool != "" {
		return []string{pool}, nil
	}
	store, err := a.Claims(ctx, id)
	if err != nil {
		return nil, err
	}
	return store.Backend().Pools(ctx)
}

func (a adminAgent) LockImage(ctx context.Context, k state.Key) (func(), error) {
	return a.d.locks.Lock(ctx, k)
}

func (a adminAgent) RememberPool(k state.Key) { a.d.fences.rememberPool(k) }
