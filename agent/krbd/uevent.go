package krbd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/pilebones/go-udev/netlink"
	"golang.org/x/sys/unix"
)

// Uevent is one device event concerning rbd: SUBSYSTEM=rbd (DEVPATH=/devices/rbd/N) or the
// block device rbdN (or a partition of it). Remove events carry no image names: read them at
// add time (ReadDevice) and remember them.
type Uevent struct {
	Action    string // add, remove, change, ...
	DevPath   string // /devices/rbd/0, /devices/rbd/0/block/rbd0
	Subsystem string // rbd, block
	DevType   string // disk, partition (block only)
	DevName   string // rbd0 (kernel) or /dev/rbd0 (udev), block only
	Major     string
	Minor     string
	FromUdev  bool              // sent by udevd after its rules ran (links exist), not by the kernel
	Env       map[string]string // all properties
	// Overflow is set on a marker event: events were lost before it (the socket buffer
	// overflowed, ENOBUFS, or a reader fell behind). Consumers re-read sysfs.
	Overflow bool
}

// RBDID returns N for an event of the rbd device /devices/rbd/N.
func (e Uevent) RBDID() (int, bool) {
	if e.Subsystem != "rbd" {
		return 0, false
	}
	rest, ok := strings.CutPrefix(e.DevPath, "/devices/rbd/")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(rest)
	return n, err == nil && n >= 0
}

// DiskID returns N for an event of the whole block device rbdN (not a partition).
func (e Uevent) DiskID() (int, bool) {
	if e.Subsystem != "block" || e.DevType != "disk" {
		return 0, false
	}
	i := strings.LastIndexByte(e.DevPath, '/')
	rest, ok := strings.CutPrefix(e.DevPath[i+1:], "rbd")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(rest)
	return n, err == nil && n >= 0
}

// IsRBD reports whether the event concerns an rbd device or an rbd block device.
func (e Uevent) IsRBD() bool {
	if e.Overflow {
		return true
	}
	if _, ok := e.RBDID(); ok {
		return true
	}
	if e.Subsystem == "block" {
		i := strings.LastIndexByte(e.DevPath, '/')
		return strings.HasPrefix(e.DevPath, "/devices/rbd/") || strings.HasPrefix(e.DevPath[i+1:], "rbd")
	}
	return false
}

// ParseUevent parses one netlink message, kernel ("add@/devices/...\0KEY=v\0...") or udev
// ("libudev\0" header) format.
func ParseUevent(msg []byte) (u Uevent, err error) {
	// go-udev v0.9.1 panics on some malformed messages (one without any NUL: found by
	// FuzzParseUevent); a datagram from a socket must never take the agent down.
	if bytes.IndexByte(msg, 0) < 0 {
		return Uevent{}, fmt.Errorf("parse uevent: %w: no NUL-separated fields", ErrInvalid)
	}
	defer func() {
		if r := recover(); r != nil {
			u, err = Uevent{}, fmt.Errorf("parse uevent: %w: malformed message (%v)", ErrInvalid, r)
		}
	}()
	ev, err := netlink.ParseUEvent(msg)
	if err != nil {
		return Uevent{}, fmt.Errorf("parse uevent: %w", err)
	}
	u = Uevent{
		Action:    string(ev.Action),
		DevPath:   ev.Env["DEVPATH"],
		Subsystem: ev.Env["SUBSYSTEM"],
		DevType:   ev.Env["DEVTYPE"],
		DevName:   ev.Env["DEVNAME"],
		Major:     ev.Env["MAJOR"],
		Minor:     ev.Env["MINOR"],
		FromUdev:  len(msg) > 8 && string(msg[:8]) == "libudev\x00",
		Env:       ev.Env,
	}
	if u.DevPath == "" {
		u.DevPath = ev.KObj
	}
	return u, nil
}

// EventSource delivers rbd uevents. Subscribe before acting so that no event is missed.
type EventSource interface {
	Subscribe(ctx context.Context) (Subscription, error)
}

// Subscription is an open stream of rbd uevents. Close ends it and closes Events().
type Subscription interface {
	Events() <-chan Uevent
	Close() error
}

// Event source modes for NetlinkSource.
const (
	ModeAuto   = 0 // udev when udevd runs (/run/udev/control exists), else kernel
	ModeKernel = 1 // kernel uevents (netlink group 1)
	ModeUdev   = 2 // udevd's events after its rules ran (netlink group 2); ErrNoUdev without udevd
)

// ErrNoUdev is Subscribe's answer for udevd's events when udevd does not run.
var ErrNoUdev = errors.New("udevd is not running")

// NetlinkSource reads uevents from a NETLINK_KOBJECT_UEVENT socket (github.com/pilebones/go-udev).
type NetlinkSource struct {
	Mode int
	// UdevControl is the file whose presence means udevd runs (default /run/udev/control).
	UdevControl string
	// Buffer is the channel depth of a subscription (default 256).
	Buffer int
}

// EffectiveMode resolves ModeAuto.
func (s *NetlinkSource) EffectiveMode() int {
	if s.Mode != ModeAuto {
		return s.Mode
	}
	if s.udevRuns() {
		return ModeUdev
	}
	return ModeKernel
}

