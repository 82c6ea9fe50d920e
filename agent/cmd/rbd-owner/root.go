package main

import (
	"fmt"
	"strings"
	"unicode"

	"github.com/spf13/cobra"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/version"
)

const rootLong = `rbd-owner keeps each Ceph RBD image mapped on at most one node at a time: before every krbd
map its agent claims the image in RADOS, and it fences a stale owner's mapping, so a volume
staged on a second node cannot be written from two nodes at once.

"rbd-owner daemon" runs the agent (systemd starts it); every other command asks the agent of
this node through its socket. Root and group rbd-owner-admin may call everything; group
rbd-owner may map, unmap, release its own claims and read (status, claims of a pool).

Exit codes: 0 done, 1 failed, 2 usage error, 3 held by another node, 4 agent not reachable,
5 status: the agent answers but reports problems (listed as "problem:" lines).

With --json, stdout is one JSON document: the answer, or the error as
{"error": {"code", "message", ...}} (code "unreachable" when no agent answers, exit 4;
"permission_denied" when the caller may not connect to the socket and "interrupted" when the
agent went away during the call, exit 1; "invalid_argument" for a mistake on the command line);
stderr stays empty, and the exit codes are the same.`

// The groups of commands in the root's help.
const (
	groupNode  = "node"
	groupAdmin = "admin"
	groupAgent = "agent"
)

// annotationJSON marks a command that takes --json.
const annotationJSON = "rbd-owner/json"

func init() {
	cobra.EnableCommandSorting = false // in the order of newRoot: the everyday ones first
}

// newRoot builds the command tree: every command with its flags, help and completion.
func (a *app) newRoot() *cobra.Command {
	var showVersion bool
	root := &cobra.Command{
		Use:   "rbd-owner",
		Short: "Keep each Ceph RBD image mapped on at most one node at a time",
		Long:  rootLong,
		// the root runs no command of its own but --version: a line without one is a usage error
		Args: func(cmd *cobra.Command, args []string) error {
			switch {
			case len(args) == 0 && showVersion:
				return nil
			case len(args) == 0:
				return usageError{"name a command"}
			}
			return usageError{fmt.Sprintf("unknown command %q%s", args[0], suggest(cmd, args[0]))}
		},
		RunE:              func(*cobra.Command, []string) error { return a.printVersion() },
		PersistentPreRunE: a.preRun,
		SilenceErrors:     true, // report prints them, as one line or the JSON error object
		SilenceUsage:      true,
		DisableAutoGenTag: true,
		// "fense": did you mean fence?
		SuggestionsMinimumDistance: 2,
	}
	root.SetOut(a.out.Writer) // before the completion command, which keeps it
	root.SetErr(a.stderr)
	root.SetUsageFunc(usage)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err.Error()} })
	root.PersistentFlags().StringVar(&a.socket, "socket", api.DefaultSocket, "the agent's API socket `PATH`")
	root.Flags().BoolVar(&showVersion, "version", false, "print the version")
	// --json may come before the command's name too; a command without it refuses it (preRun)
	root.PersistentFlags().BoolVar(&a.json, "json", false, "print JSON")
	must(root.PersistentFlags().MarkHidden("json"))
	root.AddGroup(&cobra.Group{ID: groupNode, Title: "Commands:"},
		&cobra.Group{ID: groupAdmin, Title: "Admin Commands (root or group rbd-owner-admin):"},
		&cobra.Group{ID: groupAgent, Title: "Agent Commands:"})
	root.AddCommand(
		a.mapCommand(), a.unmapCommand(), a.statusCommand(), a.claimsCommand(),
		a.fenceCommand(), a.releaseCommand(), a.unfenceCommand(),
		daemonCommand(), a.checkConfigCommand(),
		a.versionCommand(),
	)
	for _, extra := range extraCommands {
		root.AddCommand(extra(root))
	}
	root.SetHelpCommand(helpCommand(root))
	completionCommand(root)
	return root
}

