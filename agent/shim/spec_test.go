package shim

import (
	"testing"

	"github.com/rbd-owner/rbd-owner/agent/api"
)

// The image spec of a krbd map, in every form Ceph's rbd reads: the argument names as much of
// it as it wants, and --pool, --namespace, --image and --snap the rest (the pool is "rbd" when
// nothing names it).
func TestMapSpecForms(t *testing.T) {
	for _, c := range []struct {
		args []string
		want api.MapRequest
	}{
		{[]string{"map", "replicapool/ns1/csi-vol-1"}, api.MapRequest{Pool: "replicapool", Namespace: "ns1", Image: "csi-vol-1"}},
		{[]string{"map", "replicapool/csi-vol-1"}, api.MapRequest{Pool: "replicapool", Image: "csi-vol-1"}},
		{[]string{"map", "csi-vol-1"}, api.MapRequest{Pool: "rbd", Image: "csi-vol-1"}},
		{[]string{"map", "p/i@s1"}, api.MapRequest{Pool: "p", Image: "i", Snapshot: "s1"}},
		{[]string{"map", "--pool", "p", "i"}, api.MapRequest{Pool: "p", Image: "i"}},
		{[]string{"map", "-p", "p", "--namespace", "ns", "i"}, api.MapRequest{Pool: "p", Namespace: "ns", Image: "i"}},
		{[]string{"map", "--namespace=ns", "p/i"}, api.MapRequest{Pool: "p", Namespace: "ns", Image: "i"}},
		{[]string{"map", "--namespace", "ns", "p/ns2/i"}, api.MapRequest{Pool: "p", Namespace: "ns2", Image: "i"}},
		{[]string{"map", "--pool", "p", "--image", "i"}, api.MapRequest{Pool: "p", Image: "i"}},
		{[]string{"map", "--pool", "p", "--namespace", "ns", "--image", "i", "--snap", "s"}, api.MapRequest{Pool: "p", Namespace: "ns", Image: "i", Snapshot: "s"}},
		{[]string{"map", "--snap", "s", "p/i"}, api.MapRequest{Pool: "p", Image: "i", Snapshot: "s"}},
		{[]string{"map", "--snap", "s", "p/i@t"}, api.MapRequest{Pool: "p", Image: "i", Snapshot: "t"}},
		{[]string{"--id", "csi-rbd-node", "-m", "10.0.0.1:6789", "--keyfile=/k", "map", "--pool", "other", "replicapool/csi-vol-1"},
			api.MapRequest{Pool: "replicapool", Image: "csi-vol-1", Monitors: []string{"10.0.0.1:6789"}}},
	} {
		a := &fakeAgent{}
		r := run(t, a, c.args...)
		if r.code != 0 || len(a.maps) != 1 {
			t.Errorf("%v: %+v", c.args, r)
			continue
		}
		got := a.maps[0]
		if got.Pool != c.want.Pool || got.Namespace != c.want.Namespace || got.Image != c.want.Image || got.Snapshot != c.want.Snapshot ||
			len(got.Monitors) != len(c.want.Monitors) {
			t.Errorf("%v: request %+v, want %+v", c.args, got, c.want)
		}
	}
}

// A spec the agent would refuse is refused here, in one line, exit EINVAL, without a call.
func TestMapSpecRefused(t *testing.T) {
	for _, args := range [][]string{
		{"map"},
		{"map", "p/a/b/c"},
		{"map", "p/bad,name"},
		{"map", "--pool", "p"},
	} {
		a := &fakeAgent{}
		r := run(t, a, args...)
		if r.code != exitEINVAL || len(a.maps) != 0 || r.exec != nil || r.stdout != "" || len(r.stderr) == 0 || r.stderr[len(r.stderr)-1] != '\n' {
			t.Errorf("%v: %+v", args, r)
		}
	}
}
