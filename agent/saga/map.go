package saga

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/claimapi"
	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/fault"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// mapRun is one map request on its way through the saga's steps.
type mapRun struct {
	s        *Sagas
	run      *run
	req      api.MapRequest
	c        Caller
	access   claim.Access
	asked    krbd.Requested      // what the caller's options ask of the kernel
	opts     krbd.MapOptions     // how the kernel maps it, but for the secret: built and checked before the claim
	sources  []krbd.OptionSource // where each of opts.Extra came from (and cluster defaults not applied)
	secret   string              // the agent's key as the keyring holds it at this map
	t        target
	readOnly bool
	store    *claim.Store
	m        state.Mapping
	res      *claim.Result // the claim made, when one was
	dev      krbd.Device
	recorded *claim.Record // the claim as the record step left it
	answered bool          // this node had mapped it already: answered as it is, nothing done
	steps    stepTimer
}

// Map is the map saga: validate → resolve → claim (its intent written beside its reads) →
// kernel → record and persist together, then the reply. Two state writes: intent (phase
// claiming), durable before the claim is sent, and mapped beside the record; recovery of
// "claiming" finds a device the kernel made meanwhile by names and adopts it when the claim is
// this node's, and a "mapped" state whose address the claim lacks is recorded before the device
// is answered again (docs/safety.md, phases). A failing step undoes the ones before it: no claim is left
// without a device and no device without a claim. Asking again for an image this node has mapped
// answers the same device with AlreadyMapped. The outcome is recorded once, at the end; the
// claim and a takeover's fences are audited when they are made (mapRun.claim).
func (s *Sagas) Map(ctx context.Context, req api.MapRequest, c Caller) (resp *api.MapResponse, err error) {
	r := &mapRun{s: s, run: &run{s: s, name: "map"}, req: req, c: c}
	defer func(start time.Time) { s.Metrics.Map(s.Agent.ClusterLabel(r.req.Cluster), start, err) }(time.Now())
	if err := r.validate(); err != nil {
		return nil, r.outcome(err)
	}
	unlock, err := s.Locks.Lock(ctx, r.t.key)
	if err != nil {
		return nil, r.outcome(err)
	}
	defer unlock()
	// the saga runs to its end even if the caller goes away: it retries and finds the result
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.Config.MapTimeout.D()+time.Minute)
	defer cancel()
	r.steps = newStepTimer()
	resp, err = r.runSteps(ctx)
	return resp, r.outcome(err) // undone and recorded under the image's lock
}

// runSteps runs the map's steps in order; the first that fails ends it.
func (r *mapRun) runSteps(ctx context.Context) (*api.MapResponse, error) {
	if resp, done, err := r.resolve(ctx); done {
		r.answered = err == nil
		return resp, err
	}
	if r.m.Claimed { // snapshots are immutable: mapping one needs no claim
		if err := r.claim(ctx); err != nil {
			return nil, err
		}
	}
	if err := r.kernel(ctx); err != nil {
		return nil, err
	}
	if err := r.recordAndPersist(ctx); err != nil {
		return nil, err
	}
	return r.reply(), nil
}

// outcome undoes a failed map (or keeps its state for the reconciler) and records the outcome,
// once: the map done, refused or failed.
func (r *mapRun) outcome(err error) error {
	k, keep, err := classify(err)
	if err != nil {
		if keep {
			err = r.run.keep(err)
		} else {
			err = r.run.fail(err)
		}
	}
	if err != nil {
		r.recordMapError(err, k)
		return err
	}
	if !r.answered {
		r.recordMapped()
	}
	return nil
}

