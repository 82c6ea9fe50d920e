package watchers_test

import (
	"slices"
	"syscall"
	"testing"

	"github.com/ceph/go-ceph/rbd"

	"github.com/rbd-owner/rbd-owner/agent/cephconn"
	"github.com/rbd-owner/rbd-owner/agent/internal/cephtest"
	"github.com/rbd-owner/rbd-owner/agent/watchers"
)

// TestListMatchesLibrbd: the header's watchers, listed without opening the image, are exactly
// what librbd's ListWatchers of the open image says, in the default namespace and in another;
// an unwatched header has none; a missing object is -ENOENT.
func TestListMatchesLibrbd(t *testing.T) {
	admin := cephtest.AdminConn(t)
	for _, ns := range []string{"", cephtest.Namespace} {
		name := cephtest.Image(t, admin, ns)
		io, err := cephtest.Conn(t).OpenIOContext(cephtest.Pool)
		if err != nil {
			t.Fatal(err)
		}
		defer io.Destroy()
		io.SetNamespace(ns)
		probe, err := rbd.OpenImageReadOnly(io, name, rbd.NoSnapshot) // a read-only open does not watch
		if err != nil {
			t.Fatal(err)
		}
		id, err := probe.GetId()
		probe.Close()
		if err != nil {
			t.Fatal(err)
		}
		header := "rbd_header." + id
		if ws, err := watchers.List(io, header); err != nil || len(ws) != 0 {
			t.Fatalf("%q: unwatched header: %v %v", ns, ws, err)
		}
		// two other clients open it read-write: each watches the header
		var want []string
		for range 2 {
			wio, err := cephtest.Conn(t).OpenIOContext(cephtest.Pool)
			if err != nil {
				t.Fatal(err)
			}
			defer wio.Destroy()
			wio.SetNamespace(ns)
			im, err := rbd.OpenImage(wio, name, rbd.NoSnapshot)
			if err != nil {
				t.Fatal(err)
			}
			defer im.Close()
			ws, err := im.ListWatchers()
			if err != nil {
				t.Fatal(err)
			}
			want = want[:0]
			for _, w := range ws {
				want = append(want, w.Addr)
			}
		}
		got, err := watchers.List(io, header)
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(got)
		slices.Sort(want)
		if len(got) != 2 || !slices.Equal(got, want) {
			t.Fatalf("%q: watchers %q, librbd says %q", ns, got, want)
		}
	}
	io, err := cephtest.Conn(t).OpenIOContext(cephtest.Pool)
	if err != nil {
		t.Fatal(err)
	}
	defer io.Destroy()
	if _, err := watchers.List(io, cephtest.UniqueName("rbd_header.none")); cephconn.Code(err) != -int(syscall.ENOENT) {
		t.Fatalf("missing object: %v", err)
	}
}
