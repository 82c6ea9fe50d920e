package main

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/internal/agentflags"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
)

// kernelRelease is this node's kernel release (a test's own).
var kernelRelease = krbd.KernelRelease

// agentTimeout bounds the run of the agent program that says its librados's release.
const agentTimeout = 5 * time.Second

// libradosRelease is the Ceph release of the librados the agent loads, which this program
// (static: it links nothing of Ceph's) asks the agent program, as runDaemon finds it
// (agentflags.LibradosVersion). "" (not known) when the agent cannot be run, does not answer
// within agentTimeout, or does not say.
func libradosRelease() string {
	path, err := agentProgram()
	if err != nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), agentTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, agentflags.LibradosVersion) //nolint:gosec // the installed agent, or the one beside this program
	// should a child of the agent hold its stdout open
	cmd.WaitDelay = time.Second
	out, err := cmd.Output()
	if err != nil {
		return ""
	}
	line, _, _ := strings.Cut(string(out), "\n")
	if line = strings.TrimSpace(line); !releaseRE.MatchString(line) {
		return ""
	}
	return line
}

// releaseRE is what the agent may say of librados's release ("16.2.15", "19.2.3-678-gabcdef").
var releaseRE = regexp.MustCompile(`^[0-9][0-9A-Za-z.+~_-]{0,63}$`)

func (a *app) checkConfigCommand() *cobra.Command {
	var path string
	cmd := &cobra.Command{
		Use:     "check-config [--config PATH]",
		GroupID: groupAgent,
		Short:   "Say whether the agent would start with a config (exit 0 or 1)",
		Long: `Load a config as the agent does at start (every key, the defaults, the lease bound) and say
whether the agent would start with it: exit 0 with one line that sums it up, or exit 1 with the
agent's own error (one line naming the file, the line and the key). Each cluster's keyring is
read, when it can be, for a key this node cannot use: an aes256k key before Linux 7.0, or with
a librados before Ceph 19.2.6 and 20.2.4 (the agent program, run for a moment, says its
librados's release). It needs no running agent and no cluster; the packages run it before
they restart the agent on an upgrade.`,
		Example: `  # after an edit of /etc/rbd-owner/config.yaml
  rbd-owner check-config && systemctl restart rbd-owner

  rbd-owner check-config --config ./config.yaml.new`,
		DisableFlagsInUseLine: true,
		Args:                  wantArgs(),
		ValidArgsFunction:     cobra.NoFileCompletions,
		RunE: func(*cobra.Command, []string) error {
			return runCheckConfig(path, a.out)
		},
	}
	cmd.Flags().StringVar(&path, "config", config.DefaultPath, "the config file's `PATH`")
	must(cmd.MarkFlagFilename("config", "yaml", "yml"))
	return cmd
}

// runCheckConfig loads a config as the agent does at start (config.Load: every key, the
// defaults, the lease bound, the keys this node can use) and says whether the agent would start
// with it. It needs no running agent and no cluster, and links nothing of Ceph's (it runs the
// agent program to learn librados's release): the packages run it before they restart the
// agent on an upgrade. Its environment is not the agent's unit's: when the verdict depends on
// a switch of that environment (config.Env), one line says so, after the summary or in the
// error.
func runCheckConfig(path string, stdout io.Writer) error {
	env := config.ProcessEnv()
	c, err := config.LoadIn(path, "", env)
	other := env
	other.ShortFences = !env.ShortFences
	oc, _ := config.LoadIn(path, "", other)
	note := envNote(env, c, oc)
	if err != nil {
		if note != "" {
			return fmt.Errorf("%w; %s", err, note)
		}
		return err
	}
	if err := config.CheckKeys(c, krbd.NodeVersions{Kernel: kernelRelease(), Librados: libradosRelease()}); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	ids := make([]string, len(c.Clusters))
	for i, cl := range c.Clusters {
		ids[i] = cl.ID
	}
	clusters := "clusters " + strings.Join(ids, ", ")
	if len(ids) == 0 {
		clusters = "no cluster yet"
	}
	fmt.Fprintf(stdout, "%s: the agent accepts it (node %s, %s; lease_duration %s exceeds the lease bound %s for renew_interval %s)\n",
		path, c.NodeID, clusters, c.LeaseDuration.D(), c.LeaseBound(), c.RenewInterval.D())
	if note != "" {
		fmt.Fprintf(stdout, "note: %s\n", note)
	}
	return nil
}

// envNote says, in one line, when the verdict on a config judged in env (c, nil when refused)
// is not the one in env with ShortFencesEnv the other way (other): the switch lowers
// fence_expiry's floor, and the agent's unit may set it where this command's environment does
// not, or the reverse. "" when both verdicts agree.
func envNote(env config.Env, c, other *config.Config) string {
	if (c == nil) == (other == nil) {
		return ""
	}
	accepted, onlyWith := c, env.ShortFences
	if c == nil {
		accepted, onlyWith = other, !env.ShortFences
	}
	return fmt.Sprintf("fence_expiry %s is accepted only %s %s=1 in the agent's unit environment (test labs only); this check ran %s it",
		config.FormatDuration(accepted.FenceExpiry.D()), withOrWithout(onlyWith), config.ShortFencesEnv, withOrWithout(env.ShortFences))
}

func withOrWithout(with bool) string {
	if with {
		return "with"
	}
	return "without"
}
