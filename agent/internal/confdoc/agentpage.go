package confdoc

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/internal/abortdump"
	"github.com/rbd-owner/rbd-owner/agent/internal/agentflags"
	"github.com/rbd-owner/rbd-owner/agent/internal/manpage"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// envVar is an environment variable the agent reads, and what it does with it.
type envVar struct{ name, doc string }

// agentEnv is every variable the agent reads: the tests hold it to the os.Getenv calls in the
// agent's packages; the systemd ones are read by go-systemd.
func agentEnv() []envVar {
	return []envVar{
		{"NOTIFY_SOCKET", "Set by systemd for a `Type=notify` service: the agent sends `READY=1` to it once it " +
			"serves its sockets, `STATUS=` lines, `STOPPING=1`, and the watchdog's pings. Without it the agent " +
			"runs all the same."},
		{"WATCHDOG_USEC", "Systemd's watchdog interval (`WatchdogSec=`): the agent pings at half of it while each " +
			"of its loops is running. A stuck loop stops the pings, and systemd aborts the agent."},
		{"WATCHDOG_PID", "The process the watchdog is for: the agent pings only when it is its own."},
		{"LISTEN_PID", "With `LISTEN_FDS` and `LISTEN_FDNAMES`: the sockets systemd passes (socket activation by " +
			"`rbd-owner.socket`), told apart by their paths. Without them the agent creates its sockets itself, " +
			"mode 0660, group `rbd-owner`."},
		{"LISTEN_FDS", "The number of sockets passed (see `LISTEN_PID`)."},
		{"LISTEN_FDNAMES", "The names of the sockets passed (see `LISTEN_PID`)."},
		{"JOURNAL_STREAM", "Set by systemd when standard error is the journal: each log line then starts with its " +
			"priority, which the journal takes (`journalctl -p err -u rbd-owner` shows the errors), and has no " +
			"time of its own."},
		{"INVOCATION_ID", "Set by systemd for a service: the audit entries then go to the journal as entries of " +
			"their own, with fields (`RBD_OWNER_EVENT=`...), rather than as log lines."},
		{config.ShortFencesEnv, "`1` lowers the shortest `fence_expiry` the config may set from an hour to a " +
			"minute. For test labs only; the packages never set it."},
	}
}

// unitSettings are the settings of rbd-owner.service the page names (a test finds each in
// units/).
var unitSettings = []string{"ExecStart=/usr/bin/rbd-owner daemon", "Type=notify", "WatchdogSec=30s",
	"Restart=on-failure", "RestartSec=2s", "StartLimitBurst=5", "StartLimitIntervalSec=60s", "KillMode=process",
	"TriggerLimitBurst=5", "TriggerLimitIntervalSec=60s"}

