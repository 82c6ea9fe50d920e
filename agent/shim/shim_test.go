package shim

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/client"
)

// fakeAgent records the calls and answers from its fields.
type fakeAgent struct {
	maps    []api.MapRequest
	unmaps  []api.UnmapRequest
	mapErr  error
	devices []api.Device
	statErr error
}

func (f *fakeAgent) Map(_ context.Context, r api.MapRequest) (*api.MapResponse, error) {
	f.maps = append(f.maps, r)
	if f.mapErr != nil {
		return nil, f.mapErr
	}
	return &api.MapResponse{Device: "/dev/rbd3"}, nil
}

func (f *fakeAgent) Unmap(_ context.Context, r api.UnmapRequest) (*api.UnmapResponse, error) {
	f.unmaps = append(f.unmaps, r)
	return &api.UnmapResponse{Unmapped: true}, nil
}

func (f *fakeAgent) Status(context.Context) (*api.Status, error) {
	return &api.Status{Devices: f.devices}, f.statErr
}

type result struct {
	code           int
	stdout, stderr string
	exec           []string // the argv the real rbd was run with, nil if not run
}

// run runs the drop-in rbd.
func run(t *testing.T, a *fakeAgent, args ...string) result {
	t.Helper()
	return runAs(t, a, "rbd", args...)
}

// runAs runs the drop-in by the name ARGV0, as Main does.
func runAs(t *testing.T, a *fakeAgent, argv0 string, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	var r result
	env := Env{Agent: a, Socket: "/run/test.sock", RealRBD: "/usr/bin/rbd", RealRBDNBD: "/usr/bin/rbd-nbd", Stdout: &out, Stderr: &errb,
		Exec: func(path string, argv []string, _ []string) error {
			r.exec = append([]string{path}, argv...)
			return errors.New("exec recorded by the test")
		}}
	r.code = Main(argv0, args, env)
	r.stdout, r.stderr = out.String(), errb.String()
	return r
}

// ceph-csi v3.12.2's calls (internal/rbd/rbd_attach.go): createPath, getDeviceList and
// detachRBDImageOrDeviceSpec.
func TestCephCSIMap(t *testing.T) {
	a := &fakeAgent{}
	r := run(t, a, "--id", "csi-rbd-node", "-m", "10.0.0.1:6789,10.0.0.2:6789", "--keyfile=/tmp/csi/keys/keyfile-1",
		"map", "replicapool/ns1/csi-vol-1", "--device-type", "krbd", "--options", "noudev", "--options", "queue_depth=128,rbd-owner.access=rwx")
	if r.code != 0 || r.stdout != "/dev/rbd3\n" || r.stderr != "" || r.exec != nil {
		t.Fatalf("map: %+v", r)
	}
	got := a.maps[0]
	if got.Pool != "replicapool" || got.Namespace != "ns1" || got.Image != "csi-vol-1" || got.Access != "rwx" ||
		strings.Join(got.Monitors, " ") != "10.0.0.1:6789 10.0.0.2:6789" || strings.Join(got.Options, ",") != "noudev,queue_depth=128" {
		t.Fatalf("map request: %+v", got)
	}
	// mon_host as Ceph writes it: an address vector stays whole
	run(t, a, "--id", "x", "-m", "[v2:10.0.0.1:3300/0,v1:10.0.0.1:6789/0],[v2:10.0.0.2:3300/0,v1:10.0.0.2:6789/0]", "--keyfile=/k", "map", "rbd/img", "--device-type", "krbd")
	if got := a.maps[1].Monitors; strings.Join(got, " ") != "[v2:10.0.0.1:3300/0,v1:10.0.0.1:6789/0] [v2:10.0.0.2:3300/0,v1:10.0.0.2:6789/0]" {
		t.Fatalf("monitors of a map request: %q", got)
	}
	// --read-only maps rox
	run(t, a, "--id", "x", "-m", "10.0.0.1", "--keyfile=/k", "map", "rbd/img", "--device-type", "krbd", "--options", "noudev", "--read-only")
	if got := a.maps[2]; !got.ReadOnly || got.Access != "rox" || got.Pool != "rbd" || got.Image != "img" {
		t.Fatalf("read-only map request: %+v", got)
	}
}

