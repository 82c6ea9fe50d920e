package claim

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/claim/radosbackend"
	"github.com/rbd-owner/rbd-owner/agent/claim/record"
	"github.com/rbd-owner/rbd-owner/agent/internal/cephtest"
)

// TestIndexOnTheRealCluster: in a pool of its own, 1,200 claim objects an agent before the index
// made (more than one page of omap values) are indexed by one listing, and read through the
// index from then on: the reserved keys are seen, every claim is found, no second listing.
func TestIndexOnTheRealCluster(t *testing.T) {
	pool := cephtest.TempPool(t)
	conn := cephtest.Conn(t)
	r, err := radosbackend.New(conn)
	if err != nil {
		t.Fatal(err)
	}
	var listings, built atomic.Int64
	b := Counted(r, func(op, _ string) {
		if op == "objects" {
			listings.Add(1)
		}
	})
	s, err := NewStoreOn(b, Config{Node: Node{ID: "nodeIdx"}, Lease: 30 * time.Second,
		OnIndexBuilt: func(string, string, int, time.Duration) { built.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const n = 1200
	for i := range n {
		img := Image{Pool: pool, Image: fmt.Sprintf("old-%04d", i)}
		rec := fmt.Appendf(nil, `{"format": 2, "pool": %q, "image": %q, "image_id": "x%d", "epoch": 1}`, pool, img.Image, i)
		if _, err := r.CompareAndWrite(ctx, img, record.ObjectOf(img), 0, rec); err != nil {
			t.Fatal(err)
		}
	}
	pl, err := s.ListPlace(ctx, pool, "", true)
	if err != nil {
		t.Fatal(err)
	}
	if len(pl.Records) != n || len(pl.Stale) != 0 || len(pl.Errors) != 0 || !pl.Index.Built {
		t.Fatalf("first listing: %d records, %d stale, %v errors, built %v", len(pl.Records), len(pl.Stale), pl.Errors, pl.Index.Built)
	}
	if listings.Load() != 1 || built.Load() != 1 {
		t.Fatalf("listings %d, builds reported %d; want one each", listings.Load(), built.Load())
	}
	for range 2 {
		idx, err := s.ReadIndex(ctx, pool, "")
		if err != nil || !idx.Built || len(idx.Images) != n {
			t.Fatalf("index: built %v, %d images, %v", idx.Built, len(idx.Images), err)
		}
		pl, err = s.ListPlace(ctx, pool, "", true)
		if err != nil || len(pl.Records) != n {
			t.Fatalf("listing through the index: %d records, %v", len(pl.Records), err)
		}
	}
	if listings.Load() != 1 {
		t.Fatalf("the pool was listed %d times, want once", listings.Load())
	}
	// a sweep mark, read alone
	if err := s.MarkSwept(ctx, pool, "", 0); err != nil {
		t.Fatal(err)
	}
	if seq, err := s.SweptMark(ctx, pool, ""); seq != 1 || err != nil {
		t.Fatalf("sweep mark %d, %v", seq, err)
	}
}