// AgentPage writes rbd-owner-agent(8): what the agent is, how systemd runs it, its flags (from
// agentflags), files, environment, signals and exit status. date and source are the page's
// footer.
func AgentPage(w io.Writer, date, source string) error {
	var b strings.Builder
	b.WriteString(manpage.Header("rbd-owner-agent", "the rbd-owner node agent",
		manpage.Page{Section: "8", Date: date, Source: source}))
	fs := agentflags.New(&agentflags.Args{}, io.Discard)
	fmt.Fprintf(&b, ".SH SYNOPSIS\n.B rbd\\-owner daemon\n%s\n.br\n.B %s\n[\\fB%s\\fR] %s\n.br\n.B %s\n\\fB%s\\fR\n",
		synopsisFlags(fs), manpage.Escape(agentflags.Path), agentflags.Command, synopsisFlags(fs),
		manpage.Escape(agentflags.Path), manpage.Escape(agentflags.LibradosVersion))
	section(&b, "DESCRIPTION", agentDescription()...)
	section(&b, "UNDER SYSTEMD", underSystemd()...)
	b.WriteString(".SH OPTIONS\n")
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		fmt.Fprintf(&b, ".TP\n\\fB\\-\\-%s\\fR \\fI%s\\fR\n%s\n", manpage.Escape(f.Name), manpage.Escape(name),
			manpage.Inline(fmt.Sprintf("%s (default `%s`).", upperFirst(usage), f.DefValue)))
	})
	item(&b, "`-h`, `--help`", "Print the flags and exit 0.")
	paragraphs(&b, "A first argument `"+agentflags.Command+"` is skipped (`rbd-owner daemon` passes it on). A flag "+
		"may be written with one dash or two, its value after `=` or as the next argument. The agent takes no "+
		"other argument but `"+agentflags.LibradosVersion+"`, alone, with which it prints the Ceph release of the "+
		"librados it loads (such as `19.2.6`) and exits: `rbd-owner check-config`, which links nothing of Ceph's, "+
		"asks it whether this node's librados reads the keys' type (`aes256k` needs Ceph 19.2.6 or 20.2.4).")
	b.WriteString(".SH FILES\n")
	for _, f := range agentFiles() {
		item(&b, f[0], f[1])
	}
	b.WriteString(".SH ENVIRONMENT\n")
	for _, e := range agentEnv() {
		item(&b, "`"+e.name+"`", e.doc)
	}
	b.WriteString(".SH SIGNALS\n")
	item(&b, "`SIGTERM`, `SIGINT`", "Stop: the agent stops taking requests, finishes those in progress, stops its "+
		"loops and exits 0. Every mapping stays as it is.")
	item(&b, "`SIGABRT`", fmt.Sprintf("What systemd's watchdog sends a hung agent: the agent writes every goroutine's "+
		"stack to a file in `state_dir`, logs one line naming it, and exits %d. Every mapping stays as it is.", abortdump.ExitCode))
	paragraphs(&b, "The agent does not reload its configuration: restart it (`systemctl restart rbd-owner`).")
	b.WriteString(".SH \"EXIT STATUS\"\n")
	for _, e := range exitStatuses() {
		item(&b, strconv.Itoa(e.code), e.doc)
	}
	section(&b, "SEE ALSO", "`rbd-owner`(8), `rbd-owner.yaml`(5), `systemd.service`(5), `systemd.socket`(5), "+
		"`systemctl`(1), `journalctl`(1), `rbd`(8)")
	_, err := io.WriteString(w, b.String())
	return err
}

// exitStatus is one exit status of the agent and when it exits with it.
type exitStatus struct {
	code int
	doc  string
}

// exitStatuses are the agent's exit statuses, in order, from the constants its code exits with.
func exitStatuses() []exitStatus {
	byCode := map[int][]string{}
	add := func(code int, doc string) { byCode[code] = append(byCode[code], doc) }
	add(0, "Stopped by `SIGTERM` or `SIGINT`, or `--help`, or `"+agentflags.LibradosVersion+"` printed the release.")
	add(agentflags.ExitFailure, "The agent could not start, or stopped on an error: a config it refuses, a state "+
		"directory or a socket it cannot use. The reason is one line on standard error (the journal), as "+
		"`rbd-owner check-config` prints a config's. Or `"+agentflags.LibradosVersion+"` found no release to print.")
	add(agentflags.ExitUsage, "A usage error: an unknown flag, an argument.")
	add(abortdump.ExitCode, "Stopped by `SIGABRT`.")
	var out []exitStatus
	for code, docs := range byCode {
		out = append(out, exitStatus{code, strings.Join(docs, " ")})
	}
	slices.SortFunc(out, func(a, b exitStatus) int { return a.code - b.code })
	return out
}

