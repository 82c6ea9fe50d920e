package krbd_test

import (
	"strings"
	"testing"
	"unicode"

	"github.com/rbd-owner/rbd-owner/agent/krbd"
)

// FuzzParseSpec: whatever ParseSpec accepts renders back to itself, passes Validate, holds
// none of the characters that would change an add string or a /dev path, and builds an add
// string with exactly five space-separated fields whose last three are the names.
func FuzzParseSpec(f *testing.F) {
	for _, s := range []string{"rbd/img1", "rbd/ns1/img1@snap", "rbd/img@-", "a b/c", "p/i,noshare", "p/i=x",
		"p/../i", "p/\x00", "p/ns/i/j", "p/i@s@t", "p/\u2028", "p/é@ü"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		sp, err := krbd.ParseSpec(in)
		if err != nil {
			return
		}
		if sp.String() != in {
			t.Fatalf("round trip %q -> %q", in, sp.String())
		}
		if err := sp.Validate(); err != nil {
			t.Fatalf("accepted spec fails Validate: %v", err)
		}
		for _, name := range []string{sp.Pool, sp.Namespace, sp.Image, sp.Snap} {
			if strings.ContainsAny(name, ",=/@\x00") || strings.IndexFunc(name, unicode.IsSpace) >= 0 ||
				name == "." || name == ".." || len(name) > krbd.MaxNameLen {
				t.Fatalf("accepted name %q", name)
			}
		}
		add, err := krbd.BuildAddString(sp, krbd.MapOptions{Monitors: []string{"203.0.113.1"}, User: "u", Secret: testSecret})
		if err != nil {
			t.Fatalf("BuildAddString refused a valid spec: %v", err)
		}
		f := strings.Split(add, " ")
		snap := sp.Snap
		if snap == "" {
			snap = "-"
		}
		if len(f) != 5 || f[2] != sp.Pool || f[3] != sp.Image || f[4] != snap {
			t.Fatalf("add string %q for %+v", add, sp)
		}
	})
}

// FuzzBuildAddString: for any names and options, either an error or a string the kernel
// splits into exactly the intended fields and options; never a secret, never exclusive.
func FuzzBuildAddString(f *testing.F) {
	f.Add("rbd", "", "img1", "", "203.0.113.1:6789", "rbdowner", "ms_mode=crc", true)
	f.Add("rbd", "ns1", "img1", "s", "[2001:db8::1]:3300", "admin", "queue_depth=128", false)
	f.Add("rbd", "ns", "i", "", "h", "u", "exclusive", false)
	f.Add("r bd", "n,s", "i=1", "-", "1.2.3.4:1,5.6.7.8", "a,key=b", "secret=x", false)
	f.Fuzz(func(t *testing.T, pool, ns, image, snap, mon, user, extra string, ro bool) {
		sp := krbd.Spec{Pool: pool, Namespace: ns, Image: image, Snap: snap}
		o := krbd.MapOptions{Monitors: []string{mon}, User: user, Secret: testSecret, ReadOnly: ro}
		if extra != "" {
			o.Extra = []string{extra}
		}
		add, err := krbd.BuildAddString(sp, o)
		if err != nil {
			return
		}
		if strings.Contains(add, testSecret) || strings.Contains(add, "secret") {
			t.Fatalf("secret in %q", add)
		}
		fields := strings.Split(add, " ")
		if len(fields) != 5 {
			t.Fatalf("%d fields in %q", len(fields), add)
		}
		if strings.ContainsAny(add, "\n\t\x00") {
			t.Fatalf("control character in %q", add)
		}
		seen := map[string]int{}
		for _, opt := range strings.Split(fields[1], ",") {
			k, _, _ := strings.Cut(opt, "=")
			seen[k]++
			if k == "exclusive" || k == "secret" || k == "share" {
				t.Fatalf("option %q in %q", k, add)
			}
		}
		for _, k := range []string{"name", "key", "noshare", "mount_timeout"} {
			if seen[k] != 1 {
				t.Fatalf("option %s %d times in %q", k, seen[k], add)
			}
		}
		if (seen["_pool_ns"] == 1) != (ns != "") || (seen["read_only"] == 1) != ro {
			t.Fatalf("namespace/read_only wrong in %q", add)
		}
		if fields[2] != pool || fields[3] != image {
			t.Fatalf("names changed in %q", add)
		}
	})
}

// FuzzParseDevice: sysfs attribute contents never panic the parser, and what it accepts has
// the names it was given (minus the trailing newline).
func FuzzParseDevice(f *testing.F) {
	f.Add("rbd\n", "\n", "img1\n", "-\n", "251\n", "0\n", "67108864\n", "203.0.113.11:0/420843661\n")
	f.Add("rbd", "ns1", "img1", "snap1", "252", "16", "0", "")
	f.Add("", "", "", "", "x", "-1", "1e9", "\x00")
	f.Fuzz(func(t *testing.T, pool, ns, name, snap, major, minor, size, addr string) {
		attrs := map[string]string{"pool": pool, "pool_ns": ns, "name": name, "current_snap": snap,
			"major": major, "minor": minor, "size": size, "client_addr": addr}
		d, err := krbd.ParseDevice(7, attrs)
		if err != nil {
			return
		}
		if d.ID != 7 || d.Pool == "" || d.Image == "" || d.Pool != strings.TrimSuffix(pool, "\n") ||
			strings.Contains(d.Pool+d.Image+d.Namespace+d.Snap, "\n") {
			t.Fatalf("parsed %+v from %q", d, attrs)
		}
		if d.Snap == "-" {
			t.Fatalf("snap '-' not normalised")
		}
	})
}

// FuzzParseUevent: arbitrary netlink payloads never panic the parser.
func FuzzParseUevent(f *testing.F) {
	f.Add([]byte("add@/devices/rbd/0\x00ACTION=add\x00DEVPATH=/devices/rbd/0\x00SUBSYSTEM=rbd\x00"))
	f.Add([]byte("remove@/devices/rbd/0/block/rbd0\x00SUBSYSTEM=block\x00DEVTYPE=disk\x00"))
	f.Add(append([]byte("libudev\x00\xfe\xed\xca\xfe\x00\x00\x00\x00\x28\x00\x00\x00"), make([]byte, 40)...))
	f.Fuzz(func(_ *testing.T, msg []byte) {
		ev, err := krbd.ParseUevent(msg)
		if err != nil {
			return
		}
		ev.IsRBD()
		ev.RBDID()
		ev.DiskID()
	})
}
