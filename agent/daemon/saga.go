package daemon

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/rbd-owner/rbd-owner/agent/admin"
	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/fault"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
	"github.com/rbd-owner/rbd-owner/agent/server"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// saga runs steps and, when one fails, undoes the ones before it in reverse order.
type saga struct {
	d    *Daemon
	name string
	undo []func(context.Context) error
}

// step is called before each step: it gives the test fault hook its chance.
func (s *saga) step(name string) error {
	if s.d.opts.Fault == nil {
		return nil
	}
	if err := s.d.opts.Fault(s.name, name); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

func (s *saga) onFail(f func(context.Context) error) { s.undo = append(s.undo, f) }

// fail undoes what was done, newest first, and returns err. It stops at the first undo that
// fails: what is left is then exactly what the persisted phase says (e.g. "claimed, maybe
// mapped"), which the reconciler finishes or undoes later. Going on would be worse: releasing
// the claim of a device that could not be removed leaves a device without a claim.
// A simulated crash undoes nothing.
func (s *saga) fail(err error) error {
	if errors.Is(err, ErrCrash) {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), undoTimeout)
	defer cancel()
	for i := len(s.undo) - 1; i >= 0; i-- {
		if uerr := s.undo[i](ctx); uerr != nil {
			s.d.log.WithError(uerr).Error(s.name + ": undo failed; the state is kept for the reconciler to finish")
			return err
		}
	}
	return err
}

// keep abandons the undo list: the persisted state stays as it is for the reconciler.
func (s *saga) keep(err error) error {
	s.undo = nil
	return err
}

const undoTimeout = 2 * time.Minute

// target is a validated image on a configured cluster.
type target struct {
	cl   *cluster
	spec krbd.Spec
	key  state.Key
	img  claim.Image
}

func (d *Daemon) target(clusterID string, spec krbd.Spec) (target, error) {
	if err := spec.Validate(); err != nil {
		return target{}, fmt.Errorf("%w: %w", errInvalid, err)
	}
	cl, err := d.cluster(clusterID)
	if err != nil {
		return target{}, err
	}
	return target{
		cl: cl, spec: spec,
		key: state.Key{Cluster: cl.cfg.ID, Ref: spec},
		img: spec.Head(),
	}, nil
}

