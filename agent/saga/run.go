package saga

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"
)

// ErrCrash is what Sagas.Fault returns to simulate a kill -9 at that step: nothing is undone and
// nothing is recorded.
var ErrCrash = errors.New("simulated crash")

// undoTimeout bounds the undo of a failed saga.
const undoTimeout = 2 * time.Minute

// run is one saga's undo list and fault hook.
type run struct {
	s    *Sagas
	name string
	undo []func(context.Context) error
}

// step is called before each step: it gives the test fault hook its chance.
func (r *run) step(name string) error {
	if r.s.Fault == nil {
		return nil
	}
	if err := r.s.Fault(r.name, name); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// onFail adds the undo of a step just done.
func (r *run) onFail(f func(context.Context) error) { r.undo = append(r.undo, f) }

// fail undoes what was done, newest first, and returns err. It stops at the first undo that
// fails: what is left is then exactly what the persisted phase says (e.g. "claimed, maybe
// mapped"), which the reconciler finishes or undoes later. Going on would be worse: releasing
// the claim of a device that could not be removed leaves a device without a claim.
// A simulated crash undoes nothing.
func (r *run) fail(err error) error {
	if errors.Is(err, ErrCrash) {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), undoTimeout)
	defer cancel()
	for i := len(r.undo) - 1; i >= 0; i-- {
		if uerr := r.undo[i](ctx); uerr != nil {
			r.s.Log.WithError(uerr).Error(r.name + ": undo failed; the state is kept for the reconciler to finish")
			return err
		}
	}
	return err
}

// commit ends the undo list: what is done from here on is never undone.
func (r *run) commit() { r.undo = nil }

// keep abandons the undo list: the persisted state stays as it is for the reconciler.
func (r *run) keep(err error) error {
	r.undo = nil
	return err
}

// stepTimer notes how long each step of a saga took.
type stepTimer struct {
	start, last time.Time
	names       []string
	took        []time.Duration
}

func newStepTimer() stepTimer {
	now := time.Now()
	return stepTimer{start: now, last: now}
}

func (t *stepTimer) mark(name string) {
	now := time.Now()
	t.names, t.took = append(t.names, name), append(t.took, now.Sub(t.last))
	t.last = now
}

// note records a step that ran beside others (its own time), without ending the current one.
func (t *stepTimer) note(name string, took time.Duration) {
	t.names, t.took = append(t.names, name), append(t.took, took)
}

func (t *stepTimer) fields() logrus.Fields {
	f := logrus.Fields{"total_ms": float64(time.Since(t.start).Microseconds()) / 1000}
	for i, n := range t.names {
		f[n+"_ms"] = float64(t.took[i].Microseconds()) / 1000
	}
	return f
}
