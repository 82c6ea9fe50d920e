package daemon

import (
	"fmt"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/state"
)

// selfFence is the blocklist entry keepFenced made for this node's own lost mapping: until is
// when it ends as the monitors recorded it, on their clock (not this node's).
type selfFence struct {
	addr, device string
	until        time.Time
}

func (f selfFence) String() string {
	return fmt.Sprintf("its client %s is kept blocklisted until %s (the monitors' expiry); unmap %s", f.addr, f.until.UTC().Format(time.RFC3339), f.device)
}

// selfFencedNote is what a lost claim's status problem adds about the fence keepFenced keeps on
// m's mapping ("" when it keeps none for this very mapping).
func (d *Daemon) selfFencedNote(m state.Mapping) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	f, ok := d.selfFencedUntil[m.Key]
	if !ok || f.addr != m.ClientAddr || m.ClientAddr == "" {
		return ""
	}
	return "; " + f.String()
}