// Map is the map saga: validate → resolve the image → claim → map → record the mapping's
// address in the claim → persist → audit → reply. A failing step undoes the ones before it:
// no claim is left without a device and no device without a claim. Asking again for an image
// this node has mapped answers the same device with AlreadyMapped.
func (d *Daemon) Map(ctx context.Context, req api.MapRequest, peer *peercred.Cred) (resp *api.MapResponse, err error) {
	defer func(start time.Time) { d.metrics.Map(d.clusterLabel(req.Cluster), start, err) }(time.Now())
	// validate
	access, err := claim.ParseAccess(req.Access)
	if err != nil {
		return nil, d.refused(req, peer, fmt.Errorf("%w: %w", errInvalid, err))
	}
	asked, err := krbd.RequestOptions(req.Options)
	if err != nil {
		return nil, d.refused(req, peer, fmt.Errorf("map %s: %w", req.Ref(), err))
	}
	if req.Takeover {
		// a takeover fences another node: the admin's call. A CSI-role map takes over only
		// where takeover_policy allows it, or a hold an admin has fenced, never because it asks
		// a call whose caller is unknown is no admin's
		if err := server.RequireAdmin(ctx, d.audit, "POST "+api.PathMap+" with takeover"); err != nil {
			return nil, err
		}
	}
	if err := d.sameNetNS(peer); err != nil {
		return nil, d.refused(req, peer, fmt.Errorf("map %s: %w", req.Ref(), err))
	}
	if req.Cluster == "" && len(req.Monitors) > 0 {
		cl, err := d.cfg.ClusterByMonitors(req.Monitors)
		if err != nil {
			return nil, d.refused(req, peer, fmt.Errorf("map %s: %w: %w", req.Ref(), errInvalid, err))
		}
		req.Cluster = cl.ID
	}
	t, err := d.target(req.Cluster, req.Ref())
	if err != nil {
		return nil, d.refused(req, peer, err)
	}
	readOnly := req.ReadOnly || asked.ReadOnly || access == claim.ROX || t.spec.Snap != ""
	unlock, err := d.locks.lock(ctx, t.key)
	if err != nil {
		return nil, err
	}
	defer unlock()
	// the saga runs to its end even if the caller goes away: it retries and finds the result
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.MapTimeout.D()+time.Minute)
	defer cancel()

	// each step's time, logged once mapped (the benchmark's breakdown of one map)
	steps := stepTimer{start: time.Now(), last: time.Now()}

	// resolve: the cluster, and what this node already has
	store, err := t.cl.claims(ctx)
	if err != nil {
		return nil, d.refused(req, peer, err)
	}
	if resp, done, err := d.alreadyMapped(ctx, t, store, access, readOnly, req); done {
		return resp, err
	}
	others, err := d.kernel.FindBySpec(t.spec, store.FSID())
	if err != nil {
		return nil, d.failed(req, peer, fmt.Errorf("map %s: looking for devices already mapped: %w", t.spec, err))
	}
	if len(others) > 0 {
		return nil, d.refused(req, peer, fmt.Errorf("%w: %s is already mapped on this node as %s, outside rbd-owner; unmap it first",
			claim.ErrBusy, t.spec, others[0].DevNode))
	}
	steps.mark("resolve")
	s := &saga{d: d, name: "map"}
	m := state.Mapping{Key: t.key, FSID: store.FSID(), Access: string(access), ReadOnly: readOnly, VolumeID: req.VolumeID,
		Claimed: t.spec.Snap == "", Phase: state.Claiming}

	// claim (snapshots are immutable: mapping one needs no claim)
	var res *claim.Result
	if m.Claimed {
		if err := d.persist(s, "persist-intent", m); err != nil {
			return nil, d.refused(req, peer, s.fail(err))
		}
		s.onFail(func(context.Context) error { return d.state.Delete(t.key) })
		steps.mark("intent")
		if err := s.step("claim"); err != nil {
			return nil, s.fail(err)
		}
		res, err = store.Acquire(ctx, claim.Request{Image: t.img, Access: access, ReadOnly: readOnly,
			Takeover: req.Takeover || d.cfg.TakeoverPolicy == config.TakeoverAfterLeaseExpiry, TakeFenced: true,
			TakeCovered: d.cfg.TakeoverPolicy != config.TakeoverManual,
			NextStep:    func(hs []claim.Holder) string { return d.nextStepWhenHeld(ctx, t, hs) }})
		var held *claim.HeldError
		if errors.As(err, &held) {
			d.watches.add(t.key, time.Now().Add(watchFor(d.cfg.LeaseDuration.D())))
		} else {
			d.watches.drop(t.key)
		}
		if err != nil {
			if fault.MayHaveApplied(err) {
				// the claim may have been written (e.g. a timeout after the OSD applied it):
				// keep the "claiming" state; the reconciler looks at the claim and releases it
				return nil, d.failed(req, peer, s.keep(err))
			}
			return nil, d.refused(req, peer, s.fail(err))
		}
		epoch := res.Holder.Epoch
		s.onFail(func(ctx context.Context) error { _, err := store.Release(ctx, t.img, epoch); return err })
		d.audit.Record(audit.Entry{Event: audit.Claim, Cluster: t.key.Cluster, Pool: t.spec.Pool, Namespace: t.spec.Namespace,
			Image: t.spec.Image, Epoch: epoch, OwnerNode: d.cfg.NodeID, HasPeer: peer != nil, UID: peercred.UID(peer), PID: peercred.PID(peer),
			Message: fmt.Sprintf("claimed %s (%s) at epoch %d", t.spec, access, epoch)})
		d.metrics.Takeover(t.key.Cluster, len(res.Fenced))
		for _, f := range res.Fenced {
			d.audit.Record(audit.Entry{Event: audit.Takeover, Cluster: t.key.Cluster, Pool: t.spec.Pool, Namespace: t.spec.Namespace,
				Image: t.spec.Image, Epoch: epoch, OwnerNode: f.NodeID, Warning: true, HasPeer: peer != nil, UID: peercred.UID(peer), PID: peercred.PID(peer),
				Message: fmt.Sprintf("took %s over from node %s (epoch %d) after fencing %s until %s", t.spec, f.NodeID, f.Epoch, f.Described(), f.Expires.Format(time.RFC3339))})
		}
		m.Epoch, m.Phase = epoch, state.Claimed
		steps.mark("claim")
		if err := d.persist(s, "persist-claim", m); err != nil {
			return nil, d.refused(req, peer, s.fail(err))
		}
	}

	steps.mark("claimed")
	// map
	if err := s.step("map"); err != nil {
		return nil, s.fail(err)
	}
	opts := d.mapOptions(t.cl, readOnly)
	opts.Extra = append(opts.Extra, asked.Extra...)
	opts.NoUdev = asked.NoUdev
	dev, err := d.kernel.Map(ctx, t.spec, opts)
	if err != nil {
		if errors.Is(err, krbd.ErrLeftMapped) {
			// the kernel made the device but it could not be removed again: keep the claim and
			// the "claimed" state; the reconciler adopts the device (no device without a claim)
			return nil, d.failed(req, peer, s.keep(err))
		}
		return nil, d.failed(req, peer, s.fail(err))
	}
	if dev.ClientAddr == "" {
		// without the mapping's own address it could not be fenced alone: refuse it
		s.onFail(func(ctx context.Context) error {
			_, err := d.kernel.UnmapDevice(ctx, dev, krbd.UnmapOptions{Force: true})
			return err
		})
		return nil, d.failed(req, peer, s.fail(fmt.Errorf("map %s: the kernel does not report the mapping's client_addr, so it could not be fenced alone; refusing it", t.spec)))
	}
	s.onFail(func(ctx context.Context) error {
		_, err := d.kernel.UnmapDevice(ctx, dev, krbd.UnmapOptions{Force: true})
		return err
	})

	steps.mark("kernel")
	// record the mapping's own address in the claim: it is what a takeover fences
	var recorded *claim.Record
	if m.Claimed {
		if err := s.step("record"); err != nil {
			return nil, s.fail(err)
		}
		if recorded, err = store.SetMapping(ctx, t.img, m.Epoch, dev.ClientAddr, dev.DevNode); err != nil {
			return nil, d.failed(req, peer, s.fail(err))
		}
	}
	steps.mark("record")

	// persist
	m.Phase, m.DeviceID, m.Device, m.ClientAddr = state.Mapped, dev.ID, dev.DevNode, dev.ClientAddr
	if err := d.persist(s, "persist", m); err != nil {
		return nil, d.failed(req, peer, s.fail(err))
	}
	d.setProblem(t.key, "")

	// audit, reply
	d.audit.Record(audit.Entry{Event: audit.Map, Cluster: t.key.Cluster, Pool: t.spec.Pool, Namespace: t.spec.Namespace,
		Image: t.spec.Image, Device: dev.DevNode, Epoch: m.Epoch, OwnerNode: d.cfg.NodeID, HasPeer: peer != nil,
		UID: peercred.UID(peer), PID: peercred.PID(peer),
		Message: fmt.Sprintf("mapped %s as %s (epoch %d, client %s, requester %q, volume %q)", t.spec, dev.DevNode, m.Epoch, dev.ClientAddr, req.Requester, req.VolumeID)})
	resp = &api.MapResponse{Device: dev.DevNode, Link: linkOf(t.spec, store.FSID())}
	if recorded != nil {
		resp.Claim = admin.ClaimOf(t.key.Cluster, recorded) // the record as this map left it
	}
	steps.mark("persist")
	d.log.WithFields(logrus.Fields{"image": t.key.String(), "requester": req.Requester}).WithFields(steps.fields()).Info("map steps")
	return resp, nil
}

