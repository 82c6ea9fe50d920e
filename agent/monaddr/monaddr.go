// Package monaddr reads Ceph monitor addresses in every form Ceph and its users write them: the
// kernel's ("10.0.0.1:6789", "10.0.0.1", "[2001:db8::1]:6789"), typed ("v2:10.0.0.1:3300"), as
// address vectors with nonces, as mon_host writes them ("[v2:10.0.0.1:3300/0,v1:10.0.0.1:6789/0]"),
// and lists of these separated by commas, semicolons or spaces. It is the agent's one reader of
// them: the config, the kernel's add string, librados and the node-address lookup all use it.
package monaddr

import (
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
)

// Address types, as Ceph prefixes them.
const (
	V1 = "v1" // msgr1, the kernel's default; port 6789 unless given
	V2 = "v2" // msgr2; port 3300 unless given
)

// Ceph's default monitor ports.
const (
	PortV1 = 6789
	PortV2 = 3300
)

// Addr is one monitor address.
type Addr struct {
	// Type is V1, V2, or "" when the address was written without one.
	Type string
	// Host is an IP address (without brackets) or a host name.
	Host string
	// Port is 0 when the address was written without one.
	Port int
}

// IP is the host as an IP address, or nil when it is a host name.
func (a Addr) IP() net.IP { return net.ParseIP(a.Host) }

// PortOr is the port, or its type's default when none was written (PortV2 for a v2 address,
// PortV1 for the others).
func (a Addr) PortOr() int {
	switch {
	case a.Port != 0:
		return a.Port
	case a.Type == V2:
		return PortV2
	}
	return PortV1
}

// HostPort is "host:port" with the port or its default, IPv6 addresses in brackets.
func (a Addr) HostPort() string {
	host := a.Host
	if ip := a.IP(); ip != nil {
		host = ip.String()
	}
	return net.JoinHostPort(host, strconv.Itoa(a.PortOr()))
}

// Same says whether two addresses name the same monitor endpoint: the same host (IP addresses
// compared as addresses, names without case), and the same port where both give one.
func (a Addr) Same(b Addr) bool {
	if a.Port != 0 && b.Port != 0 && a.Port != b.Port {
		return false
	}
	if ia, ib := a.IP(), b.IP(); ia != nil || ib != nil {
		return ia.Equal(ib)
	}
	return strings.EqualFold(a.Host, b.Host)
}

var (
	hostRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9.-]{0,252})$`)
	// a name whose last label is all digits is a mistyped IPv4 address, not a host name
	numericRE = regexp.MustCompile(`(^|\.)[0-9]+\.?$`)
)

// Split cuts a list of monitors into its entries at commas, semicolons and spaces outside
// brackets, so that an address vector or a bracketed IPv6 address stays whole.
func Split(list string) []string {
	var out []string
	depth, start := 0, 0
	for i, r := range list {
		switch r {
		case '[':
			depth++
		case ']':
			depth--
		case ',', ';', ' ', '\t':
			if depth == 0 {
				if start < i {
					out = append(out, list[start:i])
				}
				start = i + 1
			}
		}
	}
	if start < len(list) {
		out = append(out, list[start:])
	}
	return out
}

// Parse reads a list of monitors (one or more entries, see Split). An error names the entry
// and what is wrong with it.
func Parse(list string) ([]Addr, error) {
	var out []Addr
	for _, entry := range Split(list) {
		if !strings.HasPrefix(entry, "[v") { // not a vector: one address, maybe a bracketed IPv6 one
			a, err := parseOne(entry)
			if err != nil {
				return nil, fmt.Errorf("monitor %q: %w", entry, err)
			}
			out = append(out, a)
			continue
		}
		inner, ok := strings.CutSuffix(entry[1:], "]")
		if !ok {
			return nil, fmt.Errorf("monitor %q: an address vector must end with ']'", entry)
		}
		for _, one := range Split(inner) {
			a, err := parseOne(one)
			if err == nil && a.Type == "" {
				err = fmt.Errorf("%q in an address vector has no type (v1: or v2:)", one)
			}
			if err != nil {
				return nil, fmt.Errorf("monitor %q: %w", entry, err)
			}
			out = append(out, a)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("monitors %q: no address", list)
	}
	return out, nil
}

// ParseAll reads each of the lists in turn (see Parse).
func ParseAll(lists []string) ([]Addr, error) {
	if len(lists) == 0 {
		return nil, fmt.Errorf("no monitor address")
	}
	var out []Addr
	for _, l := range lists {
		a, err := Parse(l)
		if err != nil {
			return nil, err
		}
		out = append(out, a...)
	}
	return out, nil
}

// parseOne reads one address: [type:]host[:port][/nonce].
func parseOne(s string) (Addr, error) {
	var a Addr
	for _, t := range []string{V1, V2} {
		if rest, ok := strings.CutPrefix(s, t+":"); ok {
			a.Type, s = t, rest
			break
		}
	}
	if i := strings.LastIndexByte(s, '/'); i >= 0 {
		if _, err := strconv.ParseUint(s[i+1:], 10, 32); err != nil {
			return Addr{}, fmt.Errorf("%q after '/' is not a nonce", s[i+1:])
		}
		s = s[:i]
	}
	host, port, err := net.SplitHostPort(s)
	if err == nil && port == "" {
		return Addr{}, fmt.Errorf("empty port after ':'")
	}
	if err != nil {
		// no port: a bare IPv4 or IPv6 address, an IPv6 one in brackets, or a host name
		host, port = s, ""
		if b, ok := strings.CutPrefix(s, "["); ok {
			if host, ok = strings.CutSuffix(b, "]"); !ok || net.ParseIP(host) == nil {
				return Addr{}, fmt.Errorf("not an address: want host, host:port or [IPv6]:port")
			}
		}
	}
	if port != "" {
		p, err := strconv.Atoi(port)
		if err != nil || p < 1 || p > 65535 || strconv.Itoa(p) != port {
			return Addr{}, fmt.Errorf("port %q: want 1 to 65535", port)
		}
		a.Port = p
	}
	ip := net.ParseIP(host)
	if strings.HasPrefix(s, "[") && (ip == nil || ip.To4() != nil) {
		return Addr{}, fmt.Errorf("%q in brackets is not an IPv6 address", host)
	}
	if ip != nil {
		a.Host = ip.String()
		return a, nil
	}
	if !hostRE.MatchString(host) || numericRE.MatchString(host) || host == V1 || host == V2 {
		return Addr{}, fmt.Errorf("%q is not an IP address or host name", host)
	}
	a.Host = host
	return a, nil
}
