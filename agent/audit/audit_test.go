package audit

import (
	"bytes"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
)

func TestFieldsFollowTheContract(t *testing.T) {
	e := Entry{Event: Refuse, Result: Refused, Cluster: "c1", Pool: "rbd", Namespace: "ns", Image: "img",
		Device: "/dev/rbd0", Epoch: 7, OwnerNode: "node-a", UID: 1000, PID: 42, HasPeer: true}
	f := e.Fields()
	want := map[string]string{"SYSLOG_IDENTIFIER": "rbd-owner", "RBD_OWNER_EVENT": "refuse", "RESULT": "refused",
		"RBD_CLUSTER": "c1", "RBD_POOL": "rbd", "RBD_NAMESPACE": "ns", "RBD_IMAGE": "img", "RBD_DEVICE": "/dev/rbd0",
		"RBD_CLAIM_EPOCH": "7", "RBD_OWNER_NODE": "node-a", "REQUESTER_UID": "1000", "REQUESTER_PID": "42"}
	for k, v := range want {
		if f[k] != v {
			t.Errorf("%s = %q, want %q", k, f[k], v)
		}
	}
	if len(f) != len(want) {
		t.Errorf("unexpected fields: %v", f)
	}
	if _, ok := (Entry{Event: Map}).Fields()["REQUESTER_UID"]; ok {
		t.Error("an event without a peer must not claim a requester")
	}
}

func TestTextFallbackAndRecent(t *testing.T) {
	var buf bytes.Buffer
	log := logrus.New()
	log.SetOutput(&buf)
	l := New(log, false)
	l.Record(Entry{Event: DeviceLost, Pool: "rbd", Image: "img", Device: "/dev/rbd3", Error: true})
	out := buf.String()
	for _, want := range []string{"level=error", "RBD_OWNER_EVENT=device_lost", "RBD_DEVICE=/dev/rbd3", "device_lost rbd/img: ok"} {
		if !strings.Contains(out, want) {
			t.Errorf("log line %q lacks %q", out, want)
		}
	}
	if r := l.Recent(); len(r) != 1 || r[0].Event != DeviceLost {
		t.Fatalf("recent: %+v", r)
	}
}
