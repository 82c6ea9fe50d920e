package manpage

import (
	"bytes"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

func TestWrite(t *testing.T) {
	root := &cobra.Command{Use: "tool", Short: "Do things", Long: "Tool does things.\n.dot and 'quote at the start\n\nA second paragraph with a \\ backslash."}
	root.PersistentFlags().String("socket", "/run/x.sock", "the socket `PATH`")
	root.PersistentFlags().Bool("secret", false, "hidden")
	if err := root.PersistentFlags().MarkHidden("secret"); err != nil {
		t.Fatal(err)
	}
	sub := &cobra.Command{Use: "map IMAGE", Short: "Map it", Long: "Map the image.", Example: "  tool map rbd/a\n  .starts with a dot",
		RunE: func(*cobra.Command, []string) error { return nil }}
	sub.Flags().Bool("read-only", false, "map read-only")
	sub.Flags().String("access", "rwo", "the access `MODE`")
	sub.InitDefaultHelpFlag()
	hidden := &cobra.Command{Use: "secret", Hidden: true, RunE: func(*cobra.Command, []string) error { return nil }}
	root.AddCommand(sub, hidden)
	var b bytes.Buffer
	if err := Write(&b, root, Page{Section: "8", Date: "2026-12-02", Source: "tool 1.0",
		Sections: []Section{{Title: "See also", Text: "rbd(8)"}}}); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	for _, want := range []string{
		`.TH "TOOL" "8" "2026\-12\-02" "tool 1.0"` + "\n",
		".SH NAME\ntool \\- Do things\n",
		".SH SYNOPSIS\n.B tool map IMAGE [flags]\n.br\n.SH DESCRIPTION\n.PP\nTool does things.\n\\&.dot and 'quote at the start\n.PP\nA second paragraph with a \\e backslash.\n",
		".SH OPTIONS\n", ".TP\n\\fB\\-h\\fR, \\fB\\-\\-help\\fR\nhelp for tool\n",
		".TP\n\\fB\\-\\-socket\\fR \\fIPATH\\fR\nthe socket PATH (default \"/run/x.sock\")\n",
		".SH COMMANDS\n.SS \"tool map IMAGE [flags]\"\n.PP\nMap the image.\n",
		".TP\n\\fB\\-\\-access\\fR \\fIMODE\\fR\nthe access MODE (default \"rwo\")\n",
		".TP\n\\fB\\-\\-read\\-only\\fR\nmap read\\-only\n",
		".PP\nExamples:\n.PP\n.RS\n.nf\ntool map rbd/a\n\\&.starts with a dot\n.fi\n.RE\n",
		".SH \"SEE ALSO\"\n.PP\nrbd(8)\n",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the page has no\n%s\n---- page:\n%s", want, page)
		}
	}
	for _, not := range []string{"secret", "help for map"} {
		if strings.Contains(page, not) {
			t.Errorf("the page has %q:\n%s", not, page)
		}
	}
}

func TestInline(t *testing.T) {
	for in, want := range map[string]string{
		"plain - text":                     `plain \- text`,
		"the `lease_duration` key, `-o` x": `the \fBlease_duration\fR key, \fB\-o\fR x`,
		"`.hidden` first":                  `\fB.hidden\fR first`,
		".dot `a\\b`":                      `\&.dot \fBa\eb\fR`,
		"'quote":                           `\&'quote`,
	} {
		if got := Inline(in); got != want {
			t.Errorf("Inline(%q) = %q, want %q", in, got, want)
		}
	}
}