// TestTodaysCephCSIMapOptions: what newer ceph-csi releases add to their map (read affinity
// with a CRUSH location of several labels, an ms_mode) reaches the agent as given.
func TestTodaysCephCSIMapOptions(t *testing.T) {
	a := &fakeAgent{}
	affinity := "read_from_replica=localize,crush_location=zone:east-1|host:worker-01"
	r := run(t, a, "--id", "csi-rbd-node", "-m", "10.0.0.1:3300", "--keyfile=/tmp/csi/keys/keyfile-1",
		"map", "replicapool/csi-vol-2", "--device-type", "krbd", "--options", "noudev", "--options", "ms_mode=secure", "--options", affinity)
	if r.code != 0 || r.stdout != "/dev/rbd3\n" || r.stderr != "" {
		t.Fatalf("map: %+v", r)
	}
	if got := strings.Join(a.maps[0].Options, ","); got != "noudev,ms_mode=secure,"+affinity {
		t.Fatalf("the map request's options: %s", got)
	}
}

func TestCephCSIRefusalIsOneLineNamingTheOwner(t *testing.T) {
	// the agent's own words under takeover_policy: after-lease-expiry: the time is said once
	held := "acquire rbd/img: rbd/img is held (rwo) by node node-a (host host-a, addr 10.0.0.1) at epoch 3 since 2026-01-02T03:04:05Z " +
		"(live: watching node node-a's lease; a takeover is possible in 12s unless it renews); " +
		"takeover refused while node node-a's lease is live as far as this node has seen: retry then"
	a := &fakeAgent{mapErr: &api.Error{Code: api.CodeClaimedElsewhere, Message: held, Owner: &api.Owner{NodeID: "node-a"}, RetryAfterSeconds: 12}}
	r := run(t, a, "--id", "x", "-m", "10.0.0.1:6789", "--keyfile=/k", "map", "rbd/img", "--device-type", "krbd", "--options", "noudev")
	if want := "rbd: map failed: rbd-owner refused to map rbd/img: " + held + " [claimed_elsewhere]\n"; r.code != exitEBUSY || r.stdout != "" || r.stderr != want {
		t.Fatalf("refusal: %+v\nwant stderr %q", r, want)
	}
	a.mapErr = fmt.Errorf("%w at /run/test.sock: dial unix: connection refused", client.ErrUnreachable)
	r = run(t, a, "map", "rbd/img")
	if r.code != exitENOTCONN || !strings.Contains(r.stderr, "/run/test.sock") || strings.Count(r.stderr, "\n") != 1 {
		t.Fatalf("agent down: %+v", r)
	}
}

func TestCephCSIUnmap(t *testing.T) {
	a := &fakeAgent{devices: []api.Device{
		{Device: "/dev/rbd0", Pool: "rbd", Image: "other", Managed: true},
		{Device: "/dev/rbd2", Pool: "replicapool", Namespace: "ns1", Image: "csi-vol-1", Managed: true},
	}}
	r := run(t, a, "unmap", "replicapool/ns1/csi-vol-1", "--device-type", "krbd", "--options", "noudev")
	if r.code != 0 || len(a.unmaps) != 1 || a.unmaps[0].Device != "/dev/rbd2" {
		t.Fatalf("unmap by spec: %+v %+v", r, a.unmaps)
	}
	// not mapped: the exact line ceph-csi takes for success
	r = run(t, a, "unmap", "replicapool/csi-vol-9", "--device-type", "krbd", "--options", "noudev")
	if r.code == 0 || r.stderr != "rbd: replicapool/csi-vol-9: not a mapped image or snapshot\n" {
		t.Fatalf("unmap of an unmapped image: %+v", r)
	}
	// by device (the undo path), with unmapOptions
	r = run(t, a, "unmap", "/dev/rbd0", "--device-type", "krbd", "--options", "noudev", "--options", "force")
	if r.code != 0 || a.unmaps[1].Device != "/dev/rbd0" || !a.unmaps[1].Force {
		t.Fatalf("unmap by device: %+v %+v", r, a.unmaps)
	}
	r = run(t, a, "unmap", "/dev/rbd0", "--device-type", "krbd", "--options", "bogus")
	if r.code != exitEINVAL || len(a.unmaps) != 2 {
		t.Fatalf("unknown unmap option: %+v", r)
	}
	// mapped twice: refused, naming both
	a.devices = append(a.devices, api.Device{Device: "/dev/rbd5", Pool: "rbd", Image: "other"})
	r = run(t, a, "unmap", "rbd/other")
	if r.code != exitEINVAL || !strings.Contains(r.stderr, "/dev/rbd0") || !strings.Contains(r.stderr, "/dev/rbd5") {
		t.Fatalf("ambiguous unmap: %+v", r)
	}
}