// synopsisFlags is each flag of fs as a synopsis gives it: [--config PATH].
func synopsisFlags(fs *flag.FlagSet) string {
	var parts []string
	fs.VisitAll(func(f *flag.Flag) {
		name, _ := flag.UnquoteUsage(f)
		parts = append(parts, fmt.Sprintf("[\\fB\\-\\-%s\\fR \\fI%s\\fR]", manpage.Escape(f.Name), manpage.Escape(name)))
	})
	return strings.Join(parts, " ")
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

func agentDescription() []string {
	return []string{
		"`rbd-owner-agent` is the node agent of rbd-owner, which keeps each Ceph RBD image mapped on at most " +
			"one node at a time. Before every krbd map it claims the image atomically in RADOS; it renews the " +
			"claims it holds, fences (blocklists) a stale holder's mapping before it takes an image over, and " +
			"judges the mappings made on the node outside rbd-owner. It serves the API that `rbd-owner`(8) and " +
			"the drop-in `rbd` of a CSI plugin call, on its sockets, and metrics for Prometheus.",
		"It is the one program of rbd-owner linked with librados and librbd, and it is not on the PATH: " +
			"`rbd-owner daemon` replaces itself with it, in the same process (an `rbd-owner-agent` beside the " +
			"`rbd-owner` program wins over `" + agentflags.Path + "`). That is how `rbd-owner.service` runs it; " +
			"start it by hand only to debug.",
		"At start it reads its configuration (`rbd-owner.yaml`(5)), connects to the clusters, finds the " +
			"mappings on the node and recovers their claims, and only then serves its sockets. A cluster that " +
			"does not answer does not stop it: it keeps trying.",
		"Stopping the agent, however it stops, unmaps nothing: krbd mappings live in the kernel. While it is " +
			"stopped the mapped devices keep working but their claims are not renewed; it adopts them again " +
			"when it starts.",
	}
}

func underSystemd() []string {
	s := map[string]string{}
	for _, kv := range unitSettings {
		k, _, _ := strings.Cut(kv, "=")
		s[k] = "`" + kv + "`"
	}
	return []string{
		"`rbd-owner.service` runs the agent (" + s["ExecStart"] + ", " + s["Type"] + "): the agent tells systemd " +
			"it is ready once it serves its sockets. `rbd-owner.socket` owns both sockets and passes them to it, " +
			"so that callers wait while the agent restarts.",
		"The agent pings systemd's watchdog (" + s["WatchdogSec"] + ") while all its loops run; a hung agent is " +
			"aborted with `SIGABRT` and started again (" + s["Restart"] + ", " + s["RestartSec"] + "). A start " +
			"that fails at once, as with a config the agent refuses, is repeated at most " + s["StartLimitBurst"] +
			" times in " + s["StartLimitIntervalSec"] + ", whoever starts it (`rbd-owner.socket` too, which starts it at most " +
			s["TriggerLimitBurst"] + " times in " + s["TriggerLimitIntervalSec"] + "); then the " +
			"unit and its socket stay failed, the agent's one-line error the unit's `Status:` in " +
			"`systemctl status rbd-owner`, until `systemctl reset-failed rbd-owner rbd-owner.socket`.",
		"Stopping the service signals the agent alone (" + s["KillMode"] + "). The unit runs it as root with a " +
			"few capabilities and in a sandbox; `systemctl cat rbd-owner` shows the unit and why each setting is " +
			"there. The agent's log and audit entries are in the journal: `journalctl -u rbd-owner`.",
	}
}

// agentFiles are the files the agent reads and writes, each with what it is.
func agentFiles() [][2]string {
	return [][2]string{
		{"`" + config.DefaultPath + "`", "The configuration, `rbd-owner.yaml`(5)."},
		{"`" + config.DefaultSocket + "`", "The main API socket (`socket`): root and group `rbd-owner-admin` get " +
			"the admin role, group `rbd-owner` the CSI role."},
		{"`" + config.DefaultCSISocket + "`", "The CSI socket (`csi_socket`): the CSI role only, whoever calls."},
		{"`" + config.DefaultStateDir + "/`", "The state directory (`state_dir`), root only."},
		{"`" + config.DefaultStateDir + "/" + state.FileName + "`", "Which device belongs to which claim. A file the " +
			"agent cannot use is set aside as `" + state.FileName + ".corrupt-TIME` and the agent starts from what " +
			"the kernel and the clusters say."},
		{"`" + config.DefaultStateDir + "/" + abortdump.Prefix + "TIME" + abortdump.Suffix + "`", fmt.Sprintf("The stacks written at a `SIGABRT`; "+
			"the newest %d are kept.", abortdump.Keep)},
		{"`/dev/rbd-owner/`", "Stable links to the mapped images' devices, made by udev " +
			"(`/usr/lib/udev/rules.d/60-rbd-owner.rules`)."},
		{"`/sys/bus/rbd/`", "The kernel's krbd interface, through which the agent maps and unmaps."},
	}
}
