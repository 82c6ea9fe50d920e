package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/client"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
)

// The positional arguments, as usage lines and errors name them.
const (
	argSnapSpec  = "POOL[/NAMESPACE]/IMAGE[@SNAP]"
	argImageSpec = "POOL[/NAMESPACE]/IMAGE"
)

const clusterUsage = "the cluster, by its `ID` in the config (may be left out when the config has one cluster)"

func (a *app) client() *client.Client { return client.New(a.socket) }

func parseSpec(s string, snapOK bool) (krbd.Spec, error) {
	spec, err := krbd.ParseSpec(s)
	if err != nil {
		return krbd.Spec{}, usageError{err.Error()}
	}
	if spec.Snap != "" && !snapOK {
		return krbd.Spec{}, usageError{"a snapshot cannot be given here: name the image"}
	}
	return spec, nil
}

func (a *app) mapCommand() *cobra.Command {
	var req api.MapRequest
	var noUdev bool
	cmd := &cobra.Command{
		Use:     "map " + argSnapSpec,
		GroupID: groupNode,
		Short:   "Claim an image for this node and map it (prints the device)",
		Long: `Claim the image for this node in RADOS, then map it with krbd, and print its device
(/dev/rbdN). An image this node has mapped already is not mapped twice: its device is printed.
The stable link /dev/rbd-owner/<cluster fsid>/<pool>/[<namespace>/]<image>[@<snap>] is in the
--json answer.

When another node holds the image the map is refused (exit 3), naming the holder, its epoch
and what to do: wait for its lease, map --takeover once the lease has expired, or have an admin
fence it (rbd-owner fence --node NODE, or fence the image) and map again.`,
		Example: `  # map an image for this node (rwo: one read-write holder)
  rbd-owner map rbd/pvc-123

  # a snapshot of an image in the namespace ns1, from the cluster ceph-a
  rbd-owner map --cluster ceph-a rbd/ns1/pvc-123@snap1

  # several read-write holders (block-mode live migration), for the audit trail's volume id
  rbd-owner map --access rwx --volume-id vol-7 rbd/ns1/vm-disk

  # take the image over from a node whose lease has expired (admin: fences that node's mapping)
  rbd-owner map --takeover rbd/pvc-123

  # the whole answer (device, link, claim) as JSON
  rbd-owner map --json rbd/pvc-123`,
		Args:              wantArgs(argSnapSpec),
		ValidArgsFunction: a.completeImages(true),
		RunE: func(cmd *cobra.Command, args []string) error {
			spec, err := parseSpec(args[0], true)
			if err != nil {
				return err
			}
			req.Pool, req.Namespace, req.Image, req.Snapshot = spec.Pool, spec.Namespace, spec.Image, spec.Snap
			req.Requester = "rbd-owner-cli"
			if noUdev {
				req.Options = []string{"noudev"}
			}
			return a.runMap(cmd.Context(), req)
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.Cluster, "cluster", "", clusterUsage)
	f.StringVar(&req.Access, "access", "rwo", "the access `MODE`: rwo (one read-write holder), rox (read-only holders, no writer) or rwx (several read-write holders)")
	f.BoolVar(&req.ReadOnly, "read-only", false, "map read-only")
	f.StringVar(&req.VolumeID, "volume-id", "", "the volume `ID` recorded in the audit trail")
	f.BoolVar(&req.Takeover, "takeover", false, "take the image over from a node whose lease has expired, fencing that node's mapping (admin)")
	f.BoolVar(&noUdev, "no-udev", false, "return once the kernel's device exists, without waiting for udev (the link follows)")
	a.addJSON(cmd, "the whole answer (device, link, claim)")
	a.completeClusters(cmd)
	must(cmd.RegisterFlagCompletionFunc("access", cobra.FixedCompletions([]cobra.Completion{"rwo", "rox", "rwx"}, cobra.ShellCompDirectiveNoFileComp)))
	must(cmd.RegisterFlagCompletionFunc("volume-id", cobra.NoFileCompletions))
	return cmd
}

func (a *app) runMap(ctx context.Context, req api.MapRequest) error {
	resp, err := a.client().Map(ctx, req)
	if err != nil {
		return err
	}
	if a.out.json {
		return printJSON(a.out, resp)
	}
	// the device path is the answer a script reads: a failed write of it fails the command
	_, err = fmt.Fprintln(a.out, resp.Device)
	return err
}

func (a *app) unmapCommand() *cobra.Command {
	var req api.UnmapRequest
	cmd := &cobra.Command{
		Use:     "unmap (" + argSnapSpec + " | /dev/rbdN)",
		GroupID: groupNode,
		Short:   "Unmap an image or a device and release this node's claim",
		Long: `Unmap the image (or the device /dev/rbdN) from this node and release this node's claim of
it. Unmapping what is not mapped is not an error: it says so. The device must not be open
(mounted, or in use by a process) unless --force is given.`,
		Example: `  rbd-owner unmap rbd/pvc-123
  rbd-owner unmap /dev/rbd0

  # unmap although the device is open: its in-flight I/O fails
  rbd-owner unmap --force rbd/pvc-123

  # {"unmapped": true} or {"unmapped": false}
  rbd-owner unmap --json rbd/pvc-123`,
		Args:              wantArgs(argSnapSpec + " or /dev/rbdN"),
		ValidArgsFunction: a.completeImages(true),
		RunE: func(cmd *cobra.Command, args []string) error {
			if strings.HasPrefix(args[0], "/dev/") {
				req.Device = args[0]
			} else {
				spec, err := parseSpec(args[0], true)
				if err != nil {
					return err
				}
				req.Pool, req.Namespace, req.Image, req.Snapshot = spec.Pool, spec.Namespace, spec.Image, spec.Snap
			}
			return a.runUnmap(cmd.Context(), req, args[0])
		},
	}
	cmd.Flags().StringVar(&req.Cluster, "cluster", "", clusterUsage)
	cmd.Flags().BoolVar(&req.Force, "force", false, "unmap even if the device is open (its in-flight I/O fails)")
	a.addJSON(cmd, "the answer")
	a.completeClusters(cmd)
	return cmd
}

func (a *app) runUnmap(ctx context.Context, req api.UnmapRequest, arg string) error {
	resp, err := a.client().Unmap(ctx, req)
	if err != nil {
		return err
	}
	if a.out.json {
		return printJSON(a.out, resp)
	}
	if resp.Unmapped {
		fmt.Fprintf(a.out, "unmapped %s\n", arg)
	} else {
		fmt.Fprintf(a.out, "%s was not mapped\n", arg)
	}
	return nil
}

func (a *app) statusCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "status",
		GroupID: groupNode,
		Short:   "Show this node's clusters, devices and claims, and any problem",
		Long: `Show this node's agent: its clusters, the rbd devices mapped here with their claims, and
every problem, once, as a "problem:" line (the device table's PROBLEM column marks the devices
that have one).

Exits 0 when all is well, 5 when the agent answers but reports problems (a device with a
problem, a lost claim, or a node-level problem such as a clock skew), 4 when no agent answers:
a script that asks "does the agent answer?" accepts 0 or 5; one that asks "is all well?"
wants 0. With --json the status is printed and the exit codes are the same.`,
		Example: `  rbd-owner status
  rbd-owner status --json | jq '.devices[] | {device, image, problem}'`,
		Args:              wantArgs(),
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE:              func(cmd *cobra.Command, _ []string) error { return a.runStatus(cmd.Context()) },
	}
	a.addJSON(cmd, "the status")
	return cmd
}

