package daemon

import (
	"context"
	"sync"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/state"
)

// executor runs the operations the loops decide on (settle a half-done saga, release the claim
// of a lost device), one at a time per image, each in a goroutine of its own, and backs off an
// image whose operation failed: the loops only decide and never wait on a cluster or the kernel
// (kubelet's operation executor, in small).
type executor struct {
	d *Daemon

	mu      sync.Mutex
	running map[state.Key]bool
	backoff map[state.Key]backoff
	n       int
	idle    chan struct{} // closed while n == 0
}

type backoff struct {
	until time.Time
	delay time.Duration
}

// Backoff bounds after a failed operation on an image: doubled each time, reset on success.
const (
	minBackoff = 500 * time.Millisecond
	maxBackoff = 2 * time.Minute
)

func newExecutor(d *Daemon) *executor {
	idle := make(chan struct{})
	close(idle)
	return &executor{d: d, running: map[state.Key]bool{}, backoff: map[state.Key]backoff{}, idle: idle}
}

// start runs op for key unless an operation on key is running or key is backing off; it says
// whether op was started. op runs with the image's saga lock held: when a saga (or anything
// else) holds it, op waits for it, at most as long as a saga may take, and then runs on the
// state the saga left (each op re-reads what it acts on). It returns whether it succeeded.
func (e *executor) start(ctx context.Context, key state.Key, op func(ctx context.Context) error) bool {
	e.mu.Lock()
	if e.running[key] || time.Now().Before(e.backoff[key].until) {
		e.mu.Unlock()
		return false
	}
	e.running[key] = true
	if e.n == 0 {
		e.idle = make(chan struct{})
	}
	e.n++
	e.mu.Unlock()
	e.d.bg.Add(1)
	go func() {
		defer e.d.bg.Done()
		lctx, cancel := context.WithTimeout(ctx, e.d.cfg.MapTimeout.D()+time.Minute)
		unlock, err := e.d.locks.Lock(lctx, key)
		cancel()
		if err == nil {
			err = op(ctx)
			unlock()
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		delete(e.running, key)
		if err == nil {
			delete(e.backoff, key)
		} else {
			b := e.backoff[key]
			b.delay = min(max(2*b.delay, minBackoff), maxBackoff)
			b.until = time.Now().Add(b.delay)
			e.backoff[key] = b
			e.d.log.WithError(err).WithField("image", key.String()).WithField("retry_in", b.delay).Warn("operation failed; retrying after a backoff")
		}
		if e.n--; e.n == 0 {
			close(e.idle)
		}
	}()
	return true
}

// busy says whether an operation on key is running.
func (e *executor) busy(key state.Key) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.running[key]
}

// waitIdle waits until no operation runs, at most for d; it says whether that happened.
func (e *executor) waitIdle(d time.Duration) bool {
	e.mu.Lock()
	ch := e.idle
	e.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
		return false
	}
}
