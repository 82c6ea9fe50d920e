// Package krbd maps and unmaps Ceph RBD images through the kernel's /sys/bus/rbd interface
// (the same strings Ceph's krbd.cc writes), lists mapped devices from sysfs and turns the
// kernel's errno values into typed errors. It holds no claim or API logic.
//
// Everything the kernel touches goes through small seams (Config): the sysfs and /dev roots,
// the control-file writer, the uevent source, the keyring and the module loader, so that unit
// tests run against a fake kernel (package fakekernel) and the real-kernel test against krbd.
package krbd

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/rbd-owner/rbd-owner/agent/fault"
)

// Typed errors, usable with errors.Is; each has its kind in the agent's one classification
// (package fault). Kernel errno values map onto them (see classify).
var (
	// ErrNotFound: the pool, namespace, image or snapshot does not exist (ENOENT from add),
	// or no such mapped device.
	ErrNotFound = fault.ErrNotFound
	// ErrPermission: the cephx user or key was refused (EACCES/EPERM from add).
	ErrPermission = fault.ErrPermission
	// ErrInvalid: a name or option was refused, by this package before writing or by the
	// kernel (EINVAL).
	ErrInvalid = fault.ErrInvalid
	// ErrTimeout: the monitors did not answer within mount_timeout (ETIMEDOUT), or a wait
	// for the device's events ran out: the cluster is unavailable (a Timeout when the
	// caller's own deadline ran out).
	ErrTimeout = fault.New(fault.Unavailable, "timed out")
	// ErrBusy: the device is open (EBUSY from remove).
	ErrBusy = fault.New(fault.Busy, "device busy")
	// ErrNoKernelSupport: /sys/bus/rbd is absent and the rbd module could not be loaded.
	ErrNoKernelSupport = fault.New(fault.Internal, "kernel rbd support unavailable")
	// ErrUnsupported: the image uses features this kernel cannot map (ENXIO from add).
	ErrUnsupported = fault.New(fault.Invalid, "image features not supported by this kernel")
	// ErrPendingKey: a keyring holds a pending key line, which librados refuses to load.
	ErrPendingKey = fault.New(fault.Invalid, "a pending key")
	// ErrFenced: this client is blocklisted by the cluster (ESHUTDOWN).
	ErrFenced = fault.ErrBlocklisted
	// ErrLeftMapped: a map failed after the kernel made the device, and the device could
	// not be removed again: it is still mapped.
	ErrLeftMapped = fault.New(fault.Internal, "device left mapped")
)

// KernelError is an error returned by a write to a /sys/bus/rbd control file. It matches
// both its typed error (errors.Is(err, ErrNotFound)) and its errno (errors.Is(err, syscall.ENOENT)).
type KernelError struct {
	File  string        // control file written, e.g. add_single_major
	Errno syscall.Errno // errno the kernel returned
	Kind  error         // one of the Err* values, or nil when the errno has no typed error
}

func (e *KernelError) Error() string {
	if e.Kind != nil {
		return fmt.Sprintf("kernel refused write to %s: %v (%s)", e.File, e.Kind, e.Errno.Error())
	}
	return fmt.Sprintf("kernel refused write to %s: %s", e.File, e.Errno.Error())
}

// Unwrap returns the typed error and the errno.
func (e *KernelError) Unwrap() []error {
	if e.Kind == nil {
		return []error{e.Errno}
	}
	return []error{e.Kind, e.Errno}
}

// classify turns an error from a control-file write into a *KernelError when it carries an errno.
func classify(file string, err error) error {
	if err == nil {
		return nil
	}
	var pe *os.PathError
	if errors.As(err, &pe) && pe.Op == "open" {
		// not the kernel's answer to the command: the control file itself is missing or closed
		return fmt.Errorf("open %s: %w", file, pe.Err)
	}
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return fmt.Errorf("write %s: %w", file, err)
	}
	var kind error
	switch errno {
	case syscall.ENOENT:
		kind = ErrNotFound
	case syscall.ENXIO:
		kind = ErrUnsupported
	case syscall.ESHUTDOWN:
		kind = ErrFenced
	case syscall.EACCES, syscall.EPERM, syscall.EKEYREJECTED, syscall.ENOKEY:
		kind = ErrPermission
	case syscall.EINVAL:
		kind = ErrInvalid
	case syscall.ETIMEDOUT:
		kind = ErrTimeout
	case syscall.EBUSY:
		kind = ErrBusy
	}
	return &KernelError{File: file, Errno: errno, Kind: kind}
}
