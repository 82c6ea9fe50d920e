package pkgmeta

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/goreleaser/chglog"
)

const sample = `# Changelog

Intro prose.

## [Unreleased]

Prose about this version, not an entry.

### Added

- The node agent (` + "`rbd-owner daemon`" + `): before every map it claims the image.
  It fences a stale holder.
- Fences; and [links](docs/x.md) made plain.

### Fixed

- A very long entry whose first clause does not end for a long while, so that it must be shortened at a word boundary to fit.

## [0.0.9] - 2026-01-31

### Changed

- Something older.
`

func TestParseChangelog(t *testing.T) {
	rs, err := ParseChangelog([]byte(sample))
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 2 || rs[0].Version != "" || rs[1].Version != "0.0.9" || !rs[1].Date.Equal(time.Date(2026, 1, 31, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("releases: %+v", rs)
	}
	added := rs[0].Sections[0]
	if added.Name != "Added" || len(added.Entries) != 2 {
		t.Fatalf("Added: %+v", added)
	}
	if want := "The node agent (`rbd-owner daemon`): before every map it claims the image. It fences a stale holder."; added.Entries[0] != want {
		t.Errorf("entry 0 = %q, want %q (continuation lines joined)", added.Entries[0], want)
	}
	if want := "Fences; and links made plain."; added.Entries[1] != want {
		t.Errorf("entry 1 = %q, want %q (links as their text)", added.Entries[1], want)
	}
}

func TestParseChangelogRefusesWhatItCannotRead(t *testing.T) {
	for name, md := range map[string]string{
		"no heading":         "# Changelog\n\n- an entry\n",
		"released, no date":  "## [1.0.0]\n### Added\n- x\n",
		"bad date":           "## [1.0.0] - 2026-13-01\n### Added\n- x\n",
		"heading unreadable": "## 1.0.0\n",
		"section first":      "### Added\n- x\n",
	} {
		if _, err := ParseChangelog([]byte(md)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestEntries(t *testing.T) {
	rs, err := ParseChangelog([]byte(sample))
	if err != nil {
		t.Fatal(err)
	}
	date := time.Unix(1_790_000_000, 0)
	es, err := Entries(rs, Package{Version: "0.1.0~git3.abc", Revision: "1", Maintainer: "m <m@x.invalid>", Date: date, FullChangelog: "/usr/share/doc/p/CHANGELOG.md"})
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 2 || es[0].Semver != "0.1.0~git3.abc-1" || !es[0].Date.Equal(date) || es[1].Semver != "0.0.9-1" {
		t.Fatalf("entries: %+v %+v", es[0], es[1])
	}
	var notes []string
	for _, c := range es[0].Changes {
		notes = append(notes, c.Note)
	}
	want := []string{
		"Added: The node agent (`rbd-owner daemon`)",
		"Added: Fences",
		"Fixed: A very long entry whose first clause does not end for a long...",
		"The whole entry: /usr/share/doc/p/CHANGELOG.md",
	}
	if strings.Join(notes, "\n") != strings.Join(want, "\n") {
		t.Errorf("notes:\n%s\nwant:\n%s", strings.Join(notes, "\n"), strings.Join(want, "\n"))
	}
	if _, err := Entries(rs, Package{Version: "1"}); err == nil {
		t.Error("no maintainer: accepted")
	}
}

// The repository's own CHANGELOG.md reads, and its Debian changelog keeps every line under the
// width lintian allows.
func TestRepositoryChangelog(t *testing.T) {
	md, err := os.ReadFile("../../../CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	rs, err := ParseChangelog(md)
	if err != nil {
		t.Fatalf("CHANGELOG.md: %v", err)
	}
	es, err := Entries(rs, Package{Version: "0.1.0~git1.abcdef12", Revision: "1", Maintainer: "rbd-owner maintainers <maintainers@rbd-owner.invalid>", Date: time.Unix(0, 0)})
	if err != nil {
		t.Fatal(err)
	}
	tpl, err := chglog.DebTemplate()
	if err != nil {
		t.Fatal(err)
	}
	out, err := chglog.FormatChangelog(&chglog.PackageChangeLog{Name: "rbd-owner", Entries: es}, tpl)
	if err != nil {
		t.Fatal(err)
	}
	changes := 0
	for _, line := range strings.Split(out, "\n") {
		if len([]rune(line)) >= 80 && !strings.HasPrefix(line, " -- ") { // the trailer is not checked
			t.Errorf("line of %d columns: %q", len([]rune(line)), line)
		}
		if strings.HasPrefix(line, "  * ") {
			changes++
		}
	}
	if changes < 10 {
		t.Errorf("%d changes in the Debian changelog:\n%s", changes, out)
	}
}

const (
	apache = "                                 Apache License\n                           Version 2.0, January 2004\n"
	mit    = "The MIT License (MIT)\n\nCopyright (c) 2014 Simon Eskildsen\n\nPermission is hereby granted, free of charge, to any person"
	bsd3   = "Copyright (c) 2009 The Go Authors. All rights reserved.\n\nRedistribution and use in source and binary forms, with or without\n" +
		"modification, are permitted...\n   * Neither the name of Google Inc. nor the names of its\ncontributors may be used"
	bsd2 = "Copyright 2020 A\nRedistribution and use in source and binary forms, with or without modification"
	gpl3 = "                    GNU GENERAL PUBLIC LICENSE\n                       Version 3, 29 June 2007\n\n Copyright (C) 2007 Free Software Foundation, Inc.\n" +
		"... use the GNU Lesser General Public License instead of this License."
	lgpl3 = "                   GNU LESSER GENERAL PUBLIC LICENSE\n                       Version 3, 29 June 2007\n" +
		"incorporates the terms and conditions of version 3 of the GNU General Public License"
)

func TestLicence(t *testing.T) {
	for text, want := range map[string]string{
		apache:              "Apache-2.0",
		mit:                 "MIT",
		bsd3:                "BSD-3-Clause",
		bsd2:                "BSD-2-Clause",
		gpl3:                "GPL-3.0-only",
		mit + "\n" + apache: "Apache-2.0 AND MIT",
	} {
		got, err := Licence(text)
		if err != nil || got != want {
			t.Errorf("Licence(%.40q) = %q, %v; want %q", text, got, err, want)
		}
	}
	// a licence it does not know (here the LGPL, which mentions the GPL) needs a person
	if id, err := Licence(lgpl3); err == nil {
		t.Errorf("LGPL-3.0 read as %q", id)
	}
	if id, err := Licence("All rights reserved."); err == nil {
		t.Errorf("no licence read as %q", id)
	}
}

func TestHolders(t *testing.T) {
	got := Holders(bsd3 + "\n" + gpl3 + "\nCopyright [yyyy] [name of copyright owner]\n  Copyright 2012-2015 The Prometheus Authors\nCopyright 2009 The Go Authors. All rights reserved.")
	want := []string{"2009 The Go Authors.", "2012-2015 The Prometheus Authors"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("Holders = %q, want %q (the FSF's and the template's lines are the licence's own)", got, want)
	}
}

func TestCopyright(t *testing.T) {
	p := Project{Name: "rbd-owner", Contact: "m <m@x.invalid>", Source: "https://example.invalid/rbd-owner", Copyright: "2026 The rbd-owner authors", Licence: "Apache-2.0"}
	mods := []Module{
		{Path: "example.com/mitlib", Version: "v1.0.0", Licence: mit, Programs: []string{"/usr/bin/a"}},
		{Path: "example.com/udev", Version: "v0.9.1", Licence: gpl3, Programs: []string{"/usr/bin/a", "/usr/lib/b"}},
		{Path: "example.com/apachelib", Version: "v2.0.0", Licence: apache, Notice: "Project\nCopyright 2018 CoreOS, Inc\n", Programs: []string{"/usr/lib/b"}},
	}
	expr, err := Expression(p, mods)
	if err != nil || expr != "Apache-2.0 AND GPL-3.0-only AND MIT" {
		t.Errorf("Expression = %q, %v", expr, err)
	}
	var b strings.Builder
	if err := WriteCopyright(&b, p, mods); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n",
		"\nFiles: *\nCopyright: 2026 The rbd-owner authors\nLicense: Apache-2.0\n",
		// a licence Debian has no common copy of: its text, in the paragraph
		"\nFiles: example.com/mitlib/*\nCopyright: 2014 Simon Eskildsen\nLicense: MIT\n The MIT License (MIT)\n .\n Copyright (c) 2014 Simon Eskildsen\n",
		// the copyright from the NOTICE file
		"\nFiles: example.com/apachelib/*\nCopyright: 2018 CoreOS, Inc\nLicense: Apache-2.0\n",
		"\nFiles: example.com/udev/*\nCopyright: the authors of example.com/udev (its licence file names none)\nLicense: GPL-3.0-only\n",
		"/usr/bin/a and /usr/lib/b include example.com/udev (GPL-3.0-only), so each is\n distributed",
		"\nLicense: GPL-3.0-only\n On Debian systems, the complete text of this licence is in\n /usr/share/common-licenses/GPL-3;",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("copyright lacks %q:\n%s", want, out)
		}
	}
	for i, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, " ") && strings.TrimSpace(line) == "" {
			t.Errorf("line %d: an empty continuation line (DEP-5 wants \" .\")", i+1)
		}
	}
	mods = append(mods, Module{Path: "example.com/odd", Licence: "Do what you like."})
	if err := WriteCopyright(&b, p, mods); err == nil || !strings.Contains(err.Error(), "example.com/odd") {
		t.Errorf("an unknown licence: %v, want an error naming the module", err)
	}
}
