package cephconn

import (
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// TestLibradosReleaseIsTheInstalledOnes: the release LibradosRelease reads from the loaded
// libraries is the one the package manager installed (librados2's version, without its epoch
// and its packaging revision).
func TestLibradosReleaseIsTheInstalledOnes(t *testing.T) {
	out, err := exec.Command("dpkg-query", "-W", "-f=${Version}", "librados2").Output()
	if err != nil {
		t.Skipf("no librados2 package to compare with (dpkg-query: %v)", err)
	}
	release := regexp.MustCompile(`^\d+\.\d+\.\d+`)
	pkg := string(out)
	if _, after, ok := strings.Cut(pkg, ":"); ok {
		pkg = after
	}
	want := release.FindString(pkg)
	if want == "" {
		t.Fatalf("librados2's version %q has no major.minor.patch", out)
	}
	got := LibradosRelease()
	t.Logf("LibradosRelease: %q (librados2 %s)", got, out)
	if release.FindString(got) != want {
		t.Fatalf("LibradosRelease: %q, want %s (librados2 %s)", got, want, out)
	}
}
