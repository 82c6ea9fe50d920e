package cephconn_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/cephconn"
	"github.com/rbd-owner/rbd-owner/agent/internal/cephtest"
)

// TestTheMonitorsNameTheirClockInAnAddsAnswer, on the test cluster (its monitors share this
// host's clock): each add's answer names the monitors' now, the second one too, though an
// address listed already keeps its entry's expiry.
func TestTheMonitorsNameTheirClockInAnAddsAnswer(t *testing.T) {
	conn := cephtest.Conn(t)
	addr := fmt.Sprintf("192.0.2.77:0/%d", time.Now().UnixNano()%1e9)
	t.Cleanup(func() { _ = cephconn.Unblocklist(conn, addr) })
	for i, expire := range []time.Duration{time.Minute, 10 * time.Minute} {
		before := time.Now()
		_, monNow, err := cephconn.BlocklistAdd(conn, addr, expire)
		after := time.Now()
		if err != nil {
			t.Fatal(err)
		}
		// the answer's time has microseconds; allow a second either side for the host's own
		if monNow.Before(before.Add(-time.Second)) || monNow.After(after.Add(time.Second)) {
			t.Errorf("add %d: the monitors' now %s, want between %s and %s", i+1, monNow, before, after)
		}
	}
}

// TestMonNowOfAdd reads the monitors' answers as Ceph 16.2 to 20.2 write them.
func TestMonNowOfAdd(t *testing.T) {
	got := cephconn.MonNowOfAdd("blocklisting 192.0.2.7:0/1 until 2026-12-06T20:25:48.038326+0000 (600 sec)")
	if want := time.Date(2026, 12, 6, 20, 15, 48, 38326000, time.UTC); !got.Equal(want) {
		t.Errorf("got %s, want %s", got, want)
	}
	for _, s := range []string{"", "un-blocklisting 192.0.2.7:0/1", "blocklisting x until soon (600 sec)"} {
		if got := cephconn.MonNowOfAdd(s); !got.IsZero() {
			t.Errorf("%q: %s, want zero", s, got)
		}
	}
}
