package daemon

import "sync"

// renewConcurrency bounds the renewals of one cluster in flight at once.
const renewConcurrency = 8

// eachBounded runs f on every item, at most n at once, and returns once all are done.
func eachBounded[T any](n int, items []T, f func(T)) {
	sem := make(chan struct{}, n)
	var wg sync.WaitGroup
	for _, it := range items {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			f(it)
		}()
	}
	wg.Wait()
}
