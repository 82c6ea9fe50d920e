package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/rbd-owner/rbd-owner/agent/api"
)

// imageOrNode checks the arguments of fence and unfence: an image, or none with --node.
func imageOrNode(cmd *cobra.Command, args []string) error {
	if cmd.Flags().Changed("node") {
		return wantArgs()(cmd, args)
	}
	return wantArgs(argImageSpec+" (or --node NODE)")(cmd, args)
}

// imageRequest is the request for the image of a fence, unfence or release.
func imageRequest(cluster, arg string) (api.ImageRequest, error) {
	spec, err := parseSpec(arg, false)
	if err != nil {
		return api.ImageRequest{}, err
	}
	return api.ImageRequest{Cluster: cluster, Pool: spec.Pool, Namespace: spec.Namespace, Image: spec.Image}, nil
}

func (a *app) fenceCommand() *cobra.Command {
	var cluster, node string
	cmd := &cobra.Command{
		Use:     "fence (" + argImageSpec + " | --node NODE)",
		GroupID: groupAdmin,
		Short:   "Blocklist the holders of an image, or every hold of a dead node",
		Long: `Fence the holders of an image: blocklist each holder's mapping (its exact client address) on
the cluster and mark it fenced in the claim, so that it can neither write nor renew. The next
map of the image on any node then takes it over, whatever the takeover policy; or
release --force frees it.

With --node NODE, every hold of that node in the cluster, found through the holds listed in its
heartbeats: rbd-owner claims --node NODE shows the same set first. A fence that could not read
a pool says INCOMPLETE and exits 1: run it again, or fence those images one at a time. Once
every hold the node's heartbeats list was taken over or released, it fences nothing, says so
and exits 0; a node whose heartbeats list no hold at all is not found (exit 1).`,
		Example: `  # a dead node held rbd/pvc-123: fence it, then map the image here (or release --force it)
  rbd-owner fence rbd/pvc-123

  # every hold of the dead node node-a, in the cluster ceph-a
  rbd-owner fence --node node-a --cluster ceph-a`,
		Args:              imageOrNode,
		ValidArgsFunction: a.completeImages(false),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("node") {
				return a.runFenceNode(cmd.Context(), cluster, node)
			}
			req, err := imageRequest(cluster, args[0])
			if err != nil {
				return err
			}
			return a.runFence(cmd.Context(), req, args[0])
		},
	}
	cmd.Flags().StringVar(&cluster, "cluster", "", clusterUsage)
	cmd.Flags().StringVar(&node, "node", "", "fence every hold of this dead `NODE` (its node_id) instead of an image")
	a.addJSON(cmd, "the answer")
	a.completeClusters(cmd)
	must(cmd.RegisterFlagCompletionFunc("node", cobra.NoFileCompletions))
	return cmd
}

func (a *app) runFence(ctx context.Context, req api.ImageRequest, arg string) error {
	resp, err := a.client().Fence(ctx, req)
	if err != nil {
		return err
	}
	if a.out.json {
		return printJSON(a.out, resp)
	}
	fmt.Fprintf(a.out, "fenced %s until %s; next: map %s on the node that should have it (the map takes the fenced hold over), or free it with rbd-owner release --force %s\n",
		strings.Join(resp.FencedAddrs, ", "), resp.Expires.Format(time.RFC3339), arg, arg)
	return nil
}

// runFenceNode is `fence --node NODE`: every hold of NODE, cluster-wide.
func (a *app) runFenceNode(ctx context.Context, cluster, node string) error {
	if node == "" {
		return usageError{"fence --node: name the node (its node_id, as `rbd-owner claims` shows it)"}
	}
	resp, err := a.client().Fence(ctx, api.ImageRequest{Cluster: cluster, Node: node})
	if err != nil {
		return err
	}
	if a.out.json {
		if err := printJSON(a.out, resp); err != nil {
			return err
		}
	} else if resp.Note != "" {
		fmt.Fprintln(a.out, resp.Note)
	} else {
		for _, h := range resp.Holds {
			again := ""
			if h.Again {
				again = " (fenced already: entry added again)"
			}
			fmt.Fprintf(a.out, "fenced %s on %s (epoch %d) until %s%s\n", h.Addr, h.Ref, h.Epoch, h.Expires.Format(time.RFC3339), again)
		}
		fmt.Fprintf(a.out, "node %s: %d holds fenced; the next map of each image by any node takes it over (no release --force needed)\n", resp.Node, len(resp.Holds))
	}
	if len(resp.Incomplete) > 0 {
		return fmt.Errorf("fence --node %s is INCOMPLETE, %d not found or not fenced (run it again, or fence those images one at a time): %s",
			node, len(resp.Incomplete), strings.Join(resp.Incomplete, "; "))
	}
	return nil
}

