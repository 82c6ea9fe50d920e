package saga

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/fault"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// unmapRun is one unmap request on its way through the saga's steps.
type unmapRun struct {
	s         *Sagas
	run       *run
	req       api.UnmapRequest
	c         Caller
	t         target
	named     *krbd.Device  // the device the request named by path, if it did
	m         state.Mapping // the mapping the state records (managed)
	managed   bool          // the devices are the recorded mapping's
	devs      []krbd.Device // the devices to remove
	claimNote string        // what became of the claim, for the audit entry
	// unlist drops the released image from this node's list of holds (the heartbeat), beside
	// the last state write; nil when nothing was released
	unlist func(context.Context) error
}

// Unmap is the unmap saga: resolve (the device) → intent → kernel → release (the claim) →
// persist. It needs no secret. Unmapping what is not mapped answers false. Once the device is
// gone nothing is undone: a failure after it is retried by the reconciler.
func (s *Sagas) Unmap(ctx context.Context, req api.UnmapRequest, c Caller) (unmapped bool, err error) {
	defer func(start time.Time) { s.Metrics.Unmap(s.Agent.ClusterLabel(req.Cluster), start, err) }(time.Now())
	r := &unmapRun{s: s, run: &run{s: s, name: "unmap"}, req: req, c: c}
	if r.t, r.named, err = s.unmapTarget(req); err != nil {
		return false, err
	}
	unlock, err := s.Locks.Lock(ctx, r.t.key)
	if err != nil {
		return false, err
	}
	defer unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.Config.MapTimeout.D()+time.Minute)
	defer cancel()
	if err := r.resolve(ctx); err != nil {
		return false, r.outcome(err)
	}
	if !r.managed && len(r.devs) == 0 {
		return false, nil
	}
	for _, step := range []func(context.Context) error{r.intent, r.kernel, r.release, r.persist} {
		if err := step(ctx); err != nil {
			return false, r.outcome(err)
		}
	}
	return len(r.devs) > 0, r.outcome(nil)
}

// outcome undoes a failed unmap (nothing once its devices are gone) and records the outcome,
// once.
func (r *unmapRun) outcome(err error) error {
	k, keep, err := classify(err)
	if err == nil {
		dev := ""
		if len(r.devs) > 0 {
			dev = r.devs[0].DevNode
		}
		r.s.recordUnmapped(r.t, r.c, r.m, dev, r.claimNote)
		return nil
	}
	if keep {
		err = r.run.keep(err)
	} else {
		err = r.run.fail(err)
	}
	r.s.recordUnmapError(r.t, r.c, err, k)
	return err
}

// resolve finds the devices to remove and whether they are the recorded mapping's.
func (r *unmapRun) resolve(ctx context.Context) error {
	t := r.t
	r.m, r.managed = r.s.State.Get(t.key)
	m := r.m
	switch {
	case r.named != nil:
		// a device named by path: it is this mapping's only if it is the recorded one; a
		// second mapping of the image (made behind the agent's back) is unmapped alone and
		// the claim, which protects the recorded device, is kept
		dev := *r.named
		r.devs = []krbd.Device{dev}
		if r.managed && (dev.ID != m.DeviceID || dev.ClientAddr != m.ClientAddr || (m.Phase != state.Mapped && m.Phase != state.Unmapping)) {
			r.managed = false
		}
	case r.managed && (m.Phase == state.Mapped || m.Phase == state.Unmapping):
		dd, err := r.s.Kernel.ReadDevice(m.DeviceID)
		switch {
		case err == nil && dd.Spec() == t.spec && dd.ClientAddr == m.ClientAddr:
			r.devs = []krbd.Device{dd}
		case err != nil && !errors.Is(err, krbd.ErrNotFound):
			// unreadable is not gone: never release the claim of a device that may be there
			return failure(fmt.Errorf("unmap %s: reading %s: %w", t.spec, m.Device, err))
		}
	default:
		// not recorded as mapped (e.g. a map interrupted after the kernel write): by names
		fsid := m.FSID
		if store, err := t.cl.Claims(ctx); err == nil {
			fsid = store.FSID()
		}
		found, err := r.s.Kernel.FindBySpec(t.spec, fsid)
		if err != nil {
			// an unreadable sysfs is not "not mapped": unmap would answer false and the
			// caller would think the image free while a device may still be there
			return failure(fmt.Errorf("unmap %s: looking for its device: %w", t.spec, err))
		}
		r.devs = found
	}
	if r.managed && m.Phase == state.Claiming {
		// a map interrupted while claiming: the epoch is only known to the cluster
		epoch, err := r.s.ClaimingEpoch(ctx, t.cl, m, r.devs)
		if err != nil {
			return failure(err)
		}
		r.m.Epoch = epoch
	}
	return nil
}

