package nodeaddr

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

// SourceFor asks for a route toward each monitor IP in turn, in every form Ceph writes them,
// skipping host names, until one has a source.
func TestSourceForTriesEachMonitorIP(t *testing.T) {
	var asked []string
	r := New()
	r.routeGet = func(ip net.IP) ([]netlink.Route, error) {
		asked = append(asked, ip.String())
		if ip.String() == "10.0.0.3" {
			return []netlink.Route{{Src: net.ParseIP("10.0.0.99")}}, nil
		}
		return nil, errors.New("network is unreachable")
	}
	a, err := r.SourceFor([]string{"10.0.0.1:6789", "[v2:10.0.0.2:3300/0,v1:10.0.0.2:6789/0]", "mon.example:6789", "[2001:db8::1]:6789", "10.0.0.3"})
	if err != nil || a != "10.0.0.99" {
		t.Fatalf("SourceFor = %q, %v", a, err)
	}
	want := []string{"10.0.0.1", "10.0.0.2", "10.0.0.2", "2001:db8::1", "10.0.0.3"}
	if !slices.Equal(asked, want) {
		t.Fatalf("routes asked for %v, want %v", asked, want)
	}
	if _, err := New().SourceFor([]string{"10.0.0.1:99999"}); err == nil || !strings.Contains(err.Error(), `port "99999"`) {
		t.Fatalf("a bad monitor: %v", err)
	}
}

// The real kernel's route lookup: the source toward 127.0.0.1 is 127.0.0.1.
func TestSourceForLoopbackThroughNetlink(t *testing.T) {
	r := New()
	a, err := r.SourceFor([]string{"127.0.0.1:6789"})
	if err != nil {
		t.Fatal(err)
	}
	if a != "127.0.0.1" {
		t.Fatalf("source toward loopback = %s", a)
	}
}

func TestCacheAndForget(t *testing.T) {
	calls := 0
	r := New()
	r.routeGet = func(_ net.IP) ([]netlink.Route, error) {
		calls++
		return []netlink.Route{{Src: net.ParseIP("203.0.113.11")}}, nil
	}
	for i := 0; i < 3; i++ {
		if a, err := r.SourceFor([]string{"203.0.113.1:6789"}); err != nil || a != "203.0.113.11" {
			t.Fatalf("%s %v", a, err)
		}
	}
	if calls != 1 {
		t.Fatalf("route looked up %d times, want 1 (cached)", calls)
	}
	r.Forget()
	_, _ = r.SourceFor([]string{"203.0.113.1:6789"})
	if calls != 2 {
		t.Fatalf("after Forget: %d lookups, want 2", calls)
	}
	if _, err := r.SourceFor([]string{"mon.example:6789"}); err == nil {
		t.Fatal("no IP: want an error")
	}
}

func TestWatchStopsWithContext(t *testing.T) {
	r := New()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Watch(ctx) }()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("watch: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Watch did not stop after its context ended")
	}
}
