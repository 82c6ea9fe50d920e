// Command rbd-owner is the node agent (`rbd-owner daemon`) and its command-line client
// (every other subcommand), on cobra: `rbd-owner --help`, `rbd-owner COMMAND --help`. See
// README.md and docs/api.md for the CLI.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/client"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
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
// the API's error object.
type output struct {
	io.Writer
	json bool
}

// app is one run of the command line: where it prints, and the flags every command shares.
type app struct {
	out    *output
	stderr io.Writer
	socket string
	// json is the --json flag of the command that runs (each command that takes it binds it
	// here; the root's hidden one lets it come before the command's name)
	json bool
	// parsed: the command line was parsed and checked, and the command ran: an error from here
	// on is the command's own, and json is the flag's value
	parsed bool
}

func run(args []string, stdout, stderr io.Writer) int {
	a := &app{out: &output{Writer: stdout}, stderr: stderr}
	root := a.newRoot()
	args = longFlags(root, args)
	root.SetArgs(append([]string{}, args...)) // never nil: cobra would read os.Args
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cmd, err := root.ExecuteContextC(ctx)
	return a.report(cmd, args, err)
}

// preRun runs once the command line is parsed and its arguments checked, before the command.
func (a *app) preRun(cmd *cobra.Command, _ []string) error {
	if !takesJSON(cmd) && cmd.Flags().Changed("json") {
		return usageError{"unknown flag: --json (" + cmd.CommandPath() + " prints no JSON)"}
	}
	a.out.json = a.json
	a.parsed = true
	return nil
}

// longFlags accepts the single-dash long flags of the flag package this command line was first
// written with (-json, -socket=PATH): each becomes its double-dash form. -h stays a shorthand.
func longFlags(root *cobra.Command, args []string) []string {
	names := map[string]bool{}
	var visit func(*cobra.Command)
	visit = func(c *cobra.Command) {
		for _, fs := range []*pflag.FlagSet{c.LocalFlags(), c.PersistentFlags()} {
			fs.VisitAll(func(f *pflag.Flag) { names[f.Name] = len(f.Name) > 1 })
		}
		for _, sub := range c.Commands() {
			visit(sub)
		}
	}
	visit(root)
	names["help"] = true // added by cobra when the command runs
	out := make([]string, len(args))
	for i, arg := range args {
		out[i] = arg
		if arg == "--" {
			copy(out[i:], args[i:])
			break
		}
		name, _, _ := strings.Cut(strings.TrimPrefix(arg, "-"), "=")
		if strings.HasPrefix(arg, "-") && !strings.HasPrefix(arg, "--") && names[name] {
			out[i] = "-" + arg
		}
	}
	return out
}

// jsonRequested says whether the arguments ask for --json (-json, --json=BOOL; the last one
// wins), for an error found before they are parsed.
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

