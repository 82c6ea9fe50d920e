package daemon

import (
	"context"
	"errors"
	"testing"

	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/internal/cephtest"
)

var bg = context.Background()

// The map and unmap sagas' own tests are in package saga (map_saga_test.go, resume_saga_test.go);
// these are the daemon's: a saga cut off by a crash, then the next process's recovery.

// A crash (kill -9) at any step of the map or unmap saga, then a restart: recovery leaves no
// claim without a device and no device without a claim.
func TestCrashAtEveryStepThenRestartIsConsistent(t *testing.T) {
	a := newNode(t, "node-a")
	cases := []struct{ saga, step string }{
		{"map", "persist-intent"}, {"map", "claim"}, {"map", "map"}, {"map", "record"}, {"map", "record-send"}, {"map", "persist"},
		{"unmap", "persist-intent"}, {"unmap", "unmap"}, {"unmap", "release"}, {"unmap", "persist"},
	}
	for _, c := range cases {
		t.Run(c.saga+"/"+c.step, func(t *testing.T) {
			img := a.image("")
			if c.saga == "unmap" {
				if _, err := a.d.Map(bg, mapReq("", img), nil); err != nil {
					t.Fatal(err)
				}
			}
			a.fault = func(saga, s string) error {
				if saga == c.saga && s == c.step {
					return ErrCrash
				}
				return nil
			}
			var err error
			if c.saga == "map" {
				_, err = a.d.Map(bg, mapReq("", img), nil)
			} else {
				_, err = a.d.Unmap(bg, unmapReq("", img), nil)
			}
			a.fault = nil
			if !errors.Is(err, ErrCrash) {
				t.Fatalf("want the simulated crash, got %v", err)
			}
			a.start() // a new process: same state dir, same kernel, same cluster
			a.d.reconciler.recover(bg)
			mapped := a.consistent("", img)
			if c.saga == "unmap" && c.step != "persist-intent" && c.step != "unmap" && mapped {
				t.Fatal("unmap crashed after the kernel unmapped, yet a device is back")
			}
			// whatever recovery decided, the node can go on: map and unmap work
			if _, err := a.d.Map(bg, mapReq("", img), nil); err != nil {
				t.Fatalf("map after recovery: %v", err)
			}
			if _, err := a.d.Unmap(bg, unmapReq("", img), nil); err != nil {
				t.Fatalf("unmap after recovery: %v", err)
			}
			a.consistent("", img)
		})
	}
}

func TestRestartReadoptsMappedDevice(t *testing.T) {
	a := newNode(t, "node-a")
	img := a.image(cephtest.Namespace)
	resp, err := a.d.Map(bg, mapReq(cephtest.Namespace, img), nil)
	if err != nil {
		t.Fatal(err)
	}
	a.start()
	a.d.reconciler.recover(bg)
	again, err := a.d.Map(bg, mapReq(cephtest.Namespace, img), nil)
	if err != nil || !again.AlreadyMapped || again.Device != resp.Device || again.Claim.Epoch != resp.Claim.Epoch {
		t.Fatalf("after restart: %+v %v (before %+v)", again, err, resp)
	}
	if len(a.audited(audit.DeviceLost)) != 0 || len(a.audited(audit.UnmanagedDevice)) != 0 {
		t.Fatal("a re-adopted device was reported lost or unmanaged")
	}
}
