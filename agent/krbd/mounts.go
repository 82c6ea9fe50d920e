package krbd

import (
	"fmt"
	"os"
	"strings"

	"github.com/moby/sys/mountinfo"
)

// DefaultMountInfo is where the mounts of the agent's own mount namespace are read.
const DefaultMountInfo = "/proc/self/mountinfo"

// partitionsPerDevice is how many minors one rbd device spans in single-major mode (the
// kernel's RBD_SINGLE_MAJOR_PART_SHIFT is 4): the whole disk and its partitions.
const partitionsPerDevice = 16

// BusyError is an unmap the kernel refused because the device is open (EBUSY from remove),
// naming where the device (or one of its partitions) is mounted when it is: that is what a
// person has to undo. It matches ErrBusy and syscall.EBUSY through the kernel's error.
type BusyError struct {
	Device      string   // the device node, e.g. /dev/rbd0
	MountPoints []string // where it is mounted, in mountinfo order (none when it is open otherwise)
	Err         error    // the kernel's answer (a *KernelError)
}

func (e *BusyError) Error() string {
	if len(e.MountPoints) > 0 {
		return fmt.Sprintf("%s is mounted at %s: unmount it first (or unmap --force)", e.Device, strings.Join(e.MountPoints, ", "))
	}
	return fmt.Sprintf("%s is open (the kernel answered EBUSY; it is not mounted in the agent's mount namespace): close what holds it open first (or unmap --force)", e.Device)
}

func (e *BusyError) Unwrap() error { return e.Err }

// MountPoints lists where the device major:minor, or one of its partitions, is mounted
// (Config.MountInfo). A device mounted in another mount namespace only (a container's) is not
// seen there.
func (c *Client) MountPoints(major, minor uint32) ([]string, error) {
	f, err := os.Open(c.cfg.MountInfo)
	if err != nil {
		return nil, fmt.Errorf("read mounts: %w", err)
	}
	defer func() { _ = f.Close() }() // read only: its close loses nothing
	ms, err := mountinfo.GetMountsFromReader(f, func(i *mountinfo.Info) (skip, stop bool) {
		return !(i.Major == int(major) && i.Minor >= int(minor) && i.Minor < int(minor)+partitionsPerDevice), false
	})
	if err != nil {
		return nil, fmt.Errorf("read mounts from %s: %w", c.cfg.MountInfo, err)
	}
	out := make([]string, 0, len(ms))
	for _, m := range ms {
		out = append(out, m.Mountpoint)
	}
	return out, nil
}

// busy turns the kernel's final EBUSY for device id into a *BusyError naming its mounts.
func (c *Client) busy(id int, err error) error {
	d, rerr := c.ReadDevice(id)
	if rerr != nil {
		return err
	}
	be := &BusyError{Device: d.DevNode, Err: err}
	if mps, merr := c.MountPoints(d.Major, d.Minor); merr == nil {
		be.MountPoints = mps
	} else {
		c.cfg.Logger.WithError(merr).Warn("cannot tell where a busy rbd device is mounted")
	}
	return be
}