// runStatus prints this node's status. It exits 5 (errProblems) when the agent reports
// problems, with --json too. Each problem is printed once, as a "problem:" line: the agent's
// list already names each device's problem (by image, or by device when it is unmanaged), so
// the device table only marks the devices that have one.
func (a *app) runStatus(ctx context.Context) error {
	st, err := a.client().Status(ctx)
	if err != nil {
		return err
	}
	problems := statusProblems(st)
	if a.out.json {
		if err := printJSON(a.out, st); err != nil {
			return err
		}
	} else {
		printStatus(a.out, st, problems)
	}
	if len(problems) > 0 {
		return errProblems
	}
	return nil
}

// statusProblems is every problem of a status once: the agent's list, and the problem of any
// device the list does not name (an agent that lists only node-level problems).
func statusProblems(st *api.Status) []string {
	problems := append([]string(nil), st.Problems...)
	for _, d := range st.Devices {
		// the line the agent lists the device's problem with, made from the device's data: an
		// agent that did not list it (an older one) gets it added
		if line := d.ProblemLine(); line != "" && !slices.Contains(st.Problems, line) {
			problems = append(problems, line)
		}
	}
	return problems
}

func printStatus(out io.Writer, st *api.Status, problems []string) {
	fmt.Fprintf(out, "node %s, rbd-owner %s: %d devices, %d claims, %d problems\n", st.Node, st.Version, len(st.Devices), st.ClaimsHeld, len(problems))
	for _, cl := range st.Clusters {
		state := "connected"
		switch {
		case cl.Connected:
		case cl.Connecting:
			state = "connecting"
		default:
			state = "not connected"
			if cl.Error != "" {
				state += ": " + cl.Error
			}
		}
		if cl.PriorKeyMappings > 0 {
			state += fmt.Sprintf("; %d mappings made with a prior key (keep it until 0 on every node)", cl.PriorKeyMappings)
		}
		if cl.LivenessWriteAge != nil {
			state += fmt.Sprintf("; last liveness write %.0fs ago", *cl.LivenessWriteAge)
		}
		fmt.Fprintf(out, "cluster %s (fsid %s, node address %s): %s\n", cl.ID, dash(cl.FSID), dash(cl.NodeAddr), state)
	}
	if len(st.Devices) > 0 {
		tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "DEVICE\tIMAGE\tEPOCH\tCLIENT\tMANAGED\tPROBLEM")
		for _, d := range st.Devices {
			problem := "-"
			if d.Problem != "" {
				problem = "see below"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%v\t%s\n", d.Device, imageName(d.Pool, d.Namespace, d.Image, d.Snapshot), d.Epoch, d.ClientAddr, d.Managed, problem)
		}
		tw.Flush()
	}
	for _, d := range st.Devices {
		if len(d.Options) > 0 {
			fmt.Fprintf(out, "%s options: %s\n", d.Device, optionsText(d.Options))
		}
	}
	for _, p := range problems {
		fmt.Fprintf(out, "problem: %s\n", p)
	}
}

