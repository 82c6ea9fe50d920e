package main

import (
	"context"
	"io"
	"os"

	"github.com/coreos/go-systemd/v22/journal"
	"github.com/sirupsen/logrus"

	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/daemon"
)

func runDaemon(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flags("daemon")
	path := fs.String("config", config.DefaultPath, "config file")
	if _, err := parse(fs, args, 0); err != nil {
		return err
	}
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
	cfg, err := config.Load(*path, "")
	if err != nil {
		return err
	}
	d, err := daemon.New(daemon.Options{Config: cfg, Log: log, Audit: audit.New(log, underJournal || os.Getenv("INVOCATION_ID") != "")})
	if err != nil {
		return err
	}
	return d.Run(ctx)
}
