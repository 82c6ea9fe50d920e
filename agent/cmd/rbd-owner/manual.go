package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/rbd-owner/rbd-owner/agent/internal/confdoc"
	"github.com/rbd-owner/rbd-owner/agent/internal/manpage"
	"github.com/rbd-owner/rbd-owner/agent/version"
)

// extraCommands add commands to the tree that only some builds have (gendocs.go).
var extraCommands []func(root *cobra.Command) *cobra.Command

// genDocsCommand is `__gendocs DIR`: it writes the manual pages into DIR: rbd-owner.8, the
// CLI's rbd-owner(8), from the command definitions, and rbd-owner.yaml.5 and rbd-owner-agent.8
// from the config's keys and the agent's flags (agent/internal/confdoc). Only the generator's
// build has it (gendocs.go).
func genDocsCommand(root *cobra.Command) *cobra.Command {
	return &cobra.Command{
		Use:    "__gendocs DIR",
		Hidden: true,
		Args:   wantArgs("DIR"),
		RunE: func(_ *cobra.Command, args []string) error {
			date, err := sourceDate()
			if err != nil {
				return err
			}
			source := "rbd-owner " + version.Version
			pages := []struct {
				file  string
				write func(io.Writer) error
			}{
				{root.Name() + ".8", func(w io.Writer) error { return manpage.Write(w, root, manPage(date)) }},
				{confdoc.ConfigPageFile, func(w io.Writer) error { return confdoc.ConfigPage(w, date, source) }},
				{confdoc.AgentPageFile, func(w io.Writer) error { return confdoc.AgentPage(w, date, source) }},
			}
			for _, p := range pages {
				if err := writeFile(filepath.Join(args[0], p.file), p.write); err != nil {
					return err
				}
			}
			return nil
		},
	}
}

// writeFile creates path and writes it with write.
func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		return errors.Join(err, f.Close())
	}
	return f.Close()
}

// sourceDate is the page's date: SOURCE_DATE_EPOCH's (reproducible builds; the Makefile sets
// it to the commit's time), else today's.
func sourceDate() (string, error) {
	t := time.Now()
	if epoch := os.Getenv("SOURCE_DATE_EPOCH"); epoch != "" {
		secs, err := strconv.ParseInt(epoch, 10, 64)
		if err != nil {
			return "", fmt.Errorf("SOURCE_DATE_EPOCH: %w", err)
		}
		t = time.Unix(secs, 0)
	}
	return t.UTC().Format("2006-01-02"), nil
}

// manPage is rbd-owner(8)'s header and closing sections (the commands say the rest).
func manPage(date string) manpage.Page {
	return manpage.Page{Section: "8", Date: date, Source: "rbd-owner " + version.Version, Sections: []manpage.Section{
		{Title: "Exit status", Text: fmt.Sprintf(`%d: done. %d: failed (the agent refused or could not do it; the message names the next
step; also a caller without permission on the socket, code permission_denied, and a call the
agent went away during, code interrupted: repeat it). %d: a usage error (the command's usage line
is printed). %d: the image is held by another
node (map; the message names it). %d: no agent answers on the socket (it does not exist, or
nothing listens on it). %d: status only: the agent answers but reports problems (listed as
"problem:" lines).

With --json the codes are the same, and an error is the JSON document on stdout.`,
			exitOK, exitFailed, exitUsage, exitClaimed, exitUnreachable, exitProblems)},
		{Title: "Environment", Text: `rbd-owner reads no environment variable of its own. rbd-owner daemon starts the agent
with its environment, in which systemd passes the socket activation's and the watchdog's
variables: see rbd-owner-agent(8). rbd-owner check-config judges fence_expiry with
RBD_OWNER_TEST_SHORT_FENCES as the agent does, in its own environment, and says so when the
agent's unit environment would change its verdict.`},
		{Title: "Files", Text: `/etc/rbd-owner/config.yaml: the agent's configuration, rbd-owner.yaml(5) (rbd-owner
check-config checks it).

/run/rbd-owner/rbd-owner.sock: the agent's API socket, each caller served in the role its uid
and groups give it; /run/rbd-owner/csi/csi.sock serves the CSI role only, whoever calls.

/var/lib/rbd-owner: the agent's state. /dev/rbd-owner: the stable links of the mapped images.

/usr/share/doc/rbd-owner/README.md: how it works, the configuration's keys, the API, the
metrics and troubleshooting.`},
		{Title: "See also", Text: `rbd-owner-agent(8), the agent; rbd-owner.yaml(5), its configuration's keys.

rbd(8), systemctl(1), journalctl(1): journalctl -u rbd-owner has the agent's log and its
audit entries (RBD_OWNER_EVENT=...).`},
	}}
}
