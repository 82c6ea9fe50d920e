package state

import (
	"github.com/rbd-owner/rbd-owner/agent/image"

	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
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

// TestReadersDoNotWaitForAWrite: while a Put is writing to disk (held here), Get and All
// answer at once with what is durable, the mapping as it was; once the write is done they
// see the new one. (A reader that waited on the disk once stalled the agent's main loop behind
// 64 maps' writes until systemd's watchdog killed it.)
func TestReadersDoNotWaitForAWrite(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	k := Key{Cluster: "c", Ref: image.Ref{Pool: "rbd", Image: "a"}}
	if err := s.Put(Mapping{Key: k, Phase: Claiming}); err != nil {
		t.Fatal(err)
	}
	inWrite, release := make(chan struct{}), make(chan struct{})
	s.writing = func() { close(inWrite); <-release }
	done := make(chan error, 1)
	go func() { done <- s.Put(Mapping{Key: k, Phase: Claimed, Epoch: 7}) }()
	<-inWrite
	read := make(chan Mapping, 1)
	go func() {
		m, _ := s.Get(k)
		if all := s.All(); len(all) != 1 || all[0].Phase != m.Phase {
			t.Errorf("All: %+v", all)
		}
		read <- m
	}()
	select {
	case m := <-read:
		if m.Phase != Claiming || m.Epoch != 0 {
			t.Errorf("during the write a reader saw %+v, want the durable mapping (claiming)", m)
		}
	case <-time.After(time.Minute): // only turns a hang into a failure
		t.Fatal("a reader waited for the write")
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	s.writing = nil
	if m, _ := s.Get(k); m.Phase != Claimed || m.Epoch != 7 {
		t.Fatalf("after the write: %+v", m)
	}
}

// TestFailedWriteKeepsTheOldSet: a Put whose write fails leaves readers (and the file) with
// the set as it was.
func TestFailedWriteKeepsTheOldSet(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	k := Key{Cluster: "c", Ref: image.Ref{Pool: "rbd", Image: "a"}}
	if err := s.Put(Mapping{Key: k, Phase: Mapped, DeviceID: 1}); err != nil {
		t.Fatal(err)
	}
	// the temp file's name taken by a directory: the write fails
	if err := os.Mkdir(filepath.Join(dir, "mappings.json.tmp"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(Mapping{Key: k, Phase: Unmapping, DeviceID: 1}); err == nil {
		t.Fatal("the write did not fail")
	}
	if err := s.Delete(k); err == nil {
		t.Fatal("the delete's write did not fail")
	}
	if m, ok := s.Get(k); !ok || m.Phase != Mapped {
		t.Fatalf("after failed writes: %+v %v", m, ok)
	}
	s2, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := s2.Get(k); !ok || m.Phase != Mapped {
		t.Fatalf("on disk after failed writes: %+v %v", m, ok)
	}
}

// TestConcurrentPutsShareAWrite: Puts queued while a write is under way are all written by
// the next write (one, not one each), and each returns only once its mapping is durable.
func TestConcurrentPutsShareAWrite(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	var writes atomic.Int32
	first, release := make(chan struct{}), make(chan struct{})
	s.writing = func() {
		if writes.Add(1) == 1 {
			close(first)
			<-release
		}
	}
	key := func(i int) Key { return Key{Cluster: "c", Ref: image.Ref{Pool: "rbd", Image: fmt.Sprintf("img%d", i)}} }
	errs := make(chan error, 11)
	go func() { errs <- s.Put(Mapping{Key: key(0), Phase: Claiming}) }()
	<-first
	for i := 1; i <= 10; i++ {
		go func() { errs <- s.Put(Mapping{Key: key(i), Phase: Claiming}) }()
	}
	waitQueued := time.Now().Add(time.Minute) // only turns a hang into a failure
	for {
		s.qmu.Lock()
		n := len(s.queue)
		s.qmu.Unlock()
		if n == 10 {
			break
		}
		if time.Now().After(waitQueued) {
			t.Fatalf("%d of 10 Puts queued", n)
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	for range 11 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got := writes.Load(); got != 2 {
		t.Errorf("%d writes for 11 Puts (one under way, 10 queued), want 2", got)
	}
	s2, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(s2.All()); n != 11 {
		t.Errorf("%d mappings on disk, want 11", n)
	}
}
