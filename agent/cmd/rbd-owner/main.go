// Command rbd-owner is the node agent (`rbd-owner daemon`) and its command-line client
// (every other subcommand). See README.md, docs/api.md and the product contract for the CLI.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/client"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/version"
)

// Exit codes from the product contract.
const (
	exitOK          = 0
	exitFailed      = 1
	exitUsage       = 2
	exitClaimed     = 3
	exitUnreachable = 4
	// exitProblems: `status` got the agent's answer, and it reports problems (a device with a
	// problem, a lost claim, or a node-level problem such as a clock skew).
	exitProblems = 5
)

const usage = `usage: rbd-owner [--socket PATH] <command> [flags]

commands:
  daemon  [--config PATH]                                   run the node agent
  check-config [--config PATH]                              would the agent start with this config? (exit 0 or 1)
  map     [--cluster ID] [--access rwo|rox|rwx] [--read-only] [--volume-id ID] [--takeover] [--no-udev] POOL[/NAMESPACE]/IMAGE[@SNAP]
  unmap   [--cluster ID] [--force] (POOL[/NAMESPACE]/IMAGE[@SNAP] | /dev/rbdN)
  status  [--json]                                          this node's devices and claims
  claims  [--cluster ID] [--pool POOL] [--node NODE] [--json] [--remove-orphans]   the claims of a pool, cluster-wide, or of one node
  fence   [--cluster ID] POOL[/NAMESPACE]/IMAGE             blocklist the owner's mapping (admin)
  fence   [--cluster ID] --node NODE                        blocklist every hold of a dead node (admin)
  release [--cluster ID] --force POOL[/NAMESPACE]/IMAGE     drop a dead owner's claim (admin, after fence)
  unfence [--cluster ID] POOL[/NAMESPACE]/IMAGE             lift the fence on this node's unmapped intruders (admin)
  unfence [--cluster ID] --node NODE [--force]              lift a node's whole-node fences once it rebooted (admin)
  version                                                   print the version

exit codes: 0 done, 1 failed, 2 usage error, 3 held by another node, 4 agent not reachable,
            5 status: the agent answers but reports problems (listed as "problem:" lines)
with --json, stdout is one JSON document: the answer, or the error as {"error": {"code", "message", ...}}
(code "unreachable" when no agent answers); stderr stays empty; the exit codes are the same
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// usageError is a mistake on the command line (exit 2).
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// errProblems: `status` printed the agent's answer, which reports problems (exit 5, nothing more
// on stderr: the answer lists them).
var errProblems = errors.New("the agent reports problems")

// output is where a command prints its answer. json says its errors are printed there too, as
// the API's error object: set from a scan of the arguments before the command parses them (so
// that a usage error after --json is JSON too), then from the parsed flag.
type output struct {
	io.Writer
	json bool
}

// takesJSON: the commands with a --json flag.
var takesJSON = map[string]bool{"map": true, "unmap": true, "status": true, "claims": true, "fence": true, "unfence": true, "release": true}

func run(args []string, stdout, stderr io.Writer) int {
	global := flag.NewFlagSet("rbd-owner", flag.ContinueOnError)
	global.SetOutput(io.Discard)
	socket := global.String("socket", api.DefaultSocket, "API socket")
	if err := global.Parse(args); err != nil {
		fmt.Fprintf(stderr, "rbd-owner: %v\n%s", err, usage)
		return exitUsage
	}
	args = global.Args()
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	cmd, rest := args[0], args[1:]
	out := &output{Writer: stdout, json: takesJSON[cmd] && jsonRequested(rest)}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch cmd {
	case "version", "--version":
		fmt.Fprintf(stdout, "rbd-owner %s\n", version.Version)
		return exitOK
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return exitOK
	case "daemon":
		err = runDaemon(rest)
	case "check-config":
		err = runCheckConfig(rest, stdout)
	case "map":
		err = runMap(ctx, client.New(*socket), rest, out)
	case "unmap":
		err = runUnmap(ctx, client.New(*socket), rest, out)
	case "status":
		err = runStatus(ctx, client.New(*socket), rest, out)
	case "claims":
		err = runClaims(ctx, client.New(*socket), rest, out)
	case "fence":
		err = runFence(ctx, client.New(*socket), rest, out)
	case "unfence":
		err = runUnfence(ctx, client.New(*socket), rest, out)
	case "release":
		err = runRelease(ctx, client.New(*socket), rest, out)
	default:
		fmt.Fprintf(stderr, "rbd-owner: unknown command %q\n%s", cmd, usage)
		return exitUsage
	}
	return report(cmd, err, out, stderr)
}

// jsonRequested says whether the arguments ask for --json (-json, --json=BOOL; the last one
// wins), before they are parsed.
func jsonRequested(args []string) bool {
	on := false
	for _, a := range args {
		if a == "--" {
			break
		}
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, val, hasVal := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "=")
		if name != "json" {
			continue
		}
		b, err := strconv.ParseBool(val)
		on = !hasVal || err != nil || b
	}
	return on
}

// report picks the exit code and reports the error: one line a person can act on, on stderr;
// or, under --json, the error object alone on stdout.
func report(cmd string, err error, out *output, stderr io.Writer) int {
	if err == nil {
		return exitOK
	}
	if errors.Is(err, errProblems) {
		return exitProblems
	}
	code, obj, msg := classify(err)
	if out.json {
		if printJSON(out, api.ErrorBody{Error: obj}) == nil {
			return code
		}
	}
	fmt.Fprintf(stderr, "rbd-owner %s: %s\n", cmd, msg)
	return code
}

// classify returns an error's exit code, its error object (the agent's own, or one made here
// with the same fields) and the line a person reads.
func classify(err error) (int, *api.Error, string) {
	var ue usageError
	if errors.As(err, &ue) {
		return exitUsage, &api.Error{Code: api.CodeInvalidArgument, Message: ue.msg}, ue.msg
	}
	if errors.Is(err, client.ErrUnreachable) {
		msg := fmt.Sprintf("%v (is the agent running? systemctl status rbd-owner)", err)
		return exitUnreachable, &api.Error{Code: client.CodeUnreachable, Message: msg}, msg
	}
	var ae *api.Error
	if errors.As(err, &ae) {
		msg := ae.Message
		switch ae.Code {
		case api.CodeClaimedElsewhere:
			if o := ae.Owner; o != nil {
				// "acquire rbd/img: rbd/img is held (rwo) by …": name the image once
				what := "the image"
				if before, _, ok := strings.Cut(msg, " is held"); ok {
					if f := strings.Fields(before); len(f) > 0 {
						what = f[len(f)-1]
					}
				}
				msg = fmt.Sprintf("%s is held by node %s (host %s) at epoch %d since %s",
					what, o.NodeID, o.Hostname, o.Epoch, o.AcquiredAt.Format(time.RFC3339))
				// the agent's own next step, phrased for this caller and the policy, follows the
				// first "; " of its message: kept whole, in place of the generic advice below
				_, reason, hasReason := strings.Cut(ae.Message, "; ")
				switch {
				case hasReason && o.Expired:
					msg += fmt.Sprintf(" (lease expired: its heartbeat has not changed for %.0fs on this node's clock); %s", o.LeaseAge, reason)
				case hasReason && ae.RetryAfterSeconds > 0:
					msg += fmt.Sprintf(" (live: watching node %s's lease; a takeover is possible in %ds unless it renews); %s", o.NodeID, ae.RetryAfterSeconds, reason)
				case hasReason:
					msg += " (live); " + reason
				case o.Expired:
					msg += fmt.Sprintf(" (lease expired: its heartbeat has not changed for %.0fs on this node's clock; map with --takeover to fence it and take over)", o.LeaseAge)
				case ae.RetryAfterSeconds > 0:
					msg += fmt.Sprintf(" (live: watching node %s's lease; a takeover is possible in %ds unless it renews; if that node is dead, retry with --takeover then, or run `rbd-owner fence` and `rbd-owner release --force`)", o.NodeID, ae.RetryAfterSeconds)
				default:
					msg += " (live: if that node is dead, run `rbd-owner fence` and `rbd-owner release --force` first)"
				}
			}
			return exitClaimed, ae, msg
		case api.CodePermissionDenied:
			return exitFailed, ae, msg
		}
		return exitFailed, ae, fmt.Sprintf("%s (%s)", msg, ae.Code)
	}
	return exitFailed, &api.Error{Code: client.Code(err), Message: err.Error()}, err.Error()
}

func flags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// parse parses flags anywhere on the line and returns the positional arguments.
func parse(fs *flag.FlagSet, args []string, positional int) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, usageError{err.Error()}
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
	if len(pos) != positional {
		return nil, usageError{fmt.Sprintf("want %d argument(s), got %d: %q", positional, len(pos), pos)}
	}
	return pos, nil
}

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

func runMap(ctx context.Context, c *client.Client, args []string, out *output) error {
	fs := flags("map")
	cluster := fs.String("cluster", "", "cluster id from the config")
	access := fs.String("access", "rwo", "rwo, rox or rwx")
	ro := fs.Bool("read-only", false, "map read-only")
	vol := fs.String("volume-id", "", "volume id for the audit trail")
	takeover := fs.Bool("takeover", false, "take over from a node whose lease has expired (fences it)")
	noUdev := fs.Bool("no-udev", false, "return once the kernel's device exists, without waiting for udev (its link follows)")
	asJSON := fs.Bool("json", false, "print the whole answer as JSON")
	pos, err := parse(fs, args, 1)
	if err != nil {
		return err
	}
	out.json = *asJSON
	spec, err := parseSpec(pos[0], true)
	if err != nil {
		return err
	}
	req := api.MapRequest{Cluster: *cluster, Pool: spec.Pool, Namespace: spec.Namespace, Image: spec.Image,
		Snapshot: spec.Snap, Access: *access, ReadOnly: *ro, VolumeID: *vol, Requester: "rbd-owner-cli", Takeover: *takeover}
	if *noUdev {
		req.Options = []string{"noudev"}
	}
	resp, err := c.Map(ctx, req)
	if err != nil {
		return err
	}
	if out.json {
		return printJSON(out, resp)
	}
	// the device path is the answer a script reads: a failed write of it fails the command
	_, err = fmt.Fprintln(out, resp.Device)
	return err
}

func runUnmap(ctx context.Context, c *client.Client, args []string, out *output) error {
	fs := flags("unmap")
	cluster := fs.String("cluster", "", "cluster id from the config")
	force := fs.Bool("force", false, "unmap even if the device is open (I/O in flight fails)")
	asJSON := fs.Bool("json", false, "print the answer as JSON")
	pos, err := parse(fs, args, 1)
	if err != nil {
		return err
	}
	out.json = *asJSON
	req := api.UnmapRequest{Cluster: *cluster, Force: *force}
	if strings.HasPrefix(pos[0], "/dev/") {
		req.Device = pos[0]
	} else {
		spec, err := parseSpec(pos[0], true)
		if err != nil {
			return err
		}
		req.Pool, req.Namespace, req.Image, req.Snapshot = spec.Pool, spec.Namespace, spec.Image, spec.Snap
	}
	resp, err := c.Unmap(ctx, req)
	if err != nil {
		return err
	}
	if out.json {
		return printJSON(out, resp)
	}
	if resp.Unmapped {
		fmt.Fprintf(out, "unmapped %s\n", pos[0])
	} else {
		fmt.Fprintf(out, "%s was not mapped\n", pos[0])
	}
	return nil
}

// runStatus prints this node's status. It exits 5 (errProblems) when the agent reports
// problems, with --json too. Each problem is printed once, as a "problem:" line: the agent's
// list already names each device's problem (by image, or by device when it is unmanaged), so
// the device table only marks the devices that have one.
func runStatus(ctx context.Context, c *client.Client, args []string, out *output) error {
	fs := flags("status")
	asJSON := fs.Bool("json", false, "JSON output")
	if _, err := parse(fs, args, 0); err != nil {
		return err
	}
	out.json = *asJSON
	st, err := c.Status(ctx)
	if err != nil {
		return err
	}
	problems := statusProblems(st)
	if out.json {
		if err := printJSON(out, st); err != nil {
			return err
		}
	} else {
		printStatus(out, st, problems)
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
		if d.Problem == "" {
			continue
		}
		img := imageName(d.Pool, d.Namespace, d.Image, d.Snapshot)
		listed := false
		for _, p := range st.Problems {
			if strings.Contains(p, d.Problem) && (strings.Contains(p, d.Device) || strings.Contains(p, img)) {
				listed = true
				break
			}
		}
		if !listed {
			problems = append(problems, d.Device+" ("+img+"): "+d.Problem)
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
	for _, p := range problems {
		fmt.Fprintf(out, "problem: %s\n", p)
	}
}

func runClaims(ctx context.Context, c *client.Client, args []string, out *output) error {
	fs := flags("claims")
	cluster := fs.String("cluster", "", "cluster id from the config")
	pool := fs.String("pool", "", "only this pool")
	node := fs.String("node", "", "only the holds of this node, cluster-wide (what fence --node fences)")
	asJSON := fs.Bool("json", false, "JSON output")
	prune := fs.Bool("remove-orphans", false, "remove the claims of deleted images (admin)")
	if _, err := parse(fs, args, 0); err != nil {
		return err
	}
	out.json = *asJSON
	if *prune {
		resp, err := c.RemoveOrphans(ctx, api.OrphansRequest{Cluster: *cluster, Pool: *pool})
		if err != nil {
			return err
		}
		if out.json {
			return printJSON(out, resp)
		}
		for _, r := range resp.Removed {
			fmt.Fprintf(out, "removed the orphaned claim of %s\n", r)
		}
		fmt.Fprintf(out, "%d orphaned claims removed\n", len(resp.Removed))
		return nil
	}
	claims, err := c.ClaimsOf(ctx, *cluster, *pool, *node)
	if err != nil {
		return err
	}
	if out.json {
		return printJSON(out, claims)
	}
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "IMAGE\tACCESS\tEPOCH\tNODE\tHOST\tCLIENT\tDEVICE\tRENEWED\tNOTE")
	for _, cl := range claims {
		note := ""
		if cl.Orphan {
			note = "orphan (image deleted)"
		}
		if len(cl.Holders) == 0 {
			fmt.Fprintf(tw, "%s\t-\t%d\t-\t-\t-\t-\t-\t%s\n", imageName(cl.Pool, cl.Namespace, cl.Image, ""), cl.Epoch, dash(note))
		}
		for _, h := range cl.Holders {
			n := note
			if h.Fenced {
				n = strings.TrimPrefix(n+", fenced", ", ")
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", imageName(cl.Pool, cl.Namespace, cl.Image, ""), cl.Access, h.Epoch,
				h.NodeID, h.Hostname, dash(h.ClientAddr), dash(h.Device), h.RenewedAt.Format(time.RFC3339), dash(n))
		}
		for _, in := range cl.Intruders {
			fmt.Fprintf(tw, "%s\t-\t-\t%s\t-\t%s\t%s\t%s\t%s\n", imageName(cl.Pool, cl.Namespace, cl.Image, ""), in.NodeID, in.ClientAddr, in.Device,
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
			fmt.Fprintf(tw, "%s\t-\t%d\t%s\t-\t%s\t-\t%s\t%s\n", imageName(cl.Pool, cl.Namespace, cl.Image, ""), f.Epoch, f.NodeID, f.Addr,
				f.At.Format(time.RFC3339), state)
		}
	}
	return tw.Flush()
}

// imageCommand parses the arguments of a command that names one image (fence, unfence):
// --cluster, --json (deciding out.json) and POOL[/NAMESPACE]/IMAGE.
func imageCommand(name string, args []string, out *output) (req api.ImageRequest, arg string, err error) {
	fs := flags(name)
	cluster := fs.String("cluster", "", "cluster id from the config")
	j := fs.Bool("json", false, "JSON output")
	pos, err := parse(fs, args, 1)
	if err != nil {
		return req, "", err
	}
	out.json = *j
	spec, err := parseSpec(pos[0], false)
	if err != nil {
		return req, "", err
	}
	return api.ImageRequest{Cluster: *cluster, Pool: spec.Pool, Namespace: spec.Namespace, Image: spec.Image}, pos[0], nil
}

// hasFlag says whether args carry the flag name (--name, -name, with or without =value).
func hasFlag(args []string, name string) bool {
	for _, a := range args {
		if a == "--"+name || a == "-"+name || strings.HasPrefix(a, "--"+name+"=") || strings.HasPrefix(a, "-"+name+"=") {
			return true
		}
	}
	return false
}

// runFenceNode is `fence --node NODE`: every hold of NODE, cluster-wide.
func runFenceNode(ctx context.Context, c *client.Client, args []string, out *output) error {
	fs := flags("fence")
	cluster := fs.String("cluster", "", "cluster id from the config")
	node := fs.String("node", "", "the dead node whose holds to fence")
	j := fs.Bool("json", false, "JSON output")
	if _, err := parse(fs, args, 0); err != nil {
		return err
	}
	out.json = *j
	if *node == "" {
		return usageError{"fence --node: name the node (its node_id, as `rbd-owner claims` shows it)"}
	}
	resp, err := c.Fence(ctx, api.ImageRequest{Cluster: *cluster, Node: *node})
	if err != nil {
		return err
	}
	if out.json {
		if err := printJSON(out, resp); err != nil {
			return err
		}
	} else {
		for _, h := range resp.Holds {
			again := ""
			if h.Again {
				again = " (fenced already: entry added again)"
			}
			fmt.Fprintf(out, "fenced %s on %s (epoch %d) until %s%s\n", h.Addr, h.Ref, h.Epoch, h.Expires.Format(time.RFC3339), again)
		}
		fmt.Fprintf(out, "node %s: %d holds fenced; the next map of each image by any node takes it over (no release --force needed)\n", resp.Node, len(resp.Holds))
	}
	if len(resp.Incomplete) > 0 {
		return fmt.Errorf("fence --node %s is INCOMPLETE, %d not found or not fenced (run it again, or fence those images one at a time): %s",
			*node, len(resp.Incomplete), strings.Join(resp.Incomplete, "; "))
	}
	return nil
}

func runUnfence(ctx context.Context, c *client.Client, args []string, out *output) error {
	if hasFlag(args, "node") {
		return runUnfenceNode(ctx, c, args, out)
	}
	req, _, err := imageCommand("unfence", args, out)
	if err != nil {
		return err
	}
	resp, err := c.Unfence(ctx, req)
	if err != nil {
		return err
	}
	if out.json {
		return printJSON(out, resp)
	}
	for _, in := range resp.Unfenced {
		fmt.Fprintf(out, "unfenced %s (client %s, fenced %s)\n", in.Device, in.ClientAddr, in.FencedAt.Format(time.RFC3339))
	}
	return nil
}

// runUnfenceNode is `unfence --node NODE [--force]`: the whole-node fences of NODE.
func runUnfenceNode(ctx context.Context, c *client.Client, args []string, out *output) error {
	fs := flags("unfence")
	cluster := fs.String("cluster", "", "cluster id from the config")
	node := fs.String("node", "", "the node whose whole-node fences to lift")
	force := fs.Bool("force", false, "lift them although the node was not seen rebooted")
	j := fs.Bool("json", false, "JSON output")
	if _, err := parse(fs, args, 0); err != nil {
		return err
	}
	out.json = *j
	if *node == "" {
		return usageError{"unfence --node: name the node"}
	}
	resp, err := c.UnfenceNode(ctx, api.UnfenceNodeRequest{Cluster: *cluster, Node: *node, Force: *force})
	if err != nil {
		return err
	}
	if out.json {
		return printJSON(out, resp)
	}
	for _, f := range resp.Fences {
		how := "FORCED (not seen rebooted)"
		if f.Rebooted != "" {
			how = f.Rebooted
		}
		fmt.Fprintf(out, "lifted %s on %s (fenced %s by %s): %s\n", f.Addr, f.Ref, f.FencedAt.Format(time.RFC3339), f.FencedBy, how)
	}
	return nil
}

func runFence(ctx context.Context, c *client.Client, args []string, out *output) error {
	if hasFlag(args, "node") {
		return runFenceNode(ctx, c, args, out)
	}
	req, arg, err := imageCommand("fence", args, out)
	if err != nil {
		return err
	}
	resp, err := c.Fence(ctx, req)
	if err != nil {
		return err
	}
	if out.json {
		return printJSON(out, resp)
	}
	fmt.Fprintf(out, "fenced %s until %s; next: rbd-owner release --force %s\n", strings.Join(resp.FencedAddrs, ", "), resp.Expires.Format(time.RFC3339), arg)
	return nil
}

func runRelease(ctx context.Context, c *client.Client, args []string, out *output) error {
	fs := flags("release")
	cluster := fs.String("cluster", "", "cluster id from the config")
	force := fs.Bool("force", false, "drop another (fenced) node's claim")
	asJSON := fs.Bool("json", false, "JSON output")
	pos, err := parse(fs, args, 1)
	if err != nil {
		return err
	}
	out.json = *asJSON
	if !*force {
		return usageError{"release drops a dead owner's claim: say --force (and fence it first)"}
	}
	spec, err := parseSpec(pos[0], false)
	if err != nil {
		return err
	}
	resp, err := c.Release(ctx, api.ImageRequest{Cluster: *cluster, Pool: spec.Pool, Namespace: spec.Namespace, Image: spec.Image, Force: true})
	if err != nil {
		return err
	}
	if out.json {
		return printJSON(out, resp)
	}
	if resp.Released {
		fmt.Fprintf(out, "released %s\n", pos[0])
	} else {
		fmt.Fprintf(out, "%s had no claim to release\n", pos[0])
	}
	return nil
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func imageName(pool, ns, image, snap string) string {
	return krbd.Spec{Pool: pool, Namespace: ns, Image: image, Snap: snap}.String()
}
