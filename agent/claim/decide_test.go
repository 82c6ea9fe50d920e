package claim

import (
	"errors"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/claim/record"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func holder(node string, epoch uint64, renewed time.Time, addr string) Holder {
	return Holder{NodeID: node, Epoch: epoch, AcquiredAt: renewed, RenewedAt: renewed, LeaseSeconds: 15, ClientAddr: addr}
}

func input(self string, now time.Time) acquireInput {
	return acquireInput{Self: self, FSID: "fsid-1", Image: Image{Pool: "rbd", Image: "img"}, Access: RWO, Info: record.ImageInfo{ID: "id1"},
		Now: now, Me: Holder{Hostname: self + ".example", LeaseSeconds: 15, AgentVersion: "t"}, Fenced: map[string]bool{}}
}

// TestDecideAcquire: the ownership decision over records and clocks, without a cluster.
func TestDecideAcquire(t *testing.T) {
	img := Image{Pool: "rbd", Image: "img"}
	heldBy := func(hs ...Holder) *Record {
		var e uint64
		for _, h := range hs {
			e = max(e, h.Epoch)
		}
		return &Record{Format: FormatVersion, Ref: img, ImageID: "id1", Access: RWO, Epoch: e, Holders: hs}
	}
	live := holder("node-a", 4, t0, "10.0.0.1:0/1")
	expired := holder("node-a", 4, t0.Add(-16*time.Second), "10.0.0.1:0/1")
	wholeNode := holder("node-a", 4, t0, "") // no mapping address recorded: fenced as 10.0.0.1:0/0
	wholeNode.NodeAddr = "10.0.0.1"
	// leases as this node's observer saw them; the holders' timestamps play no part
	seenExpired := func(i acquireInput) acquireInput {
		i.Leases = map[string]LeaseView{"node-a": {Expired: true, Unchanged: 16 * time.Second}}
		return i
	}
	seenLive := func(i acquireInput) acquireInput {
		i.Leases = map[string]LeaseView{"node-a": {Unchanged: 5 * time.Second, RetryAfter: 10 * time.Second}}
		return i
	}
	takeover := func(f func(acquireInput) acquireInput) func(acquireInput) acquireInput {
		return func(i acquireInput) acquireInput { i = f(i); i.Takeover = true; return i }
	}
	for _, tc := range []struct {
		name     string
		cur      *Record
		in       func(acquireInput) acquireInput
		wantErr  error
		epoch    uint64
		evict    int
		again    bool
		holdersN int
	}{
		{name: "no record: first claim at epoch 1", cur: nil, epoch: 1, holdersN: 1},
		{name: "free record keeps counting epochs", cur: &Record{Format: FormatVersion, Ref: img, ImageID: "id1", Epoch: 7}, epoch: 8, holdersN: 1},
		{name: "live holder: refused", cur: heldBy(live), wantErr: ErrClaimedElsewhere},
		{name: "live holder with takeover: refused", cur: heldBy(live), in: takeover(seenLive), wantErr: ErrClaimedElsewhere},
		{name: "holder never looked at, with takeover: refused (the first look starts the watch)", cur: heldBy(expired),
			in: func(i acquireInput) acquireInput { i.Takeover = true; return i }, wantErr: ErrClaimedElsewhere},
		{name: "a timestamp long past does not expire a live-seen lease", cur: heldBy(holder("node-a", 4, t0.Add(-24*time.Hour), "a:0/1")),
			in: takeover(seenLive), wantErr: ErrClaimedElsewhere},
		{name: "expired holder without takeover: refused", cur: heldBy(expired), in: seenExpired, wantErr: ErrClaimedElsewhere},
		{name: "expired holder with takeover: evicted, epoch+1", cur: heldBy(expired), in: takeover(seenExpired), epoch: 5, evict: 1, holdersN: 1},
		{name: "a timestamp in the future does not keep an expired-seen lease", cur: heldBy(holder("node-a", 4, t0.Add(24*time.Hour), "a:0/1")),
			in: takeover(seenExpired), epoch: 5, evict: 1, holdersN: 1},
		{name: "already fenced by this call: evicted even though it renewed meanwhile", cur: heldBy(live),
			in: func(i acquireInput) acquireInput { i.Takeover = true; i.Fenced[fenceKey(live)] = true; return i }, epoch: 5, evict: 1, holdersN: 1},
		{name: "expired holder with no address: refused", cur: heldBy(holder("node-a", 4, t0.Add(-time.Minute), "")),
			in: takeover(seenExpired), wantErr: ErrClaimedElsewhere},
		{name: "ours: renewed, same epoch", cur: heldBy(holder("node-b", 3, t0.Add(-5*time.Second), "10.0.0.2:0/2")),
			in: func(i acquireInput) acquireInput { i.Self = "node-b"; return i }, epoch: 3, again: true, holdersN: 1},
		{name: "ours but fenced by an admin: lost", cur: func() *Record { h := live; h.Fenced = true; return heldBy(h) }(),
			in: func(i acquireInput) acquireInput { i.Self = "node-a"; return i }, wantErr: ErrFenced},
		{name: "ours as rwo, asked as rox: invalid", cur: heldBy(live),
			in: func(i acquireInput) acquireInput { i.Self = "node-a"; i.Access = ROX; return i }, wantErr: ErrInvalid},
		{name: "rox joins rox", cur: func() *Record { r := heldBy(live); r.Access = ROX; return r }(),
			in: func(i acquireInput) acquireInput { i.Access = ROX; i.ReadOnly = true; return i }, epoch: 5, holdersN: 2},
		{name: "rox against a writer: refused", cur: heldBy(live), in: func(i acquireInput) acquireInput { i.Access = ROX; return i }, wantErr: ErrClaimedElsewhere},
		{name: "rwx joins rwx", cur: func() *Record { r := heldBy(live); r.Access = RWX; return r }(),
			in: func(i acquireInput) acquireInput { i.Access = RWX; return i }, epoch: 5, holdersN: 2},
		{name: "a watcher no claim explains: busy", cur: nil,
			in: func(i acquireInput) acquireInput { i.Info.Watchers = []string{"10.9.9.9:0/9"}; return i }, wantErr: ErrBusy},
		{name: "the holder's own watcher is explained", cur: heldBy(live),
			in: func(i acquireInput) acquireInput {
				i.Self = "node-a"
				i.Info.Watchers = []string{live.ClientAddr}
				return i
			}, epoch: 4, again: true, holdersN: 1},
		{name: "an evicted holder's watcher does not block the takeover", cur: heldBy(expired),
			in: takeover(func(i acquireInput) acquireInput {
				i = seenExpired(i)
				i.Info.Watchers = []string{expired.ClientAddr}
				return i
			}), epoch: 5, evict: 1, holdersN: 1},
		{name: "a fenced hold, live-seen, with TakeFenced: evicted (an admin fenced it)", cur: func() *Record { h := live; h.Fenced = true; return heldBy(h) }(),
			in: func(i acquireInput) acquireInput { i = seenLive(i); i.TakeFenced = true; return i }, epoch: 5, evict: 1, holdersN: 1},
		{name: "an unfenced hold, lease expired, with TakeFenced only: refused (the request is no takeover)", cur: heldBy(expired),
			in: func(i acquireInput) acquireInput { i = seenExpired(i); i.TakeFenced = true; return i }, wantErr: ErrClaimedElsewhere},
		{name: "a fenced hold without TakeFenced or takeover: refused", cur: func() *Record { h := live; h.Fenced = true; return heldBy(h) }(),
			in: seenLive, wantErr: ErrClaimedElsewhere},
		{name: "no mapping address, lease expired, the node seen moving elsewhere: refused (no whole-node fence of a live node)",
			cur: heldBy(wholeNode),
			in: takeover(func(i acquireInput) acquireInput {
				i.Leases = map[string]LeaseView{"node-a": {Expired: true, Unchanged: 16 * time.Second, Moved: true, MovedAgo: 3 * time.Second}}
				return i
			}), wantErr: ErrClaimedElsewhere},
		{name: "no mapping address, lease expired, the node silent everywhere: evicted (fenced whole)", cur: heldBy(wholeNode),
			in: takeover(seenExpired), epoch: 5, evict: 1, holdersN: 1},
		{name: "image recreated under the same name: old holders dropped, epoch goes on", cur: heldBy(live),
			in: func(i acquireInput) acquireInput { i.Info.ID = "id2"; return i }, epoch: 5, holdersN: 1},
	} {
		in := input("node-b", t0)
		if tc.in != nil {
			in = tc.in(in)
		}
		var before []byte
		if tc.cur != nil {
			before, _ = record.Encode(tc.cur)
		}
		plan, err := decideAcquire(tc.cur, in)
		if tc.cur != nil {
			if after, _ := record.Encode(tc.cur); string(after) != string(before) {
				t.Errorf("%s: the input record was modified", tc.name)
			}
		}
		if tc.wantErr != nil {
			if !errors.Is(err, tc.wantErr) {
				t.Errorf("%s: err %v, want %v", tc.name, err, tc.wantErr)
			}
			var held *HeldError
			if errors.As(err, &held) && (held.Owner().NodeID != "node-a" || held.Reason == "") {
				t.Errorf("%s: refusal names %+v, reason %q", tc.name, held.Owner(), held.Reason)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if plan.Next.Epoch != tc.epoch || plan.Holder.Epoch != tc.epoch || plan.Again != tc.again || len(plan.Evict) != tc.evict || len(plan.Next.Holders) != tc.holdersN {
			t.Errorf("%s: epoch %d holder epoch %d again %v evict %d holders %d; want %d %v %d %d", tc.name, plan.Next.Epoch, plan.Holder.Epoch,
				plan.Again, len(plan.Evict), len(plan.Next.Holders), tc.epoch, tc.again, tc.evict, tc.holdersN)
		}
		mine := plan.Next.Holder(in.Self)
		if mine == nil || !mine.RenewedAt.Equal(in.Now) || mine.Hostname != in.Me.Hostname || mine.LeaseSeconds != 15 {
			t.Errorf("%s: our entry %+v", tc.name, mine)
		}
		if plan.Next.ClusterFSID != "fsid-1" || plan.Next.ImageID != in.Info.ID {
			t.Errorf("%s: fsid %q image id %q", tc.name, plan.Next.ClusterFSID, plan.Next.ImageID)
		}
	}
}

// TestDecideMine: only the holder at its epoch, unfenced, may renew or record its mapping.
func TestDecideMine(t *testing.T) {
	img := Image{Pool: "rbd", Image: "img"}
	rec := &Record{Ref: img, Epoch: 5, Holders: []Holder{holder("node-a", 5, t0, "a")}}
	if h, err := decideMine(img, rec, "node-a", 5); err != nil || h.NodeID != "node-a" {
		t.Fatalf("holder at its epoch: %v %v", h, err)
	}
	fenced := rec.Clone()
	fenced.Holders[0].Fenced = true
	for name, tc := range map[string]struct {
		rec   *Record
		node  string
		epoch uint64
	}{
		"record gone":     {nil, "node-a", 5},
		"another holder":  {rec, "node-b", 5},
		"older epoch":     {rec, "node-a", 4},
		"fenced by admin": {fenced, "node-a", 5},
	} {
		if _, err := decideMine(img, tc.rec, tc.node, tc.epoch); !errors.Is(err, ErrFenced) {
			t.Errorf("%s: %v, want a lost claim", name, err)
		}
	}
}

func TestFenceAddr(t *testing.T) {
	for _, tc := range []struct {
		h    Holder
		want string
	}{
		{Holder{ClientAddr: "10.0.0.1:0/42", NodeAddr: "10.0.0.1"}, "10.0.0.1:0/42"},
		{Holder{NodeAddr: "10.0.0.1"}, "10.0.0.1:0/0"},
		{Holder{NodeAddr: "2001:db8::1"}, "[2001:db8::1]:0/0"},
		{Holder{NodeAddr: "[2001:db8::1]"}, "[2001:db8::1]:0/0"},
		{Holder{}, ""},
	} {
		if got := tc.h.FenceAddr(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.h, got, tc.want)
		}
	}
}

func TestUnexplained(t *testing.T) {
	mapped := Holder{NodeID: "a", ClientAddr: "x:0/1"}
	pending := Holder{NodeID: "b"} // claimed, not mapped yet: may account for one watcher
	for _, tc := range []struct {
		name     string
		watchers []string
		holders  []Holder
		want     int
	}{
		{"none", nil, nil, 0},
		{"explained by a mapping", []string{"x:0/1"}, []Holder{mapped}, 0},
		{"foreign", []string{"y:0/2"}, []Holder{mapped}, 1},
		{"one pending holder explains one", []string{"y:0/2"}, []Holder{mapped, pending}, 0},
		{"but not two", []string{"y:0/2", "z:0/3"}, []Holder{mapped, pending}, 2},
		{"no holder at all", []string{"y:0/2"}, nil, 1},
	} {
		if got := unexplained(tc.watchers, tc.holders); len(got) != tc.want {
			t.Errorf("%s: %v, want %d", tc.name, got, tc.want)
		}
	}
}

// TestDecideAcquireAgainForgetsTheOldMapping: a claim asked for again (the node holds the
// image, e.g. after an unmap whose release timed out) is for a mapping still to be made; the
// address of the earlier one must not stay in the record, or a takeover would fence that gone
// client instead of the new one. (The model checker's F2, docs/safety.md.)
func TestDecideAcquireAgainForgetsTheOldMapping(t *testing.T) {
	cur := &Record{Format: FormatVersion, Ref: Image{Pool: "rbd", Image: "img"}, ImageID: "id1", Access: RWO, Epoch: 4,
		Holders: []Holder{{NodeID: "node-a", Epoch: 4, ClientAddr: "10.0.0.1:0/111", Device: "/dev/rbd0", NodeAddr: "10.0.0.1"}}}
	plan, err := decideAcquire(cur, input("node-a", t0))
	if err != nil {
		t.Fatal(err)
	}
	h := plan.Next.Holder("node-a")
	if !plan.Again || h.Epoch != 4 || h.ClientAddr != "" || h.Device != "" || plan.Holder.ClientAddr != "" {
		t.Fatalf("again: %+v (plan holder %+v)", h, plan.Holder)
	}
	if h.FenceAddr() != "10.0.0.1:0/0" {
		t.Fatalf("until the new mapping is recorded a takeover fences the whole node, not %q", h.FenceAddr())
	}
	if cur.Holders[0].ClientAddr != "10.0.0.1:0/111" {
		t.Fatal("the decision changed the record it was given")
	}
}
