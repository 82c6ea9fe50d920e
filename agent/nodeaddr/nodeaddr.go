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

// MonitorIPs extracts the IP addresses from monitor addresses such as "10.0.0.1:6789",
// "[v2:10.0.0.1:3300,v1:10.0.0.1:6789]", "[2001:db8::1]:6789" or a bare IP.
func MonitorIPs(monitors []string) []net.IP {
	var out []net.IP
	for _, m := range monitors {
		if strings.HasPrefix(m, "[v") { // an address vector: [v2:ip:port/nonce,v1:ip:port/nonce]
			m = strings.TrimSuffix(strings.TrimPrefix(m, "["), "]")
		}
		for _, part := range strings.FieldsFunc(m, func(r rune) bool { return r == ',' || r == ' ' }) {
			part = strings.TrimPrefix(strings.TrimPrefix(part, "v2:"), "v1:")
			if i := strings.LastIndex(part, "/"); i >= 0 {
				part = part[:i] // ip:port/nonce
			}
			host := part
			if h, _, err := net.SplitHostPort(part); err == nil {
				host = h
			}
			if ip := net.ParseIP(strings.Trim(host, "[]")); ip != nil {
				out = append(out, ip)
			}
		}
	}
	return out
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
	ips := MonitorIPs(monitors)
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
