package record

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"
)

// The cluster's blocklist as a whole: who else has cut a holder off. ceph-csi's fencing of a node
// Kubernetes declared out of service (`osd blocklist range add <ip>/32`, else `<ip>:0/0`), a
// csi-addons NetworkFence (CIDRs) and an admin by hand all add entries that rbd-owner did not
// make. A hold whose mapping such an entry covers cannot write, so its lease need not be waited
// for (takeover_policy after-fence); the takeover still blocklists the holder with entries of
// its own, which it renews, since the other's may be lifted at any time.

// BlockEntry is one entry of `osd blocklist ls`: a client address (ip:port/nonce; nonce 0 and
// port 0 cut every client of the ip) or a range of ips (a CIDR).
type BlockEntry struct {
	Addr  string       // the address as listed, without its type ("" for a range)
	Range netip.Prefix // the range (not valid for an address)
	Until time.Time    // its expiry on the monitors' clock (zero when not understood)
}

// String is the entry as `ceph osd blocklist ls` prints it.
func (e BlockEntry) String() string {
	if e.Range.IsValid() {
		return "cidr:" + RangeAddr(e.Range)
	}
	return e.Addr
}

// RangeAddr writes a range the way Ceph lists it: ip:0/prefix-length.
func RangeAddr(p netip.Prefix) string {
	return net.JoinHostPort(p.Addr().String(), "0") + fmt.Sprintf("/%d", p.Bits())
}

// ParseBlocklist reads the JSON of `osd blocklist ls`: a list of {"addr", "until"}, followed on
// releases with range entries (Pacific 16.2.8 and later) by a second list of {"range",
// "until"}, the two written back to back; a range is listed as ip:0/bits, with or without a
// "cidr:" type, and an address with or without "v1:", "v2:" or "any:".
func ParseBlocklist(out []byte) ([]BlockEntry, error) {
	dec := json.NewDecoder(bytes.NewReader(out))
	var all []BlockEntry
	for dec.More() {
		var entries []struct {
			Addr  string `json:"addr"`
			Range string `json:"range"`
			Until string `json:"until"`
		}
		if err := dec.Decode(&entries); err != nil {
			return nil, fmt.Errorf("osd blocklist ls: %w", err)
		}
		for _, e := range entries {
			be := BlockEntry{Until: ParseUntil(e.Until)}
			switch {
			case e.Range != "" || strings.HasPrefix(e.Addr, "cidr:"):
				r := e.Range
				if r == "" {
					r = e.Addr
				}
				p, err := ParseRange(r)
				if err != nil {
					return nil, fmt.Errorf("osd blocklist ls: %w", err)
				}
				be.Range = p
			case e.Addr != "":
				be.Addr = BareAddr(e.Addr)
			default:
				continue
			}
			all = append(all, be)
		}
	}
	return all, nil
}

// ParseUntil reads an entry's expiry as the monitors print it (zero when not understood).
func ParseUntil(s string) time.Time {
	for _, layout := range []string{"2006-01-02T15:04:05.000000-0700", "2006-01-02T15:04:05.000000Z0700", "2006-01-02 15:04:05.000000", time.RFC3339Nano} {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC()
		}
	}
	return time.Time{}
}

// ParseRange reads a range as Ceph lists it (cidr:10.1.0.0:0/24) or as it is given to
// `osd blocklist range add` (10.1.0.0/24).
func ParseRange(s string) (netip.Prefix, error) {
	r := strings.TrimPrefix(BareAddr(s), "cidr:")
	slash := strings.LastIndexByte(r, '/')
	if slash < 0 {
		return netip.Prefix{}, fmt.Errorf("range %q not understood", s)
	}
	host, bits := r[:slash], r[slash:]
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	p, err := netip.ParsePrefix(host + bits)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("range %q not understood: %w", s, err)
	}
	return p.Masked(), nil
}

// AddrIP is the ip of a client address (ip:port/nonce, [v6]:port/nonce).
func AddrIP(addr string) (netip.Addr, bool) {
	a := BareAddr(addr)
	if slash := strings.LastIndexByte(a, '/'); slash >= 0 {
		a = a[:slash]
	}
	host, _, err := net.SplitHostPort(a)
	if err != nil {
		return netip.Addr{}, false
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, false
	}
	return ip.Unmap(), true
}

// WholeIP is the entry that cuts every client of addr's ip: ip:0/0.
func WholeIP(ip netip.Addr) string { return net.JoinHostPort(ip.String(), "0") + "/0" }

// Covering returns the entry that cuts addr off as the OSDs judge it (OSDMap::is_blocklisted):
// addr itself, every client of its ip (ip:0/0), or a range holding its ip; false when none
// does. addr is a client address, or ip:0/0 for a whole node (then only the last two count).
func Covering(entries []BlockEntry, addr string) (BlockEntry, bool) {
	addr = BareAddr(addr)
	ip, ok := AddrIP(addr)
	for _, e := range entries {
		switch {
		case e.Range.IsValid():
			if ok && e.Range.Contains(ip) {
				return e, true
			}
		case e.Addr == addr:
			return e, true
		case ok:
			if eip, eok := AddrIP(e.Addr); eok && eip == ip && e.Addr == WholeIP(eip) {
				return e, true
			}
		}
	}
	return BlockEntry{}, false
}

// CoveringNode is the entry that cuts a mapping's client off as part of its whole node: ip:0/0 or
// a range holding its ip, never the client's own address. Ceph keeps one entry per address,
// whoever added it: a taker's own entry for the client would be that very entry, lifted with it
// by whoever added it (docs/safety.md, F10); an entry for the node is always another one.
func CoveringNode(entries []BlockEntry, clientAddr string) (BlockEntry, bool) {
	own := BareAddr(clientAddr)
	var others []BlockEntry
	for _, e := range entries {
		if e.Range.IsValid() || e.Addr != own {
			others = append(others, e)
		}
	}
	return Covering(others, clientAddr)
}
