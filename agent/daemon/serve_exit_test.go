package daemon

import (
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// failingListener accepts nothing: once fail is closed, Accept returns an error that is not
// temporary, as when the socket's file descriptor is gone.
type failingListener struct {
	net.Listener
	fail chan struct{}
}

func (l *failingListener) Accept() (net.Conn, error) {
	<-l.fail
	return nil, errors.New("accept unix: bad file descriptor (test)")
}

// TestAPIServerStoppingEndsTheAgentWithAnError: an API socket whose server stops on its own
// ends the agent, and with an error, so that systemd's Restart=on-failure starts it again (an
// agent that exits 0 there stays down, its leases unrenewed).
func TestAPIServerStoppingEndsTheAgentWithAnError(t *testing.T) {
	c := newMemCluster("c1", "rbd", "00000000-0000-4000-8000-000000000063")
	l, err := net.Listen("unix", filepath.Join(t.TempDir(), "api.sock"))
	if err != nil {
		t.Fatal(err)
	}
	fl := &failingListener{Listener: l, fail: make(chan struct{})}
	n := startMemDaemonWith(t, func(o *Options) { o.Listener = fl }, c)
	defer n.cancel()
	close(fl.fail)
	select {
	case err := <-n.done:
		if err == nil || !strings.Contains(err.Error(), "bad file descriptor") {
			t.Fatalf("the agent ended with %v, want the API server's error", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the agent did not end when its API server stopped")
	}
}
