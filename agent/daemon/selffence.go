package daemon

import (
	"github.com/rbd-owner/rbd-owner/agent/saga"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// selfFencedNote is what a lost claim's status problem adds about the fence that
// saga.Sagas.KeepFenced keeps on m's mapping ("" when it keeps none for this very mapping).
func (r *renewer) selfFencedNote(m state.Mapping) string {
	f, ok := r.node.SelfFenceOf(m.Key)
	if !ok || f.Addr != m.ClientAddr || m.ClientAddr == "" {
		return ""
	}
	return "; " + saga.SelfFenceText(f)
}
