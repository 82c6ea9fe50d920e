// Package shim is rbd-owner's drop-in `rbd`: placed first on the PATH of a CSI plugin (ceph-csi's
// rbd node plugin runs `rbd` by name for all its krbd work), it sends krbd `map`, `unmap` and
// `device list` to the agent's CSI socket and runs Ceph's real `rbd` for everything else, with
// the same arguments, standard streams and exit status. It is built without cgo and without
// Ceph's libraries, so it runs in any container image. The same binary is also the drop-in
// `rbd-nbd` (Main dispatches on the name it was run by); a map or attach through any device type
// but krbd is refused by both (nbd.go).
//
// What it prints is what ceph-csi parses from Ceph's own `rbd`: map prints the device on stdout;
// an unmap of an image that is not mapped fails with "rbd: <spec>: not a mapped image or
// snapshot" on stderr; `device list --format=json` prints Ceph's JSON array. A refusal is one
// stderr line naming the owner node and what to do, which ceph-csi shows in the NodeStage
// error `kubectl describe pod` prints.
package shim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/client"
	"github.com/rbd-owner/rbd-owner/agent/image"
	"github.com/rbd-owner/rbd-owner/agent/monaddr"
)

// Defaults, overridden by the environment (RBD_OWNER_REAL_RBD, RBD_OWNER_REAL_RBD_NBD). The
// agent's socket is the CSI socket, api.DefaultCSISocket, unless RBD_OWNER_SOCKET names another.
const (
	DefaultRealRBD    = "/usr/bin/rbd"
	DefaultRealRBDNBD = "/usr/bin/rbd-nbd"
	// AccessOption is the map option that selects the access mode ("rbd-owner.access=rwx"):
	// a StorageClass's mapOptions carry it; it never reaches the kernel.
	AccessOption = "rbd-owner.access"
)

// Agent is the part of the agent's API the shim uses (a *client.Client).
type Agent interface {
	Map(ctx context.Context, req api.MapRequest) (*api.MapResponse, error)
	Unmap(ctx context.Context, req api.UnmapRequest) (*api.UnmapResponse, error)
	Status(ctx context.Context) (*api.Status, error)
}

// Env is what Run and RunNBD work with.
type Env struct {
	Agent      Agent
	Socket     string // for messages
	RealRBD    string
	RealRBDNBD string
	Stdout     io.Writer
	Stderr     io.Writer
	// Exec replaces the process with the real rbd or rbd-nbd (syscall.Exec); it returns only
	// on failure.
	Exec func(path string, argv []string, env []string) error
	// Timeout bounds one call to the agent (default 5 minutes: a map may wait for its cluster).
	Timeout time.Duration
}

// FromEnvironment builds the Env of the real program.
func FromEnvironment() Env {
	sock := os.Getenv("RBD_OWNER_SOCKET")
	if sock == "" {
		sock = api.DefaultCSISocket
	}
	realProg := os.Getenv("RBD_OWNER_REAL_RBD")
	if realProg == "" {
		realProg = DefaultRealRBD
	}
	realNBD := os.Getenv("RBD_OWNER_REAL_RBD_NBD")
	if realNBD == "" {
		realNBD = DefaultRealRBDNBD
	}
	return Env{Agent: client.New(sock), Socket: sock, RealRBD: realProg, RealRBDNBD: realNBD,
		Stdout: os.Stdout, Stderr: os.Stderr, Exec: syscall.Exec}
}

// Main runs the drop-in by the name it was run as (argv[0]): `rbd-nbd` is RunNBD, anything
// else (`rbd`) is Run.
func Main(argv0 string, args []string, env Env) int {
	if filepath.Base(argv0) == "rbd-nbd" {
		return RunNBD(args, env)
	}
	return Run(args, env)
}

