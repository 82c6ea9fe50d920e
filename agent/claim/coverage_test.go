package claim

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/claim/memory"
	"github.com/rbd-owner/rbd-owner/agent/claim/record"
)

// pacificLs is `ceph osd blocklist ls -f json` as Ceph 16.2.15 printed it after
// `osd blocklist range add 10.9.0.7/32`, `osd blocklist add 10.9.0.8:0/0` and
// `osd blocklist add 10.9.0.9:0/1234 600`: two arrays back to back.
const pacificLs = `[{"addr":"10.9.0.9:0/1234","until":"2026-12-02T13:22:16.769920+0000"},{"addr":"10.9.0.8:0/0","until":"2026-12-02T14:12:16.450419+0000"}][{"range":"10.9.0.7:0/32","until":"2026-12-02T14:12:16.123806+0000"}]`

// TestParseBlocklistReadsBothForms: the addresses and the ranges, as Pacific lists them (and
// with the "cidr:"/"any:" types the plain listing and other releases show).
func TestParseBlocklistReadsBothForms(t *testing.T) {
	for name, out := range map[string]string{
		"pacific": pacificLs,
		"typed": `[{"addr":"any:10.9.0.9:0/1234","until":"2026-12-02T13:22:16.769920+0000"},{"addr":"v1:10.9.0.8:0/0","until":"2026-12-02T14:12:16.450419+0000"}]` + "\n" +
			`[{"range":"cidr:10.9.0.7:0/32","until":"2026-12-02T14:12:16.123806+0000"}]`,
	} {
		got, err := ParseBlocklist([]byte(out))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var shown []string
		for _, e := range got {
			shown = append(shown, e.String())
		}
		if want := "10.9.0.9:0/1234 10.9.0.8:0/0 cidr:10.9.0.7:0/32"; strings.Join(shown, " ") != want {
			t.Errorf("%s: %q, want %q", name, strings.Join(shown, " "), want)
		}
		if got[2].Until.IsZero() || got[2].Until.Hour() != 14 {
			t.Errorf("%s: the range's expiry: %v", name, got[2].Until)
		}
	}
	if _, err := ParseBlocklist([]byte(`[{"range":"10.9.0.7","until":""}]`)); err == nil {
		t.Error("a range without its length was accepted")
	}
	if _, err := ParseBlocklist([]byte(`[{"addr":`)); err == nil {
		t.Error("truncated JSON was accepted")
	}
}

// TestCoveringFollowsTheOSDsRule: an address is cut off by its own entry, by its ip's (ip:0/0)
// or by a range holding its ip; a whole-node address (ip:0/0) only by the last two.
func TestCoveringFollowsTheOSDsRule(t *testing.T) {
	entries, err := ParseBlocklist([]byte(pacificLs + `[{"range":"10.20.0.0:0/16","until":""},{"range":"[fd00::]:0/64","until":""}]`))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		addr, by string
	}{
		{"10.9.0.9:0/1234", "10.9.0.9:0/1234"},
		{"any:10.9.0.9:0/1234", "10.9.0.9:0/1234"},
		{"10.9.0.9:0/1235", ""}, // another client of that ip
		{"10.9.0.9:0/0", ""},    // the whole node: one client's entry does not cover it
		{"10.9.0.8:0/77", "10.9.0.8:0/0"},
		{"10.9.0.8:0/0", "10.9.0.8:0/0"},
		{"10.9.0.7:0/5", "cidr:10.9.0.7:0/32"},
		{"10.9.0.7:0/0", "cidr:10.9.0.7:0/32"},
		{"10.9.0.6:0/5", ""},
		{"10.20.3.4:0/9", "cidr:10.20.0.0:0/16"},
		{"10.21.3.4:0/9", ""},
		{"[fd00::12]:0/9", "cidr:[fd00::]:0/64"},
		{"[fd01::12]:0/9", ""},
		{"garbage", ""},
	} {
		e, ok := Covering(entries, c.addr)
		if got := map[bool]string{true: e.String()}[ok]; got != c.by {
			t.Errorf("%s: covered by %q, want %q", c.addr, got, c.by)
		}
	}
}