func TestCephCSIDeviceList(t *testing.T) {
	a := &fakeAgent{devices: []api.Device{
		{Device: "/dev/rbd10", Pool: "rbd", Image: "b", Managed: true},
		{Device: "/dev/rbd2", Pool: "replicapool", Namespace: "ns1", Image: "csi-vol-1", Snapshot: "s1", Managed: true},
		{Device: "/dev/rbd3", Pool: "rbd", Image: "by-hand", Managed: false},
	}}
	r := run(t, a, "device", "list", "--format=json", "--device-type", "krbd")
	want := `[{"id":"2","pool":"replicapool","namespace":"ns1","name":"csi-vol-1","snap":"s1","device":"/dev/rbd2"},` +
		`{"id":"10","pool":"rbd","namespace":"","name":"b","snap":"-","device":"/dev/rbd10"}]` + "\n"
	if r.code != 0 || r.stdout != want {
		t.Fatalf("device list:\n got %q\nwant %q", r.stdout, want)
	}
	a.devices = nil
	if r := run(t, a, "device", "list", "--format", "json", "--device-type", "krbd"); r.stdout != "[]\n" {
		t.Fatalf("empty list: %q", r.stdout)
	}
}

// Everything that is not a krbd map, unmap or list runs Ceph's rbd with the same arguments.
func TestPassThrough(t *testing.T) {
	a := &fakeAgent{}
	for _, args := range [][]string{
		{"info", "rbd/img", "--format", "json"},
		{"snap", "create", "rbd/img@s1"},
		{"status", "rbd/img"},
		{"--foo", "bar", "info", "rbd/img"},
		{"help", "map"},
		{},
		// nbd mappings made before rbd-owner can still be listed and taken down
		{"device", "list", "--device-type=nbd", "--format=json"},
		{"device", "ls", "-t", "nbd"},
		{"unmap", "/dev/nbd0", "-t", "nbd"},
		{"--id", "x", "unmap", "-t=nbd", "rbd/img"},
		{"device", "unmap", "--device-type", "nbd", "rbd/img"},
		{"device", "detach", "-t", "nbd", "/dev/nbd0"},
		// attach is not a krbd command (Ceph's rbd says so)
		{"device", "attach", "rbd/img", "--device", "/dev/rbd0"},
	} {
		r := run(t, a, args...)
		if strings.Join(r.exec, " ") != strings.Join(append([]string{"/usr/bin/rbd", "rbd"}, args...), " ") {
			t.Errorf("%v: exec %v", args, r.exec)
		}
	}
	if len(a.maps)+len(a.unmaps) != 0 {
		t.Fatal("a pass-through reached the agent")
	}
}

// A krbd map with something the shim does not understand is refused, never passed to Ceph's
// rbd (that would map without a claim).
func TestKrbdMapNeverPassesThrough(t *testing.T) {
	a := &fakeAgent{}
	for _, args := range [][]string{
		{"map", "rbd/img", "--exclusive"},
		{"map", "rbd/img", "--weird-option"},
		{"device", "map", "rbd/img", "--quiesce"},
	} {
		r := run(t, a, args...)
		if r.exec != nil || r.code == 0 || strings.Count(r.stderr, "\n") != 1 {
			t.Errorf("%v: %+v", args, r)
		}
	}
	if len(a.maps) != 0 {
		t.Fatal("an unsupported map reached the agent")
	}
	r := run(t, a, "device", "map", "-t", "krbd", "-o", "ms_mode=crc", "p/i@s")
	if r.code != 0 || a.maps[0].Snapshot != "s" || a.maps[0].Options[0] != "ms_mode=crc" {
		t.Fatalf("device map spelling: %+v %+v", r, a.maps)
	}
}