// Exit statuses: Ceph's rbd exits with the errno of its failure; the shim does the same.
const (
	exitOK       = 0
	exitEINVAL   = 22
	exitEBUSY    = 16
	exitENOENT   = 2
	exitEACCES   = 13
	exitEIO      = 5
	exitENOTCONN = 107
	exitETIMEOUT = 110
	exitENOSPC   = 28
	exitSHUTDOWN = 108
	// EOPNOTSUPP: a map through a device type other than krbd
	exitEOPNOTSUPP = 95
)

// Run runs one `rbd` command line (args without the program name) and returns its exit status.
func Run(args []string, env Env) int {
	if env.Timeout == 0 {
		env.Timeout = 5 * time.Minute
	}
	if line := nonKrbdRefusal(args); line != "" {
		return fail(env, exitEOPNOTSUPP, "%s", line)
	}
	cl, err := parse(args)
	if err != nil || !cl.krbd() {
		if line := hiddenKrbdMap(args, cl, err); line != "" {
			return fail(env, exitEINVAL, "%s", line)
		}
		// not ours (or not understood as ours): Ceph's rbd decides, exactly as asked
		return passThrough(args, env)
	}
	ctx, cancel := context.WithTimeout(context.Background(), env.Timeout)
	defer cancel()
	switch cl.command() {
	case "map":
		return doMap(ctx, cl, env)
	case "unmap":
		return doUnmap(ctx, cl, env)
	case "list":
		return doList(ctx, cl, env)
	}
	return passThrough(args, env)
}

func passThrough(args []string, env Env) int {
	return execReal("rbd", env.RealRBD, "RBD_OWNER_REAL_RBD", args, env)
}

// execReal replaces this process with Ceph's program PROG at REAL (named by the environment
// variable VAR), with the same arguments, streams and environment; it returns only on failure.
func execReal(prog, realProg, envVar string, args []string, env Env) int {
	if self, err := os.Executable(); err == nil && sameFile(self, realProg) {
		fmt.Fprintf(env.Stderr, "%s: rbd-owner's %s would run itself as the real %s (%s); set %s to Ceph's %s\n", prog, prog, prog, realProg, envVar, prog)
		return exitEINVAL
	}
	err := env.Exec(realProg, append([]string{prog}, args...), os.Environ())
	fmt.Fprintf(env.Stderr, "%s: rbd-owner's %s cannot run Ceph's %s (%s): %v\n", prog, prog, prog, realProg, err)
	return 127
}

func sameFile(a, b string) bool {
	fa, err1 := os.Stat(a)
	fb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(fa, fb)
}

// cmdline is a parsed rbd command line.
type cmdline struct {
	words   []string            // positional words: the command and its arguments
	values  map[string][]string // options with values, by canonical name
	flags   map[string]bool     // options without values
	unknown []string            // options this parser does not know
}

// valued are the rbd options that take a value, by every spelling, with their canonical name.
var valued = map[string]string{
	"--id": "id", "--user": "id", "-n": "name", "--name": "name", "-m": "mon_host", "--mon-host": "mon_host", "--mon_host": "mon_host",
	"--keyfile": "keyfile", "-k": "keyring", "--keyring": "keyring", "-c": "conf", "--conf": "conf", "--cluster": "cluster",
	"--format": "format", "-t": "device-type", "--device-type": "device-type", "-o": "options", "--options": "options",
	"-p": "pool", "--pool": "pool", "--namespace": "namespace", "--image": "image", "--snap": "snap",
	"--log-file": "log-file", "--log_file": "log-file", "--admin-socket": "admin-socket", "--exclusive-timeout": "x",
}

// flagged are the options without a value that krbd commands accept.
var flagged = map[string]string{
	"--read-only": "read-only", "--pretty-format": "pretty-format", "--no-progress": "no-progress",
	"--exclusive": "exclusive", "--quiesce": "quiesce", "--force": "force",
}