// validate reads the request: access, options, the caller's right to a takeover, its network
// namespace, and the image on a configured cluster.
func (r *mapRun) validate() error {
	req := r.req
	var err error
	if r.access, err = claim.ParseAccess(req.Access); err != nil {
		return refuse(fmt.Errorf("%w: %w", fault.ErrInvalid, err))
	}
	if r.asked, err = krbd.RequestOptions(req.Options); err != nil {
		return refuse(fmt.Errorf("map %s: %w", req.Ref(), err))
	}
	if req.Takeover && !r.c.Admin {
		// a takeover fences another node: the admin's call. A CSI-role map takes over only
		// where takeover_policy allows it, or a hold an admin has fenced, never because it asks
		return r.c.denied("POST " + api.PathMap + " with takeover")
	}
	if err := SameNetNS(r.c.Peer); err != nil {
		return refuse(fmt.Errorf("map %s: %w", req.Ref(), err))
	}
	if req.Cluster == "" && len(req.Monitors) > 0 {
		cl, err := r.s.Config.ClusterByMonitors(req.Monitors)
		if err != nil {
			return refuse(fmt.Errorf("map %s: %w: %w", req.Ref(), fault.ErrInvalid, err))
		}
		r.req.Cluster = cl.ID
	}
	if r.t, err = r.s.target(r.req.Cluster, r.req.Ref()); err != nil {
		return refuse(err)
	}
	r.readOnly = req.ReadOnly || r.asked.ReadOnly || r.access == claim.ROX || r.t.spec.Snap != ""
	// checked without the cluster's defaults first: a request the kernel would refuse anyway
	// is refused before the agent connects
	if r.opts, r.sources, err = r.s.mapOptions(r.t.cl, r.readOnly, r.asked, krbd.ClusterDefaults{}); err != nil {
		return refuse(fmt.Errorf("map %s: %w", req.Ref(), err))
	}
	return nil
}

// resolve connects to the cluster and looks at what this node already has: the same mapping
// (answered at once: done), or a mapping of the image made outside rbd-owner (refused).
func (r *mapRun) resolve(ctx context.Context) (*api.MapResponse, bool, error) {
	t := r.t
	var err error
	if r.store, err = t.cl.Claims(ctx); err != nil {
		return nil, true, refuse(err)
	}
	if resp, done, err := r.s.alreadyMapped(ctx, t, r.store, r.access, r.readOnly); done {
		return resp, true, err
	}
	others, err := r.s.Kernel.FindBySpec(t.spec, r.store.FSID())
	if err != nil {
		return nil, true, failure(fmt.Errorf("map %s: looking for devices already mapped: %w", t.spec, err))
	}
	if len(others) > 0 {
		return nil, true, refuse(fmt.Errorf("%w: %s is already mapped on this node as %s, outside rbd-owner; unmap it first",
			claim.ErrBusy, t.spec, others[0].DevNode))
	}
	defaults, err := t.cl.MapDefaults(t.spec)
	if err != nil {
		return nil, true, refuse(fmt.Errorf("map %s: reading the cluster's %s: %w", t.spec, "rbd_default_map_options", err))
	}
	if r.opts, r.sources, err = r.s.mapOptions(t.cl, r.readOnly, r.asked, defaults); err != nil {
		return nil, true, refuse(fmt.Errorf("map %s: %w", t.spec, err))
	}
	if r.secret, err = r.s.key(t.cl); err != nil {
		return nil, true, refuse(fmt.Errorf("map %s: %w", t.spec, err))
	}
	r.steps.mark("resolve")
	r.m = state.Mapping{Key: t.key, FSID: r.store.FSID(), Access: string(r.access), ReadOnly: r.readOnly, VolumeID: r.req.VolumeID,
		Claimed: t.spec.Snap == "", Phase: state.Claiming, Options: r.sources, KeyID: krbd.KeyID(r.secret)}
	return nil, false, nil
}

// intent writes the mapping, phase claiming, before the claim is sent (Acquire runs it beside
// its reads and sends nothing before it returns): a crash from then on leaves a state the
// reconciler finishes or undoes. Undo: forget it; but a state an interrupted saga left
// ("claiming", "unmapping": not "mapped", which alreadyMapped answered) is written back when
// this map made no claim, since the hold it names is still to be settled (forgetting it would
// keep that claim for ever: docs/safety.md, variant ag). Its time is noted beside the claim's,
// which it overlaps.
func (r *mapRun) intent(context.Context) error {
	start := time.Now()
	prev, had := r.s.State.Get(r.t.key)
	if err := r.s.persist(r.run, "persist-intent", r.m); err != nil {
		return refuse(err)
	}
	r.run.onFail(func(context.Context) error {
		if had && r.res == nil {
			return r.s.State.Put(prev)
		}
		return r.s.State.Delete(r.t.key)
	})
	r.steps.note("intent", time.Since(start))
	return nil
}

