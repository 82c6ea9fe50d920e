// Package nodeaddr finds the node's source address toward a cluster's monitors through
// netlink (the kernel's own route lookup), and forgets it when routes change. The address is
// recorded as node_addr in claims: it is what gets fenced (as ip:0/0) when a holder recorded
// no mapping address yet.
package nodeaddr

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"

	"github.com/rbd-owner/rbd-owner/agent/monaddr"
)

// Resolver caches the source address toward each set of monitors.
type Resolver struct {
	mu    sync.Mutex
	cache map[string]string
	// routeGet is netlink.RouteGet (tests replace it)
	routeGet func(net.IP) ([]netlink.Route, error)
}

// New returns a Resolver.
func New() *Resolver {
	return &Resolver{cache: map[string]string{}, routeGet: netlink.RouteGet}
}

// SourceFor returns the node's source address toward the first monitor that has a route.
func (r *Resolver) SourceFor(monitors []string) (string, error) {
	key := strings.Join(monitors, ",")
	r.mu.Lock()
	if a, ok := r.cache[key]; ok {
		r.mu.Unlock()
		return a, nil
	}
	r.mu.Unlock()
	addrs, err := monaddr.ParseAll(monitors)
	if err != nil {
		return "", fmt.Errorf("node address: %w", err)
	}
	var ips []net.IP
	for _, a := range addrs {
		if ip := a.IP(); ip != nil {
			ips = append(ips, ip)
		}
	}
	if len(ips) == 0 {
		return "", fmt.Errorf("node address: no IP address among monitors %v", monitors)
	}
	var lastErr error
	for _, ip := range ips {
		routes, err := r.routeGet(ip)
		if err != nil {
			lastErr = err
			continue
		}
		for _, rt := range routes {
			if rt.Src != nil {
				a := rt.Src.String()
				r.mu.Lock()
				r.cache[key] = a
				r.mu.Unlock()
				return a, nil
			}
		}
		lastErr = fmt.Errorf("no source address in the route to %s", ip)
	}
	return "", fmt.Errorf("node address toward %v: %w", monitors, lastErr)
}

// Forget drops every cached address (routes changed).
func (r *Resolver) Forget() {
	r.mu.Lock()
	r.cache = map[string]string{}
	r.mu.Unlock()
}

// Watch forgets the cache whenever the kernel reports a route change, until ctx ends.
// It returns when the subscription cannot be made, or when ctx is done.
func (r *Resolver) Watch(ctx context.Context) error {
	ch := make(chan netlink.RouteUpdate, 16)
	done := make(chan struct{})
	defer close(done)
	if err := netlink.RouteSubscribeWithOptions(ch, done, netlink.RouteSubscribeOptions{}); err != nil {
		return fmt.Errorf("subscribe to route changes: %w", err)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-ch:
			if !ok {
				return fmt.Errorf("route subscription closed")
			}
			r.Forget()
		}
	}
}