// nextStepWhenHeld is the next step of the one reading a refusal by a map that may not take
// the image over (takeover_policy manual, no takeover asked), phrased for its caller: an admin
// may fence the holder and release its claim, a CSI-role caller (ceph-csi) can do neither and
// has to ask an admin, or have the policy changed.
func (d *Daemon) nextStepWhenHeld(ctx context.Context, t target, holders []claim.Holder) string {
	who := "its holders are"
	if len(holders) == 1 {
		who = "node " + holders[0].NodeID + " is"
	}
	cluster := ""
	if len(d.cfg.Clusters) > 1 {
		cluster = "--cluster " + t.key.Cluster + " "
	}
	fence := fmt.Sprintf("`rbd-owner fence %s%s` then `rbd-owner release --force %s%s`", cluster, t.img, cluster, t.img)
	nodeFence := "`rbd-owner fence --node NODE`"
	if len(holders) == 1 {
		nodeFence = fmt.Sprintf("`rbd-owner fence %s--node %s`", cluster, holders[0].NodeID)
	}
	if c, _ := server.CallerFrom(ctx); c.Role >= peercred.RoleAdmin {
		return fmt.Sprintf("if %s dead: run %s (every hold of that node; then map again), map with --takeover once its lease has expired, or run %s", who, nodeFence, fence)
	}
	if d.cfg.TakeoverPolicy == config.TakeoverAfterFence {
		return fmt.Sprintf("under takeover_policy: after-fence a map takes it over once the holder's mapping is on the cluster's blocklist: if %s dead, ask an admin to run %s on any node (or have Kubernetes' out-of-service taint make ceph-csi fence it): the next NodeStage then maps it", who, nodeFence)
	}
	return fmt.Sprintf("this caller (CSI role) may not take it over under takeover_policy: manual: if %s dead, ask an admin to run %s on any node, or set takeover_policy: after-fence (maps take over holds already blocklisted) or after-lease-expiry (also an expired lease)", who, fence)
}