// afterFenceSetup: node-a holds img with its mapping recorded and renews; node-b has looked at
// it, so its lease is live as node-b sees it.
func afterFenceSetup(t *testing.T) (m *memory.Memory, a, b *Store, img Image, epoch uint64) {
	t.Helper()
	ctx := context.Background()
	m = memory.New("fsid")
	img = Image{Pool: "rbd", Image: "af"}
	m.AddImage(img, "id1")
	clk := newClock()
	a = memNode(t, m, "node-a", clk)
	a.cfg.Node.Addr = func() string { return "10.0.0.1" }
	b = memNode(t, m, "node-b", clk)
	ra, err := a.Acquire(ctx, Request{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.SetMapping(ctx, img, ra.Holder.Epoch, "10.0.0.1:0/7", "/dev/rbd0"); err != nil {
		t.Fatal(err)
	}
	m.SetWatchers(img, "10.0.0.1:0/7")
	return m, a, b, img, ra.Holder.Epoch
}

// TestAfterFenceTakesOverOnlyAHoldSomeoneBlocklisted: under after-fence a live hold is
// refused, naming that nothing blocklists it; once a range entry (ceph-csi's out-of-service
// fencing) or an ip:0/0 entry covers its mapping it is taken over at once, without a lease,
// and the taker's own entry for the exact client is on the blocklist before the claim changes
// and stays when the other's is lifted.
func TestAfterFenceTakesOverOnlyAHoldSomeoneBlocklisted(t *testing.T) {
	for _, form := range []string{"range", "whole-ip"} {
		t.Run(form, func(t *testing.T) {
			ctx := context.Background()
			m, a, b, img, epoch := afterFenceSetup(t)
			_, err := b.Acquire(ctx, Request{Image: img, TakeFenced: true, TakeCovered: true})
			var held *HeldError
			if !errors.As(err, &held) || !strings.Contains(err.Error(), "node node-a's mapping (10.0.0.1:0/7) is on no blocklist entry for its whole node (ip:0/0 or a range)") {
				t.Fatalf("after-fence, nothing blocklisted: %v", err)
			}
			switch form {
			case "range":
				if err := m.BlocklistRange("10.0.0.1/32", time.Hour); err != nil {
					t.Fatal(err)
				}
			case "whole-ip":
				if _, err := m.Blocklist(ctx, "10.0.0.1:0/0", time.Hour); err != nil {
					t.Fatal(err)
				}
			}
			var ownAtWrite bool
			m.SetHook(func(_ context.Context, call string, at Image) error {
				if call == "write" && at == img {
					_, ownAtWrite = m.BlocklistedUntil("10.0.0.1:0/7")
				}
				return nil
			})
			rb, err := b.Acquire(ctx, Request{Image: img, TakeFenced: true, TakeCovered: true})
			m.SetHook(nil)
			if err != nil {
				t.Fatalf("after-fence, covered: %v", err)
			}
			if rb.Holder.Epoch != epoch+1 || len(rb.Fenced) != 1 || rb.Fenced[0].Addr != "10.0.0.1:0/7" || !ownAtWrite {
				t.Fatalf("takeover: %+v (own entry before the write: %v)", rb, ownAtWrite)
			}
			// the other's entry lifted (ceph-csi's unfence after its cool-down): the taker's stays
			_ = m.UnblocklistRange("10.0.0.1/32")
			_ = m.Unblocklist(ctx, "10.0.0.1:0/0")
			if !m.Blocklisted("10.0.0.1:0/7") {
				t.Fatal("node-a's mapping can write again once the other's entry is lifted")
			}
			if _, err := a.Renew(ctx, img, epoch); !errors.Is(err, ErrFenced) {
				t.Fatalf("node-a renewed after the takeover: %v", err)
			}
			if kept := rb.Record.Kept(); len(kept) != 1 || kept[0].Addr != "10.0.0.1:0/7" {
				t.Fatalf("the taker's fence is not recorded to be kept: %+v", kept)
			}
		})
	}
}

// TestCoverageNeedsTheHoldsOwnClient: only an entry for the holder's whole node (ip:0/0 or a
// range) covers its mapping: not an entry for another client of its ip, nor one for its own
// client that someone else added (Ceph keeps one entry per address: the taker's own entry would
// be that one, lifted with it: docs/safety.md, F10), nor anything for a hold that recorded no
// client (its fence would be ip:0/0, the node fence's very entry). Neither manual (no
// TakeCovered) nor a blocklist that cannot be read take a covered hold over.
func TestCoverageNeedsTheHoldsOwnClient(t *testing.T) {
	ctx := context.Background()
	m, a, b, img, epoch := afterFenceSetup(t)
	for _, addr := range []string{"10.0.0.1:0/8", "10.0.0.1:0/7"} {
		if _, err := m.Blocklist(ctx, addr, time.Hour); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Acquire(ctx, Request{Image: img, TakeFenced: true, TakeCovered: true}); !errors.Is(err, ErrClaimedElsewhere) {
			t.Fatalf("an entry for client %s: %v", addr, err)
		}
	}
	if err := m.BlocklistRange("10.0.0.0/24", time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, Request{Image: img, TakeFenced: true}); !errors.Is(err, ErrClaimedElsewhere) {
		t.Fatalf("manual (no TakeCovered), covered: %v", err)
	}
	m.SetHook(func(_ context.Context, call string, _ Image) error {
		if call == "blocklist-ls" {
			return errors.New("osd blocklist ls: permission denied")
		}
		return nil
	})
	_, err := b.Acquire(ctx, Request{Image: img, TakeFenced: true, TakeCovered: true})
	if !errors.Is(err, ErrClaimedElsewhere) || !strings.Contains(err.Error(), "the blocklist could not be read: osd blocklist ls: permission denied") {
		t.Fatalf("blocklist unreadable: %v", err)
	}
	m.SetHook(nil)
	// node-a maps again: its hold names no client until the new mapping is recorded
	if _, err := a.SetMapping(ctx, img, epoch, "", ""); err != nil {
		t.Fatal(err)
	}
	_, err = b.Acquire(ctx, Request{Image: img, TakeFenced: true, TakeCovered: true})
	if !errors.Is(err, ErrClaimedElsewhere) || !strings.Contains(err.Error(), "recorded no mapping address, so its fence would be its whole address") {
		t.Fatalf("a covered hold with no client recorded: %v", err)
	}
}

// TestNodeHoldsAndFenceNode: a node's heartbeats list what it holds (added before the claim,
// dropped after the release); FenceNode finds them in every pool and namespace without listing
// a pool, blocklists each hold's client (or the node's ip:0/0 where none is recorded), marks
// only that node's holds fenced, and the next map by another node takes them over.
func TestNodeHoldsAndFenceNode(t *testing.T) {
	ctx := context.Background()
	m := memory.New("fsid")
	clk := newClock()
	a := memNode(t, m, "node-a", clk)
	a.cfg.Node.Addr = func() string { return "10.0.0.1" }
	b := memNode(t, m, "node-b", clk)
	imgs := []Image{{Pool: "rbd", Image: "one"}, {Pool: "rbd", Namespace: "ns1", Image: "two"}, {Pool: "other", Image: "three"}, {Pool: "rbd", Image: "gone"}}
	m.AddNamespace("rbd", "ns1")
	for i, img := range imgs {
		m.AddImage(img, "id"+img.Image)
		r, err := a.Acquire(ctx, Request{Image: img})
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			if _, err := a.SetMapping(ctx, img, r.Holder.Epoch, "10.0.0.1:0/7", "/dev/rbd0"); err != nil {
				t.Fatal(err)
			}
		}
		if img.Image == "gone" {
			if ok, err := a.Release(ctx, img, r.Holder.Epoch); !ok || err != nil {
				t.Fatal(ok, err)
			}
		}
	}
	shared := Image{Pool: "rbd", Image: "shared"}
	m.AddImage(shared, "idshared")
	for _, s := range []*Store{a, b} {
		if _, err := s.Acquire(ctx, Request{Image: shared, Access: RWX}); err != nil {
			t.Fatal(err)
		}
	}
	if got := strings.Join(a.Holds("rbd", ""), ","); got != "one,shared" {
		t.Fatalf("node-a's heartbeat in rbd lists %q", got)
	}
	m.Counts(true) // count from here
	holds, errs := b.NodeHolds(ctx, "node-a")
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	var names []string
	for _, h := range holds {
		names = append(names, h.Record.Ref.String())
	}
	if strings.Join(names, " ") != "other/three rbd/ns1/two rbd/one rbd/shared" {
		t.Fatalf("holds found: %v", names)
	}
	if n := m.Counts(true)["objects"]; n != 0 {
		t.Fatalf("NodeHolds listed a pool %d times", n)
	}
	fenced, errs := b.FenceNode(ctx, "node-a")
	if len(errs) > 0 || len(fenced) != 4 {
		t.Fatalf("fence --node: %+v %v", fenced, errs)
	}
	if !m.Blocklisted("10.0.0.1:0/7") || !m.Blocklisted("10.0.0.1:0/0") {
		t.Fatalf("blocklist: client %v, whole node %v", m.Blocklisted("10.0.0.1:0/7"), m.Blocklisted("10.0.0.1:0/0"))
	}
	rec, err := b.Inspect(ctx, shared)
	if err != nil || !rec.Holder("node-a").Fenced || rec.Holder("node-b").Fenced {
		t.Fatalf("the shared image: only node-a's hold is fenced: %+v %v", rec, err)
	}
	again, errs := b.FenceNode(ctx, "node-a")
	if len(errs) > 0 || len(again) != 4 || !again[0].Again {
		t.Fatalf("fence --node again: %+v %v", again, errs)
	}
	// no release --force: a map by another node takes a fenced hold over
	r, err := b.Acquire(ctx, Request{Image: imgs[0], TakeFenced: true})
	if err != nil || len(r.Record.Holders) != 1 || r.Record.Holders[0].NodeID != "node-b" {
		t.Fatalf("a map after the node fence: %+v %v", r, err)
	}
}

// TestNodeHoldsSaysWhatItCannotSee: a heartbeat written by an agent before the list of holds is
// not taken for "no holds": the place is named as not read, as facts (the way around it is the
// admin layer's: agent/admin TestFenceNodeOfAnOldAgentSaysTheWayAround).
func TestNodeHoldsSaysWhatItCannotSee(t *testing.T) {
	ctx := context.Background()
	m := memory.New("fsid")
	b := memNode(t, m, "node-b", newClock())
	m.AddImage(Image{Pool: "rbd", Image: "x"}, "idx")
	m.Put(Image{Pool: "rbd"}, record.HeartbeatObject("node-old"), []byte(`{"format":2,"node_id":"node-old","seq":4,"agent_version":"0.9"}`))
	holds, errs := b.NodeHolds(ctx, "node-old")
	var unlisted *UnlistedHoldsError
	if len(holds) != 0 || len(errs) != 1 || !errors.As(errs[0], &unlisted) || unlisted.Node != "node-old" || unlisted.Place != "rbd" || unlisted.AgentVersion != "0.9" {
		t.Fatalf("an old agent's heartbeat: %v %v", holds, errs)
	}
	if _, errs := b.FenceNode(ctx, "node-old"); len(errs) != 1 {
		t.Fatalf("fence --node of an old agent's node: %v", errs)
	}
}

// TestAdoptionIsListedAmongTheNodesHolds: a mapping adopted under adopt-or-fence is a hold like
// any other: the node's heartbeat lists it (written before the claim), so fence --node finds it.
func TestAdoptionIsListedAmongTheNodesHolds(t *testing.T) {
	ctx := context.Background()
	m := memory.New("fsid")
	clk := newClock()
	a, b := memNode(t, m, "node-a", clk), memNode(t, m, "node-b", clk)
	img := Image{Pool: "rbd", Image: "adopted"}
	m.AddImage(img, "id-adopted")
	res, err := a.Unmanaged(ctx, Unmanaged{Image: img, ImageID: "id-adopted", ClientAddr: "10.0.0.1:0/5", Device: "/dev/rbd2", OwnClient: true}, AdoptOrFence)
	if err != nil || res.Action != Adopt {
		t.Fatalf("adoption: %+v %v", res, err)
	}
	holds, errs := b.NodeHolds(ctx, "node-a")
	if len(errs) > 0 || len(holds) != 1 || holds[0].Record.Ref != img || holds[0].Holder.ClientAddr != "10.0.0.1:0/5" {
		t.Fatalf("node-a's holds: %+v %v", holds, errs)
	}
}
