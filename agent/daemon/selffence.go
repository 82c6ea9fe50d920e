package daemon

import (
	"fmt"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/nodestate"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// selfFenceText says what the self-fence f of a lost mapping keeps.
func selfFenceText(f nodestate.SelfFence) string {
	return fmt.Sprintf("its client %s is kept blocklisted until %s (the monitors' expiry); unmap %s", f.Addr, f.Until.UTC().Format(time.RFC3339), f.Device)
}

// selfFencedNote is what a lost claim's status problem adds about the fence keepFenced keeps on
// m's mapping ("" when it keeps none for this very mapping).
func (d *Daemon) selfFencedNote(m state.Mapping) string {
	f, ok := d.node.SelfFenceOf(m.Key)
	if !ok || f.Addr != m.ClientAddr || m.ClientAddr == "" {
		return ""
	}
	return "; " + selfFenceText(f)
}