// persist writes m to the state file at a saga step. A write that fails (a full disk, a
// read-only file system) is said in words a person acts on and logged at error priority; a
// fault injected at the step (Options.Fault, tests) stands in for the write.
func (d *Daemon) persist(s *saga, step string, m state.Mapping) error {
	var err error
	if d.opts.Fault != nil {
		err = d.opts.Fault(s.name, step)
	}
	if err == nil {
		err = d.state.Put(m)
	}
	if err == nil || errors.Is(err, ErrCrash) {
		return err
	}
	return d.stateUnwritable(err)
}

// stateUnwritable is a failed write of the state file (the store's error names the file and
// the cause) as one line naming the next step. The store's failure hook has logged it and
// counted it (rebuild.go): nothing is claimed or mapped that the state does not record, so the
// operation is refused.
func (d *Daemon) stateUnwritable(err error) error {
	return fmt.Errorf("%w; %s", err, d.stateNextStep(err))
}

// stateNextStep is what a person does about a state file that cannot be written.
func (d *Daemon) stateNextStep(err error) string {
	dir := d.cfg.StateDir
	switch {
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return "free space in " + dir + ", then retry"
	case errors.Is(err, syscall.EROFS):
		return "its file system is read-only: remount " + dir + " read-write, then retry"
	}
	return "check that " + dir + " is writable, then retry"
}

// stepTimer notes how long each step of a saga took.
type stepTimer struct {
	start, last time.Time
	names       []string
	took        []time.Duration
}

func (s *stepTimer) mark(name string) {
	now := time.Now()
	s.names, s.took = append(s.names, name), append(s.took, now.Sub(s.last))
	s.last = now
}

func (s *stepTimer) fields() logrus.Fields {
	f := logrus.Fields{"total_ms": float64(time.Since(s.start).Microseconds()) / 1000}
	for i, n := range s.names {
		f[n+"_ms"] = float64(s.took[i].Microseconds()) / 1000
	}
	return f
}