func (a *app) unfenceCommand() *cobra.Command {
	var req api.UnfenceNodeRequest
	cmd := &cobra.Command{
		Use:     "unfence (" + argImageSpec + " | --node NODE [--force])",
		GroupID: groupAdmin,
		Short:   "Lift the fence of this node's unmapped intruders, or a rebooted node's whole-node fences",
		Long: `Lift the fence on this node's intruders of an image: mappings made outside rbd-owner while
another node held the image, which the agent fenced. Unmap the device first
(rbd unmap -o force /dev/rbdN): it is refused while the device is still mapped.

With --node NODE, lift the whole-node fences (ip:0/0) of that node, found in the claims of every
pool of the cluster: refused unless the node's liveness record shows a boot after the fence,
or with --force (you know it rebooted or is off; audited at warning priority). Lift them only
when nothing of that node can still write, then restart the agent on that node.`,
		Example: `  # on the node of the intruder, once its device is unmapped
  rbd-owner unfence rbd/pvc-123

  # node-a rebooted after a takeover fenced its whole node
  rbd-owner unfence --node node-a

  # node-a is off for good, or you know it rebooted
  rbd-owner unfence --node node-a --force`,
		Args:              imageOrNode,
		ValidArgsFunction: a.completeImages(false),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("node") {
				return a.runUnfenceNode(cmd.Context(), req)
			}
			if req.Force {
				return usageError{"--force is for unfence --node NODE"}
			}
			ireq, err := imageRequest(req.Cluster, args[0])
			if err != nil {
				return err
			}
			return a.runUnfence(cmd.Context(), ireq)
		},
	}
	cmd.Flags().StringVar(&req.Cluster, "cluster", "", clusterUsage)
	cmd.Flags().StringVar(&req.Node, "node", "", "lift the whole-node fences of this `NODE` (its node_id) instead")
	cmd.Flags().BoolVar(&req.Force, "force", false, "with --node: lift them although the node was not seen rebooted")
	a.addJSON(cmd, "the answer")
	a.completeClusters(cmd)
	must(cmd.RegisterFlagCompletionFunc("node", cobra.NoFileCompletions))
	return cmd
}

func (a *app) runUnfence(ctx context.Context, req api.ImageRequest) error {
	resp, err := a.client().Unfence(ctx, req)
	if err != nil {
		return err
	}
	if a.out.json {
		return printJSON(a.out, resp)
	}
	for _, in := range resp.Unfenced {
		fmt.Fprintf(a.out, "unfenced %s (client %s, fenced %s)\n", in.Device, in.ClientAddr, in.FencedAt.Format(time.RFC3339))
	}
	return nil
}

// runUnfenceNode is `unfence --node NODE [--force]`: the whole-node fences of NODE.
func (a *app) runUnfenceNode(ctx context.Context, req api.UnfenceNodeRequest) error {
	if req.Node == "" {
		return usageError{"unfence --node: name the node"}
	}
	resp, err := a.client().UnfenceNode(ctx, req)
	if err != nil {
		return err
	}
	if a.out.json {
		return printJSON(a.out, resp)
	}
	for _, f := range resp.Fences {
		how := "FORCED (not seen rebooted)"
		if f.Rebooted != "" {
			how = f.Rebooted
		}
		fmt.Fprintf(a.out, "lifted %s on %s (fenced %s by %s): %s\n", f.Addr, f.Ref, f.FencedAt.Format(time.RFC3339), f.FencedBy, how)
	}
	return nil
}

func (a *app) releaseCommand() *cobra.Command {
	var cluster string
	var force bool
	cmd := &cobra.Command{
		Use:     "release [--force] " + argImageSpec,
		GroupID: groupAdmin,
		Short:   "Drop this node's unused claim of an image, or (--force) a dead owner's",
		Long: `Without --force: drop this node's own claim of an image it does not map (a claim left
behind, for example after its state file was lost). It is refused while the image, or the
claim's client, is mapped on this node: unmap it instead. Group rbd-owner may do this.

With --force (admin): drop another node's claim, so that any node can map it. It is refused
unless every holder was fenced first (rbd-owner fence): --force says you know the owner is dead.`,
		Example: `  # this node's claim, left without a device
  rbd-owner release rbd/pvc-123

  # a dead node's claim, once fenced
  rbd-owner fence rbd/pvc-123
  rbd-owner release --force rbd/pvc-123`,
		Args:              wantArgs(argImageSpec),
		ValidArgsFunction: a.completeImages(false),
		RunE: func(cmd *cobra.Command, args []string) error {
			req, err := imageRequest(cluster, args[0])
			if err != nil {
				return err
			}
			req.Force = force
			return a.runRelease(cmd.Context(), req, args[0])
		},
	}
	cmd.Flags().StringVar(&cluster, "cluster", "", clusterUsage)
	cmd.Flags().BoolVar(&force, "force", false, "drop another (fenced) node's claim (admin)")
	a.addJSON(cmd, "the answer")
	a.completeClusters(cmd)
	return cmd
}

func (a *app) runRelease(ctx context.Context, req api.ImageRequest, arg string) error {
	resp, err := a.client().Release(ctx, req)
	if err != nil {
		return err
	}
	if a.out.json {
		return printJSON(a.out, resp)
	}
	if resp.Released {
		fmt.Fprintf(a.out, "released %s\n", arg)
	} else {
		fmt.Fprintf(a.out, "%s had no claim to release\n", arg)
	}
	return nil
}
