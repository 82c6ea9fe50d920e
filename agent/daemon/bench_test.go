package daemon

import (
	"slices"
	"testing"
	"time"
)

// The map and unmap sagas end to end on the fake kernel against the live cluster: everything
// but the real kernel's own latency (measured in the lab: 0.16-0.25 s per map under TCG).
func BenchmarkMapUnmapSaga(b *testing.B) {
	n := newNode(b, "bench")
	img := n.image("")
	var maps, unmaps []time.Duration
	for b.Loop() {
		start := time.Now()
		if _, err := n.d.Map(bg, mapReq("", img), nil); err != nil {
			b.Fatal(err)
		}
		maps = append(maps, time.Since(start))
		start = time.Now()
		if _, err := n.d.Unmap(bg, unmapReq("", img), nil); err != nil {
			b.Fatal(err)
		}
		unmaps = append(unmaps, time.Since(start))
	}
	for _, l := range []struct {
		name string
		d    []time.Duration
	}{{"map", maps}, {"unmap", unmaps}} {
		slices.Sort(l.d)
		b.ReportMetric(float64(l.d[len(l.d)/2].Microseconds())/1000, l.name+"-p50-ms")
		b.ReportMetric(float64(l.d[len(l.d)*99/100].Microseconds())/1000, l.name+"-p99-ms")
	}
}
