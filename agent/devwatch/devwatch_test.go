package devwatch_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/devwatch"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/krbd/fakekernel"
)

const secret = "AQBzXHxlAAAAABAAm0Tq4kVJ2HbsYQ1rLA5pUw=="

func setup(t *testing.T) (*fakekernel.Kernel, *krbd.Client) {
	t.Helper()
	k, err := fakekernel.New(t.TempDir(), fakekernel.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := k.AddUser("u", secret); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		k.AddImage("rbd", "", fmt.Sprintf("img%d", i), 1<<20)
	}
	k.AddImage("rbd", "ns1", "img0", 1<<20, "s1")
	cfg := k.Config()
	cfg.Poll = 10 * time.Millisecond
	t.Cleanup(func() {
		if n := k.Subscribers(); n != 0 {
			t.Errorf("%d subscriptions left open", n)
		}
	})
	return k, krbd.New(cfg)
}

func mapImg(t *testing.T, c *krbd.Client, spec string) krbd.Device {
	t.Helper()
	sp, err := krbd.ParseSpec(spec)
	if err != nil {
		t.Fatal(err)
	}
	d, err := c.Map(context.Background(), sp, krbd.MapOptions{Monitors: []string{"203.0.113.1"}, User: "u", Secret: secret, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func unmap(t *testing.T, c *krbd.Client, id int) {
	t.Helper()
	if ok, err := c.Unmap(context.Background(), id, krbd.UnmapOptions{}); !ok || err != nil {
		t.Fatalf("unmap %d: %v %v", id, ok, err)
	}
}

func next(t *testing.T, w *devwatch.Watcher) devwatch.Event {
	t.Helper()
	select {
	case e, ok := <-w.Events():
		if !ok {
			t.Fatal("stream closed")
		}
		return e
	case <-time.After(30 * time.Second):
		t.Fatal("no event within 30 s")
	}
	return devwatch.Event{}
}

func expect(t *testing.T, w *devwatch.Watcher, kind devwatch.Kind, spec string, id int, resync bool) devwatch.Event {
	t.Helper()
	e := next(t, w)
	if e.Kind != kind || e.Device.Spec().String() != spec || e.Device.ID != id || e.Resync != resync {
		t.Fatalf("got %v %s id %d resync %v; want %v %s id %d resync %v", e.Kind, e.Device.Spec(), e.Device.ID, e.Resync, kind, spec, id, resync)
	}
	return e
}

func noEvent(t *testing.T, w *devwatch.Watcher) {
	t.Helper()
	select {
	case e := <-w.Events():
		t.Fatalf("unexpected event %+v", e)
	case <-time.After(50 * time.Millisecond):
	}
}

// silentSource is an event source that loses every event without saying so (no Overflow
// marker either): only a resync can find a device.
type silentSource struct{}

func (silentSource) Subscribe(context.Context) (krbd.Subscription, error) {
	return &silentSub{ch: make(chan krbd.Uevent)}, nil
}

type silentSub struct {
	ch   chan krbd.Uevent
	once sync.Once
}

func (s *silentSub) Events() <-chan krbd.Uevent { return s.ch }
func (s *silentSub) Close() error               { s.once.Do(func() { close(s.ch) }); return nil }

func TestStream(t *testing.T) {
	_, c := setup(t)
	pre := mapImg(t, c, "rbd/img0")
	w, err := devwatch.Start(context.Background(), devwatch.Config{Client: c})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	expect(t, w, devwatch.Added, "rbd/img0", pre.ID, true) // initial listing
	d := mapImg(t, c, "rbd/ns1/img0@s1")
	e := expect(t, w, devwatch.Added, "rbd/ns1/img0@s1", d.ID, false)
	if e.Device.ClientAddr != d.ClientAddr || e.Device.Major != d.Major || e.Device.ClusterFSID == "" {
		t.Errorf("attributes: %+v vs %+v", e.Device, d)
	}
	unmap(t, c, d.ID)
	// names remembered from add time: the remove uevent has none and sysfs is gone
	e = expect(t, w, devwatch.Removed, "rbd/ns1/img0@s1", d.ID, false)
	if e.Device.ClientAddr != d.ClientAddr {
		t.Errorf("removed device lost its attributes: %+v", e.Device)
	}
	if got := w.Devices(); len(got) != 1 || got[0].ID != pre.ID {
		t.Errorf("Devices() = %+v", got)
	}
	noEvent(t, w)
}

func TestLostEvents(t *testing.T) {
	k, c := setup(t)
	w, err := devwatch.Start(context.Background(), devwatch.Config{Client: c})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	k.DropEvents(3)
	d1 := mapImg(t, c, "rbd/img1")
	expect(t, w, devwatch.Added, "rbd/img1", d1.ID, true)
	d2 := mapImg(t, c, "rbd/img2")
	// img2's own events carry the overflow marker: the re-listing they trigger may find img2
	// already in sysfs (resync) or leave it to its events; either way it is reported once
	if e := next(t, w); e.Kind != devwatch.Added || e.Device.Spec().String() != "rbd/img2" || e.Device.ID != d2.ID {
		t.Fatalf("got %v %s id %d; want added rbd/img2 id %d", e.Kind, e.Device.Spec(), e.Device.ID, d2.ID)
	}
	k.DropEvents(3)
	unmap(t, c, d1.ID)
	expect(t, w, devwatch.Removed, "rbd/img1", d1.ID, true)
	// id reused by another image while its events were lost: removed + added
	k.DropEvents(6)
	unmap(t, c, d2.ID)
	d3 := mapImg(t, c, "rbd/img3")
	if d3.ID != d2.ID && d3.ID != d1.ID {
		t.Logf("id not reused (%d)", d3.ID)
	}
	seen := map[string]bool{}
	for range 2 {
		e := next(t, w)
		seen[fmt.Sprintf("%v %s", e.Kind, e.Device.Spec())] = true
	}
	if !seen["removed rbd/img2"] || !seen["added rbd/img3"] {
		t.Errorf("after lost events got %v", seen)
	}
	noEvent(t, w)
}

func TestSlowConsumerAndStop(t *testing.T) {
	_, c := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	w, err := devwatch.Start(ctx, devwatch.Config{Client: c, Buffer: 1})
	if err != nil {
		t.Fatal(err)
	}
	// nobody reads: the watcher must not block the maps, and must still stop on cancel
	for i := range 4 {
		mapImg(t, c, fmt.Sprintf("rbd/img%d", i))
	}
	cancel()
	select {
	case <-w.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("watcher did not stop on cancel")
	}
	for range w.Events() { // drains, then closed
	}
	if err := w.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// Close stops the watcher and closes Events(). The periodic resync is driven by the test
// (Config.ResyncTick), so it can neither beat a device's own events nor be missed.
func TestClose(t *testing.T) {
	_, c := setup(t)
	tick := make(chan time.Time) // unbuffered: a send returns once the watcher took it
	w, err := devwatch.Start(context.Background(), devwatch.Config{Client: c, ResyncTick: tick})
	if err != nil {
		t.Fatal(err)
	}
	// the first device is found by the start listing or by its events, depending on whether
	// the watcher listed sysfs before the map; either way the start listing is over once it
	// is reported (the watcher handles no event before it)
	first := mapImg(t, c, "rbd/img1")
	if e := next(t, w); e.Kind != devwatch.Added || e.Device.Spec().String() != "rbd/img1" || e.Device.ID != first.ID {
		t.Fatalf("got %v %s id %d; want added rbd/img1 id %d", e.Kind, e.Device.Spec(), e.Device.ID, first.ID)
	}
	// no resync is triggered from here on: only the device's uevents can report it
	d := mapImg(t, c, "rbd/img0")
	expect(t, w, devwatch.Added, "rbd/img0", d.ID, false)
	// two resyncs: the second send is taken only once the first resync has sent whatever it
	// found, and nothing changed, so the first found nothing new
	tick <- time.Now()
	tick <- time.Now()
	select {
	case e := <-w.Events():
		t.Fatalf("a resync reported a known device again: %+v", e)
	default:
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	// (the second resync found nothing new either: Events() holds nothing before it closed)
	if e, ok := <-w.Events(); ok {
		t.Errorf("Events() not closed after Close (got %+v)", e)
	}
	if _, err := devwatch.Start(context.Background(), devwatch.Config{}); err == nil {
		t.Error("Start without a client succeeded")
	}
}

// A resync happens at each value from Config.ResyncTick: with an event source that loses
// everything silently, the tick alone finds a new device and notices a removed one.
func TestResyncTick(t *testing.T) {
	_, c := setup(t)
	tick := make(chan time.Time)
	w, err := devwatch.Start(context.Background(), devwatch.Config{Client: c, Source: silentSource{}, ResyncTick: tick})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	tick <- time.Now() // taken: the start listing is over (the resync it starts may overlap the map)
	d := mapImg(t, c, "rbd/img0")
	tick <- time.Now() // taken once the first resync is over: this one starts after the map
	expect(t, w, devwatch.Added, "rbd/img0", d.ID, true)
	unmap(t, c, d.ID)
	tick <- time.Now() // this resync starts after the unmap (the one before may have seen it already)
	expect(t, w, devwatch.Removed, "rbd/img0", d.ID, true)
	if got := w.Devices(); len(got) != 0 {
		t.Errorf("Devices() = %+v", got)
	}
}

// Without ResyncTick, Config.Resync runs a real ticker: with an event source that loses
// everything silently, the periodic resync alone reports the device.
func TestPeriodicResync(t *testing.T) {
	_, c := setup(t)
	w, err := devwatch.Start(context.Background(), devwatch.Config{Client: c, Source: silentSource{}, Resync: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	d := mapImg(t, c, "rbd/img0")
	expect(t, w, devwatch.Added, "rbd/img0", d.ID, true) // the start listing or a periodic one
	unmap(t, c, d.ID)
	expect(t, w, devwatch.Removed, "rbd/img0", d.ID, true)
}