// alreadyMapped answers a repeated map: same device, lease renewed. done is false when the
// saga has to run.
func (d *Daemon) alreadyMapped(ctx context.Context, t target, store *claim.Store, access claim.Access, readOnly bool, req api.MapRequest) (*api.MapResponse, bool, error) {
	m, ok := d.state.Get(t.key)
	if !ok || m.Phase != state.Mapped {
		return nil, false, nil
	}
	dev, err := d.kernel.ReadDevice(m.DeviceID)
	if err != nil && !errors.Is(err, krbd.ErrNotFound) {
		// unreadable is not gone: never drop the claim of a device that may still be there
		return nil, true, fmt.Errorf("map %s: reading its device %s: %w", t.spec, m.Device, err)
	}
	if err != nil || dev.Spec() != t.spec || dev.ClientAddr != m.ClientAddr {
		// the device went away without us: release its claim now, then map afresh
		if err := d.deviceGone(ctx, m, "found missing at map time"); err != nil {
			return nil, true, fmt.Errorf("map %s: its old device is gone and releasing its claim failed: %w", t.spec, err)
		}
		return nil, false, nil
	}
	if m.Access != string(access) || m.ReadOnly != readOnly {
		return nil, true, fmt.Errorf("%w: %s is mapped here as %s%s; unmap it first to map it differently",
			errInvalid, t.spec, m.Access, map[bool]string{true: " read-only", false: ""}[m.ReadOnly])
	}
	resp := &api.MapResponse{Device: dev.DevNode, Link: linkOf(t.spec, m.FSID), AlreadyMapped: true}
	if m.Claimed {
		// a read, not a write: the lease is the node's heartbeat; this only proves the claim
		// is still this node's at its epoch
		rec, err := store.Check(ctx, t.img, m.Epoch)
		if err != nil {
			if errors.Is(err, claim.ErrFenced) {
				d.setLost(t.key, err.Error())
			}
			return nil, true, err
		}
		resp.Claim = admin.ClaimOf(t.key.Cluster, rec)
	}
	return resp, true, nil
}

func (d *Daemon) mapOptions(cl *cluster, readOnly bool) krbd.MapOptions {
	secret := cl.secret()
	return krbd.MapOptions{
		Monitors: cl.cfg.Monitors, User: cl.cfg.User, Secret: secret, ReadOnly: readOnly,
		MountTimeout: d.cfg.MountTimeout.D(), Timeout: d.cfg.MapTimeout.D(),
		Extra: append(append([]string(nil), d.cfg.MapOptions...), cl.cfg.MapOptions...),
	}
}

