package daemon

import (
	"context"
	"sync"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/saga"
	"github.com/rbd-owner/rbd-owner/agent/state"
	"github.com/sirupsen/logrus"
)

// executor runs the operations the loops decide on (settle a half-done saga, release the claim
// of a lost device), one at a time per image, each in a goroutine of its own, and backs off an
// image whose operation failed: the loops only decide and never wait on a cluster or the kernel
// (kubelet's operation executor, in small).
type executor struct {
	bg       *sync.WaitGroup // the agent's: its goroutines are the agent's
	locks    *saga.Locks     // an operation holds its image's saga lock
	lockWait time.Duration   // at most this long, waiting for it
	log      *logrus.Logger

	mu      sync.Mutex
	running map[state.Key]bool
	backoff map[state.Key]backoff
	// next holds the operations an event asked for while another on the same image ran: they
	// run after it, in order (queue), never dropped as a reconciler's repeat is (start)
	next map[state.Key][]queued
	n    int
	idle chan struct{} // closed while n == 0
}

type backoff struct {
	until time.Time
	delay time.Duration
}

// queued is an operation waiting for the one running on its image.
type queued struct {
	ctx context.Context
	op  func(ctx context.Context) error
}

// Backoff bounds after a failed operation on an image: doubled each time, reset on success.
const (
	minBackoff = 500 * time.Millisecond
	maxBackoff = 2 * time.Minute
)

func newExecutor(bg *sync.WaitGroup, locks *saga.Locks, lockWait time.Duration, log *logrus.Logger) *executor {
	idle := make(chan struct{})
	close(idle)
	return &executor{bg: bg, locks: locks, lockWait: lockWait, log: log, running: map[state.Key]bool{}, backoff: map[state.Key]backoff{}, next: map[state.Key][]queued{}, idle: idle}
}

// start runs op for key unless an operation on key is running or key is backing off; it says
// whether op was started. It is for what a loop decides again at its next round (a settle, a
// judgement): dropped now, asked again then. op runs with the image's saga lock held: when a
// saga (or anything else) holds it, op waits for it, at most as long as a saga may take, and
// then runs on the state the saga left (each op re-reads what it acts on).
func (e *executor) start(ctx context.Context, key state.Key, op func(ctx context.Context) error) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.running[key] || time.Now().Before(e.backoff[key].until) {
		return false
	}
	e.launch(ctx, key, op)
	return true
}

// queue runs op for key once no other operation on key runs: at once, or right after the one
// running now (and any queued before it). It is for what an event alone says, such as a
// device's remove event, which no later round repeats: dropping it would leave the claim of a
// gone device held until the reconciler's next round. A backoff does not delay it: the event
// is news the failed operation did not have.
func (e *executor) queue(ctx context.Context, key state.Key, op func(ctx context.Context) error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.running[key] {
		e.next[key] = append(e.next[key], queued{ctx: ctx, op: op})
		return
	}
	e.launch(ctx, key, op)
}

// launch starts the goroutine that runs op, then what was queued for key meanwhile. e.mu is held.
func (e *executor) launch(ctx context.Context, key state.Key, op func(ctx context.Context) error) {
	e.running[key] = true
	if e.n == 0 {
		e.idle = make(chan struct{})
	}
	e.n++
	e.bg.Add(1)
	go func() {
		defer e.bg.Done()
		for {
			err := e.run(ctx, key, op)
			e.mu.Lock()
			e.ended(key, err)
			q := e.next[key]
			if len(q) == 0 {
				delete(e.next, key)
				delete(e.running, key)
				if e.n--; e.n == 0 {
					close(e.idle)
				}
				e.mu.Unlock()
				return
			}
			ctx, op = q[0].ctx, q[0].op
			e.next[key] = q[1:]
			e.mu.Unlock()
		}
	}()
}

// run runs op with key's saga lock held, waiting for it at most as long as a saga may take.
func (e *executor) run(ctx context.Context, key state.Key, op func(ctx context.Context) error) error {
	lctx, cancel := context.WithTimeout(ctx, e.lockWait)
	unlock, err := e.locks.Lock(lctx, key)
	cancel()
	if err != nil {
		return err
	}
	defer unlock()
	return op(ctx)
}

// ended records how an operation on key ended: a success resets its backoff, a failure
// doubles it. e.mu is held.
func (e *executor) ended(key state.Key, err error) {
	if err == nil {
		delete(e.backoff, key)
		return
	}
	b := e.backoff[key]
	b.delay = min(max(2*b.delay, minBackoff), maxBackoff)
	b.until = time.Now().Add(b.delay)
	e.backoff[key] = b
	e.log.WithError(err).WithField("image", key.String()).WithField("retry_in", b.delay).Warn("operation failed; retrying after a backoff")
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
