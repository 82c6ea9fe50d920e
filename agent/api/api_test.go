package api

import (
	"testing"
	"time"
)

// TestProblemLine: a device's problem line names a managed device by its cluster and whole image
// (namespace and snapshot included), one mapped outside rbd-owner by its device node, and ends
// with since when it is known.
func TestProblemLine(t *testing.T) {
	since := time.Date(2026, 12, 7, 18, 0, 0, 0, time.FixedZone("x", 3600))
	for _, tc := range []struct {
		d    Device
		want string
	}{
		{Device{Device: "/dev/rbd0", Cluster: "c1", Pool: "rbd", Image: "img1", Managed: true}, ""},
		{Device{Device: "/dev/rbd0", Cluster: "c1", Pool: "rbd", Image: "img1", Managed: true, Problem: "p"}, "c1:rbd/img1: p"},
		{Device{Device: "/dev/rbd2", Cluster: "c1", Pool: "rbd", Namespace: "ns", Image: "img1", Snapshot: "s", Managed: true, Problem: "p", ProblemSince: &since},
			"c1:rbd/ns/img1@s: p (since 2026-12-07T17:00:00Z)"},
		{Device{Device: "/dev/rbd1", Pool: "rbd", Image: "img3", Problem: "fenced"}, "/dev/rbd1: fenced"},
	} {
		if got := tc.d.ProblemLine(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.d, got, tc.want)
		}
	}
}