func (s *NetlinkSource) udevRuns() bool {
	ctl := s.UdevControl
	if ctl == "" {
		ctl = "/run/udev/control"
	}
	_, err := os.Stat(ctl)
	return err == nil
}

// Subscribe opens the socket now (so events from this moment on are queued) and starts a
// reader that ends on Close or when ctx is done. For udevd's events it answers ErrNoUdev when
// udevd does not run (nothing would ever come).
func (s *NetlinkSource) Subscribe(ctx context.Context) (Subscription, error) {
	mode := s.EffectiveMode()
	if mode == ModeUdev && !s.udevRuns() {
		return nil, ErrNoUdev
	}
	conn := &netlink.UEventConn{}
	if err := conn.Connect(netlink.Mode(mode)); err != nil {
		return nil, fmt.Errorf("uevent socket: %w", err)
	}
	// A bigger buffer (best effort: FORCE needs CAP_NET_ADMIN).
	if err := unix.SetsockoptInt(conn.Fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 4<<20); err != nil {
		// without either the default buffer stays: more overflows, each of which the watcher
		// answers with a resync from sysfs, so nothing is lost but time
		_ = unix.SetsockoptInt(conn.Fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
	}
	// The reader waits in poll(2) on the socket and on an eventfd that Close (or ctx) signals:
	// Close returns as soon as the reader has stopped, not after a receive timeout (a 100 ms
	// timeout once cost every map and unmap up to 100 ms on its way out).
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		_ = conn.Close() // the eventfd's error is the one to report
		return nil, fmt.Errorf("uevent socket: eventfd: %w", err)
	}
	n := s.Buffer
	if n <= 0 {
		n = 256
	}
	sub := &netlinkSub{conn: conn, wake: wake, ch: make(chan Uevent, n), exited: make(chan struct{})}
	stop := context.AfterFunc(ctx, sub.signal)
	go func() { defer stop(); sub.run() }()
	return sub, nil
}

type netlinkSub struct {
	conn   *netlink.UEventConn
	wake   int // eventfd: readable once the reader is to stop
	ch     chan Uevent
	exited chan struct{}
	once   sync.Once
}

func (s *netlinkSub) Events() <-chan Uevent { return s.ch }

// signal tells the reader to stop (idempotent; the eventfd stays readable).
func (s *netlinkSub) signal() {
	s.once.Do(func() {
		one := [8]byte{1}
		_, _ = unix.Write(s.wake, one[:]) // cannot fail short of a closed fd: the reader owns it
	})
}

func (s *netlinkSub) Close() error {
	s.signal()
	<-s.exited
	return nil
}

func (s *netlinkSub) run() {
	defer func() {
		s.once.Do(func() {}) // from here on signal writes nothing, so the eventfd can go
		// the reader's end: the subscriber learns it from the closed channel, and a close
		// error of either socket leaves nothing to undo
		_ = unix.Close(s.wake)
		_ = s.conn.Close()
		close(s.ch)
		close(s.exited)
	}()
	lost := false
	buf := make([]byte, 64<<10)
	fds := []unix.PollFd{{Fd: int32(s.conn.Fd), Events: unix.POLLIN}, {Fd: int32(s.wake), Events: unix.POLLIN}} //nolint:gosec // fds are C ints: they fit
	for {
		if lost { // a loss not reported yet: say so now, not only with the next rbd event
			lost = !s.offer(Uevent{Overflow: true})
		}
		// a bound on the wait only so that a pending loss report is retried
		timeout := -1
		if lost {
			timeout = 100
		}
		fds[0].Revents, fds[1].Revents = 0, 0
		if _, err := unix.Poll(fds, timeout); err != nil && !errors.Is(err, unix.EINTR) {
			select { // an unexpected poll error: report loss and stop; the owner resubscribes
			case s.ch <- Uevent{Overflow: true}:
			default:
			}
			return
		}
		if fds[1].Revents != 0 {
			return // Close, or the subscription's context ended
		}
		if fds[0].Revents == 0 {
			continue
		}
		n, _, err := unix.Recvfrom(s.conn.Fd, buf, unix.MSG_DONTWAIT)
		switch {
		case errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.ENOBUFS):
			// the socket overflowed: say so at once (nothing else may come to carry it)
			lost = !s.offer(Uevent{Overflow: true})
			continue
		case err != nil:
			// an unexpected socket error: report loss and stop; the owner resubscribes
			select {
			case s.ch <- Uevent{Overflow: true}:
			default:
			}
			return
		}
		ev, err := ParseUevent(buf[:n])
		if err != nil || !ev.IsRBD() {
			if err != nil {
				lost = true // an rbd event we cannot read counts as lost
			}
			continue
		}
		if lost {
			if !s.offer(Uevent{Overflow: true}) {
				continue
			}
			lost = false
		}
		if !s.offer(ev) {
			lost = true
		}
	}
}

// offer queues ev without blocking the reader; a full queue counts as lost events.
func (s *netlinkSub) offer(ev Uevent) bool {
	select {
	case s.ch <- ev:
		return true
	default:
		return false
	}
}
