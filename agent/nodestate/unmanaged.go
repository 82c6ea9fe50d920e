package nodestate

import (
	"fmt"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
)

// Unmanaged is a device this agent did not map, and what was decided about it.
type Unmanaged struct {
	Dev     krbd.Device
	Cluster string // "" until its cluster is known
	Owner   string // the node that held its image when judged ("" when free)
	Verdict claim.Action
	Why     string
	// FencedAt is when this agent last blocklisted its client; FencedUntil when that ends.
	FencedAt, FencedUntil time.Time
	// Pending: not judged yet, because its claim has not been read (its cluster is not
	// connected yet, or did not answer): nothing is said about it but that, least of all
	// advice to unmap it, which may be a healthy mapping this agent will adopt back.
	Pending  bool
	FenceErr string // a fence verdict whose blocklisting failed: why (it can still write)
	Inflight bool   // a judgement of a pending device is under way
	// Since is when this device was first noted (kept while it stays noted).
	Since time.Time
	// Unfenceable: it can write to an image held elsewhere and could not be fenced alone
	Unfenceable bool
}

// Problem is the device's line in status.
func (u Unmanaged) Problem() string {
	switch {
	case u.Verdict == claim.FenceIntruder && u.FenceErr != "":
		return fmt.Sprintf("mapped outside rbd-owner while %s, and NOT fenced: %s; the agent retries; unmap it now", u.Why, u.FenceErr)
	case u.Pending:
		return "not checked yet: mapped outside this agent's records, and its claim has not been read (" + u.Why + "); the agent checks it once it can"
	case u.Verdict == claim.FenceIntruder && !u.FencedAt.IsZero():
		return fmt.Sprintf("mapped outside rbd-owner and FENCED (client %s blocklisted until %s): %s; unmap it, then `rbd-owner unfence %s`",
			u.Dev.ClientAddr, u.FencedUntil.UTC().Format(time.RFC3339), u.Why, u.Dev.Spec().Head())
	case u.Why != "":
		return "mapped outside rbd-owner: no claim protects it: " + u.Why
	}
	return "mapped outside rbd-owner: no claim protects it"
}

// UnmanagedOf is what was decided about dv (the same device id and client), if anything.
func (n *Node) UnmanagedOf(dv krbd.Device) (Unmanaged, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	u, ok := n.unmanaged[dv.ID]
	if !ok || u.Dev.ClientAddr != dv.ClientAddr {
		return Unmanaged{}, false
	}
	return u, true
}

// NoteUnmanaged records what was decided about a device, keeping since when it was first
// noted; it returns what was recorded before for this very device (seen).
func (n *Node) NoteUnmanaged(u Unmanaged) (old Unmanaged, seen bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	old, seen = n.unmanaged[u.Dev.ID]
	seen = seen && old.Dev.ClientAddr == u.Dev.ClientAddr
	u.Since = time.Now()
	if seen {
		u.Since = old.Since
	}
	n.unmanaged[u.Dev.ID] = u
	return old, seen
}

// NotePending notes a device whose claim has not been read yet, and why (a judgement already
// made stands meanwhile). With start, it also says whether the caller is to start a judgement
// (which ends with Judged): not while one is in flight, nor for a judged device.
func (n *Node) NotePending(dv krbd.Device, why string, start bool) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	old, seen := n.unmanaged[dv.ID]
	seen = seen && old.Dev.ClientAddr == dv.ClientAddr
	if seen && !old.Pending {
		return false // judged before: that stands until its cluster answers again
	}
	if seen && old.Inflight && start {
		return false
	}
	u := Unmanaged{Dev: dv, Pending: true, Why: why, Inflight: start || (seen && old.Inflight), Since: time.Now()}
	if seen {
		u.Since = old.Since
	}
	n.unmanaged[dv.ID] = u
	return start
}

// Judged ends the judgement in flight of a device (NotePending).
func (n *Node) Judged(dv krbd.Device) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if u, ok := n.unmanaged[dv.ID]; ok && u.Dev.ClientAddr == dv.ClientAddr {
		u.Inflight = false
		n.unmanaged[dv.ID] = u
	}
}

// ForgetUnmanaged drops what was noted of device id (unmapped, or adopted).
func (n *Node) ForgetUnmanaged(id int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.unmanaged, id)
}

// UnmanagedDevices lists the devices noted, in device id order.
func (n *Node) UnmanagedDevices() []Unmanaged {
	n.mu.Lock()
	out := make([]Unmanaged, 0, len(n.unmanaged))
	for _, u := range n.unmanaged {
		out = append(out, u)
	}
	n.mu.Unlock()
	sortUnmanaged(out)
	return out
}