// claimsQuery is the flags of `claims`.
type claimsQuery struct {
	cluster, pool, node string
	prune, force        bool
}

func (a *app) claimsCommand() *cobra.Command {
	var q claimsQuery
	cmd := &cobra.Command{
		Use:     "claims",
		GroupID: groupNode,
		Short:   "List the claims of a pool, of every pool, or of one node, cluster-wide",
		Long: `List the claims of a pool (--pool), of every pool (admin), or the holds of one node
(--node: what fence --node fences), cluster-wide: each image's holders with their epoch, node,
host, client address, device and last renewal; fenced holders and intruders; the fences kept
until their mapping is gone; and orphans (claims of deleted images).

--remove-orphans removes the claims of deleted images instead (admin), as the automatic sweep
does: only free claims that keep no live fence. An image gone by name may only have been renamed
or moved to the trash, which keeps its data; so a claim still held, or keeping the live fence of
a mapping that could still write, is kept and listed with why and the next step. Check that its
image is really deleted (rbd trash ls, rbd ls), then remove it with --remove-orphans --force
(audited at warning priority).`,
		Example: `  rbd-owner claims --pool rbd
  rbd-owner claims --node node-a
  rbd-owner claims --cluster ceph-a --json
  rbd-owner claims --pool rbd --remove-orphans

  # an orphan kept: its image is neither in the trash nor renamed
  rbd trash ls --pool rbd; rbd ls --pool rbd
  rbd-owner claims --pool rbd --remove-orphans --force`,
		Args:              wantArgs(),
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE:              func(cmd *cobra.Command, _ []string) error { return a.runClaims(cmd.Context(), q) },
	}
	f := cmd.Flags()
	f.StringVar(&q.cluster, "cluster", "", clusterUsage)
	f.StringVar(&q.pool, "pool", "", "only this `POOL`")
	f.StringVar(&q.node, "node", "", "only the holds of this `NODE` (its node_id), cluster-wide")
	f.BoolVar(&q.prune, "remove-orphans", false, "remove the claims of deleted images (admin)")
	f.BoolVar(&q.force, "force", false, "with --remove-orphans: remove also the orphans still held or keeping live fences (their images really deleted)")
	a.addJSON(cmd, "the claims (or the orphans removed and kept)")
	a.completeClusters(cmd)
	must(cmd.RegisterFlagCompletionFunc("pool", cobra.NoFileCompletions))
	must(cmd.RegisterFlagCompletionFunc("node", cobra.NoFileCompletions))
	return cmd
}

