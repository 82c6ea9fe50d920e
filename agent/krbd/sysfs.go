package krbd

import (
	"context"
	"fmt"
	"os"
	"os/exec"

	"golang.org/x/sys/unix"
)

// ControlWriter writes a string to a /sys/bus/rbd control file (add, add_single_major,
// remove, remove_single_major) in ONE write(2), returning the kernel's errno. It is the seam
// the fake kernel replaces: a write to a regular file cannot fail like the kernel's does.
type ControlWriter interface {
	WriteControl(path string, data []byte) error
}

// SysfsWriter is the real ControlWriter: open O_WRONLY, one write.
type SysfsWriter struct{}

// WriteControl implements ControlWriter: exactly one write(2) (os.File.Write would send the
// rest of a short write as a second command). A write error is returned as its syscall.Errno.
func (SysfsWriter) WriteControl(path string, data []byte) error {
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: path, Err: err}
	}
	// the kernel acts on the write(2) and answers there; a close of a sysfs control file
	// reports nothing, and an add or remove it made stands whatever close says
	defer func() { _ = unix.Close(fd) }()
	n, err := unix.Write(fd, data)
	if err != nil {
		return &os.PathError{Op: "write", Path: path, Err: err}
	}
	if n != len(data) {
		return fmt.Errorf("write %s: short write %d/%d", path, n, len(data))
	}
	return nil
}

// ModprobeRBD loads the rbd module with /sbin/modprobe.
func ModprobeRBD(ctx context.Context) error {
	out, err := exec.CommandContext(ctx, "/sbin/modprobe", "rbd").CombinedOutput()
	if err != nil {
		return fmt.Errorf("/sbin/modprobe rbd: %w: %s", err, out)
	}
	return nil
}

// StatDevNode returns the major:minor of a block device node (following links).
func StatDevNode(path string) (major, minor uint32, err error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, 0, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return 0, 0, fmt.Errorf("%s: not a block device", path)
	}
	return unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev)), nil
}
