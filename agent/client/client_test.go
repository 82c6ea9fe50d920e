package client

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/rbd-owner/rbd-owner/agent/api"
)

// Code is "" for success alone: a caller's `case "":` must never take a failed call for a map.
func TestCodeIsEmptyOnlyWithoutError(t *testing.T) {
	_, unreachable := New(filepath.Join(t.TempDir(), "none")).Status(context.Background())
	if !errors.Is(unreachable, ErrUnreachable) {
		t.Fatalf("a call to a missing socket: %v, want ErrUnreachable", unreachable)
	}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{fmt.Errorf("map: %w", &api.Error{Code: api.CodeClaimedElsewhere, Message: "held"}), api.CodeClaimedElsewhere},
		{unreachable, CodeUnreachable},
		{fmt.Errorf("POST /v1/map: %w", context.DeadlineExceeded), api.CodeTimeout},
		{errors.New("POST /v1/map: bad answer"), api.CodeInternal},
	} {
		if got := Code(tc.err); got != tc.want {
			t.Errorf("Code(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

// noDialText: a call that got no answer names what happened, never Go's dial text.
func noDialText(t *testing.T, what string, err error) {
	t.Helper()
	for _, s := range []string{"dial unix", "connect:"} {
		if strings.Contains(err.Error(), s) {
			t.Errorf("%s: %q has Go's dial text %q", what, err, s)
		}
	}
}

// TestUnreachableSaysWhy (issue 52): a socket that does not exist and one nothing listens on
// are both ErrUnreachable (code unreachable), told apart by their errno and their message.
func TestUnreachableSaysWhy(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none.sock")
	_, err := New(missing).Status(context.Background())
	if !errors.Is(err, ErrUnreachable) || !errors.Is(err, syscall.ENOENT) || Code(err) != CodeUnreachable {
		t.Fatalf("missing socket: %v (code %q), want ErrUnreachable with ENOENT", err, Code(err))
	}
	if want := "no rbd-owner agent answers on " + missing + ": the socket does not exist"; err.Error() != want {
		t.Errorf("missing socket: %q, want %q", err, want)
	}
	noDialText(t, "missing socket", err)

	dead := filepath.Join(t.TempDir(), "dead.sock")
	l, err := net.Listen("unix", dead)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	_ = l.Close() // the socket file stays, nothing listens
	_, err = New(dead).Map(context.Background(), api.MapRequest{Pool: "rbd", Image: "img"})
	if !errors.Is(err, ErrUnreachable) || !errors.Is(err, syscall.ECONNREFUSED) || Code(err) != CodeUnreachable {
		t.Fatalf("dead socket: %v (code %q), want ErrUnreachable with ECONNREFUSED", err, Code(err))
	}
	if want := "no rbd-owner agent answers on " + dead + ": nothing listens on the socket (connection refused)"; err.Error() != want {
		t.Errorf("dead socket: %q, want %q", err, want)
	}
	noDialText(t, "dead socket", err)
}

// TestNoAccessIsNotUnreachable (issue 52): EACCES connecting to the socket is ErrNoAccess, code
// permission_denied, and says so (the agent may well be running). The errno comes from the
// dialer as net.Dial returns it (root may connect to any socket, so it is injected here).
func TestNoAccessIsNotUnreachable(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "rbd-owner.sock")
	c := New(sock)
	c.hc.Transport.(*http.Transport).DialContext = func(context.Context, string, string) (net.Conn, error) {
		return nil, &net.OpError{Op: "dial", Net: "unix", Addr: &net.UnixAddr{Name: sock, Net: "unix"}, Err: os.NewSyscallError("connect", syscall.EACCES)}
	}
	_, err := c.Status(context.Background())
	if !errors.Is(err, ErrNoAccess) || errors.Is(err, ErrUnreachable) || !errors.Is(err, syscall.EACCES) || Code(err) != api.CodePermissionDenied {
		t.Fatalf("EACCES: %v (code %q), want ErrNoAccess alone, with EACCES, code permission_denied", err, Code(err))
	}
	if want := "no permission to connect to the rbd-owner agent's socket " + sock; err.Error() != want {
		t.Errorf("EACCES: %q, want %q", err, want)
	}
	noDialText(t, "EACCES", err)
}

// cuttingAgent serves a socket whose every connection reads one request and then does cut to
// it (closing the connection, or writing part of an answer first).
func cuttingAgent(t *testing.T, cut func(net.Conn)) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "rbd-owner.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			if _, err := http.ReadRequest(bufio.NewReader(conn)); err == nil {
				cut(conn)
			}
			_ = conn.Close()
		}
	}()
	return sock
}

// TestCutOffCallIsInterrupted (issue 52): a call whose request was sent and whose connection
// closed before the whole answer (an agent restarted during a map) is ErrCutOff, code
// interrupted, and says that the agent went away during the call, that its recovery may have
// finished or undone the map, and that it can be repeated.
func TestCutOffCallIsInterrupted(t *testing.T) {
	for name, cut := range map[string]func(net.Conn){
		"closed before the answer": func(net.Conn) {},
		"closed half-way through the answer": func(c net.Conn) {
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"device\":")
		},
	} {
		t.Run(name, func(t *testing.T) {
			c := New(cuttingAgent(t, cut))
			_, err := c.Map(context.Background(), api.MapRequest{Pool: "rbd", Image: "img"})
			if !errors.Is(err, ErrCutOff) || errors.Is(err, ErrUnreachable) || Code(err) != CodeInterrupted {
				t.Fatalf("map cut off: %v (code %q), want ErrCutOff, code interrupted", err, Code(err))
			}
			for _, want := range []string{"the rbd-owner agent went away during POST /v1/map", "its recovery may have finished the map or undone it", "repeat the map", "answered with its device"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("map cut off: %q does not say %q", err, want)
				}
			}
			if strings.Contains(err.Error(), "EOF") {
				t.Errorf("map cut off: %q has Go's EOF text", err)
			}
			_, err = c.Status(context.Background())
			if !errors.Is(err, ErrCutOff) || !strings.Contains(err.Error(), "went away during GET /v1/status") || !strings.Contains(err.Error(), "repeat the call") {
				t.Errorf("status cut off: %v, want ErrCutOff saying so", err)
			}
		})
	}
}
