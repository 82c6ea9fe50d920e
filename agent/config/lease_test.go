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
				"renew_interval (2s) + the heartbeat's deadline (2s) + its write's answer (10s) + a read's answer (10s) = 24s; " +
				"raise lease_duration above 24s"}},
		{name: "defaults", doc: "", lease: 60 * time.Second, renew: 20 * time.Second},
		{name: "defaults, written out", doc: "lease_duration: 60s\nrenew_interval: 20s\n", lease: 60 * time.Second, renew: 20 * time.Second},
		{name: "the lab's values", doc: "lease_duration: 35s\nrenew_interval: 5s\n", lease: 35 * time.Second, renew: 5 * time.Second},
		{name: "the lab's values before: 15s/5s", doc: "lease_duration: 15s\nrenew_interval: 5s\n",
			err: []string{"lease_duration: 15s is too short for renew_interval 5s", "= 30s", "raise lease_duration above 30s",
				"no renew_interval makes a lease of 20s or less safe"}},
		{name: "a lease equal to the bound", doc: "lease_duration: 30s\nrenew_interval: 5s\n",
			err: []string{"lease_duration: 30s is too short for renew_interval 5s", "= 30s", "or lower renew_interval below 5s"}},
		{name: "a lease just over the bound", doc: "lease_duration: 30001ms\nrenew_interval: 5s\n", lease: 30001 * time.Millisecond, renew: 5 * time.Second},
		{name: "the heartbeat's deadline stops at 10s: 15s", doc: "lease_duration: 45s\nrenew_interval: 15s\n",
			err: []string{"renew_interval (15s) + the heartbeat's deadline (10s) + its write's answer (10s) + a read's answer (10s) = 45s",
				"or lower renew_interval below 15s"}},
		{name: "the heartbeat's deadline stops at 10s: 46s", doc: "lease_duration: 46s\nrenew_interval: 15s\n", lease: 46 * time.Second, renew: 15 * time.Second},
		{name: "renew_interval by default a third of 45s", doc: "lease_duration: 45s\n",
			err: []string{"lease_duration: 45s is too short for renew_interval 15s"}},
		{name: "renew_interval by default a third of 46s", doc: "lease_duration: 46s\n", lease: 46 * time.Second, renew: 46 * time.Second / 3},
		{name: "a short renew_interval cannot save a lease of 20s", doc: "lease_duration: 20s\nrenew_interval: 1ms\n",
			err: []string{"lease_duration: 20s is too short for renew_interval 1ms", "= 20.002s"}},
		{name: "a lease of 25s needs renew_interval under 2.5s", doc: "lease_duration: 25s\nrenew_interval: 2400ms\n", lease: 25 * time.Second, renew: 2400 * time.Millisecond},
		{name: "90s with its default renew_interval", doc: "lease_duration: 90s\n", lease: 90 * time.Second, renew: 30 * time.Second},
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

// TestHeartbeatTimeout: renew_interval, at most 10s; the bound is built from it.
func TestHeartbeatTimeout(t *testing.T) {
	for _, tc := range []struct{ renew, want, bound time.Duration }{
		{2 * time.Second, 2 * time.Second, 24 * time.Second},
		{5 * time.Second, 5 * time.Second, 30 * time.Second},
		{10 * time.Second, 10 * time.Second, 40 * time.Second},
		{20 * time.Second, 10 * time.Second, 50 * time.Second},
		{time.Hour, 10 * time.Second, time.Hour + 30*time.Second},
	} {
		c := &Config{RenewInterval: Duration(tc.renew)}
		if got := c.HeartbeatTimeout(); got != tc.want {
			t.Errorf("renew_interval %s: heartbeat timeout %s, want %s", tc.renew, got, tc.want)
		}
		if got := c.LeaseBound(); got != tc.bound {
			t.Errorf("renew_interval %s: bound %s, want %s", tc.renew, got, tc.bound)
		}
	}
}
