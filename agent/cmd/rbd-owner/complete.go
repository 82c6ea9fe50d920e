package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/rbd-owner/rbd-owner/agent/api"
)

// completionTimeout bounds the agent's answer to a completion: the shell waits for it.
const completionTimeout = 2 * time.Second

// completionCommand adjusts cobra's `completion` command: bash, zsh and fish (no powershell on
// a Linux node), and a usage error without a known shell.
func completionCommand(root *cobra.Command) {
	root.InitDefaultCompletionCmd()
	comp, _, err := root.Find([]string{"completion"})
	must(err)
	for _, sub := range comp.Commands() {
		if sub.Name() == "powershell" {
			comp.RemoveCommand(sub)
		}
	}
	comp.Use = "completion (bash | zsh | fish)"
	comp.Short = "Print the shell completion script for bash, zsh or fish"
	comp.Long = `Print the shell completion script of rbd-owner for bash, zsh or fish. The packages install
all three where the shells look for them, so a new shell completes the commands, their flags,
and the images mapped on this node (from the agent's status; nothing when it does not answer).`
	comp.Example = `  # try it in the running bash
  source <(rbd-owner completion bash)

  # install it for zsh (the packages do it)
  rbd-owner completion zsh > /usr/share/zsh/vendor-completions/_rbd-owner`
	comp.Args = cobra.ArbitraryArgs
	comp.RunE = func(_ *cobra.Command, args []string) error {
		if len(args) == 0 {
			return usageError{"name a shell: bash, zsh or fish"}
		}
		return usageError{fmt.Sprintf("unknown shell %q: bash, zsh or fish", args[0])}
	}
}

// agentStatus is the agent's status for a completion, or nil: best effort, as fast as the agent
// answers, and silent on the command line when it does not (the reason goes to cobra's
// completion debug log, BASH_COMP_DEBUG_FILE).
func (a *app) agentStatus(cmd *cobra.Command) *api.Status {
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, completionTimeout)
	defer cancel()
	st, err := a.client().Status(ctx)
	if err != nil {
		cobra.CompDebugln("rbd-owner: no completion from the agent: "+err.Error(), false)
		return nil
	}
	return st
}

// completeImages completes the image argument with the images mapped on this node (with their
// snapshot when snapOK, and for unmap, with the devices too when the word starts with "/").
func (a *app) completeImages(snapOK bool) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 || cmd.Flags().Changed("node") {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		st := a.agentStatus(cmd)
		if st == nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		devices := cmd.Name() == "unmap" && strings.HasPrefix(toComplete, "/")
		seen := map[string]bool{}
		var names []cobra.Completion
		for _, d := range st.Devices {
			name, desc := d.Device, imageName(d.Pool, d.Namespace, d.Image, d.Snapshot)
			if !devices {
				snap := d.Snapshot
				if !snapOK {
					snap = ""
				}
				name, desc = imageName(d.Pool, d.Namespace, d.Image, snap), "mapped at "+d.Device
			}
			if d.Image == "" || seen[name] || !strings.HasPrefix(name, toComplete) {
				continue
			}
			seen[name] = true
			names = append(names, cobra.CompletionWithDesc(name, desc))
		}
		return names, cobra.ShellCompDirectiveNoFileComp
	}
}

// completeClusters completes cmd's --cluster with the clusters of this node's agent.
func (a *app) completeClusters(cmd *cobra.Command) {
	must(cmd.RegisterFlagCompletionFunc("cluster", func(cmd *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		st := a.agentStatus(cmd)
		if st == nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var ids []cobra.Completion
		for _, cl := range st.Clusters {
			if strings.HasPrefix(cl.ID, toComplete) {
				ids = append(ids, cobra.CompletionWithDesc(cl.ID, "fsid "+dash(cl.FSID)))
			}
		}
		return ids, cobra.ShellCompDirectiveNoFileComp
	}))
}
