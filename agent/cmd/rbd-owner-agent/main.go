// Command rbd-owner-agent is the node agent that `rbd-owner daemon` runs (it replaces itself
// with this program): the one part of rbd-owner that links the Ceph libraries. Installed as
// /usr/lib/rbd-owner/rbd-owner-agent; the unit starts it as `/usr/bin/rbd-owner daemon`.
//
//	rbd-owner-agent [daemon] [--config PATH]
//	rbd-owner-agent librados-version
//
// Its flags are defined in agent/internal/agentflags, from which its manual page
// rbd-owner-agent(8) is written (agent/internal/confdoc).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	sddaemon "github.com/coreos/go-systemd/v22/daemon"
	"github.com/coreos/go-systemd/v22/journal"
	"github.com/sirupsen/logrus"

	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/cephconn"
	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/daemon"
	"github.com/rbd-owner/rbd-owner/agent/internal/abortdump"
	"github.com/rbd-owner/rbd-owner/agent/internal/agentflags"
)

func main() {
	args := os.Args[1:]
	if len(args) == 1 && args[0] == agentflags.LibradosVersion {
		os.Exit(printLibradosVersion(os.Stdout, os.Stderr))
	}
	if len(args) > 0 && args[0] == agentflags.Command {
		args = args[1:]
	}
	var a agentflags.Args
	fs := agentflags.New(&a, os.Stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(agentflags.ExitUsage) // the flag package said what was wrong
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "rbd-owner daemon: unexpected argument %q\n", fs.Arg(0))
		os.Exit(agentflags.ExitUsage)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	underJournal, jerr := journal.StderrIsJournalStream()
	if err := run(ctx, a.Config, os.Stderr, underJournal, jerr); err != nil {
		line := fmt.Sprintf("rbd-owner daemon: %v", err)
		// systemd's Status line of the unit (`systemctl status rbd-owner`) says it too, and keeps
		// saying it while the unit stays failed (a start refused by the start limit keeps the
		// last Status); sent before the process ends, so that systemd still knows its sender
		// (NotifyAccess=main). Not under systemd (no NOTIFY_SOCKET): nothing is sent.
		_, _ = sddaemon.SdNotify(false, "STATUS="+firstLine(line))
		// the agent's one line, as `rbd-owner check-config` prints it; at error priority in the
		// journal (journald reads the "<3>" and drops it): the last line the agent writes
		fmt.Fprintf(os.Stderr, "%s%s\n", priorityPrefix(underJournal, logrus.ErrorLevel), line)
		os.Exit(agentflags.ExitFailure)
	}
}

// firstLine is s up to its first newline (a notify message's STATUS= is one line).
func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// printLibradosVersion prints the Ceph release of the librados this program loads, for
// `rbd-owner check-config` (agentflags.LibradosVersion), and is the exit status.
func printLibradosVersion(stdout, stderr io.Writer) int {
	release := cephconn.LibradosRelease()
	if release == "" {
		fmt.Fprintln(stderr, "rbd-owner-agent: the librados loaded does not say its Ceph release")
		return agentflags.ExitFailure
	}
	fmt.Fprintln(stdout, release)
	return 0
}

func run(ctx context.Context, path string, stderr io.Writer, underJournal bool, journalErr error) error {
	log := logrus.New()
	log.SetOutput(stderr)
	if journalErr != nil {
		// not knowing only changes the log format: say so and go on with timestamps
		log.WithError(journalErr).Warn("cannot tell whether stderr is the journal")
	}
	if underJournal {
		// systemd adds the time and the unit; keep the lines short, each at its level's priority
		log.SetFormatter(journalFormatter{&logrus.TextFormatter{DisableTimestamp: true}})
	}
	cfg, err := config.Load(path, "")
	if err != nil {
		return err
	}
	// systemd's watchdog aborts a hung agent with SIGABRT: its goroutines' stacks go to a file
	// in the state directory, the journal gets one line naming it
	abortdump.Watch(cfg.StateDir, log)
	d, err := daemon.New(daemon.Options{Config: cfg, Log: log, Audit: audit.New(log, underJournal || os.Getenv("INVOCATION_ID") != "")})
	if err != nil {
		return err
	}
	return d.Run(ctx)
}

// journalFormatter prefixes each line with the syslog priority of its level ("<3>" for an
// error), which journald takes as the line's PRIORITY and removes from the message: `journalctl
// -p err -u rbd-owner` then shows the agent's errors.
type journalFormatter struct{ logrus.Formatter }

func (f journalFormatter) Format(e *logrus.Entry) ([]byte, error) {
	b, err := f.Formatter.Format(e)
	if err != nil {
		return nil, err
	}
	return append([]byte(priorityPrefix(true, e.Level)), b...), nil
}

// priorityPrefix is the journal's priority prefix for level, "" when stderr is not the journal.
func priorityPrefix(underJournal bool, level logrus.Level) string {
	if !underJournal {
		return ""
	}
	p := 6 // info
	switch level {
	case logrus.PanicLevel, logrus.FatalLevel:
		p = 2
	case logrus.ErrorLevel:
		p = 3
	case logrus.WarnLevel:
		p = 4
	case logrus.DebugLevel, logrus.TraceLevel:
		p = 7
	}
	return fmt.Sprintf("<%d>", p)
}
