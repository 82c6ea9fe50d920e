package pkgmeta

import (
	"fmt"
	"io"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// Module is one body of code compiled into the programs, with its licence file's text.
type Module struct {
	// Path is the Go module path ("std" for Go's standard library and runtime).
	Path    string
	Version string
	// Licence is the text of the module's licence file.
	Licence string
	// Notice is the text of its NOTICE file, if it has one (Apache-2.0's copyright notices).
	Notice string
	// Programs are the installed programs it is compiled into.
	Programs []string
}

// Licence names the licence of a licence file's text by its SPDX identifier (or an "AND" of
// them), from the phrases each licence's text has. An unknown text is an error: a module under a
// licence this list does not know needs a person to read it before it ships.
func Licence(text string) (string, error) {
	t := strings.ToLower(strings.Join(strings.Fields(text), " "))
	has := func(s string) bool { return strings.Contains(t, s) }
	var ids []string
	if has("apache license") && has("version 2.0") {
		ids = append(ids, "Apache-2.0")
	}
	if has("permission is hereby granted, free of charge") {
		ids = append(ids, "MIT")
	}
	if has("redistribution and use in source and binary forms") {
		if has("neither the name") || has("names of its contributors") {
			ids = append(ids, "BSD-3-Clause")
		} else {
			ids = append(ids, "BSD-2-Clause")
		}
	}
	if has("gnu general public license") && has("version 3, 29 june 2007") && !strings.HasPrefix(t, "gnu lesser") {
		ids = append(ids, "GPL-3.0-only")
	}
	if has("mozilla public license") && has("version 2.0") {
		ids = append(ids, "MPL-2.0")
	}
	if has("permission to use, copy, modify, and/or distribute this software") {
		ids = append(ids, "ISC")
	}
	if len(ids) == 0 {
		return "", fmt.Errorf("a licence this generator does not know (%.60q...): read it, and teach pkgmeta.Licence its phrases", strings.TrimSpace(text))
	}
	return strings.Join(ids, " AND "), nil
}

// copyrightLine: a line that states a copyright; the licence's own template lines are not.
var copyrightLine = regexp.MustCompile(`(?i)^\s*copyright\s+(?:\(c\)\s*|©\s*)?(\d{4}.*)$`)

// Holders are the copyright statements of a licence file, without "Copyright (c)".
func Holders(text string) []string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		m := copyrightLine.FindStringSubmatch(line)
		if m == nil || strings.Contains(line, "Free Software Foundation") {
			continue
		}
		h := strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(m[1]), "All rights reserved."))
		if !slices.Contains(out, h) {
			out = append(out, h)
		}
	}
	return out
}

// Project is this package's own part of the copyright file.
type Project struct {
	Name, Contact, Source, Copyright, Licence string
}

// commonLicences are the texts Debian installs in /usr/share/common-licenses, which a copyright
// file refers to instead of repeating them (lintian asks for that); and where else to read them.
var commonLicences = map[string]string{
	"Apache-2.0":   "https://www.apache.org/licenses/LICENSE-2.0",
	"GPL-3.0-only": "https://www.gnu.org/licenses/gpl-3.0.html",
	"MPL-2.0":      "https://www.mozilla.org/MPL/2.0/",
}

// debianName is the file name under /usr/share/common-licenses.
var debianName = map[string]string{"Apache-2.0": "Apache-2.0", "GPL-3.0-only": "GPL-3", "MPL-2.0": "MPL-2.0"}

