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

// WriteControl implements ControlWriter. A write error is returned as its syscall.Errno.
func (SysfsWriter) WriteControl(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	n, werr := f.Write(data)
	cerr := f.Close()
	if werr != nil {
		return werr // *os.PathError wrapping the errno
	}
	if n != len(data) {
		return fmt.Errorf("short write %d/%d", n, len(data))
	}
	return cerr
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