func parse(args []string) (*cmdline, error) {
	c := &cmdline{values: map[string][]string{}, flags: map[string]bool{}}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			c.words = append(c.words, args[i+1:]...)
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			c.words = append(c.words, a)
			continue
		}
		name, val, hasVal := strings.Cut(a, "=")
		if canon, ok := valued[name]; ok {
			if !hasVal {
				if i+1 >= len(args) {
					return nil, fmt.Errorf("option %s needs a value", name)
				}
				i++
				val = args[i]
			}
			c.values[canon] = append(c.values[canon], val)
			continue
		}
		if canon, ok := flagged[name]; ok && !hasVal {
			c.flags[canon] = true
			continue
		}
		c.unknown = append(c.unknown, name)
	}
	return c, nil
}

func (c *cmdline) last(name string) string {
	v := c.values[name]
	if len(v) == 0 {
		return ""
	}
	return v[len(v)-1]
}

// command is "map", "unmap", "list" or "" (anything else), and the index of its argument.
func (c *cmdline) command() string {
	w := c.words
	if len(w) > 0 && w[0] == "device" {
		w = w[1:]
		if len(w) > 0 && (w[0] == "list" || w[0] == "ls") {
			return "list"
		}
	} else if len(w) > 0 && w[0] == "showmapped" {
		return "list"
	}
	if len(w) > 0 && (w[0] == "map" || w[0] == "unmap") {
		return w[0]
	}
	return ""
}

// arg is the command's argument (the image spec or device), "" when none.
func (c *cmdline) arg() string {
	w := c.words
	if len(w) > 0 && w[0] == "device" {
		w = w[1:]
	}
	if len(w) >= 2 {
		return w[1]
	}
	return ""
}

// krbd says whether the command is one the agent handles: a kernel map, unmap or list (the
// default device type is krbd).
func (c *cmdline) krbd() bool {
	t := c.last("device-type")
	return (t == "" || t == "krbd") && c.command() != ""
}

func fail(env Env, code int, format string, a ...any) int {
	msg := fmt.Sprintf(format, a...)
	fmt.Fprintln(env.Stderr, strings.Join(strings.Fields(msg), " ")) // one line, always
	return code
}

// spec reads the image spec as Ceph's rbd does: the argument, [POOL/[NAMESPACE/]]IMAGE[@SNAP],
// with what it leaves out from --pool, --namespace and --snap (image.ParseWithDefaults), or
// --image and those when there is no argument; the pool defaults to Ceph's "rbd". Every part is
// validated as the agent validates it.
func (c *cmdline) spec() (image.Ref, error) {
	r := image.Ref{Pool: c.last("pool"), Namespace: c.last("namespace"), Image: c.last("image"), Snap: c.last("snap")}
	if r.Pool == "" {
		r.Pool = "rbd"
	}
	if a := c.arg(); a != "" {
		return image.ParseWithDefaults(a, r)
	}
	if r.Image == "" {
		return image.Ref{}, errors.New("image name was not specified")
	}
	if err := r.Validate(); err != nil {
		return image.Ref{}, fmt.Errorf("image spec %q: %w", r, err)
	}
	return r, nil
}