// The refusal's reason and next step (refusal in nbd.go), spelled out here so that a change of
// wording shows in the test.
const (
	refusedWhy = "this node's rbd-owner protects RWO images only through krbd mappings it makes; "
	nbdNext    = "remove `mounter: rbd-nbd` from the StorageClass (use the default krbd mounter; a volume provisioned with it keeps it in its PersistentVolume)"
	krbdNext   = "map it with the default device type, krbd"
)

// A map or attach through a device type other than krbd is refused by the drop-in rbd in one
// stderr line, exit 95 (EOPNOTSUPP): never handed to Ceph's rbd (which would run rbd-nbd from
// its own directory), never sent to the agent.
func TestNonKrbdMapRefused(t *testing.T) {
	for _, c := range []struct {
		args []string
		line string
	}{
		// ceph-csi v3.12.2's createPath with `mounter: rbd-nbd` (internal/rbd/rbd_attach.go)
		{[]string{"--id", "csi-rbd-node", "-m", "10.0.0.1:6789,10.0.0.2:6789", "--keyfile=/tmp/csi/keys/keyfile-1",
			"--log-file", "/var/log/ceph/rbd-nbd-0001-vol.log", "map", "replicapool/ns1/csi-vol-1", "--device-type", "nbd",
			"--options", "try-netlink", "--options", "reattach-timeout=300", "--options", "io-timeout=0", "--options", "cookie=0001-vol"},
			"rbd map --device-type nbd of replicapool/ns1/csi-vol-1: " + refusedWhy + nbdNext},
		{[]string{"map", "rbd/img", "--device-type=nbd"}, "rbd map --device-type nbd of rbd/img: " + refusedWhy + nbdNext},
		{[]string{"map", "rbd/img", "-t", "nbd"}, "rbd map --device-type nbd of rbd/img: " + refusedWhy + nbdNext},
		{[]string{"map", "rbd/img", "-t=nbd"}, "rbd map --device-type nbd of rbd/img: " + refusedWhy + nbdNext},
		{[]string{"map", "-tnbd", "rbd/img"}, "rbd map --device-type nbd of rbd/img: " + refusedWhy + nbdNext},
		{[]string{"map", "--read-only", "rbd/img@s1", "-t", "krbd", "-t", "nbd"}, "rbd map --device-type nbd of rbd/img@s1: " + refusedWhy + nbdNext},
		// the device type and other options before the command
		{[]string{"-t", "nbd", "map", "rbd/img"}, "rbd map --device-type nbd of rbd/img: " + refusedWhy + nbdNext},
		{[]string{"--device-type", "nbd", "--id", "x", "map", "rbd/img"}, "rbd map --device-type nbd of rbd/img: " + refusedWhy + nbdNext},
		{[]string{"-tnbd", "map", "rbd/img"}, "rbd map --device-type nbd of rbd/img: " + refusedWhy + nbdNext},
		{[]string{"--rbd_cache", "false", "map", "rbd/img", "-t", "nbd"}, "rbd map --device-type nbd of rbd/img: " + refusedWhy + nbdNext},
		{[]string{"--debug-rbd=20", "--no-such-switch", "map", "rbd/img", "-t", "nbd"}, "rbd map --device-type nbd of rbd/img: " + refusedWhy + nbdNext},
		// device map, device attach
		{[]string{"device", "map", "-t", "nbd", "rbd/img"}, "rbd device map --device-type nbd of rbd/img: " + refusedWhy + nbdNext},
		{[]string{"device", "attach", "--device-type", "nbd", "rbd/img", "--device", "/dev/nbd0"}, "rbd device attach --device-type nbd of rbd/img: " + refusedWhy + nbdNext},
		{[]string{"-t", "nbd", "device", "attach", "-o", "cookie=x", "p/ns/img"}, "rbd device attach --device-type nbd of p/ns/img: " + refusedWhy + nbdNext},
		// Ceph's older `nbd map`, which needs no device type
		{[]string{"--id", "x", "nbd", "map", "rbd/img"}, "rbd nbd map of rbd/img: " + refusedWhy + nbdNext},
		// other device types
		{[]string{"device", "map", "-t", "ubbd", "rbd/img"}, "rbd device map --device-type ubbd of rbd/img: " + refusedWhy + krbdNext},
		{[]string{"map", "--device-type", "ggate", "rbd/img"}, "rbd map --device-type ggate of rbd/img: " + refusedWhy + krbdNext},
		// no image named: the line says so by naming none
		{[]string{"map", "-t", "nbd"}, "rbd map --device-type nbd: " + refusedWhy + nbdNext},
	} {
		a := &fakeAgent{}
		r := run(t, a, c.args...)
		if want := "rbd-owner: refused: " + c.line + "\n"; r.code != exitEOPNOTSUPP || r.stderr != want || r.stdout != "" || r.exec != nil || len(a.maps) != 0 {
			t.Errorf("%v:\n got %+v\nwant exit %d, stderr %q", c.args, r, exitEOPNOTSUPP, want)
		}
	}
}

