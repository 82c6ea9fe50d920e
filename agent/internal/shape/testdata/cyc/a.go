// Package cyc is the fixture of shape's test: a.go and b.go link to each other (a cycle on
// floor 1), c.go links to a.go and d.go (floor 2), d.go to none (floor 1).
package cyc

import "sync"

// Store has two mutex fields (one a pointer) and two map fields in one list.
type Store struct {
	mu           sync.Mutex
	rw           *sync.RWMutex
	byName, byID map[string]int
	list         []int
}

// Get names helperB, declared in b.go: a.go → b.go.
func (s *Store) Get() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return helperB() + len(s.list)
}