// intent writes the mapping, phase unmapping, with the device it names. Undo: write it back
// as it was.
func (r *unmapRun) intent(context.Context) error {
	if !r.managed {
		return nil
	}
	if err := r.run.step("persist-intent"); err != nil {
		return err
	}
	prev := r.m
	if r.m.ClientAddr == "" && len(r.devs) > 0 {
		// a map interrupted after the kernel write, its device found by names: record it
		// before anything else, so that a crash from here on leaves a state that still
		// names the device to remove, never one that forgets it and frees the claim of a
		// live mapping (found by the model checker: docs/safety.md, F1)
		d := r.devs[0]
		r.m.DeviceID, r.m.Device, r.m.ClientAddr = d.ID, d.DevNode, d.ClientAddr
	}
	r.m.Phase = state.Unmapping
	if err := r.s.State.Put(r.m); err != nil {
		return failure(r.s.stateUnwritable(err))
	}
	r.run.onFail(func(context.Context) error { return r.s.State.Put(prev) })
	return nil
}

// kernel removes the devices. From here on the device is gone: nothing is undone.
func (r *unmapRun) kernel(ctx context.Context) error {
	if err := r.run.step("unmap"); err != nil {
		return err
	}
	for _, dv := range r.devs {
		if _, err := r.s.Kernel.UnmapDevice(ctx, dv, krbd.UnmapOptions{Force: r.req.Force}); err != nil {
			return failure(err)
		}
		r.s.Node.ForgetUnmanaged(dv.ID)
	}
	r.run.commit()
	return nil
}

// release drops the mapping's claim (a failure is retried by the reconciler).
func (r *unmapRun) release(ctx context.Context) error {
	if !r.managed || !r.m.Claimed {
		return nil
	}
	if err := r.run.step("release"); err != nil {
		return err
	}
	notHeld, unlist, err := r.s.releaseClaim(ctx, r.t.cl, r.m)
	if err != nil {
		return failure(fmt.Errorf("unmapped, but releasing the claim failed (will retry): %w", err))
	}
	r.unlist = unlist
	r.claimNote = ", claim released"
	if notHeld != "" {
		r.claimNote = "; its claim was already lost: " + notHeld + "; nothing to release"
	}
	return nil
}

// persist forgets the mapping. The heartbeat that drops the released image from this node's
// list of holds is written meanwhile: it may come at any time after the release, and the two
// writes (a RADOS round trip, an fsync) need not wait for each other.
func (r *unmapRun) persist(ctx context.Context) error {
	if err := r.run.step("persist"); err != nil {
		return err
	}
	if r.unlist != nil {
		done := make(chan error, 1)
		go func() { done <- r.unlist(ctx) }()
		defer func() { r.s.unlisted(<-done) }()
	}
	if r.managed {
		if err := r.s.State.Forget(r.t.key); err != nil {
			// the device is gone and the claim released: forgotten in memory, written to the
			// state file by the next write that succeeds
			return failure(r.s.stateUnwritable(err))
		}
	}
	r.s.Node.SetProblem(r.t.key, "")
	return nil
}

// unmapTarget resolves an unmap request: by image spec, or by /dev path.
func (s *Sagas) unmapTarget(req api.UnmapRequest) (target, *krbd.Device, error) {
	if req.Device == "" {
		t, err := s.target(req.Cluster, req.Ref())
		return t, nil, err
	}
	if req.Image != "" || req.Pool != "" {
		return target{}, nil, fmt.Errorf("%w: give an image or a device, not both", fault.ErrInvalid)
	}
	dev, err := s.Kernel.FindByPath(req.Device)
	if err != nil {
		if errors.Is(err, krbd.ErrNotFound) {
			return target{}, nil, fmt.Errorf("%w: %s is not a mapped rbd device", claim.ErrNotFound, req.Device)
		}
		return target{}, nil, err
	}
	// which configured cluster: the one the state names for this device, else by fsid
	clusterID := req.Cluster
	for _, m := range s.State.All() {
		if m.DeviceID == dev.ID && m.ClientAddr == dev.ClientAddr {
			clusterID = m.Cluster
		}
	}
	if clusterID == "" {
		if c := s.Agent.ClusterByFSID(dev.ClusterFSID); c != nil {
			clusterID = c.ID()
		}
	}
	t, err := s.target(clusterID, dev.Spec())
	return t, &dev, err
}
