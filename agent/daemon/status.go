package daemon

import (
	"fmt"
	"sort"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/nodestate"
	"github.com/rbd-owner/rbd-owner/agent/saga"
	"github.com/rbd-owner/rbd-owner/agent/state"
	"github.com/rbd-owner/rbd-owner/agent/version"
)

// Status is this node's view: clusters, devices (managed or not), claims held, problems.
func (d *Daemon) Status() api.Status {
	st := api.Status{Node: d.cfg.NodeID, Version: version.Version, Clusters: d.clusterStatuses(), Devices: []api.Device{},
		Problems: []string{}, ClaimsHeld: d.node.HeldCount()}
	shown := map[state.Key]bool{} // the claims whose problem a device here shows
	for _, m := range d.state.All() {
		if m.Phase != state.Mapped {
			continue
		}
		ad := api.Device{Device: m.Device, Link: saga.LinkOf(m.Ref, m.FSID), Cluster: m.Cluster, FSID: m.FSID,
			Pool: m.Pool, Namespace: m.Namespace, Image: m.Image, Snapshot: m.Snap, ClientAddr: m.ClientAddr, Managed: true,
			Epoch: m.Epoch}
		for _, o := range m.Options {
			ad.Options = append(ad.Options, api.MapOption{Option: o.Option, From: o.From})
		}
		var since time.Time
		if ad.Problem, since = d.node.Problem(m.Key); ad.Problem != "" && !since.IsZero() {
			ad.ProblemSince = &since
		}
		shown[m.Key] = ad.Problem != ""
		st.Devices = append(st.Devices, ad)
	}
	for _, u := range d.node.UnmanagedDevices() {
		st.Devices = append(st.Devices, unmanagedStatus(u))
	}
	// each device's problem as the device names it (api.Device.ProblemLine), then those of the
	// claims no device here shows
	for _, dv := range st.Devices {
		if line := dv.ProblemLine(); line != "" {
			st.Problems = append(st.Problems, line)
		}
	}
	for _, p := range d.node.Problems() {
		if !shown[p.Key] {
			st.Problems = append(st.Problems, p.Key.String()+": "+p.Msg+sinceText(p.Since))
		}
	}
	if err, since := d.state.WriteFailure(); err != nil {
		st.Problems = append(st.Problems, d.stateWriteProblem(err)+sinceText(since))
	}
	st.Problems = append(st.Problems, d.skewProblems()...)
	sort.Strings(st.Problems)
	return st
}

// unmanagedStatus is an unmanaged device's entry in status.
func unmanagedStatus(u nodestate.Unmanaged) api.Device {
	dv := u.Dev
	ad := api.Device{Device: dv.DevNode, Cluster: u.Cluster, FSID: dv.ClusterFSID, Pool: dv.Pool, Namespace: dv.Namespace,
		Image: dv.Image, Snapshot: dv.Snap, ClientAddr: dv.ClientAddr, Problem: u.Problem()}
	if !u.Since.IsZero() {
		since := u.Since
		ad.ProblemSince = &since
	}
	if u.Verdict == claim.FenceIntruder && !u.FencedAt.IsZero() {
		until := u.FencedUntil
		ad.FencedUntil = &until
	}
	return ad
}

// clusterStatuses is each configured cluster's connection and this node's address toward it,
// by cluster id.
func (d *Daemon) clusterStatuses() []api.ClusterStatus {
	ids := make([]string, 0, len(d.clusters))
	for id := range d.clusters {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	ages := d.metrics.LivenessAges()
	out := []api.ClusterStatus{}
	for _, id := range ids {
		c := d.clusters[id]
		cs := api.ClusterStatus{ID: id}
		if age, ok := ages[id]; ok {
			cs.LivenessWriteAge = new(age.Seconds())
		}
		c.mu.Lock()
		switch {
		case c.store != nil:
			cs.Connected, cs.FSID = true, c.store.FSID()
		case c.lastErr != nil:
			cs.Error = c.lastErr.Error()
		default: // not tried yet, or the first attempt is under way
			cs.Connecting = true
		}
		c.mu.Unlock()
		cs.PriorKeyMappings = c.priorKeyMappings()
		var err error
		if cs.NodeAddr, err = d.addrs.SourceFor(c.cfg.Monitors); err != nil {
			msg := "node address toward the monitors unknown: " + err.Error()
			if cs.Error != "" {
				msg = cs.Error + "; " + msg
			}
			cs.Error = msg
		}
		out = append(out, cs)
	}
	return out
}

func (d *Daemon) statusLine() string {
	s := d.Status()
	return fmt.Sprintf("STATUS=%d devices, %d claims, %d problems", len(s.Devices), s.ClaimsHeld, len(s.Problems))
}
