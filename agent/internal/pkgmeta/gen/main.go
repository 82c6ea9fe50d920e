// Command gen writes the packages' changelog and copyright files for `make package` (not
// shipped):
//
//	gen changelog -version V -maintainer M -date UNIX -out dist/changelog.yml [-in CHANGELOG.md]
//	gen copyright -contact M -tags T -program /usr/bin/x=./agent/cmd/x ... -out dist/copyright
//
// The copyright's licence expression must equal nfpm.yaml's license (-nfpm), so that the rpm's
// License tag cannot drift from what the programs contain.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/rbd-owner/rbd-owner/agent/internal/pkgmeta"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: gen changelog|copyright [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "changelog":
		err = changelog(os.Args[2:])
	case "copyright":
		err = copyright(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q: want changelog or copyright", os.Args[1])
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "gen %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func changelog(args []string) error {
	fs := flag.NewFlagSet("changelog", flag.ContinueOnError)
	in := fs.String("in", "CHANGELOG.md", "the Keep a Changelog file")
	out := fs.String("out", "", "the chglog YAML file nfpm reads")
	version := fs.String("version", "", "the package version of the [Unreleased] section")
	revision := fs.String("revision", "1", "the packaging revision")
	maintainer := fs.String("maintainer", "", "the entries' RFC 822 contact")
	date := fs.Int64("date", 0, "the [Unreleased] entry's date, in seconds since 1970 (the commit's)")
	full := fs.String("full", "/usr/share/doc/rbd-owner/CHANGELOG.md", "where the whole changelog is installed")
	if err := fs.Parse(args); err != nil {
		return err
	}
	md, err := os.ReadFile(*in)
	if err != nil {
		return err
	}
	releases, err := pkgmeta.ParseChangelog(md)
	if err != nil {
		return fmt.Errorf("%s: %w", *in, err)
	}
	entries, err := pkgmeta.Entries(releases, pkgmeta.Package{
		Version: *version, Revision: *revision, Maintainer: *maintainer,
		Date: time.Unix(*date, 0), FullChangelog: *full,
	})
	if err != nil {
		return err
	}
	data, err := yaml.Marshal(entries)
	if err != nil {
		return err
	}
	return write(*out, data)
}

// programs is the repeated -program PATH=PACKAGE flag.
type programs []string

func (p *programs) String() string     { return strings.Join(*p, ",") }
func (p *programs) Set(s string) error { *p = append(*p, s); return nil }

func copyright(args []string) error {
	fs := flag.NewFlagSet("copyright", flag.ContinueOnError)
	var progs programs
	fs.Var(&progs, "program", "INSTALLED-PATH=GO-PACKAGE, once per shipped program")
	tags := fs.String("tags", "", "the Go build tags of the programs")
	out := fs.String("out", "", "the copyright file to write")
	nfpm := fs.String("nfpm", "nfpm.yaml", "the nfpm config whose license must match")
	p := pkgmeta.Project{Licence: "Apache-2.0"}
	fs.StringVar(&p.Name, "name", "rbd-owner", "Upstream-Name")
	fs.StringVar(&p.Contact, "contact", "", "Upstream-Contact (the maintainer)")
	fs.StringVar(&p.Source, "source", "", "Source (the project's home)")
	fs.StringVar(&p.Copyright, "copyright", "2026 The rbd-owner authors", "the project's own copyright")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if len(progs) == 0 || p.Contact == "" || p.Source == "" {
		return errors.New("-program, -contact and -source are required")
	}
	mods, err := modules(progs, *tags)
	if err != nil {
		return err
	}
	expr, err := pkgmeta.Expression(p, mods)
	if err != nil {
		return err
	}
	if err := matchNfpm(*nfpm, expr); err != nil {
		return err
	}
	var b bytes.Buffer
	if err := pkgmeta.WriteCopyright(&b, p, mods); err != nil {
		return err
	}
	return write(*out, b.Bytes())
}

// matchNfpm: the nfpm config's license is the expression the programs' contents give.
func matchNfpm(path, expr string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var cfg struct {
		License string `yaml:"license"`
	}
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if cfg.License != expr {
		return fmt.Errorf("%s says license %q, but the programs contain %q: set it to that (the modules compiled in, or their licences, changed)", path, cfg.License, expr)
	}
	return nil
}

// licenceFile matches a module's licence file name.
var (
	licenceFile = regexp.MustCompile(`(?i)^(licen[cs]e|copying)(\.(txt|md))?$`)
	noticeFile  = regexp.MustCompile(`(?i)^notice(\.(txt|md))?$`)
)

// modules lists every module compiled into the programs (not the main module), and Go's
// standard library, with the programs each is in, in module path order.
func modules(progs []string, tags string) ([]pkgmeta.Module, error) {
	byPath := map[string]*pkgmeta.Module{}
	var order []string
	for _, pr := range progs {
		installed, pkg, ok := strings.Cut(pr, "=")
		if !ok {
			return nil, fmt.Errorf("-program %q: want INSTALLED-PATH=GO-PACKAGE", pr)
		}
		mods, err := goList(pkg, tags)
		if err != nil {
			return nil, err
		}
		for _, m := range mods {
			if byPath[m.Path] == nil {
				byPath[m.Path] = &m
				order = append(order, m.Path)
			}
			byPath[m.Path].Programs = append(byPath[m.Path].Programs, installed)
		}
	}
	slices.Sort(order)
	out := make([]pkgmeta.Module, 0, len(order))
	for _, path := range order {
		out = append(out, *byPath[path])
	}
	return out, nil
}

// goList is the modules of one program's packages, from `go list -deps`.
func goList(pkg, tags string) ([]pkgmeta.Module, error) {
	cmd := exec.Command("go", "list", "-deps", "-tags", tags, "-json=Standard,Module", pkg) //nolint:gosec // a build tool run by the Makefile with its own arguments
	cmd.Stderr = os.Stderr
	raw, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list %s: %w", pkg, err)
	}
	seen := map[string]bool{}
	var out []pkgmeta.Module
	dec := json.NewDecoder(bytes.NewReader(raw))
	for {
		var p struct {
			Standard bool
			Module   *struct {
				Path, Version, Dir string
				Main               bool
			}
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("go list %s: %w", pkg, err)
		}
		var path, version, dir string
		switch {
		case p.Standard:
			path, version, dir = "std", goEnv("GOVERSION"), goEnv("GOROOT")
		case p.Module == nil || p.Module.Main:
			continue
		default:
			path, version, dir = p.Module.Path, p.Module.Version, p.Module.Dir
		}
		if seen[path] {
			continue
		}
		seen[path] = true
		text, err := fileOf(dir, licenceFile)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", path, version, err)
		}
		notice, _ := fileOf(dir, noticeFile) // most modules have none
		out = append(out, pkgmeta.Module{Path: path, Version: version, Licence: text, Notice: notice})
	}
	return out, nil
}

// fileOf is the text of the first file in dir whose name matches.
func fileOf(dir string, name *regexp.Regexp) (string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	for _, e := range entries {
		if !e.IsDir() && name.MatchString(e.Name()) {
			b, err := os.ReadFile(filepath.Join(dir, e.Name()))
			return string(b), err
		}
	}
	return "", fmt.Errorf("no file named like %s in %s", name, dir)
}

func goEnv(name string) string {
	out, err := exec.Command("go", "env", name).Output() //nolint:gosec // name is one of this file's constants
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

func write(path string, data []byte) error {
	if path == "" || path == "-" {
		_, err := os.Stdout.Write(data)
		return err
	}
	return os.WriteFile(path, data, 0o644) //nolint:gosec // a file the packages ship world-readable
}
