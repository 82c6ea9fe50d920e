// Package pkgmeta writes the packages' changelog and copyright from their one source each: the
// changelog from CHANGELOG.md (Keep a Changelog), the copyright (DEP-5) from the Go modules
// compiled into the programs and their licence files. `make package` runs it (./gen).
package pkgmeta

import (
	"bufio"
	"bytes"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/goreleaser/chglog"
)

// Release is one version's section of CHANGELOG.md.
type Release struct {
	// Version is the section's version, "" for [Unreleased].
	Version string
	// Date is the release date, zero for [Unreleased].
	Date time.Time
	// Sections are the "### Added", "### Fixed", ... sections in file order.
	Sections []Section
}

// Section is one kind of change and its entries, each flattened to one line of plain text.
type Section struct {
	Name    string
	Entries []string
}

var (
	releaseHeading = regexp.MustCompile(`^## \[([^\]]+)\](?:\s+-\s+(\d{4}-\d{2}-\d{2}))?\s*$`)
	mdLink         = regexp.MustCompile(`\[([^\]]+)\]\([^)]*\)`)
)

// ParseChangelog reads a Keep a Changelog file: "## [Unreleased]" or "## [1.2.3] - 2026-01-31"
// headings, "### Kind" sections, "- " entries whose further lines are indented. Prose between a
// heading and its first section is not an entry and is left out.
func ParseChangelog(md []byte) ([]Release, error) {
	var (
		releases []Release
		entry    *strings.Builder
	)
	flush := func() {
		if entry == nil {
			return
		}
		r := &releases[len(releases)-1]
		s := &r.Sections[len(r.Sections)-1]
		s.Entries = append(s.Entries, plain(entry.String()))
		entry = nil
	}
	sc := bufio.NewScanner(bytes.NewReader(md))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## "):
			flush()
			m := releaseHeading.FindStringSubmatch(line)
			if m == nil {
				return nil, fmt.Errorf("line %d: %q: want \"## [Unreleased]\" or \"## [1.2.3] - YYYY-MM-DD\"", n, line)
			}
			r := Release{}
			if !strings.EqualFold(m[1], "unreleased") {
				if m[2] == "" {
					return nil, fmt.Errorf("line %d: release %s has no date (\"## [%s] - YYYY-MM-DD\")", n, m[1], m[1])
				}
				d, err := time.Parse(time.DateOnly, m[2])
				if err != nil {
					return nil, fmt.Errorf("line %d: release %s: %w", n, m[1], err)
				}
				r.Version, r.Date = m[1], d
			}
			releases = append(releases, r)
		case strings.HasPrefix(line, "### "):
			flush()
			if len(releases) == 0 {
				return nil, fmt.Errorf("line %d: section %q before any \"## [version]\" heading", n, line)
			}
			r := &releases[len(releases)-1]
			r.Sections = append(r.Sections, Section{Name: strings.TrimSpace(line[4:])})
		case strings.HasPrefix(line, "- ") && len(releases) > 0 && len(releases[len(releases)-1].Sections) > 0:
			flush()
			entry = &strings.Builder{}
			entry.WriteString(line[2:])
		case entry != nil && strings.HasPrefix(line, "  ") && strings.TrimSpace(line) != "":
			entry.WriteString(" " + strings.TrimSpace(line))
		default:
			flush()
		}
	}
	flush()
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(releases) == 0 {
		return nil, fmt.Errorf("no \"## [version]\" heading")
	}
	return releases, nil
}

// plain turns an entry's Markdown into one line of text: links become their text.
func plain(s string) string {
	return strings.Join(strings.Fields(mdLink.ReplaceAllString(s, "$1")), " ")
}

// Package is what the package changelog needs besides the releases.
type Package struct {
	// Version is the package's version for the [Unreleased] section (e.g. 0.1.0~git12.abcdef12).
	Version string
	// Revision is the packaging revision appended to every version ("1": 0.1.0-1).
	Revision string
	// Maintainer is the RFC 822 contact of every entry.
	Maintainer string
	// Date is the [Unreleased] entry's date (the commit's, for reproducible packages).
	Date time.Time
	// FullChangelog names where the whole text is installed, for the last line of each entry.
	FullChangelog string
}

// Width is the longest line of a package changelog entry: lintian wants Debian changelog lines
// under 80 columns ("  * " and the entry).
const Width = 76

// Entries is the package changelog (deb and rpm, through nfpm's chglog format): one entry per
// release, newest first, each with one line per change: its kind and the change's first clause,
// shortened to Width, and a last line naming the full text.
func Entries(releases []Release, p Package) (chglog.ChangeLogEntries, error) {
	if p.Version == "" || p.Maintainer == "" {
		return nil, fmt.Errorf("the package version and maintainer are required")
	}
	var out chglog.ChangeLogEntries
	for _, r := range releases {
		version, date := r.Version, r.Date
		if version == "" {
			version, date = p.Version, p.Date
		}
		if p.Revision != "" {
			version += "-" + p.Revision
		}
		e := &chglog.ChangeLog{
			ChangeLogOverridables: chglog.ChangeLogOverridables{
				Deb: &chglog.ChangelogDeb{Urgency: "medium", Distributions: []string{"unstable"}},
			},
			Semver:   version,
			Date:     date.UTC(),
			Packager: p.Maintainer,
		}
		for _, s := range r.Sections {
			for _, text := range s.Entries {
				e.Changes = append(e.Changes, &chglog.ChangeLogChange{Note: shorten(s.Name+": "+firstClause(text), Width-4)})
			}
		}
		if p.FullChangelog != "" {
			e.Changes = append(e.Changes, &chglog.ChangeLogChange{Note: shorten("The whole entry: "+p.FullChangelog, Width-4)})
		}
		out = append(out, e)
	}
	return out, nil
}

// firstClause is the text up to its first ". ", ": " or "; " outside parentheses and backquotes
// (without that punctuation).
func firstClause(s string) string {
	depth, code := 0, false
	for i, c := range s {
		switch {
		case c == '`':
			code = !code
		case code:
		case c == '(':
			depth++
		case c == ')' && depth > 0:
			depth--
		case depth == 0 && (c == '.' || c == ':' || c == ';') && i+1 < len(s) && s[i+1] == ' ':
			return s[:i]
		}
	}
	return strings.TrimSuffix(s, ".")
}

// shorten cuts s at a word boundary to at most width runes, marking the cut with "...".
func shorten(s string, width int) string {
	r := []rune(s)
	if len(r) <= width {
		return s
	}
	cut := string(r[:width-3])
	if i := strings.LastIndexByte(cut, ' '); i > width/2 {
		cut = cut[:i]
	}
	return strings.TrimRight(cut, " ,;:(") + "..."
}
