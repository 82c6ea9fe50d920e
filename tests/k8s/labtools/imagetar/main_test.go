package main

import (
	"archive/tar"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// TestPacksADirectoryAsAnImage: the tarball holds one image whose config has the entrypoint and
// environment asked, and whose one layer has the tree's files, directories and links.
func TestPacksADirectoryAsAnImage(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "usr/local/bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "usr/local/bin/cephcsi"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("usr/local/bin", filepath.Join(root, "bin")); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "img.tar")
	if err := run(out, "lab.invalid/cephcsi:v1", root, "", "/usr/local/bin/cephcsi,--v=1", []string{"A=b"}); err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(out, nil)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cf.Config.Entrypoint, []string{"/usr/local/bin/cephcsi", "--v=1"}) || len(cf.Config.Env) != 2 || cf.Config.Env[1] != "A=b" || cf.OS != "linux" || cf.Architecture != "amd64" {
		t.Fatalf("config: %+v", cf)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 || len(cf.RootFS.DiffIDs) != 1 {
		t.Fatalf("layers: %d %v, diff IDs %v", len(layers), err, cf.RootFS.DiffIDs)
	}
	if id, _ := layers[0].DiffID(); id != cf.RootFS.DiffIDs[0] {
		t.Fatalf("the layer's diff ID %s is not the config's %s", id, cf.RootFS.DiffIDs[0])
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	got := map[string]string{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		got[h.Name] = string(rune(h.Typeflag)) + h.Linkname + string(b)
	}
	want := map[string]string{"usr/": "5", "usr/local/": "5", "usr/local/bin/": "5", "usr/local/bin/cephcsi": "0#!/bin/sh\n", "bin": "2usr/local/bin"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("layer: %q, want %q", got, want)
	}
}

func TestBadArgumentsAreRefused(t *testing.T) {
	out := filepath.Join(t.TempDir(), "img.tar")
	for _, c := range []struct{ tag, dir, layer string }{{"", "/", ""}, {"x:y", "", ""}, {"x:y", "/", "/l.tar"}, {"Bad Tag", "/", ""}} {
		if err := run(out, c.tag, c.dir, c.layer, "", nil); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatalf("a refused call wrote %s", out)
	}
}
