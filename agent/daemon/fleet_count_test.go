package daemon

import (
	"context"
	"errors"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/server"
)

// The fleet benchmark's counting of RADOS calls (fleet_test.go). The wrapper of claim.Backend
// (countingBackend) is in fleet_backend_test.go, kept apart because the interface changes between
// the revisions the benchmark compares: it embeds the interface, so it still compiles when
// methods are added (those are passed through uncounted until a method is added there), and it
// overrides the calls that reach the cluster.
//
// Not counted here: ImageInfo (its result type is unexported from package claim, so no method
// outside it can override it; an image's open and watcher listing show in the OSD's totals
// only), FSID and OwnAddr (no cluster call).

// fleetCounts counts calls by kind: the call, the object's class and where in the agent it
// comes from ("read claim @renew", "cas-write heartbeat @heartbeat", "list-objects @sweep"),
// and the failed ones by kind and error ("cas-write heartbeat @map: conflict").
type fleetCounts struct {
	mu     sync.Mutex
	calls  map[string]int64
	errs   map[string]int64
	taking map[string]time.Duration // the summed latency of each kind
}

func newFleetCounts() *fleetCounts {
	return &fleetCounts{calls: map[string]int64{}, errs: map[string]int64{}, taking: map[string]time.Duration{}}
}

func (c *fleetCounts) add(kind string, start time.Time, err error) {
	took := time.Since(start)
	kind += " @" + origin()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls[kind]++
	c.taking[kind] += took
	if err != nil {
		c.errs[kind+": "+errorKind(err)]++
	}
}

// items counts things that are not calls (the claims a listing returned: "items list-objects
// @sweep"), with the origin as add gives it.
func (c *fleetCounts) items(kind string, n int) {
	kind = "items " + kind + " @" + origin()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls[kind] += int64(n)
}

// fleetSnapshot is the counts at one moment.
type fleetSnapshot struct {
	calls, errs map[string]int64
	taking      map[string]time.Duration
}

func (c *fleetCounts) snapshot() fleetSnapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := fleetSnapshot{calls: map[string]int64{}, errs: map[string]int64{}, taking: map[string]time.Duration{}}
	for k, v := range c.calls {
		s.calls[k] = v
	}
	for k, v := range c.errs {
		s.errs[k] = v
	}
	for k, v := range c.taking {
		s.taking[k] = v
	}
	return s
}

// since is what was counted between before and s, kinds sorted.
func (s fleetSnapshot) since(before fleetSnapshot) (kinds []string, calls, errs map[string]int64, taking map[string]time.Duration) {
	calls, errs, taking = map[string]int64{}, map[string]int64{}, map[string]time.Duration{}
	for k, v := range s.calls {
		if d := v - before.calls[k]; d > 0 {
			calls[k] = d
			taking[k] = s.taking[k] - before.taking[k]
			kinds = append(kinds, k)
		}
	}
	for k, v := range s.errs {
		if d := v - before.errs[k]; d > 0 {
			errs[k] = d
		}
	}
	sort.Strings(kinds)
	return kinds, calls, errs, taking
}

// objectClass names what an object is by its name: a claim, a node's heartbeat, another object
// of rbd-owner's (whatever a later version adds), or something else.
func objectClass(oid string) string {
	switch {
	case strings.HasPrefix(oid, "rbd-owner.claim."):
		return "claim"
	case strings.HasPrefix(oid, "rbd-owner.node."):
		return "heartbeat"
	case strings.HasPrefix(oid, "rbd-owner."):
		return "rbd-owner-other"
	}
	return "other"
}

// origins name where in the agent a call comes from, by a function on its goroutine's stack:
// the first entry one of whose names is there wins (closures and the goroutines a function
// starts carry its name: checkClaims.func1). A call none names is "other". Only names, so a
// renamed function makes its calls "other" and nothing stops compiling.
var origins = []struct{ fn, origin string }{
	{"daemon.(*sweeper)", "sweep"}, // the pool sweep
	{"daemon.(*Daemon).Map", "map"},
	{"daemon.(*Daemon).Unmap", "unmap"},
	{"daemon.(*heartbeats)", "heartbeat"},
	{"daemon.(*renewer).heartbeat", "heartbeat"},
	{"daemon.(*renewer).watchRound", "watch"}, // takeover watches
	{"daemon.(*renewer)", "renew"},            // the round of claim checks
	{"daemon.(*reconciler).reconcile", "reconcile"},
	{"daemon.(*reconciler).recover", "recover"},
}

func origin() string {
	var pcs [128]uintptr
	frames := runtime.CallersFrames(pcs[:runtime.Callers(3, pcs[:])])
	var names []string
	for {
		f, more := frames.Next()
		names = append(names, f.Function)
		if !more {
			break
		}
	}
	for _, o := range origins {
		for _, n := range names {
			if strings.Contains(n, o.fn) {
				return o.origin
			}
		}
	}
	return "other"
}

// errorKind is a short name for a failed call's error.
func errorKind(err error) string {
	switch {
	case errors.Is(err, claim.ErrConflict):
		return "conflict"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	return server.APIError(err).Code
}
