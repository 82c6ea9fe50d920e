package claim

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// N claimers on separate connections (standing in for nodes) race for one image, round after
// round: exactly one wins each round, and the record names the winner.
func TestRaceExactlyOneOwnerPerRound(t *testing.T) {
	const claimers, rounds = 20, 50
	img := testImage(t, "")
	nodes := make([]node, claimers)
	for i := range nodes {
		nodes[i] = newNode(t, fmt.Sprintf("racer-%02d", i), nil)
	}
	lastEpoch := uint64(0)
	for round := 0; round < rounds; round++ {
		var (
			wg      sync.WaitGroup
			start   = make(chan struct{})
			mu      sync.Mutex
			winners []int
			results = map[int]*Result{}
		)
		for i := range nodes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				res, err := nodes[i].Acquire(ctx(t), Request{Image: img})
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					winners = append(winners, i)
					results[i] = res
				case errors.Is(err, ErrClaimedElsewhere):
				default:
					t.Errorf("round %d racer %d: unexpected error %v", round, i, err)
				}
			}()
		}
		close(start)
		wg.Wait()
		if len(winners) != 1 {
			t.Fatalf("round %d: %d winners %v, want exactly 1", round, len(winners), winners)
		}
		w := winners[0]
		rec, err := nodes[0].Inspect(ctx(t), img)
		if err != nil {
			t.Fatal(err)
		}
		if len(rec.Holders) != 1 || rec.Holders[0].NodeID != nodes[w].NodeID() || rec.Epoch != results[w].Holder.Epoch {
			t.Fatalf("round %d: winner %s at epoch %d, record says %+v", round, nodes[w].NodeID(), results[w].Holder.Epoch, rec.Holders)
		}
		if rec.Epoch <= lastEpoch {
			t.Fatalf("round %d: epoch %d did not rise above %d", round, rec.Epoch, lastEpoch)
		}
		lastEpoch = rec.Epoch
		if ok, err := nodes[w].Release(ctx(t), img, rec.Epoch); !ok || err != nil {
			t.Fatalf("round %d: release: %v %v", round, ok, err)
		}
	}
}

// Random acquire / takeover / renew / record-mapping / release interleavings across claimers,
// with leases running out on a shared clock: at no point do two claimers believe they own the
// image at the same epoch, and every success agrees with the record it wrote.
func TestRaceRandomInterleavings(t *testing.T) {
	const claimers, opsEach = 10, 60
	img := testImage(t, "")
	clk := newClock()
	nodes := make([]node, claimers)
	for i := range nodes {
		nodes[i] = newNode(t, fmt.Sprintf("mixer-%02d", i), clk)
	}
	var (
		mu      sync.Mutex
		epochOf = map[uint64]string{} // epoch -> the one node ever told it owns it
		stats   = map[string]int{}
	)
	believe := func(who string, epoch uint64, rec *Record, op string) {
		mu.Lock()
		defer mu.Unlock()
		if prev, ok := epochOf[epoch]; ok && prev != who {
			t.Errorf("%s: %s believes it owns epoch %d, which %s was given", op, who, epoch, prev)
		}
		epochOf[epoch] = who
		if h := rec.Holder(who); h == nil || h.Epoch != epoch || len(rec.Holders) != 1 {
			t.Errorf("%s by %s at epoch %d, but the written record says %+v", op, who, epoch, rec.Holders)
		}
		stats[op]++
	}
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := nodes[i]
			r := rand.New(rand.NewPCG(uint64(i), 42))
			var held uint64 // the epoch this claimer believes it holds, 0 for none
			for k := 0; k < opsEach; k++ {
				if r.IntN(6) == 0 {
					clk.Advance(time.Duration(r.IntN(80)) * time.Second) // leases run out now and then
				}
				switch op := r.IntN(4); {
				case op == 0 || held == 0:
					res, err := n.Acquire(ctx(t), Request{Image: img, Takeover: r.IntN(2) == 0})
					if err == nil {
						held = res.Holder.Epoch
						believe(n.NodeID(), held, res.Record, "acquire")
						if len(res.Fenced) > 0 {
							mu.Lock()
							stats["takeover"]++
							mu.Unlock()
						}
						if rec, err := n.SetMapping(ctx(t), img, held, fakeClientAddr(i), "/dev/rbd0"); err == nil {
							believe(n.NodeID(), held, rec, "set-mapping")
						} else if errors.Is(err, ErrFenced) {
							held = 0
						} else {
							t.Errorf("set mapping: %v", err)
						}
					} else if !errors.Is(err, ErrClaimedElsewhere) && !errors.Is(err, ErrFenced) && !errors.Is(err, ErrBusy) {
						// busy: another claimer's swap mark (it is adding a fence's entry again
						// before its claim); the claimers' clocks jump here while the monitors'
						// does not, so entries often look aging to them
						t.Errorf("acquire: %v", err)
					}
				case op == 1 || op == 2:
					rec, err := n.Renew(ctx(t), img, held)
					if err == nil {
						believe(n.NodeID(), held, rec, "renew")
					} else if errors.Is(err, ErrFenced) {
						held = 0
						mu.Lock()
						stats["lost"]++
						mu.Unlock()
					} else {
						t.Errorf("renew: %v", err)
					}
				default:
					if _, err := n.Release(ctx(t), img, held); err != nil {
						t.Errorf("release: %v", err)
					}
					held = 0
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("operations that succeeded: %v; epochs handed out: %d", stats, len(epochOf))
	if stats["acquire"] < 2 || stats["renew"] == 0 {
		t.Fatalf("the mix exercised too little: %v", stats)
	}
}
