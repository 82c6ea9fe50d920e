package confdoc

import (
	"bytes"
	"flag"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/internal/agentflags"
)

var update = flag.Bool("update", false, "rewrite the generated parts of docs/configuration.md and README.md")

// the repository's root, from this package's directory
const root = "../../.."

// TestDocsUpToDate: the key tables committed in docs/configuration.md and README.md are the
// ones Keys gives. With -update it writes them.
func TestDocsUpToDate(t *testing.T) {
	for _, d := range []struct{ file, name, content string }{
		{"docs/configuration.md", DocsTableName, DocsTable()},
		{"README.md", ShortTableName, ShortTable()},
	} {
		path := filepath.Join(root, d.file)
		old, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		doc, err := Splice(string(old), d.name, d.content)
		if err != nil {
			t.Fatalf("%s: %v", d.file, err)
		}
		switch {
		case doc == string(old):
		case *update:
			if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: rewrote %s", d.file, d.name)
		default:
			t.Errorf("%s: the table %s is not what agent/config/keys.go gives; run "+
				"`go test ./agent/internal/confdoc -update` and commit the result", d.file, d.name)
		}
	}
}

func TestSplice(t *testing.T) {
	begin, end := Markers("x")
	doc := "a\n" + begin + "\nold\n" + end + "\nb\n"
	got, err := Splice(doc, "x", "new\nlines\n")
	if want := "a\n" + begin + "\nnew\nlines\n" + end + "\nb\n"; err != nil || got != want {
		t.Errorf("Splice: %q, %v; want %q", got, err, want)
	}
	// an empty part, at the start of the file; and emptied
	doc = begin + "\n" + end + "\nb\n"
	got, err = Splice(doc, "x", "new\n")
	if want := begin + "\nnew\n" + end + "\nb\n"; err != nil || got != want {
		t.Errorf("Splice into an empty part: %q, %v; want %q", got, err, want)
	}
	if got, err = Splice(got, "x", ""); err != nil || got != doc {
		t.Errorf("Splice of nothing: %q, %v; want %q", got, err, doc)
	}
	for _, bad := range []string{"a\n" + begin + "\n", "a\n" + end + "\n" + begin + "\n", begin + "\nx" + end + "\n",
		"x" + begin + "\n" + end + "\n", begin + "\n" + end + "\n" + end + "\n", begin + end + "\n"} {
		if got, err := Splice(bad, "x", "new\n"); err == nil {
			t.Errorf("Splice(%q): no error, %q", bad, got)
		}
	}
}

