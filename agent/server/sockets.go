package server

import (
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"time"

	"github.com/coreos/go-systemd/v22/activation"
	"github.com/sirupsen/logrus"
)

// Sockets names the agent's two sockets and any listeners already made for them.
type Sockets struct {
	Main, CSI   string       // paths; CSI "" or "none": no CSI socket
	MainL, CSIL net.Listener // made by the caller (tests); nil: passed by systemd, else created
	Log         *logrus.Logger
}

// Listeners returns the main socket and the CSI socket (nil when there is none): those given,
// else those systemd passed (rbd-owner.socket listens on both; they are told apart by path),
// else sockets created here: mode 0660, group rbd-owner.
func (s Sockets) Listeners() (main, csi net.Listener, err error) {
	main, csi = s.MainL, s.CSIL
	wantCSI := s.CSI != "" && s.CSI != "none"
	if main == nil || (csi == nil && wantCSI) {
		main, csi, err = s.passed(main, csi, wantCSI)
		if err != nil {
			return nil, nil, err
		}
	}
	if main == nil {
		if main, err = Listen(s.Main, s.Log); err != nil {
			return nil, nil, err
		}
	}
	if csi == nil && wantCSI {
		if csi, err = Listen(s.CSI, s.Log); err != nil {
			if cerr := main.Close(); cerr != nil {
				s.Log.WithError(cerr).WithField("socket", s.Main).Warn("closing the main socket")
			}
			return nil, nil, err
		}
	}
	return main, csi, nil
}

// passed takes the sockets systemd passed for those not given yet, and closes any other.
func (s Sockets) passed(main, csi net.Listener, wantCSI bool) (net.Listener, net.Listener, error) {
	passed, err := activation.Listeners()
	if err != nil {
		return nil, nil, fmt.Errorf("socket activation: %w", err)
	}
	for _, l := range passed {
		if l == nil {
			continue
		}
		switch addr := l.Addr().String(); {
		case addr == s.Main && main == nil:
			main = l
		case addr == s.CSI && wantCSI && csi == nil:
			csi = l
		default:
			s.Log.WithField("socket", addr).Warn("systemd passed a socket the config does not name; closing it")
			if err := l.Close(); err != nil {
				s.Log.WithError(err).WithField("socket", addr).Warn("closing the unexpected socket")
			}
			continue
		}
		s.Log.WithField("socket", l.Addr().String()).Info("using the socket systemd passed")
	}
	return main, csi, nil
}

// Listen creates a socket at path: mode 0660, group rbd-owner, in a directory of mode 0755.
func Listen(path string, log *logrus.Logger) (net.Listener, error) {
	// the directory is world-searchable so that group members reach the socket; the socket's own
	// mode (0660) decides who may connect
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil { //nolint:gosec // see above
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	if err := removeStale(path); err != nil {
		return nil, err
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	gid := LookupGroup("rbd-owner")
	if gid < 0 {
		gid = 0
		log.WithField("socket", path).Warn("group rbd-owner does not exist: only root can use the socket")
	}
	if err := os.Chown(path, 0, gid); err != nil {
		log.WithError(err).WithField("socket", path).Warn("cannot give the socket to group rbd-owner")
	}
	// group rbd-owner (ceph-csi, the CLI of its members) connects: read-write for the group
	if err := os.Chmod(path, 0o660); err != nil { //nolint:gosec // see above
		if cerr := l.Close(); cerr != nil {
			log.WithError(cerr).WithField("socket", path).Warn("closing the socket")
		}
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	return l, nil
}

// removeStale removes a socket left at path by an agent that is gone; it refuses a file that is
// not a socket, and a socket another agent answers on.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil // nothing there (or nothing this can tell): net.Listen says what is wrong
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("socket %s: exists and is not a socket", path)
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		_ = c.Close() // only a probe: whether it closes cleanly changes nothing
		return fmt.Errorf("socket %s: another agent is answering on it", path)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("socket %s: removing the stale socket: %w", path, err)
	}
	return nil
}

// LookupGroup returns the gid of a group, or -1.
func LookupGroup(name string) int {
	g, err := user.LookupGroup(name)
	if err != nil {
		return -1
	}
	gid, err := strconv.Atoi(g.Gid)
	if err != nil {
		return -1
	}
	return gid
}
