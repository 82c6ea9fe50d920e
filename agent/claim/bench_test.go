package claim

import (
	"context"
	"fmt"
	"slices"
	"sync"
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

// BenchmarkClaimOps: acquire, renew and release, each client a node of its own with an image of
// its own on its own connection, with 1 and 16 clients at once: p50/p99 of each operation and
// the operations per second of all clients together.
func BenchmarkClaimOps(b *testing.B) {
	for _, clients := range []int{1, 16} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			type worker struct {
				n   node
				img Image
			}
			ws := make([]worker, clients)
			for i := range ws {
				ws[i] = worker{newNode(b, fmt.Sprintf("bench-c%d", i), nil), testImage(b, "")}
			}
			per := max(1, b.N/clients)
			var mu sync.Mutex
			var acq, ren, rel latencies
			c := context.Background()
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for _, w := range ws {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var a, rn, rl latencies
					for i := 0; i < per; i++ {
						var res *Result
						if err := timed(&a, func() (err error) { res, err = w.n.Acquire(c, Request{Image: w.img}); return }); err != nil {
							b.Error(err)
							return
						}
						if err := timed(&rn, func() error { _, err := w.n.Renew(c, w.img, res.Holder.Epoch); return err }); err != nil {
							b.Error(err)
							return
						}
						if err := timed(&rl, func() error { _, err := w.n.Release(c, w.img, res.Holder.Epoch); return err }); err != nil {
							b.Error(err)
							return
						}
					}
					mu.Lock()
					acq, ren, rel = append(acq, a...), append(ren, rn...), append(rel, rl...)
					mu.Unlock()
				}()
			}
			wg.Wait()
			took := time.Since(start)
			b.StopTimer()
			for name, l := range map[string]latencies{"acquire": acq, "renew": ren, "release": rel} {
				if len(l) == 0 {
					continue
				}
				slices.Sort(l)
				b.ReportMetric(float64(l[len(l)/2].Microseconds())/1000, name+"-p50-ms")
				b.ReportMetric(float64(l[len(l)*99/100].Microseconds())/1000, name+"-p99-ms")
			}
			b.ReportMetric(float64(len(acq)+len(ren)+len(rel))/took.Seconds(), "ops/s")
		})
	}
}