// Unmap is the unmap saga: find the device → unmap → release the claim → persist → audit.
// It needs no secret. Unmapping what is not mapped answers false.
func (d *Daemon) Unmap(ctx context.Context, req api.UnmapRequest, peer *peercred.Cred) (unmapped bool, err error) {
	defer func(start time.Time) { d.metrics.Unmap(d.clusterLabel(req.Cluster), start, err) }(time.Now())
	t, dev, err := d.unmapTarget(req)
	if err != nil {
		return false, err
	}
	unlock, err := d.locks.lock(ctx, t.key)
	if err != nil {
		return false, err
	}
	defer unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.MapTimeout.D()+time.Minute)
	defer cancel()
	s := &saga{d: d, name: "unmap"}

	m, managed := d.state.Get(t.key)
	var devs []krbd.Device
	switch {
	case dev != nil:
		// a device named by path: it is this mapping's only if it is the recorded one; a
		// second mapping of the image (made behind the agent's back) is unmapped alone and
		// the claim, which protects the recorded device, is kept
		devs = []krbd.Device{*dev}
		if managed && (dev.ID != m.DeviceID || dev.ClientAddr != m.ClientAddr || (m.Phase != state.Mapped && m.Phase != state.Unmapping)) {
			managed = false
		}
	case managed && (m.Phase == state.Mapped || m.Phase == state.Unmapping):
		dd, err := d.kernel.ReadDevice(m.DeviceID)
		switch {
		case err == nil && dd.Spec() == t.spec && dd.ClientAddr == m.ClientAddr:
			devs = []krbd.Device{dd}
		case err != nil && !errors.Is(err, krbd.ErrNotFound):
			// unreadable is not gone: never release the claim of a device that may be there
			return false, d.unmapFailed(t, peer, fmt.Errorf("unmap %s: reading %s: %w", t.spec, m.Device, err))
		}
	default:
		// not recorded as mapped (e.g. a map interrupted after the kernel write): by names
		fsid := m.FSID
		if store, err := t.cl.claims(ctx); err == nil {
			fsid = store.FSID()
		}
		found, err := d.kernel.FindBySpec(t.spec, fsid)
		if err != nil {
			// an unreadable sysfs is not "not mapped": unmap would answer false and the
			// caller would think the image free while a device may still be there
			return false, d.unmapFailed(t, peer, fmt.Errorf("unmap %s: looking for its device: %w", t.spec, err))
		}
		devs = found
	}
	if !managed && len(devs) == 0 {
		return false, nil
	}
	if managed && m.Phase == state.Claiming {
		// a map interrupted while claiming: the epoch is only known to the cluster
		epoch, err := d.claimingEpoch(ctx, t.cl, m)
		if err != nil {
			return false, d.unmapFailed(t, peer, err)
		}
		m.Epoch = epoch
	}
	if managed {
		if err := s.step("persist-intent"); err != nil {
			return false, s.fail(err)
		}
		prev := m
		if m.ClientAddr == "" && len(devs) > 0 {
			// a map interrupted after the kernel write, its device found by names: record it
			// before anything else, so that a crash from here on leaves a state that still
			// names the device to remove, never one that forgets it and frees the claim of a
			// live mapping (found by the model checker: docs/safety.md, F1)
			m.DeviceID, m.Device, m.ClientAddr = devs[0].ID, devs[0].DevNode, devs[0].ClientAddr
		}
		m.Phase = state.Unmapping
		if err := d.state.Put(m); err != nil {
			return false, d.unmapFailed(t, peer, d.stateUnwritable(err))
		}
		s.onFail(func(context.Context) error { return d.state.Put(prev) })
	}
	if err := s.step("unmap"); err != nil {
		return false, s.fail(err)
	}
	for _, dv := range devs {
		if _, err := d.kernel.UnmapDevice(ctx, dv, krbd.UnmapOptions{Force: req.Force}); err != nil {
			return false, d.unmapFailed(t, peer, s.fail(err))
		}
		d.node.ForgetUnmanaged(dv.ID)
	}
	// from here on the device is gone: failures are retried by the reconciler, never undone
	claimNote := ""
	if managed && m.Claimed {
		if err := s.step("release"); err != nil {
			return false, err
		}
		notHeld, err := d.releaseClaim(ctx, t.cl, m)
		if err != nil {
			return false, d.unmapFailed(t, peer, fmt.Errorf("unmapped, but releasing the claim failed (will retry): %w", err))
		}
		claimNote = ", claim released"
		if notHeld != "" {
			claimNote = "; its claim was already lost: " + notHeld + "; nothing to release"
		}
	}
	if err := s.step("persist"); err != nil {
		return false, err
	}
	if managed {
		if err := d.state.Forget(t.key); err != nil {
			// the device is gone and the claim released: forgotten in memory, written to the
			// state file by the next write that succeeds
			return false, d.unmapFailed(t, peer, d.stateUnwritable(err))
		}
	}
	d.setProblem(t.key, "")
	devName := ""
	if len(devs) > 0 {
		devName = devs[0].DevNode
	}
	d.audit.Record(audit.Entry{Event: audit.Unmap, Cluster: t.key.Cluster, Pool: t.spec.Pool, Namespace: t.spec.Namespace,
		Image: t.spec.Image, Device: devName, Epoch: m.Epoch, OwnerNode: d.cfg.NodeID, HasPeer: peer != nil, UID: peercred.UID(peer), PID: peercred.PID(peer),
		Message: fmt.Sprintf("unmapped %s (%s)%s", t.spec, devName, claimNote)})
	return len(devs) > 0, nil
}

