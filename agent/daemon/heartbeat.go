package daemon

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/nodestate"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// heartbeats keeps this node's liveness on one cluster: one goroutine per place this node holds
// claims in, each on its own schedule (a write every renew interval, each bounded by the
// heartbeat deadline). Nothing else runs in those goroutines, so no claim check, no slow pool
// and no other cluster ever delays a place's heartbeat: a stalled pool's lease runs out alone.
// The renew loop owns it: sync starts and stops places as claims come and go, and stop ends
// them all and waits for them.
type heartbeats struct {
	cl *cluster
	// from the renewer (heartbeatsOf): the places this node holds claims in, one write, and
	// where a place that does not answer is reported
	held       func(clusterID string) map[place][]state.Key
	unsettled  *unsettledHolds
	write      func(ctx context.Context, cl *cluster, store *claim.Store, pool, ns string, keys []state.Key)
	node       *nodestate.Node
	setProblem func(k state.Key, p string)
	ticker     func(loop string, every time.Duration) (<-chan time.Time, func())
	every      time.Duration // renew_interval
	hbTimeout  time.Duration // bounds one heartbeat

	mu     sync.Mutex
	places map[place]context.CancelFunc
	// since is when the write in flight in a place started (absent when none is): a write
	// that outlives its deadline (a cluster call that does not honour it) is reported by sync
	since map[place]time.Time
	wg    sync.WaitGroup
}

// sync runs a heartbeat for every place this node holds claims in, and stops the others (an
// acquire writes its own heartbeat first, so a new place is covered until its loop starts).
func (h *heartbeats) sync(ctx context.Context) {
	want := h.held(h.cl.cfg.ID)
	for p := range h.unsettled.places(h.cl.cfg.ID) {
		if _, ok := want[p]; !ok {
			want[p] = nil // a hold the rebuild could not settle: still this node's
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for p, cancel := range h.places {
		if _, ok := want[p]; !ok {
			cancel()
			delete(h.places, p)
		}
	}
	for p, since := range h.since {
		if late := time.Since(since); late > h.hbTimeout+h.every {
			msg := fmt.Sprintf("lease not renewed: cluster %s has not answered this node's heartbeat in %s for %s", h.cl.cfg.ID, p, late.Round(time.Second))
			h.node.SetPlaceFailing(h.cl.cfg.ID, p.pool, p.namespace, true)
			for _, k := range want[p] {
				h.setProblem(k, msg)
			}
		}
	}
	if ctx.Err() != nil {
		return
	}
	for p := range want {
		if _, ok := h.places[p]; ok {
			continue
		}
		pctx, cancel := context.WithCancel(ctx)
		h.places[p] = cancel
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			h.run(pctx, p)
		}()
	}
}

// stop ends every place's heartbeat and waits for them.
func (h *heartbeats) stop() {
	h.mu.Lock()
	for p, cancel := range h.places {
		cancel()
		delete(h.places, p)
	}
	h.mu.Unlock()
	h.wg.Wait()
}

// run writes the place's heartbeat at once and then every renew interval, until ctx ends. A
// write still running at a tick makes that tick drop (the ticker's), never two at once.
func (h *heartbeats) run(ctx context.Context, p place) {
	tick, stopTick := h.ticker(fmt.Sprintf("heartbeat %s %s", h.cl.cfg.ID, p), h.every)
	defer stopTick()
	for {
		h.beat(ctx, p)
		select {
		case <-ctx.Done():
			return
		case <-tick:
		}
	}
}

// beat writes the place's heartbeat once, bounded by the heartbeat deadline.
func (h *heartbeats) beat(ctx context.Context, p place) {
	hctx, cancel := context.WithTimeout(ctx, h.hbTimeout)
	defer cancel()
	keys := h.held(h.cl.cfg.ID)[p]
	if len(keys) == 0 && !h.unsettled.places(h.cl.cfg.ID)[p] {
		return // released meanwhile; sync stops this loop
	}
	start := time.Now()
	h.mu.Lock()
	h.since[p] = start
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		delete(h.since, p)
		h.mu.Unlock()
	}()
	store, err := h.cl.Claims(hctx)
	if err != nil {
		if ctx.Err() == nil {
			for _, k := range keys {
				h.setProblem(k, "lease not renewed: "+err.Error())
			}
		}
		return
	}
	h.write(hctx, h.cl, store, p.pool, p.namespace, keys)
}