// The drop-in rbd-nbd refuses map and attach (exit 1, as rbd-nbd fails) and runs Ceph's
// rbd-nbd for everything else; Main picks it by the name it was run as.
func TestRbdNbd(t *testing.T) {
	for _, c := range []struct {
		args []string
		line string
	}{
		// ceph-csi v3.12.2's createPath re-attaching a volume after a plugin restart
		{[]string{"--id", "csi-rbd-node", "-m", "10.0.0.1:6789", "--keyfile=/tmp/csi/keys/keyfile-1", "--log-file", "/var/log/ceph/rbd-nbd-0001-vol.log",
			"attach", "replicapool/ns1/csi-vol-1", "--device", "/dev/nbd0", "--try-netlink", "--reattach-timeout=300", "--io-timeout=0", "--cookie=0001-vol"},
			"rbd-nbd attach of replicapool/ns1/csi-vol-1"},
		{[]string{"map", "rbd/img"}, "rbd-nbd map of rbd/img"},
		{[]string{"--id", "x", "-c", "/etc/ceph/ceph.conf", "map", "rbd/img@s1", "--read-only"}, "rbd-nbd map of rbd/img@s1"},
		{[]string{"--device", "/dev/nbd3", "--nbds_max", "16", "--read_only", "map", "rbd/img"}, "rbd-nbd map of rbd/img"},
		{[]string{"--rbd_cache", "false", "--debug-rbd=20", "map", "rbd/img"}, "rbd-nbd map of rbd/img"},
		{[]string{"--no-such-switch", "map", "rbd/img"}, "rbd-nbd map of rbd/img"},
		{[]string{"--", "map", "rbd/img"}, "rbd-nbd map of rbd/img"},
		{[]string{"attach", "--device", "/dev/nbd0", "rbd/img"}, "rbd-nbd attach of rbd/img"},
		{[]string{"map"}, "rbd-nbd map"},
	} {
		for _, argv0 := range []string{"rbd-nbd", "/usr/lib/rbd-owner/bin/rbd-nbd"} {
			a := &fakeAgent{}
			r := runAs(t, a, argv0, c.args...)
			if want := "rbd-owner: refused: " + c.line + ": " + refusedWhy + nbdNext + "\n"; r.code != exitFailure || r.stderr != want || r.stdout != "" || r.exec != nil || len(a.maps) != 0 {
				t.Errorf("%s %v:\n got %+v\nwant exit %d, stderr %q", argv0, c.args, r, exitFailure, want)
			}
		}
	}
	for _, args := range [][]string{
		{"unmap", "/dev/nbd0"},
		{"--id", "x", "unmap", "rbd/img"},
		{"detach", "/dev/nbd0"},
		{"detach", "rbd/map"},
		{"list-mapped", "--format", "json", "--pretty-format"},
		{"--help"},
		{"--version"},
		{"--id", "x", "-m", "10.0.0.1", "list-mapped"},
		{},
	} {
		a := &fakeAgent{}
		r := runAs(t, a, "rbd-nbd", args...)
		if got, want := strings.Join(r.exec, " "), strings.Join(append([]string{"/usr/bin/rbd-nbd", "rbd-nbd"}, args...), " "); got != want || r.code != 127 || len(a.maps)+len(a.unmaps) != 0 {
			t.Errorf("%v: exec %q, want %q (%+v)", args, got, want, r)
		}
	}
	// the name decides: the same command line as rbd is Ceph's rbd's
	if r := runAs(t, &fakeAgent{}, "/usr/lib/rbd-owner/bin/rbd", "list-mapped"); len(r.exec) < 2 || r.exec[0] != "/usr/bin/rbd" || r.exec[1] != "rbd" {
		t.Fatalf("rbd list-mapped: %+v", r)
	}
}

