// Package claimapi turns claim records into the API's form: one conversion, for the map's reply and the
// admin listings.
package claimapi

import (
	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/claim"
)

// Of is a claim record in the API's form (nil for none).
func Of(clusterID string, r *claim.Record) *api.Claim {
	if r == nil {
		return nil
	}
	c := &api.Claim{Cluster: clusterID, ClusterFSID: r.ClusterFSID, Pool: r.Pool, Namespace: r.Namespace, Image: r.Image,
		ImageID: r.ImageID, Access: string(r.Access), Epoch: r.Epoch, Holders: []api.Holder{}}
	for _, h := range r.Holders {
		c.Holders = append(c.Holders, api.Holder{NodeID: h.NodeID, Hostname: h.Hostname, NodeAddr: h.NodeAddr, ClientAddr: h.ClientAddr,
			Device: h.Device, ReadOnly: h.ReadOnly, Epoch: h.Epoch, AcquiredAt: h.AcquiredAt, RenewedAt: h.RenewedAt,
			LeaseSeconds: h.LeaseSeconds, AgentVersion: h.AgentVersion, Fenced: h.Fenced})
	}
	for _, in := range r.Intruders {
		c.Intruders = append(c.Intruders, Intruder(in))
	}
	for _, f := range r.Fences {
		c.Fences = append(c.Fences, api.Fence{NodeID: f.NodeID, Addr: f.Addr, Epoch: f.Epoch, At: f.At, By: f.By, Expires: f.Expires,
			BootID: f.BootID, RenewedAt: f.RenewedAt, RenewedBy: f.RenewedBy, Gone: f.Gone, GoneAt: f.GoneAt})
	}
	return c
}

// Intruder is a fenced intruder in the API's form.
func Intruder(in claim.Intruder) api.Intruder {
	return api.Intruder{NodeID: in.NodeID, Device: in.Device, ClientAddr: in.Addr, SharedClient: in.SharedClient,
		Holders: in.Holders, FencedAt: in.At, Expires: in.Expires}
}
