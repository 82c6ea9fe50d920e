package nodestate

import (
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/image"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

func key(name string) state.Key {
	return state.Key{Cluster: "c1", Ref: image.Ref{Pool: "rbd", Image: name}}
}

// A problem keeps since when it began while its message changes; clearing it also ends the
// claim's lost note, and a lost claim is counted lost once.
func TestProblemsKeepTheirSinceAndClearLost(t *testing.T) {
	n := New(nil)
	k := key("a")
	n.SetProblem(k, "first")
	_, since := n.Problem(k)
	time.Sleep(2 * time.Millisecond)
	n.SetProblem(k, "second")
	if msg, s := n.Problem(k); msg != "second" || !s.Equal(since) {
		t.Fatalf("problem %q since %v, want second since %v", msg, s, since)
	}
	if !n.SetLost(k, "taken over") || n.SetLost(k, "taken over") {
		t.Fatal("SetLost: first should be true once")
	}
	if msg, s := n.Problem(k); msg != "taken over" || !s.Equal(since) || !n.IsLost(k) {
		t.Fatalf("lost: %q since %v lost %v", msg, s, n.IsLost(k))
	}
	n.SetProblem(k, "")
	if msg, _ := n.Problem(k); msg != "" || n.IsLost(k) || len(n.Problems()) != 0 {
		t.Fatalf("cleared: %q lost %v problems %v", msg, n.IsLost(k), n.Problems())
	}
}

// A pending device starts one judgement at a time, and a judged device is not made pending
// again by a cluster that does not answer.
func TestPendingDevicesStartOneJudgement(t *testing.T) {
	n := New(nil)
	dv := krbd.Device{ID: 3, ClientAddr: "10.0.0.1:0/1", Pool: "rbd", Image: "a"}
	if !n.NotePending(dv, "not connected", true) || n.NotePending(dv, "not connected", true) {
		t.Fatal("a second judgement was started while one is in flight")
	}
	n.Judged(dv)
	if !n.NotePending(dv, "still not connected", true) {
		t.Fatal("no judgement started once the first ended")
	}
	n.NoteUnmanaged(Unmanaged{Dev: dv, Verdict: claim.Report, Why: "free"})
	if n.NotePending(dv, "cluster gone", true) {
		t.Fatal("a judged device was made pending again")
	}
	if u, ok := n.UnmanagedOf(dv); !ok || u.Pending || u.Why != "free" {
		t.Fatalf("verdict %+v %v, want the judged one", u, ok)
	}
	other := dv
	other.ClientAddr = "10.0.0.1:0/2" // the same device number, a new mapping
	if _, ok := n.UnmanagedOf(other); ok {
		t.Fatal("a new mapping with a reused device number took the old one's verdict")
	}
}

// Notes of kept fences older than asked for are dropped; a place's notes go unless held.
func TestKeptFencesAge(t *testing.T) {
	n := New(nil)
	a, b := claim.Image{Pool: "rbd", Image: "a"}, claim.Image{Pool: "rbd", Image: "b"}
	f := []claim.KeptFence{{}}
	n.NoteKept("c1", a, KeptFences{Cluster: "c1", Place: "rbd", Fences: f, At: 10 * time.Second})
	n.NoteKept("c1", b, KeptFences{Cluster: "c1", Place: "rbd", Fences: f, At: 20 * time.Second})
	if got := n.Kept(15 * time.Second); len(got) != 1 || n.KeepsFences("c1", a) || !n.KeepsFences("c1", b) {
		t.Fatalf("kept %+v: want only b's", got)
	}
	n.ForgetKeptIn("c1", "rbd", map[string]bool{HeldName("c1", b): true})
	if !n.KeepsFences("c1", b) {
		t.Fatal("a held claim's fences were forgotten")
	}
	n.ForgetKeptIn("c1", "rbd", nil)
	if n.KeepsFences("c1", b) {
		t.Fatal("an unheld claim's fences were kept")
	}
}