// report picks the exit code and reports the error: one line a person can act on, on stderr
// (a usage mistake adds the command's usage line); or, under --json, the error object alone on
// stdout. An error before the command ran is a mistake on the command line.
func (a *app) report(cmd *cobra.Command, args []string, err error) int {
	if err == nil {
		return exitOK
	}
	if errors.Is(err, errProblems) {
		return exitProblems
	}
	var ue usageError
	if !a.parsed && !errors.As(err, &ue) {
		err = usageError{err.Error()} // cobra's own: an unknown command, a flag or argument
	}
	if !a.parsed {
		a.out.json = takesJSON(cmd) && jsonRequested(args)
	}
	code, obj, msg := classify(err)
	if a.out.json {
		if printJSON(a.out, api.ErrorBody{Error: obj}) == nil {
			return code
		}
	}
	fmt.Fprintf(a.stderr, "%s: %s\n", cmd.CommandPath(), msg)
	if code == exitUsage {
		fmt.Fprintf(a.stderr, "usage: %s (see %s --help)\n", usageLine(cmd), cmd.CommandPath())
	}
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
		// the client's error names the socket and what was found there: the next step follows
		var msg string
		switch {
		case errors.Is(err, syscall.ENOENT):
			msg = fmt.Sprintf("%v: start the agent with `systemctl start rbd-owner.socket rbd-owner` (`systemctl status rbd-owner` says why it is not running)", err)
		case errors.Is(err, syscall.ECONNREFUSED):
			msg = fmt.Sprintf("%v: see why with `systemctl status rbd-owner rbd-owner.socket`, then start both again with `systemctl restart rbd-owner.socket rbd-owner`", err)
		default:
			msg = fmt.Sprintf("%v (is the agent running? systemctl status rbd-owner)", err)
		}
		return exitUnreachable, &api.Error{Code: client.CodeUnreachable, Message: msg}, msg
	}
	if errors.Is(err, client.ErrNoAccess) {
		// not "is the agent running?": it may well be; this caller may not talk to it
		msg := fmt.Sprintf("%v: run the command as root, or as a member of the socket's group (rbd-owner, or rbd-owner-admin as well for the admin commands: usermod -aG rbd-owner USER, then log in again)", err)
		return exitFailed, &api.Error{Code: api.CodePermissionDenied, Message: msg}, msg
	}
	var ae *api.Error
	if errors.As(err, &ae) {
		msg := ae.Message
		switch ae.Code {
		case api.CodeClaimedElsewhere:
			if ae.Owner != nil {
				msg = heldLine(ae)
			}
			return exitClaimed, ae, msg
		case api.CodePermissionDenied:
			return exitFailed, ae, msg
		}
		return exitFailed, ae, fmt.Sprintf("%s (%s)", msg, ae.Code)
	}
	return exitFailed, &api.Error{Code: client.Code(err), Message: err.Error()}, err.Error()
}

// heldLine is a refusal by others' holds in one line, from the agent's data alone (the image,
// its first holder, the reason, the next steps): the image named once, the holder,
// its lease as this node saw it, then what to do.
func heldLine(ae *api.Error) string {
	o := ae.Owner
	what, spec := ae.Image, ae.Image
	if what == "" {
		what, spec = "the image", "POOL/IMAGE"
	}
	msg := fmt.Sprintf("%s is held by node %s (host %s) at epoch %d since %s",
		what, o.NodeID, o.Hostname, o.Epoch, o.AcquiredAt.Format(time.RFC3339))
	// the agent's reason, then its next steps for this caller and policy (the list, as data),
	// in place of the generic advice below; an agent that sends no steps may send them as one
	// phrase (advice)
	var said []string
	if ae.Reason != "" {
		said = append(said, ae.Reason)
	}
	switch {
	case len(ae.NextSteps) > 0:
		said = append(said, stepsText(ae.NextSteps))
	case ae.Advice != "":
		said = append(said, ae.Advice)
	}
	reason := strings.Join(said, "; ")
	switch {
	case reason != "" && o.Expired:
		return msg + fmt.Sprintf(" (lease expired: its heartbeat has not changed for %.0fs on this node's clock); %s", o.LeaseAge, reason)
	case reason != "" && ae.RetryAfterSeconds > 0:
		return msg + fmt.Sprintf(" (live: watching node %s's lease; a takeover is possible in %ds unless it renews); %s", o.NodeID, ae.RetryAfterSeconds, reason)
	case reason != "":
		return msg + " (live); " + reason
	case o.Expired:
		return msg + fmt.Sprintf(" (lease expired: its heartbeat has not changed for %.0fs on this node's clock; map with --takeover to fence it and take over)", o.LeaseAge)
	case ae.RetryAfterSeconds > 0:
		return msg + fmt.Sprintf(" (live: watching node %s's lease; a takeover is possible in %ds unless it renews; if that node is dead, retry with --takeover then, or have an admin run `rbd-owner fence --node %s` and map again)", o.NodeID, ae.RetryAfterSeconds, o.NodeID)
	}
	return msg + fmt.Sprintf(" (live: if that node is dead, have an admin run `rbd-owner fence --node %s`, or `rbd-owner fence %s` for this image only, and map again: the map takes a fenced hold over)", o.NodeID, spec)
}

// stepsText says next steps in one phrase: "run `X` (why); or …".
func stepsText(steps []api.Step) string {
	parts := make([]string, 0, len(steps))
	for _, st := range steps {
		if st.Run == "" {
			parts = append(parts, st.Why)
			continue
		}
		parts = append(parts, fmt.Sprintf("run `%s` (%s)", st.Run, st.Why))
	}
	return strings.Join(parts, "; or ")
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