// TestConfigPage: rbd-owner.yaml(5) has every key, every word of the keys that take one, and
// an example the agent accepts; groff formats it without a warning.
func TestConfigPage(t *testing.T) {
	var b bytes.Buffer
	if err := ConfigPage(&b, "2026-12-02", "rbd-owner dev"); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	for _, want := range []string{`.TH "RBD\-OWNER.YAML" "5" "2026\-12\-02" "rbd\-owner dev"`, ".SH NAME\nrbd\\-owner.yaml \\- ",
		".SH KEYS\n", ".SS \"Keys of each cluster\"\n", ".SH \"THE LEASE BOUND\"\n", "= \\fB50s\\fR, less than \\fB60s\\fR",
		".SH EXAMPLE\n", "\\fBrbd\\-owner\\-agent\\fR(8)"} {
		if !strings.Contains(page, want) {
			t.Errorf("the page has no %q", want)
		}
	}
	for _, k := range config.Keys() {
		name := strings.TrimPrefix(k.Name, config.ClustersPrefix)
		if !strings.Contains(page, ".TP\n\\fB"+strings.ReplaceAll(name, "-", "\\-")+"\\fR ("+k.Type+")\n") {
			t.Errorf("the page has no entry for %s", k.Name)
		}
		for _, v := range k.Values {
			if !strings.Contains(page, ".TP\n\\fB"+strings.ReplaceAll(v.Name, "-", "\\-")+"\\fR\n") {
				t.Errorf("the page has no entry for %s: %s", k.Name, v.Name)
			}
		}
	}
	mid := filepath.Join(t.TempDir(), "machine-id")
	if err := os.WriteFile(mid, []byte("0123456789abcdef\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := config.Parse([]byte(Example), mid); err != nil {
		t.Errorf("the page's example: %v", err)
	}
	groffCheck(t, page)
}

// TestAgentPage: rbd-owner-agent(8) names every flag the agent defines, every environment
// variable its packages read, and only settings the unit has; groff formats it without a
// warning.
func TestAgentPage(t *testing.T) {
	var b bytes.Buffer
	if err := AgentPage(&b, "2026-12-02", "rbd-owner dev"); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	for _, want := range []string{`.TH "RBD\-OWNER\-AGENT" "8"`, ".SH SYNOPSIS\n", ".SH OPTIONS\n", ".SH FILES\n",
		".SH ENVIRONMENT\n", ".SH SIGNALS\n", ".SH \"EXIT STATUS\"\n", "\\fBrbd\\-owner.yaml\\fR(5)", "/etc/rbd\\-owner/config.yaml"} {
		if !strings.Contains(page, want) {
			t.Errorf("the page has no %q", want)
		}
	}
	agentflags.New(&agentflags.Args{}, io.Discard).VisitAll(func(f *flag.Flag) {
		name, _ := flag.UnquoteUsage(f)
		tag := "\\fB\\-\\-" + strings.ReplaceAll(f.Name, "-", "\\-") + "\\fR \\fI" + name + "\\fR"
		if strings.Count(page, tag) < 3 { // two synopsis lines and OPTIONS
			t.Errorf("the page does not give the flag --%s as %q in its synopsis and options", f.Name, tag)
		}
	})
	documented := map[string]bool{}
	for _, e := range agentEnv() {
		documented[e.name] = true
		if !strings.Contains(page, ".TP\n\\fB"+strings.ReplaceAll(e.name, "-", "\\-")+"\\fR\n") {
			t.Errorf("the page has no entry for %s", e.name)
		}
	}
	read := envRead(t)
	for _, must := range []string{config.ShortFencesEnv, "INVOCATION_ID"} {
		if read[must] == "" {
			t.Errorf("the scan of agent/ did not find %s read: it finds nothing", must)
		}
	}
	for name, where := range read {
		if !documented[name] {
			t.Errorf("%s reads %s, which the agent's page does not document (agentEnv)", where, name)
		}
	}
	unitLines := map[string]bool{}
	for _, unit := range []string{"units/rbd-owner.service", "units/rbd-owner.socket"} {
		data, err := os.ReadFile(filepath.Join(root, unit))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			unitLines[line] = true
		}
	}
	for _, s := range unitSettings {
		if !unitLines[s] {
			t.Errorf("the page says the unit has %s; units/ has no such line", s)
		}
	}
	groffCheck(t, page)
}

// agentSkip are the directories under agent/ of programs other than the agent: the CLI, the
// drop-in rbd, the failover controller (its flags and POD_NAME, POD_NAMESPACE: docs/kubernetes.md)
// and the test cluster's helpers.
var agentSkip = map[string]bool{"cmd/rbd-owner": true, "cmd/rbd-shim": true, "shim": true, "cmd/rbd-owner-failover": true, "internal/cephtest": true}

