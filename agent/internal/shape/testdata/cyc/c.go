package cyc

// Put is a method of Store, declared in a.go: c.go → a.go.
func (s *Store) Put(k string) {
	s.byName[k] = limit // limit is declared in d.go: c.go → d.go
}

// long is 62 lines long; its registry is a local, which links to no file.
func long() int {
	registry := 0
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	registry++
	return registry
}