func doMap(ctx context.Context, c *cmdline, env Env) int {
	if len(c.unknown) > 0 {
		return fail(env, exitEINVAL, "rbd: map refused by rbd-owner: option %s is not supported for a krbd map through rbd-owner", c.unknown[0])
	}
	for _, f := range []string{"exclusive", "quiesce"} {
		if c.flags[f] {
			return fail(env, exitEINVAL, "rbd: map refused by rbd-owner: --%s is not used: it would break snapshots and resizes by other clients", f)
		}
	}
	ref, err := c.spec()
	if err != nil {
		return fail(env, exitEINVAL, "rbd: %v", err)
	}
	req := api.MapRequest{Pool: ref.Pool, Namespace: ref.Namespace, Image: ref.Image, Snapshot: ref.Snap,
		Requester: "rbd (rbd-owner drop-in)", ReadOnly: c.flags["read-only"]}
	for _, m := range c.values["mon_host"] {
		req.Monitors = append(req.Monitors, monaddr.Split(m)...)
	}
	for _, o := range c.values["options"] {
		for _, one := range strings.Split(o, ",") {
			if v, ok := strings.CutPrefix(one, AccessOption+"="); ok {
				req.Access = v
				continue
			}
			if one != "" {
				req.Options = append(req.Options, one)
			}
		}
	}
	if req.ReadOnly && req.Access == "" {
		req.Access = "rox"
	}
	resp, err := env.Agent.Map(ctx, req)
	if err != nil {
		code, msg := agentError(err)
		var ae *api.Error
		if !errors.As(err, &ae) {
			// no refusal: the agent did not answer
			return fail(env, code, "rbd: map failed: rbd-owner could not map %s: %s", ref, msg)
		}
		return fail(env, code, "rbd: map failed: rbd-owner refused to map %s: %s", ref, msg)
	}
	if _, err := fmt.Fprintln(env.Stdout, resp.Device); err != nil {
		// the caller cannot learn the device: fail, so that it asks again (and is answered
		// with the same device, already mapped)
		return fail(env, exitEIO, "rbd: map: %s is mapped as %s, but writing its path failed: %v", ref, resp.Device, err)
	}
	return exitOK
}

func doUnmap(ctx context.Context, c *cmdline, env Env) int {
	if len(c.unknown) > 0 {
		return fail(env, exitEINVAL, "rbd: unmap refused by rbd-owner: option %s is not supported", c.unknown[0])
	}
	req := api.UnmapRequest{}
	for _, o := range c.values["options"] {
		for _, one := range strings.Split(o, ",") {
			switch one {
			case "", "noudev", "udev":
			case "force":
				req.Force = true
			default:
				return fail(env, exitEINVAL, "rbd: unmap refused by rbd-owner: unmap option %q is not supported (only force)", one)
			}
		}
	}
	arg := c.arg()
	if strings.HasPrefix(arg, "/dev/") {
		req.Device = arg
		resp, err := env.Agent.Unmap(ctx, req)
		if err != nil {
			code, msg := agentError(err)
			return fail(env, code, "rbd: unmap of %s failed: %s", arg, msg)
		}
		if !resp.Unmapped {
			return fail(env, exitEINVAL, "rbd: '%s' is not an rbd device", arg)
		}
		return exitOK
	}
	ref, err := c.spec()
	if err != nil {
		return fail(env, exitEINVAL, "rbd: %v", err)
	}
	st, err := env.Agent.Status(ctx)
	if err != nil {
		code, msg := agentError(err)
		return fail(env, code, "rbd: unmap of %s failed: %s", ref, msg)
	}
	// the devices of this spec, managed or not (one mapped before rbd-owner is unmapped too)
	var found []api.Device
	for _, d := range st.Devices {
		if d.Pool == ref.Pool && d.Namespace == ref.Namespace && d.Image == ref.Image && d.Snapshot == ref.Snap {
			found = append(found, d)
		}
	}
	switch {
	case len(found) == 0:
		// the line ceph-csi takes for "already unmapped"
		return fail(env, exitEINVAL, "rbd: %s: not a mapped image or snapshot", ref)
	case len(found) > 1:
		devs := make([]string, len(found))
		for i, d := range found {
			devs[i] = d.Device
		}
		return fail(env, exitEINVAL, "rbd: unmap refused by rbd-owner: %s is mapped more than once on this node (%s); unmap one device by its path", ref, strings.Join(devs, ", "))
	}
	req.Device = found[0].Device
	if _, err := env.Agent.Unmap(ctx, req); err != nil {
		code, msg := agentError(err)
		return fail(env, code, "rbd: unmap of %s failed: %s", ref, msg)
	}
	return exitOK
}

