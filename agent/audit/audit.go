// Package audit writes rbd-owner's audit trail: one structured entry per event, sent to the
// systemd journal with the fields of the product contract (RBD_OWNER_EVENT, RBD_POOL, ...)
// when the journal is there, and as a plain text line through logrus otherwise. Secrets are
// never among the fields: no event carries one.
package audit

import (
	"fmt"
	"strconv"
	"sync"

	"github.com/coreos/go-systemd/v22/journal"
	"github.com/sirupsen/logrus"
)

// Event names (RBD_OWNER_EVENT).
const (
	Map             = "map"
	Unmap           = "unmap"
	Claim           = "claim"
	Renew           = "renew"
	Release         = "release"
	Refuse          = "refuse"
	Takeover        = "takeover"
	Fence           = "fence"
	DeviceLost      = "device_lost"
	UnmanagedDevice = "unmanaged_device"
	Denied          = "denied"
	StateRebuilt    = "state_rebuilt"
)

// Results (RESULT).
const (
	OK      = "ok"
	Refused = "refused"
	Failed  = "failed"
	// for unmanaged_device: what was done with a mapping made outside rbd-owner
	Fenced   = "fenced"
	Adopted  = "adopted"
	Reported = "reported"
)

// Entry is one audit event.
type Entry struct {
	Event     string
	Result    string
	Message   string
	Cluster   string
	Pool      string
	Namespace string
	Image     string
	Device    string
	Epoch     uint64
	OwnerNode string
	// UID and PID of the API caller; -1 (or 0 with HasPeer false) when there is none.
	UID, PID int
	HasPeer  bool
	// Error priority: something that needs a person (a lost claim, a device lost).
	Error bool
	// Warning priority.
	Warning bool
}

// Fields returns the journal fields of the entry (without MESSAGE and PRIORITY).
func (e Entry) Fields() map[string]string {
	f := map[string]string{
		"SYSLOG_IDENTIFIER": "rbd-owner",
		"RBD_OWNER_EVENT":   e.Event,
		"RESULT":            e.Result,
	}
	set := func(k, v string) {
		if v != "" {
			f[k] = v
		}
	}
	set("RBD_CLUSTER", e.Cluster)
	set("RBD_POOL", e.Pool)
	set("RBD_NAMESPACE", e.Namespace)
	set("RBD_IMAGE", e.Image)
	set("RBD_DEVICE", e.Device)
	set("RBD_OWNER_NODE", e.OwnerNode)
	if e.Epoch > 0 {
		f["RBD_CLAIM_EPOCH"] = strconv.FormatUint(e.Epoch, 10)
	}
	if e.HasPeer {
		f["REQUESTER_UID"] = strconv.Itoa(e.UID)
		f["REQUESTER_PID"] = strconv.Itoa(e.PID)
	}
	return f
}

// Sink receives entries; the journal in production, a recorder in tests.
type Sink func(e Entry)

// Log is the audit trail. The zero value is not usable; use New.
type Log struct {
	log  *logrus.Logger
	sink Sink
	mu   sync.Mutex
	// Recent keeps the last entries for status and tests.
	recent []Entry
}

// New returns an audit trail that sends to the journal when it is available (useJournal and
// journal.Enabled()) and otherwise logs a text line through log.
func New(log *logrus.Logger, useJournal bool) *Log {
	l := &Log{log: log}
	if useJournal && journal.Enabled() {
		l.sink = toJournal(log)
	} else {
		l.sink = l.toLogrus
	}
	return l
}

// NewWithSink returns an audit trail that sends every entry to sink (tests).
func NewWithSink(log *logrus.Logger, sink Sink) *Log { return &Log{log: log, sink: sink} }

const keepRecent = 256

// Record writes one entry.
func (l *Log) Record(e Entry) {
	if e.Result == "" {
		e.Result = OK
	}
	if e.Message == "" {
		e.Message = defaultMessage(e)
	}
	l.mu.Lock()
	l.recent = append(l.recent, e)
	if len(l.recent) > keepRecent {
		l.recent = l.recent[len(l.recent)-keepRecent:]
	}
	l.mu.Unlock()
	l.sink(e)
}

// Recent returns a copy of the last entries, oldest first.
func (l *Log) Recent() []Entry {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Entry(nil), l.recent...)
}

func defaultMessage(e Entry) string {
	img := e.Pool + "/"
	if e.Namespace != "" {
		img += e.Namespace + "/"
	}
	img += e.Image
	return fmt.Sprintf("%s %s: %s", e.Event, img, e.Result)
}

func priority(e Entry) journal.Priority {
	switch {
	case e.Error:
		return journal.PriErr
	case e.Warning || e.Result == Refused || e.Result == Failed:
		return journal.PriWarning
	}
	return journal.PriInfo
}

func toJournal(log *logrus.Logger) Sink {
	return func(e Entry) {
		if err := journal.Send(e.Message, priority(e), e.Fields()); err != nil {
			log.WithError(err).Warn("audit: journal send failed; the entry follows")
			log.WithFields(logrusFields(e)).Info(e.Message)
		}
	}
}

func (l *Log) toLogrus(e Entry) {
	entry := l.log.WithFields(logrusFields(e))
	switch priority(e) {
	case journal.PriErr:
		entry.Error(e.Message)
	case journal.PriWarning:
		entry.Warn(e.Message)
	default:
		entry.Info(e.Message)
	}
}

func logrusFields(e Entry) logrus.Fields {
	f := logrus.Fields{}
	for k, v := range e.Fields() {
		if k != "SYSLOG_IDENTIFIER" {
			f[k] = v
		}
	}
	return f
}