func (a *app) runClaims(ctx context.Context, q claimsQuery) error {
	c := a.client()
	if q.force && !q.prune {
		return usageError{"--force is for claims --remove-orphans"}
	}
	if q.prune {
		if q.node != "" {
			return usageError{"--remove-orphans removes the orphans of a pool (--pool) or of every pool, not of a node (--node)"}
		}
		resp, err := c.RemoveOrphans(ctx, api.OrphansRequest{Cluster: q.cluster, Pool: q.pool, Force: q.force})
		if err != nil {
			return err
		}
		if a.out.json {
			return printJSON(a.out, resp)
		}
		printOrphans(a.out, resp)
		return nil
	}
	claims, err := c.ClaimsOf(ctx, q.cluster, q.pool, q.node)
	if err != nil {
		return err
	}
	if a.out.json {
		return printJSON(a.out, claims)
	}
	return printClaims(a.out, claims)
}

// printOrphans prints what claims --remove-orphans did: each claim removed, each kept with why
// and the next step, and the counts.
func printOrphans(out io.Writer, resp *api.OrphansResponse) {
	for _, r := range resp.Removed {
		fmt.Fprintf(out, "removed the orphaned claim of %s\n", r)
	}
	for _, k := range resp.Kept {
		fmt.Fprintf(out, "KEPT the orphaned claim of %s: %s; next: %s\n", k.Image, k.Why, k.NextStep)
	}
	if len(resp.Kept) > 0 {
		fmt.Fprintf(out, "%d orphaned claims removed, %d kept\n", len(resp.Removed), len(resp.Kept))
		return
	}
	fmt.Fprintf(out, "%d orphaned claims removed\n", len(resp.Removed))
}

func printClaims(out io.Writer, claims []api.Claim) error {
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "IMAGE\tACCESS\tEPOCH\tNODE\tHOST\tCLIENT\tDEVICE\tRENEWED\tNOTE")
	for _, cl := range claims {
		name := imageName(cl.Pool, cl.Namespace, cl.Image, "")
		note := ""
		if cl.Orphan {
			note = "orphan (image deleted)"
		}
		if len(cl.Holders) == 0 {
			fmt.Fprintf(tw, "%s\t-\t%d\t-\t-\t-\t-\t-\t%s\n", name, cl.Epoch, dash(note))
		}
		for _, h := range cl.Holders {
			n := note
			if h.Fenced {
				n = strings.TrimPrefix(n+", fenced", ", ")
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", name, cl.Access, h.Epoch,
				h.NodeID, h.Hostname, dash(h.ClientAddr), dash(h.Device), h.RenewedAt.Format(time.RFC3339), dash(n))
		}
		for _, in := range cl.Intruders {
			fmt.Fprintf(tw, "%s\t-\t-\t%s\t-\t%s\t%s\t%s\t%s\n", name, in.NodeID, in.ClientAddr, in.Device,
				in.FencedAt.Format(time.RFC3339), "FENCED INTRUDER: mapped outside rbd-owner while "+in.Holders+" held it; blocklisted until "+in.Expires.Format(time.RFC3339))
		}
		for _, f := range cl.Fences {
			state := "FENCE kept: blocklisted until " + f.Expires.Format(time.RFC3339) + ", renewed until its mapping is gone"
			if f.RenewedBy != "" {
				state += " (last by " + f.RenewedBy + ")"
			}
			if f.Gone != "" {
				state = "fence ended: " + f.Gone
			}
			fmt.Fprintf(tw, "%s\t-\t%d\t%s\t-\t%s\t-\t%s\t%s\n", name, f.Epoch, f.NodeID, f.Addr,
				f.At.Format(time.RFC3339), state)
		}
	}
	return tw.Flush()
}

// optionsText renders a mapping's kernel options with where each came from:
// "ms_mode=secure (cluster rbd_default_map_options (config)), queue_depth=128 (caller)".
func optionsText(opts []api.MapOption) string {
	parts := make([]string, len(opts))
	for i, o := range opts {
		parts[i] = o.Option + " (" + o.From + ")"
	}
	return strings.Join(parts, ", ")
}
