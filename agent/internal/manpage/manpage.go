// Package manpage writes the manual page of a cobra command tree: one page in man(7) roff for
// the program and every command, from the commands' own help (their usage line, description,
// flags and examples), so that `man rbd-owner` and `rbd-owner COMMAND --help` say the same.
package manpage

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Page is what the commands do not say: the page's header and its closing sections.
type Page struct {
	Section string // "8"
	Date    string // "2026-12-02": the build's, for a reproducible page
	Source  string // "rbd-owner 0.1.0"
	// Sections follow COMMANDS, in order (FILES, SEE ALSO, ...).
	Sections []Section
}

// Section is a closing section: a title and paragraphs of text (blank lines between them).
type Section struct {
	Title string
	Text  string
}

// Write writes root's page: NAME, SYNOPSIS, DESCRIPTION (root's long help), OPTIONS (root's
// flags), COMMANDS (each available command with its usage line, help, flags and examples), then
// the page's own sections.
func Write(w io.Writer, root *cobra.Command, p Page) error {
	root.InitDefaultHelpFlag()
	root.InitDefaultVersionFlag()
	bw := &strings.Builder{}
	bw.WriteString(Header(root.Name(), root.Short, p))
	bw.WriteString(".SH SYNOPSIS\n")
	for _, c := range commands(root) {
		fmt.Fprintf(bw, ".B %s\n.br\n", Escape(c.UseLine()))
	}
	bw.WriteString(".SH DESCRIPTION\n")
	paragraphs(bw, root.Long)
	bw.WriteString(".SH OPTIONS\n")
	flags(bw, root.LocalFlags(), false)
	bw.WriteString(".SH COMMANDS\n")
	for _, c := range commands(root) {
		fmt.Fprintf(bw, ".SS %s\n", Quote(c.UseLine()))
		paragraphs(bw, c.Long)
		flags(bw, c.LocalNonPersistentFlags(), true)
		if c.HasExample() {
			bw.WriteString(".PP\nExamples:\n.PP\n.RS\n.nf\n")
			for _, line := range strings.Split(c.Example, "\n") {
				fmt.Fprintf(bw, "%s\n", Escape(strings.TrimPrefix(line, "  ")))
			}
			bw.WriteString(".fi\n.RE\n")
		}
	}
	for _, s := range p.Sections {
		fmt.Fprintf(bw, ".SH %s\n", Quote(strings.ToUpper(s.Title)))
		paragraphs(bw, s.Text)
	}
	_, err := io.WriteString(w, bw.String())
	return err
}

// Header is the start of any page: its title line (the name in capitals, p's section, date and
// source), no hyphenation and ragged right (option names stay whole), and NAME (name - summary).
func Header(name, summary string, p Page) string {
	return fmt.Sprintf(".TH %s %s %s %s\n.nh\n.ad l\n.SH NAME\n%s \\- %s\n",
		Quote(strings.ToUpper(name)), Quote(p.Section), Quote(p.Date), Quote(p.Source), Escape(name), Escape(summary))
}

// commands is root's available commands, in the order of its help, each with its --help and
// the flags it inherits (as when it runs: its usage line says [flags] as its help does).
func commands(root *cobra.Command) []*cobra.Command {
	var cs []*cobra.Command
	for _, c := range root.Commands() {
		if c.IsAvailableCommand() {
			c.InitDefaultHelpFlag()
			cs = append(cs, c)
		}
	}
	return cs
}

// paragraphs writes text's paragraphs (separated by blank lines), filled.
func paragraphs(w *strings.Builder, text string) {
	for _, para := range strings.Split(strings.TrimSpace(text), "\n\n") {
		w.WriteString(".PP\n")
		for _, line := range strings.Split(para, "\n") {
			fmt.Fprintf(w, "%s\n", Escape(strings.TrimSpace(line)))
		}
	}
}

// flags writes one tagged paragraph per visible flag ("--access MODE", then what it does and
// its default); without --help when noHelp (a command's: every command has it).
func flags(w *strings.Builder, fs *pflag.FlagSet, noHelp bool) {
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden || noHelp && f.Name == "help" {
			return
		}
		tag := `\fB\-\-` + Escape(f.Name) + `\fR`
		if f.Shorthand != "" {
			tag = `\fB\-` + Escape(f.Shorthand) + `\fR, ` + tag
		}
		varname, usage := pflag.UnquoteUsage(f)
		if varname != "" && f.Value.Type() != "bool" {
			tag += ` \fI` + Escape(varname) + `\fR`
		}
		if f.DefValue != "" && f.Value.Type() != "bool" {
			usage += fmt.Sprintf(" (default %q)", f.DefValue)
		}
		fmt.Fprintf(w, ".TP\n%s\n%s\n", tag, Escape(usage))
	})
}

// Escape makes text safe in a roff line: backslashes, minus signs (an option's dashes stay
// ASCII when copied), and a leading control character.
func Escape(s string) string { return guardStart(escapeChars(s)) }

// Quote is a macro argument: escaped, in double quotes (a double quote inside is \(dq).
func Quote(s string) string {
	return `"` + strings.ReplaceAll(Escape(s), `"`, `\(dq`) + `"`
}

// Inline is Escape, with each `code` span (between backquotes) in bold: a name, a value or a
// command to type as it stands.
func Inline(s string) string {
	parts := strings.Split(s, "`")
	for i := range parts {
		parts[i] = escapeChars(parts[i])
		if i%2 == 1 {
			parts[i] = `\fB` + parts[i] + `\fR`
		}
	}
	return guardStart(strings.Join(parts, ""))
}

// escapeChars escapes backslashes and minus signs, and writes a character beyond ASCII as its
// code point (\[u2026]), which groff takes in any input encoding.
func escapeChars(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == '\\':
			b.WriteString(`\e`)
		case r == '-':
			b.WriteString(`\-`)
		case r > 0x7f:
			fmt.Fprintf(&b, `\[u%04X]`, r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// guardStart keeps a line that starts with a control character ('.' or ') from being a request.
func guardStart(s string) string {
	if strings.HasPrefix(s, ".") || strings.HasPrefix(s, "'") {
		return `\&` + s
	}
	return s
}
