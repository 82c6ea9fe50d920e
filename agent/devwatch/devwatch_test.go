package devwatch_test

import (
	"context"
	"fmt"
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
	case <-time.After(5 * time.Second):
		t.Fatal("no event within 5 s")
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
	case <-time.After(5 * time.Second):
		t.Fatal("watcher did not stop on cancel")
	}
	for range w.Events() { // drains, then closed
	}
	if err := w.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

func TestClose(t *testing.T) {
	_, c := setup(t)
	w, err := devwatch.Start(context.Background(), devwatch.Config{Client: c, Resync: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	d := mapImg(t, c, "rbd/img0")
	expect(t, w, devwatch.Added, "rbd/img0", d.ID, false)
	noEvent(t, w) // periodic resyncs find nothing new
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := <-w.Events(); ok {
		t.Error("Events() not closed after Close")
	}
	if _, err := devwatch.Start(context.Background(), devwatch.Config{}); err == nil {
		t.Error("Start without a client succeeded")
	}
}
