// Command rbd-owner-agent is the node agent that `rbd-owner daemon` runs (it replaces itself
// with this program): the one part of rbd-owner that links the Ceph libraries. Installed as
// /usr/lib/rbd-owner/rbd-owner-agent; the unit starts it as `/usr/bin/rbd-owner daemon`.
//
//	rbd-owner-agent [daemon] [--config PATH]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/coreos/go-systemd/v22/journal"
	"github.com/sirupsen/logrus"

	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/daemon"
)

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "daemon" {
		args = args[1:]
	}
	fs := flag.NewFlagSet("rbd-owner daemon", flag.ContinueOnError)
	path := fs.String("config", config.DefaultPath, "config file")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2) // the flag package said what was wrong
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "rbd-owner daemon: unexpected argument %q\n", fs.Arg(0))
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *path, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "rbd-owner daemon: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, path string, stderr io.Writer) error {
	log := logrus.New()
	log.SetOutput(stderr)
	underJournal, err := journal.StderrIsJournalStream()
	if err != nil {
		// not knowing only changes the log format: say so and go on with timestamps
		log.WithError(err).Warn("cannot tell whether stderr is the journal")
	}
	if underJournal {
		// systemd adds the time and the unit; keep the lines short
		log.SetFormatter(&logrus.TextFormatter{DisableTimestamp: true})
	}
	cfg, err := config.Load(path, "")
	if err != nil {
		return err
	}
	d, err := daemon.New(daemon.Options{Config: cfg, Log: log, Audit: audit.New(log, underJournal || os.Getenv("INVOCATION_ID") != "")})
	if err != nil {
		return err
	}
	return d.Run(ctx)
}
