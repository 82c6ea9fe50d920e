// Package confdoc writes the documentation that definitions in code already hold, so that it
// cannot drift from them: the manual page rbd-owner.yaml(5) and the key tables of
// docs/configuration.md and README.md from config.Keys, and the manual page rbd-owner-agent(8)
// with the agent's flags from agentflags. The CLI's `__gendocs` (a -tags gendocs build, run by
// `make package`) writes the pages; the tables are committed, and this package's tests fail
// when they differ from what Keys gives (`go test ./agent/internal/confdoc -update` rewrites
// them).
package confdoc

import (
	"fmt"
	"strings"

	"github.com/rbd-owner/rbd-owner/agent/config"
)

// The names of the generated parts of the markdown files, as their markers give them.
const (
	DocsTableName  = "config-keys"
	ShortTableName = "config-keys-short"
)

// DocsTable is the key table of docs/configuration.md: every key with its type, default, what
// it accepts and what it means, then the meanings of the words of the keys that take one of a
// few.
func DocsTable() string {
	var b strings.Builder
	b.WriteString("| key | type | default | accepted | meaning |\n|---|---|---|---|---|\n")
	for _, k := range config.Keys() {
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s |\n", k.Name, k.Type, defaultText(k), accepted(k), meaning(k, ""))
	}
	for _, k := range config.Keys() {
		if len(k.Values) == 0 {
			continue
		}
		fmt.Fprintf(&b, "\n`%s` takes:\n\n", k.Name)
		for _, v := range k.Values {
			def := ""
			if v.Name == k.Default {
				def = " (the default)"
			}
			fmt.Fprintf(&b, "- `%s`%s: %s\n", v.Name, def, v.Doc)
		}
	}
	return b.String()
}

// ShortTable is the README's table: the top-level keys, their defaults and a few words each.
func ShortTable() string {
	var b strings.Builder
	b.WriteString("| key | default | what |\n|---|---|---|\n")
	for _, k := range config.Keys() {
		if strings.HasPrefix(k.Name, config.ClustersPrefix) {
			continue
		}
		what := k.Summary
		if len(k.Values) > 0 {
			what += ": " + words(k.Values)
		}
		if k.See != "" {
			what += fmt.Sprintf(", see [docs/%s](docs/%s)", page(k.See), k.See)
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", k.Name, defaultText(k), what)
	}
	return b.String()
}

// defaultText is a key's default as the tables and the page give it: the value, what it
// depends on, or that the key is required.
func defaultText(k config.Key) string {
	switch {
	case k.Default != "" && k.DefaultNote != "":
		return "`" + k.Default + "` (" + k.DefaultNote + ")"
	case k.Default != "":
		return "`" + k.Default + "`"
	}
	return k.DefaultNote
}

// accepted is what a key accepts: its words, its rule, or any value of its type.
func accepted(k config.Key) string {
	switch {
	case len(k.Values) > 0:
		return words(k.Values)
	case k.Rule != "":
		return k.Rule
	case k.Type == "boolean":
		return "`true` or `false`"
	}
	return "any " + k.Type
}

// meaning is the key's meaning with a link to the page that says more; linkBase is the path
// from the markdown file to docs/.
func meaning(k config.Key, linkBase string) string {
	if k.See == "" {
		return k.Doc
	}
	return fmt.Sprintf("%s See [%s](%s%s).", k.Doc, page(k.See), linkBase, k.See)
}

// page is the file a See names, without its anchor.
func page(see string) string {
	file, _, _ := strings.Cut(see, "#")
	return file
}

// words lists values as "`a`, `b` or `c`".
func words(vs []config.Value) string {
	names := make([]string, len(vs))
	for i, v := range vs {
		names[i] = "`" + v.Name + "`"
	}
	if len(names) == 1 {
		return names[0]
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// Markers are the lines that begin and end the generated part name of a markdown file.
func Markers(name string) (begin, end string) {
	return fmt.Sprintf("<!-- %s: generated from agent/config/keys.go; `go test ./agent/internal/confdoc -update` rewrites it -->", name),
		fmt.Sprintf("<!-- end of %s -->", name)
}

// Splice replaces the lines between the markers of the generated part name in doc with
// content (empty, or lines that end in a newline). Each marker must be a line of its own, once,
// the beginning first.
func Splice(doc, name, content string) (string, error) {
	begin, end := Markers(name)
	bad := fmt.Errorf("want the lines %q and %q once each, in that order", begin, end)
	if strings.Count(doc, begin) != 1 || strings.Count(doc, end) != 1 || content != "" && !strings.HasSuffix(content, "\n") {
		return "", bad
	}
	i := strings.Index(doc, begin+"\n")
	start := i + len(begin) + 1
	stop := strings.Index(doc, end+"\n")
	switch {
	case i < 0, stop < start, i > 0 && doc[i-1] != '\n', doc[stop-1] != '\n':
		return "", bad
	}
	return doc[:start] + content + doc[stop:], nil
}
