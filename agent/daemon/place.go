package daemon

// place is a pool and namespace of one cluster: where one heartbeat object of this node lives.
type place struct{ pool, namespace string }

func (p place) String() string { return livenessPlace(p.pool, p.namespace) }

// livenessPlace is the place label of a heartbeat: "pool" or "pool/namespace".
func livenessPlace(pool, ns string) string {
	if ns == "" {
		return pool
	}
	return pool + "/" + ns
}