// A drop-in never runs itself as the real program (a loop).
func TestRealProgramIsNotTheDropIn(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Skip(err)
	}
	var errb bytes.Buffer
	env := Env{Agent: &fakeAgent{}, RealRBD: self, RealRBDNBD: self, Stdout: io.Discard, Stderr: &errb,
		Exec: func(string, []string, []string) error { t.Fatal("exec"); return nil }}
	for _, c := range []struct{ argv0, want string }{
		{"rbd", "rbd: rbd-owner's rbd would run itself as the real rbd (" + self + "); set RBD_OWNER_REAL_RBD to Ceph's rbd\n"},
		{"rbd-nbd", "rbd-nbd: rbd-owner's rbd-nbd would run itself as the real rbd-nbd (" + self + "); set RBD_OWNER_REAL_RBD_NBD to Ceph's rbd-nbd\n"},
	} {
		errb.Reset()
		if code := Main(c.argv0, []string{"info", "rbd/img"}, env); code != exitEINVAL || errb.String() != c.want {
			t.Errorf("%s: exit %d, stderr %q, want %q", c.argv0, code, errb.String(), c.want)
		}
	}
}

// A krbd map that parse does not read as one, but Ceph's rbd may (an option it does not know
// took the next word as its value, or the line does not parse), is refused, never passed to
// Ceph's rbd (a map without a claim).
func TestHiddenKrbdMapRefused(t *testing.T) {
	for _, c := range []struct {
		args []string
		line string
	}{
		{[]string{"--rbd_default_features", "3", "map", "rbd/img"}, "rbd: map refused by rbd-owner: option --rbd_default_features is not supported for a krbd map through rbd-owner"},
		{[]string{"--debug-rbd", "20", "device", "map", "-t", "krbd", "rbd/img"}, "rbd: map refused by rbd-owner: option --debug-rbd is not supported for a krbd map through rbd-owner"},
		{[]string{"map", "rbd/img", "-t"}, "rbd: map refused by rbd-owner: option -t needs a value"},
	} {
		a := &fakeAgent{}
		r := run(t, a, c.args...)
		if r.code != exitEINVAL || r.stderr != c.line+"\n" || r.exec != nil || len(a.maps) != 0 {
			t.Errorf("%v:\n got %+v\nwant stderr %q", c.args, r, c.line)
		}
	}
}

// failingWriter fails every write, as a closed pipe does.
type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("broken pipe") }