// listEntry is one device in Ceph's `rbd device list --format=json` (krbd.cc's order).
type listEntry struct {
	ID        string `json:"id"`
	Pool      string `json:"pool"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Snap      string `json:"snap"`
	Device    string `json:"device"`
}

// doList lists the devices the agent manages: a device mapped outside it is not offered to a
// CSI plugin as already staged (it would be used without a claim); its map is refused instead.
func doList(ctx context.Context, c *cmdline, env Env) int {
	st, err := env.Agent.Status(ctx)
	if err != nil {
		code, msg := agentError(err)
		return fail(env, code, "rbd: device list failed: %s", msg)
	}
	out := []listEntry{}
	for _, d := range st.Devices {
		if !d.Managed {
			continue
		}
		snap := d.Snapshot
		if snap == "" {
			snap = "-"
		}
		out = append(out, listEntry{ID: strings.TrimPrefix(d.Device, "/dev/rbd"), Pool: d.Pool, Namespace: d.Namespace,
			Name: d.Image, Snap: snap, Device: d.Device})
	}
	sortEntries(out)
	switch f := c.last("format"); {
	case f == "json":
		var b []byte
		if c.flags["pretty-format"] {
			b, _ = json.MarshalIndent(out, "", "    ")
		} else {
			b, _ = json.Marshal(out)
		}
		fmt.Fprintln(env.Stdout, string(b))
	case f == "" || f == "plain":
		if len(out) == 0 {
			return exitOK
		}
		tw := tabwriter.NewWriter(env.Stdout, 0, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "id\tpool\tnamespace\timage\tsnap\tdevice")
		for _, e := range out {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", e.ID, e.Pool, e.Namespace, e.Name, e.Snap, e.Device)
		}
		tw.Flush()
	default:
		return fail(env, exitEINVAL, "rbd: invalid output format: %s (rbd-owner's rbd lists devices as json or plain)", f)
	}
	return exitOK
}

// sortEntries orders devices by id, as the kernel numbers them.
func sortEntries(es []listEntry) {
	num := func(s string) int { n, _ := strconv.Atoi(s); return n }
	slices.SortFunc(es, func(a, b listEntry) int { return num(a.ID) - num(b.ID) })
}

// agentError turns an agent error into an exit status (the errno Ceph's rbd would use) and one
// line for a person: the agent's message (which names the owner and what to do), or how to
// reach the agent.
func agentError(err error) (int, string) {
	var ae *api.Error
	if errors.As(err, &ae) {
		code := exitEIO
		switch ae.Code {
		case api.CodeClaimedElsewhere, api.CodeBusy:
			code = exitEBUSY
		case api.CodeInvalidArgument:
			code = exitEINVAL
		case api.CodeNotFound:
			code = exitENOENT
		case api.CodePermissionDenied:
			code = exitEACCES
		case api.CodeClusterUnavailable, api.CodeTimeout:
			code = exitETIMEOUT
		case api.CodeFenced:
			code = exitSHUTDOWN
		case api.CodeStateUnwritable:
			code = exitENOSPC
		}
		// the agent's message names the holders (Owner and Holders say the same as data) and
		// when a takeover is possible (RetryAfterSeconds): nothing is added to it, nothing read
		// out of it
		return code, ae.Message + " [" + ae.Code + "]"
	}
	switch {
	case errors.Is(err, client.ErrUnreachable):
		// the client's error names the socket and what was found there
		return exitENOTCONN, fmt.Sprintf("%v (is rbd-owner installed and running on this node, and its socket directory mounted into this container?)", err)
	case errors.Is(err, client.ErrNoAccess):
		return exitEACCES, fmt.Sprintf("%v: run the plugin as root, or in the socket's group (rbd-owner)", err)
	}
	// a call cut off (client.ErrCutOff) says itself that the agent went away and that the
	// call may be repeated; ceph-csi repeats a failed stage
	return exitEIO, err.Error()
}
