// Command imagetar packs a root file system into a container image tarball that
// `ctr -n k8s.io images import` (and `docker load`) reads: the lab has no registry, so its
// images (the ceph-csi plugin, the registrar, the sidecars, pause, the test pods) are built
// here and imported on each node, with imagePullPolicy Never.
//
//	imagetar -o OUT.tar -t NAME:TAG [-entrypoint PATH[,ARG...]] [-env K=V]... (-dir ROOT | -layer LAYER.tar)
//
// -dir takes a directory (its files, owners and modes as they are; symbolic links kept), -layer
// an uncompressed tar of one. The image is one layer on an empty base, for linux/amd64.
package main

import (
	"archive/tar"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

type envs []string

func (e *envs) String() string { return strings.Join(*e, " ") }
func (e *envs) Set(v string) error {
	if !strings.Contains(v, "=") {
		return fmt.Errorf("-env %q: want KEY=VALUE", v)
	}
	*e = append(*e, v)
	return nil
}

func main() {
	var out, tag, dir, layer, entrypoint string
	var env envs
	flag.StringVar(&out, "o", "", "the image tarball to write")
	flag.StringVar(&tag, "t", "", "the image's name and tag, e.g. lab.invalid/cephcsi:v3.12.2")
	flag.StringVar(&dir, "dir", "", "a root file system directory to pack")
	flag.StringVar(&layer, "layer", "", "an uncompressed tar of a root file system")
	flag.StringVar(&entrypoint, "entrypoint", "", "the entrypoint, its arguments separated by commas")
	flag.Var(&env, "env", "an environment variable KEY=VALUE (repeatable)")
	flag.Parse()
	if err := run(out, tag, dir, layer, entrypoint, env); err != nil {
		fmt.Fprintf(os.Stderr, "imagetar: %v\n", err)
		os.Exit(1)
	}
}

func run(out, tag, dir, layerTar, entrypoint string, env []string) error {
	if out == "" || tag == "" || (dir == "") == (layerTar == "") {
		return errors.New("usage: imagetar -o OUT.tar -t NAME:TAG [-entrypoint PATH[,ARG...]] [-env K=V]... (-dir ROOT | -layer LAYER.tar)")
	}
	ref, err := name.NewTag(tag)
	if err != nil {
		return fmt.Errorf("-t %s: %w", tag, err)
	}
	if layerTar == "" {
		tmp, err := os.CreateTemp(filepath.Dir(out), ".layer-*.tar")
		if err != nil {
			return err
		}
		defer os.Remove(tmp.Name()) //nolint:errcheck // a temporary file
		if err := tarDir(tmp, dir); err != nil {
			tmp.Close() //nolint:errcheck,gosec // the error is the tar's
			return fmt.Errorf("packing %s: %w", dir, err)
		}
		if err := tmp.Close(); err != nil {
			return err
		}
		layerTar = tmp.Name()
	}
	l, err := tarball.LayerFromFile(layerTar)
	if err != nil {
		return fmt.Errorf("layer %s: %w", layerTar, err)
	}
	cfg := v1.Config{Env: append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, env...)}
	if entrypoint != "" {
		cfg.Entrypoint = strings.Split(entrypoint, ",")
	}
	// the config first, then the layer, which adds its diff ID and history to it
	img, err := mutate.ConfigFile(empty.Image, &v1.ConfigFile{Architecture: "amd64", OS: "linux", Config: cfg,
		RootFS: v1.RootFS{Type: "layers"}})
	if err != nil {
		return err
	}
	if img, err = mutate.AppendLayers(img, l); err != nil {
		return err
	}
	tmp := out + ".new"
	if err := tarball.WriteToFile(tmp, ref, img); err != nil {
		os.Remove(tmp) //nolint:errcheck,gosec // the error is the write's
		return fmt.Errorf("writing %s: %w", out, err)
	}
	return os.Rename(tmp, out)
}

// tarDir writes the tree at root to w as a tar with paths relative to it, keeping owners,
// modes and symbolic links, and leaving out sockets and devices.
func tarDir(w io.Writer, root string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil || rel == "." {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if info.Mode()&(fs.ModeSocket|fs.ModeDevice|fs.ModeCharDevice|fs.ModeNamedPipe) != 0 {
			return nil
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(path); err != nil {
				return err
			}
		}
		h, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		h.Name = filepath.ToSlash(rel)
		if d.IsDir() {
			h.Name += "/"
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			h.Uid, h.Gid, h.Uname, h.Gname = int(st.Uid), int(st.Gid), "", ""
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		_, err = io.Copy(tw, f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}
