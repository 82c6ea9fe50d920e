package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestManualPage: `__gendocs DIR` (the build with -tags gendocs) writes rbd-owner(8) with every
// command, its flags and examples, dated by SOURCE_DATE_EPOCH, and the pages rbd-owner.yaml(5)
// and rbd-owner-agent(8).
func TestManualPage(t *testing.T) {
	t.Setenv("SOURCE_DATE_EPOCH", "1796212800")
	dir := t.TempDir()
	a := &app{out: &output{Writer: os.Stdout}, stderr: os.Stderr}
	root := a.newRoot()
	root.AddCommand(genDocsCommand(root))
	root.SetArgs([]string{"__gendocs", dir})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "rbd-owner.8"))
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	for _, want := range []string{
		`.TH "RBD\-OWNER" "8" "2026\-12\-02" "rbd\-owner dev"`, ".SH NAME\nrbd\\-owner \\- Keep each Ceph RBD image mapped",
		".B rbd\\-owner map POOL[/NAMESPACE]/IMAGE[@SNAP] [flags]\n", "Exit codes: 0 done, 1 failed, 2 usage error",
		"\\fB\\-\\-socket\\fR \\fIPATH\\fR", ".SS \"rbd\\-owner fence (POOL[/NAMESPACE]/IMAGE | \\-\\-node NODE) [flags]\"",
		"\\fB\\-\\-takeover\\fR", ".SH \"EXIT STATUS\"\n.PP\n0: done. 1: failed", "3: the image is held by another\nnode",
		"5: status only", ".SH \"ENVIRONMENT\"\n.PP\nrbd\\-owner reads no environment variable", ".SH \"FILES\"\n", "/etc/rbd\\-owner/config.yaml", ".SH \"SEE ALSO\"\n",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("rbd-owner.8 has no %q", want)
		}
	}
	for name := range commands {
		if !strings.Contains(page, ".SS \"rbd\\-owner "+strings.ReplaceAll(name, "-", "\\-")+" ") {
			t.Errorf("rbd-owner.8 has no section for %s", name)
		}
	}
	if strings.Contains(page, "__gendocs") || strings.Contains(page, "__complete") || strings.Contains(page, "powershell") {
		t.Error("rbd-owner.8 documents a hidden command")
	}
	// the config's and the agent's pages beside it (agent/internal/confdoc tests what they say)
	for file, want := range map[string]string{"rbd-owner.yaml.5": `.TH "RBD\-OWNER.YAML" "5" "2026\-12\-02" "rbd\-owner dev"`,
		"rbd-owner-agent.8": `.TH "RBD\-OWNER\-AGENT" "8" "2026\-12\-02" "rbd\-owner dev"`} {
		b, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil || !strings.HasPrefix(string(b), want+"\n") {
			t.Errorf("%s: %v; want it to start with %s", file, err, want)
		}
	}
}