// claimingEpoch finds the epoch of a claim this node was writing when its map was
// interrupted (0 when the claim was not written, or holds a mapping already).
func (d *Daemon) claimingEpoch(ctx context.Context, cl *cluster, m state.Mapping) (uint64, error) {
	store, err := cl.claims(ctx)
	if err != nil {
		return 0, err
	}
	rec, err := store.Inspect(ctx, m.Ref.Head())
	if errors.Is(err, claim.ErrNoClaim) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if h := rec.Holder(d.cfg.NodeID); h != nil && h.ClientAddr == "" {
		return h.Epoch, nil
	}
	return 0, nil
}

// release drops the claim of a mapping and audits it.
func (d *Daemon) release(ctx context.Context, cl *cluster, m state.Mapping) error {
	_, err := d.releaseClaim(ctx, cl, m)
	return err
}

// releaseClaim is release, saying why nothing was released when the claim was no longer this
// node's ("" when it was released): who took it, or that an admin force-released it.
func (d *Daemon) releaseClaim(ctx context.Context, cl *cluster, m state.Mapping) (notHeld string, err error) {
	store, err := cl.claims(ctx)
	if err != nil {
		return "", err
	}
	img := m.Ref.Head()
	res, err := store.ReleaseHold(ctx, img, m.Epoch)
	if err != nil {
		return "", err
	}
	if !res.Released {
		// not ours any more: another node took it, fencing this mapping, which is gone now
		d.fencedMappingGone(ctx, store, m)
		return res.NotHeld, nil
	}
	d.audit.Record(audit.Entry{Event: audit.Release, Cluster: m.Cluster, Pool: m.Pool, Namespace: m.Namespace, Image: m.Image,
		Device: m.Device, Epoch: m.Epoch, OwnerNode: d.cfg.NodeID})
	return "", nil
}

// unmapTarget resolves an unmap request: by image spec, or by /dev path.
func (d *Daemon) unmapTarget(req api.UnmapRequest) (target, *krbd.Device, error) {
	if req.Device != "" {
		if req.Image != "" || req.Pool != "" {
			return target{}, nil, fmt.Errorf("%w: give an image or a device, not both", errInvalid)
		}
		dev, err := d.kernel.FindByPath(req.Device)
		if err != nil {
			if errors.Is(err, krbd.ErrNotFound) {
				return target{}, nil, fmt.Errorf("%w: %s is not a mapped rbd device", claim.ErrNotFound, req.Device)
			}
			return target{}, nil, err
		}
		// which configured cluster: the one the state names for this device, else by fsid
		clusterID := req.Cluster
		for _, m := range d.state.All() {
			if m.DeviceID == dev.ID && m.ClientAddr == dev.ClientAddr {
				clusterID = m.Cluster
			}
		}
		if clusterID == "" {
			if c := d.clusterByFSID(dev.ClusterFSID); c != nil {
				clusterID = c.cfg.ID
			}
		}
		t, err := d.target(clusterID, dev.Spec())
		return t, &dev, err
	}
	t, err := d.target(req.Cluster, req.Ref())
	return t, nil, err
}

// refused audits a map that was refused (another owner, bad input, ...) and returns err.
func (d *Daemon) refused(req api.MapRequest, peer *peercred.Cred, err error) error {
	clusterID := req.Cluster
	if c, cerr := d.cfg.Cluster(req.Cluster); cerr == nil {
		clusterID = c.ID
	}
	e := audit.Entry{Event: audit.Refuse, Result: audit.Refused, Cluster: clusterID, Pool: req.Pool, Namespace: req.Namespace,
		Image: req.Image, HasPeer: peer != nil, UID: peercred.UID(peer), PID: peercred.PID(peer), Message: "map refused: " + err.Error()}
	var held *claim.HeldError
	if errors.As(err, &held) {
		e.OwnerNode, e.Epoch = held.Owner().NodeID, held.Epoch
	}
	if !errors.Is(err, ErrCrash) {
		d.audit.Record(e)
		d.metrics.Refused(d.clusterLabel(req.Cluster), err)
	}
	return err
}