// A map whose device path cannot be written out fails (EIO), so that ceph-csi asks again
// rather than go on without the device; the agent answers the retry with the same device.
func TestMapFailsWhenTheDevicePathCannotBeWritten(t *testing.T) {
	var errb bytes.Buffer
	env := Env{Agent: &fakeAgent{}, RealRBD: "/usr/bin/rbd", RealRBDNBD: "/usr/bin/rbd-nbd", Stdout: failingWriter{}, Stderr: &errb,
		Exec: func(string, []string, []string) error { t.Fatal("exec"); return nil }}
	code := Main("rbd", []string{"--id", "x", "-m", "10.0.0.1", "--keyfile=/k", "map", "rbd/img", "--device-type", "krbd"}, env)
	if code != exitEIO || !strings.Contains(errb.String(), "rbd/img is mapped as /dev/rbd3, but writing its path failed: broken pipe") {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
}

// TestCephCSIAgentGoneIsOneLineSayingWhatHappened (issue 52): the client's errors that got no
// answer, as the drop-in prints them for ceph-csi: no socket (ENOTCONN), no permission on it
// (EACCES, not "is the agent running?"), and a map cut off by an agent restart (EIO: ceph-csi
// stages again), saying what the CLI says, never Go's dial or EOF text.
func TestCephCSIAgentGoneIsOneLineSayingWhatHappened(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none.sock")
	_, unreachable := client.New(missing).Map(context.Background(), api.MapRequest{Pool: "rbd", Image: "img"})
	cutSock := filepath.Join(t.TempDir(), "cut.sock")
	l, err := net.Listen("unix", cutSock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = http.ReadRequest(bufio.NewReader(conn))
			_ = conn.Close()
		}
	}()
	_, cutOff := client.New(cutSock).Map(context.Background(), api.MapRequest{Pool: "rbd", Image: "img"})
	for _, tc := range []struct {
		name string
		err  error
		code int
		want []string
	}{
		{"no socket", unreachable, exitENOTCONN, []string{"no rbd-owner agent answers on " + missing + ": the socket does not exist", "mounted into this container"}},
		{"no permission", fmt.Errorf("%w /run/rbd-owner/csi/csi.sock", client.ErrNoAccess), exitEACCES, []string{"/run/rbd-owner/csi/csi.sock", "run the plugin as root, or in the socket's group"}},
		{"cut off", cutOff, exitEIO, []string{"the rbd-owner agent went away during POST /v1/map", "its recovery may have finished the map or undone it: repeat the map"}},
	} {
		r := run(t, &fakeAgent{mapErr: tc.err}, "map", "rbd/img")
		if r.code != tc.code || strings.Count(r.stderr, "\n") != 1 || !strings.HasPrefix(r.stderr, "rbd: map failed: rbd-owner could not map rbd/img: ") {
			t.Errorf("%s: %+v, want exit %d and one line", tc.name, r, tc.code)
		}
		for _, w := range tc.want {
			if !strings.Contains(r.stderr, w) {
				t.Errorf("%s: %q does not say %q", tc.name, r.stderr, w)
			}
		}
		for _, bad := range []string{"dial unix", "EOF", "is the agent running"} {
			if strings.Contains(r.stderr, bad) {
				t.Errorf("%s: %q says %q", tc.name, r.stderr, bad)
			}
		}
	}
}

// TestCephCSIStateUnwritableIsENOSPC (issue 52): a map refused because the agent cannot write its
// state file (state_unwritable: a full disk, a quota, a read-only file system) exits ENOSPC, not
// EIO, with the agent's line naming what to free.
func TestCephCSIStateUnwritableIsENOSPC(t *testing.T) {
	msg := "cannot write the state file /var/lib/rbd-owner/mappings.json: no space left on device; free space in /var/lib/rbd-owner, then retry"
	r := run(t, &fakeAgent{mapErr: &api.Error{Code: "state_unwritable", Message: msg}}, "map", "rbd/img")
	if want := "rbd: map failed: rbd-owner refused to map rbd/img: " + msg + " [state_unwritable]\n"; r.code != 28 || r.stderr != want {
		t.Fatalf("%+v, want exit 28 (ENOSPC) and stderr %q", r, want)
	}
}

// TestTheDropInReadsNoMessageText: a refusal reworded so that its message names no holder is
// printed as the agent wrote it: the drop-in adds nothing to the message and reads nothing out of
// it (the holders are data: Owner, Holders).
func TestTheDropInReadsNoMessageText(t *testing.T) {
	msg := "rbd/img is taken elsewhere"
	owner := api.Owner{NodeID: "node-a", Hostname: "host-a"}
	a := &fakeAgent{mapErr: &api.Error{Code: api.CodeClaimedElsewhere, Message: msg, Owner: &owner, Holders: []api.Owner{owner}}}
	r := run(t, a, "map", "rbd/img")
	if want := "rbd: map failed: rbd-owner refused to map rbd/img: " + msg + " [claimed_elsewhere]\n"; r.code != exitEBUSY || r.stderr != want {
		t.Fatalf("%+v\nwant exit %d and stderr %q", r, exitEBUSY, want)
	}
}
