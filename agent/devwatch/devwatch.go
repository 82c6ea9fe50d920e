// Package devwatch turns the kernel's (or udevd's) rbd uevents into a stream of device
// added / removed events carrying the image's names. The names are read from sysfs when the
// device appears and remembered, because remove events carry none. Lost events (socket
// overflow, a slow consumer) are repaired by listing sysfs again and emitting the difference.
package devwatch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"sync"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/krbd"

	"github.com/sirupsen/logrus"
)

// Kind says what happened to a device.
type Kind int

// The kinds of change.
const (
	Added   Kind = iota + 1 // mapped: its block device exists
	Removed                 // unmapped
)

func (k Kind) String() string {
	switch k {
	case Added:
		return "added"
	case Removed:
		return "removed"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Event is one device change. Device holds the attributes read at add time (for Removed:
// the remembered ones).
type Event struct {
	Kind   Kind
	Device krbd.Device
	// Resync is set when the event comes from a sysfs listing (the initial one, or one after
	// lost events) rather than from a uevent: the change may have happened a while ago.
	Resync bool
}

// Config configures a Watcher.
type Config struct {
	Client *krbd.Client     // reads sysfs (required)
	Source krbd.EventSource // default Client's Config().Events
	Buffer int              // Events() depth (default 64)
	// Resync, when > 0, also re-lists sysfs this often (a safety net; default 0: only after
	// lost events and at start).
	Resync time.Duration
	// ResyncTick, when set, replaces the ticker made from Resync: sysfs is re-listed after
	// every value received from it (and Resync is ignored). Tests use it to decide exactly
	// when a periodic resync happens. Default: a time.Ticker of Resync (none when Resync is 0).
	ResyncTick <-chan time.Time
	Logger     logrus.FieldLogger // the agent's logger; default: discard
}

// Watcher streams rbd device events. Create it with Start; stop it by cancelling the
// context given to Start or with Close; Events() is closed when it has stopped.
type Watcher struct {
	cfg    Config
	out    chan Event
	cancel context.CancelFunc
	done   chan struct{}
	err    error

	mu    sync.Mutex
	known map[int]krbd.Device
}

// Start subscribes to uevents, then lists sysfs (emitting Added with Resync for every device
// already mapped), then follows the events, until ctx is done or Close is called.
func Start(ctx context.Context, cfg Config) (*Watcher, error) {
	if cfg.Client == nil {
		return nil, errors.New("devwatch: no krbd client")
	}
	if cfg.Source == nil {
		cfg.Source = cfg.Client.Config().Events
	}
	if cfg.Buffer <= 0 {
		cfg.Buffer = 64
	}
	if cfg.Logger == nil {
		discard := logrus.New()
		discard.SetOutput(io.Discard)
		cfg.Logger = discard
	}
	ctx, cancel := context.WithCancel(ctx)
	sub, err := cfg.Source.Subscribe(ctx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("devwatch: %w", err)
	}
	w := &Watcher{cfg: cfg, out: make(chan Event, cfg.Buffer), cancel: cancel, done: make(chan struct{}),
		known: map[int]krbd.Device{}}
	go w.run(ctx, sub)
	return w, nil
}

// Events is the stream; it is closed when the watcher stops.
func (w *Watcher) Events() <-chan Event { return w.out }

// Close stops the watcher and waits for its goroutine. It returns the error that stopped it
// early, if any.
func (w *Watcher) Close() error {
	w.cancel()
	<-w.done
	return w.err
}

// Done is closed when the watcher has stopped.
func (w *Watcher) Done() <-chan struct{} { return w.done }

// Devices returns the devices the watcher currently knows, by id.
func (w *Watcher) Devices() []krbd.Device {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]krbd.Device, 0, len(w.known))
	for _, d := range w.known {
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func (w *Watcher) run(ctx context.Context, sub krbd.Subscription) {
	defer close(w.done)
	defer close(w.out)
	defer func() {
		if err := sub.Close(); err != nil {
			w.cfg.Logger.WithError(err).Warn("devwatch: close the uevent subscription")
		}
	}()
	if !w.resync(ctx) {
		return
	}
	tick := w.cfg.ResyncTick
	if tick == nil && w.cfg.Resync > 0 {
		t := time.NewTicker(w.cfg.Resync)
		defer t.Stop()
		tick = t.C
	}
	pending := map[int]krbd.Device{} // rbd add seen, block add not yet
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
			if !w.resync(ctx) {
				return
			}
		case ev, ok := <-sub.Events():
			if !ok {
				// the source ended (socket error): resubscribe, then repair by listing
				if ctx.Err() != nil {
					return
				}
				w.cfg.Logger.Warn("uevent stream ended; resubscribing")
				var err error
				if sub, err = w.cfg.Source.Subscribe(ctx); err != nil {
					w.err = fmt.Errorf("devwatch: resubscribe: %w", err)
					return
				}
				if !w.resync(ctx) {
					return
				}
				continue
			}
			if !w.handle(ctx, ev, pending) {
				return
			}
		}
	}
}

// handle processes one uevent; false when ctx ended while sending.
func (w *Watcher) handle(ctx context.Context, ev krbd.Uevent, pending map[int]krbd.Device) bool {
	if ev.Overflow {
		w.cfg.Logger.Info("uevents lost; re-reading sysfs")
		clear(pending)
		return w.resync(ctx)
	}
	if id, ok := ev.RBDID(); ok {
		switch ev.Action {
		case "add":
			// read the names now: at remove time they are gone
			d, err := w.cfg.Client.ReadDevice(id)
			if err == nil {
				pending[id] = d
			}
		case "remove":
			delete(pending, id)
			w.mu.Lock()
			d, was := w.known[id]
			delete(w.known, id)
			w.mu.Unlock()
			if was {
				return w.send(ctx, Event{Kind: Removed, Device: d})
			}
		}
		return true
	}
	if id, ok := ev.DiskID(); ok && ev.Action == "add" {
		d, ok := pending[id]
		delete(pending, id)
		if !ok { // rbd add not seen (started in between): read from the parent now
			var err error
			if d, err = w.cfg.Client.ReadDevice(id); err != nil {
				return true // already gone; its remove will find nothing to report
			}
		}
		w.mu.Lock()
		_, was := w.known[id]
		w.known[id] = d
		w.mu.Unlock()
		if !was {
			return w.send(ctx, Event{Kind: Added, Device: d})
		}
	}
	return true
}

// resync lists sysfs and emits the difference with what is known.
func (w *Watcher) resync(ctx context.Context) bool {
	devs, err := w.cfg.Client.List()
	if err != nil {
		w.cfg.Logger.WithError(err).Warn("devwatch: list rbd devices")
		return true // try again at the next event or tick
	}
	now := make(map[int]krbd.Device, len(devs))
	for _, d := range devs {
		now[d.ID] = d
	}
	var evs []Event
	w.mu.Lock()
	for id, d := range w.known {
		if nd, ok := now[id]; !ok || nd.Spec() != d.Spec() || nd.ClientID != d.ClientID {
			evs = append(evs, Event{Kind: Removed, Device: d, Resync: true})
			delete(w.known, id)
		}
	}
	for _, d := range devs {
		if _, ok := w.known[d.ID]; !ok {
			w.known[d.ID] = d
			evs = append(evs, Event{Kind: Added, Device: d, Resync: true})
		}
	}
	w.mu.Unlock()
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].Kind == Removed && evs[j].Kind == Added })
	for _, e := range evs {
		if !w.send(ctx, e) {
			return false
		}
	}
	return true
}

func (w *Watcher) send(ctx context.Context, e Event) bool {
	select {
	case w.out <- e:
		return true
	case <-ctx.Done():
		return false
	}
}