// claim writes the intent and takes the image's claim (one compare-and-set; a takeover where
// the policy or an admin allows it): Acquire's reads, its heartbeat and the intent at once,
// then the compare-and-set. Undo: release it.
func (r *mapRun) claim(ctx context.Context) error {
	if err := r.run.step("claim"); err != nil {
		return err
	}
	t, policy := r.t, r.s.Config.TakeoverPolicy
	var intentErr error
	res, err := r.store.Acquire(ctx, claim.Request{Image: t.img, Access: r.access, ReadOnly: r.readOnly,
		Takeover: r.req.Takeover || policy == config.TakeoverAfterLeaseExpiry, TakeFenced: true,
		TakeCovered: policy != config.TakeoverManual,
		Durable:     func(ctx context.Context) error { intentErr = r.intent(ctx); return intentErr }})
	if intentErr != nil {
		return intentErr // no claim was sent: refused as the intent's write failed
	}
	var held *claim.HeldError
	r.s.Agent.WatchHeld(t.key, errors.As(err, &held))
	if err != nil {
		if fault.MayHaveApplied(err) {
			// the claim may have been written (e.g. a timeout after the OSD applied it):
			// keep the "claiming" state; the reconciler looks at the claim and releases it
			return kept(err)
		}
		return refuse(r.s.refusal(r.c, t, err))
	}
	r.res = res
	// audited now, not with the outcome: the claim (and a takeover's fences) changed the
	// cluster, and a kill later in the saga must not lose the record of it
	r.recordClaim()
	epoch := res.Holder.Epoch
	r.run.onFail(func(ctx context.Context) error { return r.s.releaseAndUnlist(ctx, r.store, t.img, epoch) })
	// not written: the state stays "claiming" until the device is recorded ("mapped"). A
	// crash in between leaves "claiming", whose recovery looks for the device by names and
	// adopts it when this node's claim is there (Sagas.Resume, saga/resume.go): one fsync fewer per map
	r.m.Epoch = epoch
	r.steps.mark("claim")
	return nil
}

// kernel maps the image (krbd, noshare: a client of its own). Undo: unmap it.
func (r *mapRun) kernel(ctx context.Context) error {
	if err := r.run.step("map"); err != nil {
		return err
	}
	opts := r.opts
	opts.Secret = r.secret // read by resolve
	dev, err := r.s.Kernel.Map(ctx, r.t.spec, opts)
	if err != nil {
		if errors.Is(err, krbd.ErrLeftMapped) {
			// the kernel made the device but it could not be removed again: keep the claim and
			// the "claiming" state; the reconciler finds the device by names and adopts it (no
			// device without a claim)
			return kept(err)
		}
		return failure(err)
	}
	r.dev = dev
	r.run.onFail(func(ctx context.Context) error {
		_, err := r.s.Kernel.UnmapDevice(ctx, dev, krbd.UnmapOptions{Force: true})
		return err
	})
	if dev.ClientAddr == "" {
		// without the mapping's own address it could not be fenced alone: refuse it
		return failure(fmt.Errorf("map %s: the kernel does not report the mapping's client_addr, so it could not be fenced alone; refusing it", r.t.spec))
	}
	r.steps.mark("kernel")
	return nil
}

// recordAndPersist runs record and persist together; the reply waits for both. Neither needs
// the other: a crash after persist and before the record leaves "mapped" with no address in
// the claim, which alreadyMapped records before it answers the device again and the renewals'
// claim check records meanwhile (docs/safety.md, invariant 7). A failure of either undoes the
// map; record's is the one returned when both fail. Each notes its own time, and "finish"
// is the two together.
func (r *mapRun) recordAndPersist(ctx context.Context) error {
	if err := r.run.step("record"); err != nil { // a crash before either
		return err
	}
	var perr error
	var persistTook time.Duration
	done := make(chan struct{})
	go func() {
		defer close(done)
		start := time.Now()
		perr = r.persist(ctx)
		persistTook = time.Since(start)
	}()
	start := time.Now()
	rerr := r.record(ctx)
	recordTook := time.Since(start)
	<-done // a local write, waited for as the serial map did
	r.steps.note("record", recordTook)
	r.steps.note("persist", persistTook)
	r.steps.mark("finish")
	if rerr != nil {
		return rerr
	}
	return perr
}

