package claim

import (
	"context"
	"slices"
	"testing"
	"time"
)

// latencies records each operation's wall time and reports the median and p99 next to
// Go's mean ns/op.
type latencies []time.Duration

func (l latencies) report(b *testing.B) {
	if len(l) == 0 {
		return
	}
	slices.Sort(l)
	b.ReportMetric(float64(l[len(l)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(l[len(l)*99/100].Microseconds())/1000, "p99-ms")
}

func timed(l *latencies, f func() error) error {
	start := time.Now()
	err := f()
	*l = append(*l, time.Since(start))
	return err
}

// Acquire of a free image (includes the image check: open read-only, list watchers).
func BenchmarkAcquire(b *testing.B) {
	img := testImage(b, "")
	n := newNode(b, "bench-a", nil)
	c := context.Background()
	var lat latencies
	for b.Loop() {
		var res *Result
		if err := timed(&lat, func() (err error) { res, err = n.Acquire(c, Request{Image: img}); return }); err != nil {
			b.Fatal(err)
		}
		if _, err := n.Release(c, img, res.Holder.Epoch); err != nil {
			b.Fatal(err)
		}
	}
	lat.report(b)
}

// Renew of a held claim: one read and one compare-and-set.
func BenchmarkRenew(b *testing.B) {
	img := testImage(b, "")
	n := newNode(b, "bench-r", nil)
	c := context.Background()
	res, err := n.Acquire(c, Request{Image: img})
	if err != nil {
		b.Fatal(err)
	}
	var lat latencies
	for b.Loop() {
		if err := timed(&lat, func() error { _, err := n.Renew(c, img, res.Holder.Epoch); return err }); err != nil {
			b.Fatal(err)
		}
	}
	lat.report(b)
}

// Release of a held claim: one read and one compare-and-set.
func BenchmarkRelease(b *testing.B) {
	img := testImage(b, "")
	n := newNode(b, "bench-l", nil)
	c := context.Background()
	var lat latencies
	for b.Loop() {
		res, err := n.Acquire(c, Request{Image: img})
		if err != nil {
			b.Fatal(err)
		}
		if err := timed(&lat, func() error { _, err := n.Release(c, img, res.Holder.Epoch); return err }); err != nil {
			b.Fatal(err)
		}
	}
	lat.report(b)
}
