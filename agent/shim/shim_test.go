package shim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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

func run(t *testing.T, a *fakeAgent, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	var r result
	env := Env{Agent: a, Socket: "/run/test.sock", RealRBD: "/usr/bin/rbd", Stdout: &out, Stderr: &errb,
		Exec: func(path string, argv []string, _ []string) error {
			r.exec = append([]string{path}, argv...)
			return errors.New("exec recorded by the test")
		}}
	r.code = Run(args, env)
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
	// --read-only maps rox
	run(t, a, "--id", "x", "-m", "10.0.0.1", "--keyfile=/k", "map", "rbd/img", "--device-type", "krbd", "--options", "noudev", "--read-only")
	if got := a.maps[1]; !got.ReadOnly || got.Access != "rox" || got.Pool != "rbd" || got.Image != "img" {
		t.Fatalf("read-only map request: %+v", got)
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
		{"--id", "x", "-m", "1.2.3.4", "map", "rbd/img", "--device-type", "nbd"},
		{"device", "list", "--device-type=nbd", "--format=json"},
		{"unmap", "/dev/nbd0", "-t", "nbd"},
		{"status", "rbd/img"},
		{},
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