// record writes the mapping's own client address into the claim: what a takeover fences.
func (r *mapRun) record(ctx context.Context) error {
	if !r.m.Claimed {
		return nil
	}
	if err := r.run.step("record-send"); err != nil { // a crash beside persist
		return err
	}
	rec, err := r.store.SetMapping(ctx, r.t.img, r.m.Epoch, r.dev.ClientAddr, r.dev.DevNode)
	if err != nil {
		return failure(err)
	}
	r.recorded = rec
	return nil
}

// persist writes the mapping, phase mapped, with its device (on a copy of the intent: record
// reads r.m meanwhile).
func (r *mapRun) persist(context.Context) error {
	m := r.m
	m.Phase, m.DeviceID, m.Device, m.ClientAddr = state.Mapped, r.dev.ID, r.dev.DevNode, r.dev.ClientAddr
	if err := r.s.persist(r.run, "persist", m); err != nil {
		return failure(err)
	}
	r.s.Node.SetProblem(r.t.key, "")
	return nil
}

// reply is the answer to a map done: the device, its link, and the claim as the map left it.
func (r *mapRun) reply() *api.MapResponse {
	resp := &api.MapResponse{Device: r.dev.DevNode, Link: LinkOf(r.t.spec, r.store.FSID())}
	if r.recorded != nil {
		resp.Claim = claimapi.Of(r.t.key.Cluster, r.recorded)
	}
	return resp
}

// mapOptions is how the kernel maps an image of cl (but for the secret): the cluster's
// monitors and user, the config's timeouts, and the kernel options krbd.Compose makes of what
// the caller asked, the config's global and the cluster's map_options, and the cluster's own
// rbd_default_map_options, with where each came from. They are checked whole here, before any
// claim: a map the kernel would refuse (an ms_mode the cluster's monitors do not speak, say)
// claims nothing.
func (s *Sagas) mapOptions(cl Cluster, readOnly bool, asked krbd.Requested, defaults krbd.ClusterDefaults) (krbd.MapOptions, []krbd.OptionSource, error) {
	opts := cl.MapOptions()
	opts.ReadOnly, opts.NoUdev = readOnly, asked.NoUdev
	opts.MountTimeout, opts.Timeout = s.Config.MountTimeout.D(), s.Config.MapTimeout.D()
	extra, sources, err := krbd.Compose(krbd.Layers{
		Caller:   asked.Extra,
		Agent:    append(append([]string(nil), s.Config.MapOptions...), opts.Extra...),
		Cluster:  defaults,
		Monitors: opts.Monitors, KernelMsgr2: krbd.KernelSpeaksMsgr2(s.KernelRelease),
	})
	if err != nil {
		return krbd.MapOptions{}, nil, err
	}
	opts.Extra = extra
	return opts, sources, opts.Validate()
}

// key is the agent's key for cl as its keyring holds it now, checked against this node's
// kernel and librados: a key rotated to a type either cannot read refuses the map before any
// claim.
func (s *Sagas) key(cl Cluster) (string, error) {
	secret, err := cl.Secret()
	if err != nil {
		return "", fmt.Errorf("%w: the agent's key: %w", fault.ErrInvalid, err)
	}
	typ, err := krbd.KeyType(secret)
	if err != nil {
		return "", fmt.Errorf("the agent's key: %w", err)
	}
	if err := krbd.CheckNodeKey(typ, krbd.NodeVersions{Kernel: s.KernelRelease, Librados: s.LibradosRelease}); err != nil {
		return "", fmt.Errorf("the agent's key: %w", err)
	}
	return secret, nil
}