// Expression is the licence of the whole package, as an rpm License tag and nfpm's license take
// it: every licence of the project and the modules, in order, joined by AND.
func Expression(p Project, mods []Module) (string, error) {
	set := map[string]bool{p.Licence: true}
	for _, m := range mods {
		id, err := Licence(m.Licence)
		if err != nil {
			return "", fmt.Errorf("%s %s: %w", m.Path, m.Version, err)
		}
		for _, one := range strings.Split(id, " AND ") {
			set[one] = true
		}
	}
	ids := make([]string, 0, len(set))
	for id := range set {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return strings.Join(ids, " AND "), nil
}

// WriteCopyright writes a machine-readable (DEP-5) copyright file: the project, then one
// paragraph per module with its holders and licence (the text itself where Debian has no common
// copy), then the common licences' paragraphs.
func WriteCopyright(w io.Writer, p Project, mods []Module) error {
	var b strings.Builder
	fmt.Fprintf(&b, "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n")
	fmt.Fprintf(&b, "Upstream-Name: %s\nUpstream-Contact: %s\nSource: %s\n", p.Name, p.Contact, p.Source)
	b.WriteString(field("Comment", wrap("The programs are written in Go, which compiles the modules they use into "+
		"each program. Each module is listed below by its Go module path, with the programs it is "+
		"compiled into; a program as a whole is covered by the licences of everything in it.\n"+
		gplNote(mods))))
	fmt.Fprintf(&b, "\nFiles: *\nCopyright: %s\nLicense: %s\n", p.Copyright, p.Licence)
	used := map[string]bool{p.Licence: true}
	for _, m := range mods {
		id, err := Licence(m.Licence)
		if err != nil {
			return fmt.Errorf("%s %s: %w", m.Path, m.Version, err)
		}
		for _, one := range strings.Split(id, " AND ") {
			used[one] = true
		}
		holders := Holders(m.Licence + "\n" + m.Notice)
		if len(holders) == 0 {
			holders = []string{"the authors of " + m.Path + " (its licence file names none)"}
		}
		files, what := m.Path+"/*", "the Go module "+m.Path+" "+m.Version
		if m.Path == "std" {
			files, what = "go/src/*", "the Go standard library and runtime, "+m.Version
		}
		fmt.Fprintf(&b, "\nFiles: %s\n", files)
		b.WriteString(field("Copyright", strings.Join(holders, "\n")))
		dep5 := strings.ReplaceAll(id, " AND ", " and ")
		if _, common := commonLicences[id]; common {
			fmt.Fprintf(&b, "License: %s\n", dep5)
		} else {
			b.WriteString(field("License", dep5+"\n"+strings.TrimSpace(m.Licence)))
		}
		b.WriteString(field("Comment", wrap(what+", compiled into "+strings.Join(m.Programs, ", "))))
	}
	ids := make([]string, 0, len(used))
	for id := range used {
		if _, common := commonLicences[id]; common {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	for _, id := range ids {
		b.WriteString("\n" + field("License", id+"\n"+wrap(
			"On Debian systems, the complete text of this licence is in "+
				"/usr/share/common-licenses/"+debianName[id]+"; it is also at "+commonLicences[id]+".")))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// gplNote says which programs a GPL module makes GPL-covered as a whole ("" when none does).
func gplNote(mods []Module) string {
	var notes []string
	for _, m := range mods {
		if id, err := Licence(m.Licence); err == nil && strings.Contains(id, "GPL-") {
			verb := "includes"
			if len(m.Programs) > 1 {
				verb = "include"
			}
			notes = append(notes, fmt.Sprintf("%s %s %s (%s), so %s is distributed as a whole under "+
				"the terms of the %s, the other licences of its parts being compatible with it.",
				strings.Join(m.Programs, " and "), verb, m.Path, id, pronoun(m.Programs), id))
		}
	}
	return strings.Join(notes, "\n")
}

func pronoun(programs []string) string {
	if len(programs) == 1 {
		return "it"
	}
	return "each"
}

// field formats a DEP-5 field: the first line after the name, every further line indented by
// one space, an empty line as " .".
func field(name, value string) string {
	lines := strings.Split(value, "\n")
	var b strings.Builder
	b.WriteString(name + ": " + strings.TrimRight(lines[0], " \t") + "\n")
	for _, l := range lines[1:] {
		l = strings.TrimRight(l, " \t")
		if l == "" {
			l = "."
		}
		b.WriteString(" " + l + "\n")
	}
	return b.String()
}

// wrap fills each paragraph of s (lines split by "\n") to 78 columns, for a field's value whose
// lines a reader sees indented by one space.
func wrap(s string) string {
	var out []string
	for _, para := range strings.Split(s, "\n") {
		line := ""
		for _, w := range strings.Fields(para) {
			if line != "" && len(line)+1+len(w) > 78 {
				out = append(out, line)
				line = w
				continue
			}
			if line != "" {
				line += " "
			}
			line += w
		}
		out = append(out, line)
	}
	return strings.Join(out, "\n")
}