// usage writes the end of a command's help: cobra's default, with one usage line per command
// (usageLine), and "Other Commands" for those of no group. A function, not a template: cobra's
// templates would keep the linker from dropping unused methods (2 MB more of program).
func usage(cmd *cobra.Command) error {
	w := cmd.OutOrStderr()
	fmt.Fprintf(w, "Usage:\n  %s", usageLine(cmd))
	if cmd.HasExample() {
		fmt.Fprintf(w, "\n\nExamples:\n%s", cmd.Example)
	}
	if cmd.HasAvailableSubCommands() {
		rest := "Other Commands:"
		if len(cmd.Groups()) == 0 {
			rest = "Available Commands:"
		}
		groups := append(append([]*cobra.Group(nil), cmd.Groups()...), &cobra.Group{Title: rest})
		for _, g := range groups {
			title := "\n\n" + g.Title
			for _, sub := range cmd.Commands() {
				if sub.GroupID == g.ID && (sub.IsAvailableCommand() || sub.Name() == "help") {
					fmt.Fprintf(w, "%s\n  %-*s %s", title, sub.NamePadding(), sub.Name(), sub.Short)
					title = ""
				}
			}
		}
	}
	if cmd.HasAvailableLocalFlags() {
		fmt.Fprintf(w, "\n\nFlags:\n%s", strings.TrimRightFunc(cmd.LocalFlags().FlagUsages(), unicode.IsSpace))
	}
	if cmd.HasAvailableInheritedFlags() {
		fmt.Fprintf(w, "\n\nGlobal Flags:\n%s", strings.TrimRightFunc(cmd.InheritedFlags().FlagUsages(), unicode.IsSpace))
	}
	if cmd.HasAvailableSubCommands() {
		fmt.Fprintf(w, "\n\nUse \"%s <command> --help\" for more information about a command.", cmd.CommandPath())
	}
	fmt.Fprintln(w)
	return nil
}

// usageLine is a command's usage line: "rbd-owner map POOL/IMAGE [flags]", or for the root,
// "rbd-owner <command> [flags]".
func usageLine(cmd *cobra.Command) string {
	if !cmd.HasParent() {
		return cmd.CommandPath() + " <command> [flags]"
	}
	return cmd.UseLine()
}

// suggest is " (did you mean ...?)" for a mistyped command, or "".
func suggest(cmd *cobra.Command, typed string) string {
	s := cmd.SuggestionsFor(typed)
	if len(s) == 0 {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", strings.Join(s, `" or "`))
}

// wantArgs checks that the command got exactly the positional arguments named (none when
// names is empty): one line for what is missing or left over.
func wantArgs(names ...string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		switch {
		case len(args) > len(names):
			return usageError{fmt.Sprintf("unexpected argument %q", args[len(names)])}
		case len(args) < len(names):
			return usageError{"missing argument " + names[len(args)]}
		}
		return nil
	}
}

// addJSON gives cmd its --json flag (the answer as JSON; errors as the API's error object).
func (a *app) addJSON(cmd *cobra.Command, answer string) {
	cmd.Flags().BoolVar(&a.json, "json", false, "print "+answer+" as JSON, and an error as the API's error object, on stdout")
	if cmd.Annotations == nil {
		cmd.Annotations = map[string]string{}
	}
	cmd.Annotations[annotationJSON] = "true"
}

// takesJSON: cmd has a --json flag of its own.
func takesJSON(cmd *cobra.Command) bool {
	return cmd != nil && cmd.Annotations[annotationJSON] == "true"
}

func (a *app) versionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Long:  "Print the version of this program (the same as rbd-owner --version).",
		Example: `  rbd-owner version
  rbd-owner --version`,
		Args:              wantArgs(),
		RunE:              func(*cobra.Command, []string) error { return a.printVersion() },
		ValidArgsFunction: cobra.NoFileCompletions,
	}
}

func (a *app) printVersion() error {
	_, err := fmt.Fprintf(a.out, "rbd-owner %s\n", version.Version)
	return err
}

// helpCommand is cobra's help command, except that an unknown topic is a usage error.
func helpCommand(root *cobra.Command) *cobra.Command {
	return &cobra.Command{
		Use:   "help [command]",
		Short: "Help about any command",
		Long:  "Help about any command: rbd-owner help COMMAND is rbd-owner COMMAND --help.",
		RunE: func(_ *cobra.Command, args []string) error {
			target, rest, err := root.Find(args)
			if err != nil || len(rest) > 0 {
				return usageError{fmt.Sprintf("unknown help topic %q", strings.Join(args, " "))}
			}
			target.InitDefaultHelpFlag()
			target.InitDefaultVersionFlag()
			return target.Help()
		},
		ValidArgsFunction: func(_ *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
			target, _, err := root.Find(args)
			if err != nil {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			var names []cobra.Completion
			for _, sub := range target.Commands() {
				if sub.IsAvailableCommand() && strings.HasPrefix(sub.Name(), toComplete) {
					names = append(names, cobra.CompletionWithDesc(sub.Name(), sub.Short))
				}
			}
			return names, cobra.ShellCompDirectiveNoFileComp
		},
	}
}

// must panics on an error that only a mistake in this program's command definitions makes.
func must(err error) {
	if err != nil {
		panic(err)
	}
}
