package daemon

import (
	"strings"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/fault"
)

// listText is ": a, b" or "".
func listText(items []string) string {
	if len(items) == 0 {
		return ""
	}
	return ": " + strings.Join(items, ", ")
}

// sinceText is how a problem says since when it has held, in the cluster-neutral UTC.
func sinceText(t time.Time) string { return api.SinceText(t) }

// errInvalid is the fault class of a request refused as invalid (an unknown cluster, say).
var errInvalid = fault.ErrInvalid
