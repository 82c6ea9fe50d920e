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

// TestUnusableFileIsSetAside: a state file cut short, not JSON, or of another format does not
// stop the agent: it is kept as mappings.json.corrupt-<time> and the store starts empty, with a
// new incarnation written to a fresh file.
func TestUnusableFileIsSetAside(t *testing.T) {
	for _, tc := range []struct{ name, content, reason string }{
		{"truncated", `{"format": 1, "mappings": [{"cluster": "c", "pool": "rbd", "ima`, "not valid JSON (63 bytes): unexpected end of JSON input"},
		{"empty", ``, "not valid JSON (0 bytes): unexpected end of JSON input"},
		{"garbage", "\x00\x00\x00", "not valid JSON (3 bytes): invalid character"},
		{"newer format", `{"format": 2, "mappings": []}`, "format 2, this agent reads format 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "mappings.json")
			if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			s, err := Open(dir)
			if err != nil {
				t.Fatalf("Open refused an unusable state file: %v", err)
			}
			sa := s.SetAside()
			if sa == nil || sa.Path != path || !strings.Contains(sa.Reason.Error(), tc.reason) {
				t.Fatalf("SetAside = %+v, want the reason %q", sa, tc.reason)
			}
			if !strings.HasPrefix(filepath.Base(sa.KeptAs), "mappings.json.corrupt-") {
				t.Fatalf("kept as %q", sa.KeptAs)
			}
			if kept, err := os.ReadFile(sa.KeptAs); err != nil || string(kept) != tc.content {
				t.Fatalf("the kept file holds %q (%v), want the original %q", kept, err, tc.content)
			}
			if len(s.All()) != 0 || s.Incarnation() == "" {
				t.Fatalf("want an empty store with an incarnation: %+v %q", s.All(), s.Incarnation())
			}
			again, err := Open(dir)
			if err != nil || again.SetAside() != nil || again.Incarnation() != s.Incarnation() {
				t.Fatalf("the fresh file does not reopen cleanly: %v %+v %q", err, again.SetAside(), again.Incarnation())
			}
		})
	}
}

// TestFailedWriteLeavesNoTemporaryFile: a write that fails after its temporary file was made
// (here the rename: the state file's name is taken by a directory) removes it, and the error
// names the state file once, then the cause.
func TestFailedWriteLeavesNoTemporaryFile(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "mappings.json")
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(path, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	err = s.Put(Mapping{Key: Key{Ref: image.Ref{Image: "x"}}})
	if err == nil {
		t.Fatal("a write whose rename fails succeeded")
	}
	if want := "cannot write the state file " + path + ": rename: "; !strings.HasPrefix(err.Error(), want) || strings.Count(err.Error(), path) != 1 {
		t.Fatalf("error %q, want it to start %q and name the file once", err, want)
	}
	if _, err := os.Stat(path + ".tmp"); !os.IsNotExist(err) {
		t.Fatalf("the temporary file is left behind: %v", err)
	}
	if werr, since := s.WriteFailure(); werr == nil || since.IsZero() {
		t.Fatalf("WriteFailure = %v, %v", werr, since)
	}
	if err := os.RemoveAll(path); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(Mapping{Key: Key{Ref: image.Ref{Image: "x"}}}); err != nil {
		t.Fatal(err)
	}
	if werr, _ := s.WriteFailure(); werr != nil {
		t.Fatalf("WriteFailure after a good write = %v", werr)
	}
}

// TestStartsWhenTheFirstWriteFails: a full disk or a read-only state directory does not stop
// Open: the incarnation lives in memory and is written with the first write that succeeds; a
// temporary file left by a crash is removed.
func TestStartsWhenTheFirstWriteFails(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "mappings.json")
	if err := os.WriteFile(path+".tmp", []byte("{half"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path + ".tmp"); !os.IsNotExist(err) {
		t.Fatalf("a crash's temporary file is left: %v", err)
	}
	dir = t.TempDir()
	path = filepath.Join(dir, "mappings.json")
	// the temporary file's name taken by a directory that cannot be removed: every write fails
	if err := os.MkdirAll(filepath.Join(path+".tmp", "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	s, err := Open(dir)
	if err != nil {
		t.Fatalf("Open with a failing first write: %v", err)
	}
	inc := s.Incarnation()
	if werr, _ := s.WriteFailure(); inc == "" || werr == nil {
		t.Fatalf("incarnation %q, WriteFailure %v", inc, werr)
	}
	if err := os.RemoveAll(path + ".tmp"); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(Mapping{Key: Key{Ref: image.Ref{Image: "x"}}}); err != nil {
		t.Fatal(err)
	}
	if again, err := Open(dir); err != nil || again.Incarnation() != inc {
		t.Fatalf("the incarnation was not written with the first good write: %q vs %q (%v)", again.Incarnation(), inc, err)
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

// TestObserveAndForgetStandWhenTheWriteFails: what is so (a mapping adopted, one gone) stands
// in memory when the disk cannot take it, unlike what is about to be done (Put); Flush writes
// it once the disk can.
func TestObserveAndForgetStandWhenTheWriteFails(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	gone := Key{Cluster: "c", Ref: image.Ref{Pool: "rbd", Image: "gone"}}
	if err := s.Put(Mapping{Key: gone, Phase: Mapped, Claimed: true}); err != nil {
		t.Fatal(err)
	}
	blocker := filepath.Join(dir, "mappings.json.tmp", "x") // every write fails at its temporary file
	if err := os.MkdirAll(blocker, 0o700); err != nil {
		t.Fatal(err)
	}
	adopted := Key{Cluster: "c", Ref: image.Ref{Pool: "rbd", Image: "adopted"}}
	planned := Key{Cluster: "c", Ref: image.Ref{Pool: "rbd", Image: "planned"}}
	if err := s.Observe(Mapping{Key: adopted, Phase: Mapped, Claimed: true}); err == nil {
		t.Fatal("Observe with a failing write said nothing")
	}
	if err := s.Forget(gone); err == nil {
		t.Fatal("Forget with a failing write said nothing")
	}
	if err := s.Put(Mapping{Key: planned, Phase: Claiming}); err == nil {
		t.Fatal("Put with a failing write succeeded")
	}
	if _, ok := s.Get(adopted); !ok {
		t.Fatal("an observed mapping is not in memory after its write failed")
	}
	if _, ok := s.Get(gone); ok {
		t.Fatal("a forgotten mapping stays in memory after its write failed")
	}
	if _, ok := s.Get(planned); ok {
		t.Fatal("a Put whose write failed is in memory")
	}
	if err := s.Flush(); err == nil {
		t.Fatal("Flush with a failing write said nothing")
	}
	if err := os.RemoveAll(filepath.Dir(blocker)); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	again, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if all := again.All(); len(all) != 1 || all[0].Key != adopted {
		t.Fatalf("on disk after Flush: %+v, want only the adopted mapping", all)
	}
	if err := again.Flush(); err != nil { // nothing to write: no write at all
		t.Fatal(err)
	}
}
