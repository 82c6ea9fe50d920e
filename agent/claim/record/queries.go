package record

import (
	"fmt"
	"time"
)

// KeptFence is one live blocklist entry a record keeps: a fence or an intruder.
type KeptFence struct {
	NodeID   string
	Addr     string
	Expires  time.Time
	Intruder bool
}

// ToLift lists the gone fences whose entries this project listed and has not removed yet (not
// whole-node ones: `rbd-owner unfence --node` lifts those).
func (r *Record) ToLift() []Fence {
	if r == nil {
		return nil
	}
	var out []Fence
	for _, f := range r.Fences {
		if !f.Live() && f.Made && f.LiftedAt.IsZero() && !f.WholeNode() {
			out = append(out, f)
		}
	}
	return out
}

// Kept lists the record's live fences and intruders: what must be kept on the blocklist.
func (r *Record) Kept() []KeptFence {
	if r == nil {
		return nil
	}
	var out []KeptFence
	for _, f := range r.Fences {
		if f.Live() {
			out = append(out, KeptFence{NodeID: f.NodeID, Addr: f.Addr, Expires: f.Expires})
		}
	}
	for _, in := range r.Intruders {
		out = append(out, KeptFence{NodeID: in.NodeID, Addr: in.Addr, Expires: in.Expires, Intruder: true})
	}
	return out
}

// UnmarkFenced ends or unmarks node's hold whose fence (at addr) was lifted: a hold counts as
// fenced only while its fence is in force. After a reboot its mapping is gone, so the hold ends;
// forced, it is an ordinary hold again (its lease, and no whole-node fence of a node seen alive).
func (r *Record) UnmarkFenced(node, addr string, rebooted bool) {
	h := r.Holder(node)
	if h == nil || !h.Fenced || h.FenceAddr() != addr {
		return
	}
	if rebooted {
		r.Without(node)
		return
	}
	h.Fenced = false
}

// Described is the kept fence as a person reads it.
func (k KeptFence) Described() string {
	switch {
	case k.Intruder:
		return fmt.Sprintf("the fence of node %s's mapping %s made outside rbd-owner", k.NodeID, k.Addr)
	case Fence{Addr: k.Addr}.WholeNode():
		return fmt.Sprintf("node %s's whole-node fence %s", k.NodeID, k.Addr)
	}
	return fmt.Sprintf("node %s's fence %s", k.NodeID, k.Addr)
}