func (d *Daemon) failed(req api.MapRequest, peer *peercred.Cred, err error) error {
	if !errors.Is(err, ErrCrash) {
		d.audit.Record(audit.Entry{Event: audit.Map, Result: audit.Failed, Cluster: req.Cluster, Pool: req.Pool, Namespace: req.Namespace,
			Image: req.Image, HasPeer: peer != nil, UID: peercred.UID(peer), PID: peercred.PID(peer), Message: "map failed: " + err.Error()})
	}
	return err
}

func (d *Daemon) unmapFailed(t target, peer *peercred.Cred, err error) error {
	if !errors.Is(err, ErrCrash) {
		d.audit.Record(audit.Entry{Event: audit.Unmap, Result: audit.Failed, Cluster: t.key.Cluster, Pool: t.spec.Pool, Namespace: t.spec.Namespace,
			Image: t.spec.Image, HasPeer: peer != nil, UID: peercred.UID(peer), PID: peercred.PID(peer), Message: "unmap failed: " + err.Error()})
	}
	return err
}

// linkOf is the stable udev link of a mapping (see udev/60-rbd-owner.rules).
// It is "" when a name has characters udev would replace: the rule makes no link then.
func linkOf(s krbd.Spec, fsid string) string {
	for _, n := range []string{fsid, s.Pool, s.Namespace, s.Image, s.Snap} {
		if !linkSafe.MatchString(n) {
			return ""
		}
	}
	return "/dev/rbd-owner/" + fsid + "/" + s.String()
}

var linkSafe = regexp.MustCompile(`^[A-Za-z0-9#+.:=@_-]*$`)

// keyedLocks serialises the sagas of one image; different images proceed in parallel. An
// image's entry lives only while someone holds or waits for its lock, so the map does not grow
// with every image the node has ever seen.
type keyedLocks struct {
	mu sync.Mutex
	m  map[state.Key]*keyLock
}

type keyLock struct {
	ch   chan struct{} // holds one token while the lock is held
	refs int           // holders and waiters
}

func (k *keyedLocks) ref(key state.Key) *keyLock {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = map[state.Key]*keyLock{}
	}
	l := k.m[key]
	if l == nil {
		l = &keyLock{ch: make(chan struct{}, 1)}
		k.m[key] = l
	}
	l.refs++
	return l
}

func (k *keyedLocks) unref(key state.Key, l *keyLock) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if l.refs--; l.refs == 0 {
		delete(k.m, key)
	}
}

// lock waits for the image's lock, at most until ctx ends.
func (k *keyedLocks) lock(ctx context.Context, key state.Key) (func(), error) {
	l := k.ref(key)
	select {
	case l.ch <- struct{}{}:
		return func() { <-l.ch; k.unref(key, l) }, nil
	case <-ctx.Done():
		k.unref(key, l)
		return nil, fmt.Errorf("%w: another operation on %s is still running", claim.ErrBusy, key)
	}
}

// tryLock takes the lock only if it is free.
func (k *keyedLocks) tryLock(key state.Key) (func(), bool) {
	l := k.ref(key)
	select {
	case l.ch <- struct{}{}:
		return func() { <-l.ch; k.unref(key, l) }, true
	default:
		k.unref(key, l)
		return nil, false
	}
}

// isHeld says whether someone holds (or waits for) key's lock.
func (k *keyedLocks) isHeld(key state.Key) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.m[key] != nil
}

// held is the number of images with an entry (tests).
func (k *keyedLocks) held() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.m)
}
