package config

import (
	"strings"
	"testing"
	"time"
)

// TestLeaseMustCoverTheBound: a lease the lease rule's proof (model/lease.pml: R + D < L) does
// not cover is refused with the bound spelled out, whatever the other checks allow; the
// defaults and the lab's values are accepted.
func TestLeaseMustCoverTheBound(t *testing.T) {
	for _, tc := range []struct {
		name         string
		doc          string
		lease, renew time.Duration // accepted: the values parsed
		err          []string      // refused: what the one-line error says
	}{
		{name: "5s/2s: the values the issue found accepted", doc: "lease_duration: 5s\nrenew_interval: 2s\n",
			err: []string{"lease_duration: 5s is too short for renew_interval 2s: a lease must exceed " +
				"renew_interval (2s) + the OSDs' failover (osd_failover, 30s) + a read's answer (10s) = 42s, " +
				"or a heartbeat stalled by a stopped OSD makes this live node look dead; raise lease_duration above 42s " +
				"(no renew_interval makes a lease of 40s or less safe)"}},
		{name: "defaults", doc: "", lease: 60 * time.Second, renew: 10 * time.Second},
		{name: "defaults, written out", doc: "lease_duration: 60s\nrenew_interval: 10s\nosd_failover: 30s\n", lease: 60 * time.Second, renew: 10 * time.Second},
		{name: "the defaults before osd_failover: 60s/20s, a stall of 30s on top of 20s",
			doc: "lease_duration: 60s\nrenew_interval: 20s\n",
			err: []string{"renew_interval (20s) + the OSDs' failover (osd_failover, 30s) + renew_interval past a write's answer (10s) + " +
				"a read's answer (10s) = 1m10s", "raise lease_duration above 1m10s or lower renew_interval to 14s"}},
		{name: "the prod lab's values", doc: "lease_duration: 50s\nrenew_interval: 5s\n", lease: 50 * time.Second, renew: 5 * time.Second},
		{name: "the small lab's values (its OSD stalls at most 12s)", doc: "lease_duration: 35s\nrenew_interval: 5s\nosd_failover: 15s\n",
			lease: 35 * time.Second, renew: 5 * time.Second},
		{name: "the small lab's values with the default osd_failover", doc: "lease_duration: 35s\nrenew_interval: 5s\n",
			err: []string{"lease_duration: 35s is too short for renew_interval 5s", "= 45s", "raise lease_duration above 45s",
				"no renew_interval makes a lease of 40s or less safe"}},
		{name: "a lease equal to the bound", doc: "lease_duration: 45s\nrenew_interval: 5s\n",
			err: []string{"lease_duration: 45s is too short for renew_interval 5s", "= 45s", "or lower renew_interval to 4s"}},
		{name: "a lease just over the bound", doc: "lease_duration: 45001ms\nrenew_interval: 5s\n", lease: 45001 * time.Millisecond, renew: 5 * time.Second},
		{name: "a short failover: the heartbeat's deadline stops at 10s", doc: "lease_duration: 45s\nrenew_interval: 15s\nosd_failover: 5s\n",
			err: []string{"renew_interval (15s) + the heartbeat's deadline (10s) + its write's answer (10s) + a read's answer (10s) = 45s",
				"or lower renew_interval to 14s"}},
		{name: "a short failover: 46s", doc: "lease_duration: 46s\nrenew_interval: 15s\nosd_failover: 5s\n", lease: 46 * time.Second, renew: 15 * time.Second},
		{name: "a long failover needs a long lease: 80s", doc: "lease_duration: 80s\nosd_failover: 60s\n",
			err: []string{"renew_interval (10s) + the OSDs' failover (osd_failover, 1m0s) + a read's answer (10s) = 1m20s"}},
		{name: "a long failover needs a long lease: 81s", doc: "lease_duration: 81s\nosd_failover: 60s\n", lease: 81 * time.Second, renew: 10 * time.Second},
		{name: "renew_interval by default a third of 27s", doc: "lease_duration: 27s\nosd_failover: 1s\n",
			err: []string{"lease_duration: 27s is too short for renew_interval 9s", "= 38s", "or lower renew_interval to 3s"}},
		{name: "renew_interval by default at most 10s", doc: "lease_duration: 90s\n", lease: 90 * time.Second, renew: 10 * time.Second},
		{name: "osd_failover under a second", doc: "osd_failover: 500ms\n", err: []string{"osd_failover: 500ms: want 1s to 10m"}},
		{name: "osd_failover over ten minutes", doc: "lease_duration: 1h\nosd_failover: 11m\n", err: []string{"osd_failover: 11m0s: want 1s to 10m"}},
		{name: "renew_interval over half the lease: still its own error", doc: "lease_duration: 100s\nrenew_interval: 60s\n",
			err: []string{"renew_interval: 1m0s must be positive and at most half of lease_duration"}},
	} {
		c, err := Parse([]byte("node_id: n\nclusters: []\n"+tc.doc), machineID(t))
		if tc.err == nil {
			if err != nil {
				t.Errorf("%s: refused: %v", tc.name, err)
			} else if c.LeaseDuration.D() != tc.lease || c.RenewInterval.D() != tc.renew {
				t.Errorf("%s: lease %s renew %s, want %s %s", tc.name, c.LeaseDuration.D(), c.RenewInterval.D(), tc.lease, tc.renew)
			}
			continue
		}
		if err == nil {
			t.Errorf("%s: accepted, want an error saying %q", tc.name, tc.err)
			continue
		}
		for _, want := range tc.err {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: error %q does not say %q", tc.name, err, want)
			}
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: error is not one line: %q", tc.name, err)
		}
	}
}

// TestHeartbeatTimeout: renew_interval, at most 10s; the bound is built from it and from
// osd_failover (30s unless given).
func TestHeartbeatTimeout(t *testing.T) {
	for _, tc := range []struct{ renew, failover, want, bound time.Duration }{
		{2 * time.Second, 0, 2 * time.Second, 42 * time.Second},
		{5 * time.Second, 0, 5 * time.Second, 45 * time.Second},
		{10 * time.Second, 0, 10 * time.Second, 50 * time.Second},
		{20 * time.Second, 0, 10 * time.Second, 70 * time.Second},
		{time.Hour, 0, 10 * time.Second, 2*time.Hour + 30*time.Second},
		// a failover shorter than a healthy heartbeat's wait: the healthy wait counts
		{5 * time.Second, 5 * time.Second, 5 * time.Second, 30 * time.Second},
		{20 * time.Second, 5 * time.Second, 10 * time.Second, 50 * time.Second},
	} {
		c := &Config{RenewInterval: Duration(tc.renew), OSDFailover: Duration(tc.failover)}
		if got := c.HeartbeatTimeout(); got != tc.want {
			t.Errorf("renew_interval %s: heartbeat timeout %s, want %s", tc.renew, got, tc.want)
		}
		if got := c.LeaseBound(); got != tc.bound {
			t.Errorf("renew_interval %s: bound %s, want %s", tc.renew, got, tc.bound)
		}
		// the heartbeat gap a healthy cluster explains (the renewal alert's threshold): the
		// bound less a read's answer
		if got := c.HeartbeatGapBound(); got != tc.bound-ClusterCallTimeout {
			t.Errorf("renew_interval %s: heartbeat gap bound %s, want %s", tc.renew, got, tc.bound-ClusterCallTimeout)
		}
	}
}