// envRead finds the environment variables the agent's packages read (os.Getenv, os.LookupEnv),
// each with the file that reads it; a name given by a constant is looked up among the string
// constants of agent/.
func envRead(t *testing.T) map[string]string {
	t.Helper()
	consts := map[string]string{}
	type call struct {
		arg  ast.Expr
		file string
	}
	var calls []call
	dir := filepath.Join(root, "agent")
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		if d.IsDir() && agentSkip[filepath.ToSlash(rel)] {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.ValueSpec:
				for i, name := range n.Names {
					if i < len(n.Values) {
						if lit, ok := n.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
							consts[name.Name], _ = strconv.Unquote(lit.Value)
						}
					}
				}
			case *ast.CallExpr:
				if sel, ok := n.Fun.(*ast.SelectorExpr); ok && len(n.Args) == 1 {
					if pkg, ok := sel.X.(*ast.Ident); ok && pkg.Name == "os" && (sel.Sel.Name == "Getenv" || sel.Sel.Name == "LookupEnv") {
						calls = append(calls, call{n.Args[0], "agent/" + filepath.ToSlash(rel)})
					}
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	read := map[string]string{}
	for _, c := range calls {
		var name string
		switch a := c.arg.(type) {
		case *ast.BasicLit:
			name, _ = strconv.Unquote(a.Value)
		case *ast.Ident:
			name = consts[a.Name]
		case *ast.SelectorExpr:
			name = consts[a.Sel.Name]
		}
		if name == "" {
			t.Errorf("%s reads an environment variable this test cannot name", c.file)
			continue
		}
		read[name] = c.file
	}
	return read
}

// groffCheck formats page as `man -l` does, with every warning on: there must be none.
func groffCheck(t *testing.T, page string) {
	t.Helper()
	if _, err := exec.LookPath("groff"); err != nil {
		t.Log("groff is not installed: the page's roff is not checked")
		return
	}
	cmd := exec.Command("groff", "-man", "-Tutf8", "-ww", "-z")
	cmd.Stdin = strings.NewReader(page)
	out, err := cmd.CombinedOutput()
	if err != nil || len(out) > 0 {
		t.Errorf("groff -man -ww: %v\n%s", err, out)
	}
}

// TestPackagedConfig: the packaged config.yaml has every top-level key, those with a default
// commented out at that default ("#lease_duration: 60s").
func TestPackagedConfig(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(root, "packaging/config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	lines := map[string]bool{}
	for _, line := range strings.Split(string(data), "\n") {
		lines[line] = true
	}
	for _, k := range config.Keys() {
		if strings.HasPrefix(k.Name, config.ClustersPrefix) {
			continue
		}
		if k.Default != "" && !lines["#"+k.Name+": "+k.Default] {
			t.Errorf("packaging/config.yaml has no line %q", "#"+k.Name+": "+k.Default)
		}
		if !strings.Contains(string(data), "\n#"+k.Name+":") && !strings.Contains(string(data), "\n"+k.Name+":") {
			t.Errorf("packaging/config.yaml does not have %s", k.Name)
		}
	}
}

// TestSocketTriggerLimitIsTheServicesStartLimit (issue 52): rbd-owner.socket starts the agent at
// most as often as rbd-owner.service's start limit allows, so that the limit holds whoever
// starts it (systemd's default trigger limit, 20 in 2 s, started a failing agent again and
// again on connections).
func TestSocketTriggerLimitIsTheServicesStartLimit(t *testing.T) {
	value := func(unit, key string) string {
		data, err := os.ReadFile(filepath.Join(root, "units", unit))
		if err != nil {
			t.Fatal(err)
		}
		found := ""
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, key+"="); ok {
				found = v
			}
		}
		if found == "" {
			t.Errorf("%s has no %s=", unit, key)
		}
		return found
	}
	if s, k := value("rbd-owner.service", "StartLimitBurst"), value("rbd-owner.socket", "TriggerLimitBurst"); s != k {
		t.Errorf("TriggerLimitBurst=%s, StartLimitBurst=%s: want the same", k, s)
	}
	if s, k := value("rbd-owner.service", "StartLimitIntervalSec"), value("rbd-owner.socket", "TriggerLimitIntervalSec"); s != k {
		t.Errorf("TriggerLimitIntervalSec=%s, StartLimitIntervalSec=%s: want the same", k, s)
	}
}
