package saga

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"syscall"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/claimapi"
	"github.com/rbd-owner/rbd-owner/agent/fault"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// alreadyMapped answers a repeated map: same device, lease renewed. done is false when the
// saga has to run.
func (s *Sagas) alreadyMapped(ctx context.Context, t target, store *claim.Store, access claim.Access, readOnly bool) (*api.MapResponse, bool, error) {
	m, ok := s.State.Get(t.key)
	if !ok || m.Phase != state.Mapped {
		return nil, false, nil
	}
	dev, err := s.Kernel.ReadDevice(m.DeviceID)
	if err != nil && !errors.Is(err, krbd.ErrNotFound) {
		// unreadable is not gone: never drop the claim of a device that may still be there
		return nil, true, fmt.Errorf("map %s: reading its device %s: %w", t.spec, m.Device, err)
	}
	if err != nil || dev.Spec() != t.spec || dev.ClientAddr != m.ClientAddr {
		// the device went away without us: release its claim now, then map afresh
		if err := s.DeviceGone(ctx, m, "found missing at map time"); err != nil {
			return nil, true, fmt.Errorf("map %s: its old device is gone and releasing its claim failed: %w", t.spec, err)
		}
		return nil, false, nil
	}
	if m.Access != string(access) || m.ReadOnly != readOnly {
		return nil, true, fmt.Errorf("%w: %s is mapped here as %s%s; unmap it first to map it differently",
			fault.ErrInvalid, t.spec, m.Access, map[bool]string{true: " read-only", false: ""}[m.ReadOnly])
	}
	resp := &api.MapResponse{Device: dev.DevNode, Link: LinkOf(t.spec, m.FSID), AlreadyMapped: true}
	if m.Claimed {
		// a read, not a write: the lease is the node's heartbeat; this only proves the claim
		// is still this node's at its epoch
		rec, err := store.Check(ctx, t.img, m.Epoch)
		if err == nil && !store.Records(rec, m.ClientAddr) {
			// a map interrupted after its persist, before its record: the device is handed
			// over only once the claim names it (else a takeover fences the whole node)
			rec, err = store.SetMapping(ctx, t.img, m.Epoch, m.ClientAddr, m.Device)
		}
		if err != nil {
			if errors.Is(err, claim.ErrFenced) {
				s.setLost(t.key, err.Error())
			}
			return nil, true, err
		}
		resp.Claim = claimapi.Of(t.key.Cluster, rec)
	}
	return resp, true, nil
}

// persist writes m to the state file at a saga step. A write that fails (a full disk, a
// read-only file system) is said in words a person acts on and logged at error priority; a
// fault injected at the step (Options.Fault, tests) stands in for the write.
func (s *Sagas) persist(r *run, step string, m state.Mapping) error {
	var err error
	if s.Fault != nil {
		err = s.Fault(r.name, step)
	}
	if err == nil {
		err = s.State.Put(m)
	}
	if err == nil || errors.Is(err, ErrCrash) {
		return err
	}
	return s.stateUnwritable(err)
}

// stateUnwritable is a failed write of the state file (the store's error names the file and
// the cause) as one line naming the next step. The store's failure hook has logged it and
// counted it (rebuild.go): nothing is claimed or mapped that the state does not record, so the
// operation is refused.
func (s *Sagas) stateUnwritable(err error) error {
	return fmt.Errorf("%w; %s", err, StateNextStep(s.Config.StateDir, err))
}

// StateNextStep is what a person does about a state file that cannot be written.
func StateNextStep(dir string, err error) string {
	switch {
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return "free space in " + dir + ", then retry"
	case errors.Is(err, syscall.EROFS):
		return "its file system is read-only: remount " + dir + " read-write, then retry"
	}
	return "check that " + dir + " is writable, then retry"
}

// LinkOf is the stable udev link of a mapping (see udev/60-rbd-owner.rules).
// It is "" when a name has characters udev would replace: the rule makes no link then.
func LinkOf(s krbd.Spec, fsid string) string {
	for _, n := range []string{fsid, s.Pool, s.Namespace, s.Image, s.Snap} {
		if !linkSafe.MatchString(n) {
			return ""
		}
	}
	return "/dev/rbd-owner/" + fsid + "/" + s.String()
}

// setLost records that this node's claim on k is gone, counted once.
func (s *Sagas) setLost(k state.Key, why string) {
	if s.Node.SetLost(k, why) {
		s.Metrics.ClaimLost(k.Cluster)
	}
}

// denied is the refusal of what to this caller for want of the admin role, audited by the
// caller's Denied.
func (c Caller) denied(what string) error {
	if c.Denied != nil {
		return c.Denied(what)
	}
	return fmt.Errorf("%w: %s needs the admin role", fault.ErrPermission, what)
}

var linkSafe = regexp.MustCompile(`^[A-Za-z0-9#+.:=@_-]*$`)
