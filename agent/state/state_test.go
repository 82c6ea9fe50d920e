package state

import (
	"github.com/rbd-owner/rbd-owner/agent/image"

	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPersistsAcrossOpen(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	k := Key{Cluster: "c", Ref: image.Ref{Pool: "rbd", Namespace: "ns", Image: "a"}}
	if err := s.Put(Mapping{Key: k, Phase: Claimed, Epoch: 3}); err != nil {
		t.Fatal(err)
	}
	k2 := Key{Cluster: "c", Ref: image.Ref{Pool: "rbd", Image: "b"}}
	if err := s.Put(Mapping{Key: k2, Phase: Mapped, Epoch: 1, DeviceID: 2}); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := s2.Get(k); !ok || m.Phase != Claimed || m.Epoch != 3 {
		t.Fatalf("reloaded %+v %v", m, ok)
	}
	if err := s2.Delete(k); err != nil {
		t.Fatal(err)
	}
	s3, _ := Open(dir)
	if all := s3.All(); len(all) != 1 || all[0].Key != k2 {
		t.Fatalf("after delete: %+v", all)
	}
}

func TestCorruptFileIsAClearError(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "mappings.json"), []byte("{nope"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("want a corrupt-state error, got %v", err)
	}
}

func TestFailedSaveKeepsMemoryConsistent(t *testing.T) {
	dir := t.TempDir()
	s, _ := Open(dir)
	// a directory where the temporary file must go: the write fails, even for root
	if err := os.Mkdir(filepath.Join(dir, "mappings.json.tmp"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(Mapping{Key: Key{Ref: image.Ref{Image: "x"}}}); err == nil {
		t.Fatal("save into a read-only dir succeeded")
	}
	if len(s.All()) != 0 {
		t.Fatal("a failed Put must not stay in memory")
	}
}

func TestClaimPoolsAreRemembered(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	k := Key{Cluster: "c", Ref: image.Ref{Pool: "rbd", Image: "a"}}
	if err := s.Put(Mapping{Key: k, Phase: Mapped, Claimed: true}); err != nil {
		t.Fatal(err)
	}
	snap := Key{Cluster: "c", Ref: image.Ref{Pool: "snaps", Image: "b", Snap: "s1"}}
	if err := s.Put(Mapping{Key: snap, Phase: Mapped}); err != nil { // a snapshot map takes no claim
		t.Fatal(err)
	}
	if err := s.Delete(k); err != nil {
		t.Fatal(err)
	}
	again, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := again.ClaimPools(); len(got) != 1 || got[0] != (Pool{Cluster: "c", Pool: "rbd"}) {
		t.Fatalf("claim pools after the mapping is gone and a reopen: %+v", got)
	}
}
