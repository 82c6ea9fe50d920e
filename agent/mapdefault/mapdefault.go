// Package mapdefault reads a cluster's default kernel map options for one image,
// rbd_default_map_options, from where Ceph's rbd device map reads them: the image's metadata
// (`rbd config image set`), the pool's (`rbd config pool set`), and the client configuration the
// monitors hand out (`ceph config set client ...`, as Rook sets ms_mode there). The most specific
// level that sets it wins whole.
package mapdefault

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"

	"github.com/rbd-owner/rbd-owner/agent/cephconn"
	"github.com/rbd-owner/rbd-owner/agent/image"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
)

// Option is Ceph's name of the setting; MetadataKey is how librbd stores a pool's or an image's
// override of it.
const (
	Option      = "rbd_default_map_options"
	MetadataKey = "conf_" + Option
)

// readCap is the cap the reads need (what the agent's user has anyway).
const readCap = "osd 'profile rbd'"

// Read returns the cluster's rbd_default_map_options for ref's image and the level it came
// from ("" options when no level sets it). An image that does not exist has no level of its own
// (the map then fails on the image, not here). Every call is bounded by the connection's
// operation timeouts.
func Read(conn *rados.Conn, ref image.Ref) (krbd.ClusterDefaults, error) {
	if v, err := imageLevel(conn, ref); err != nil || v != "" {
		return krbd.ClusterDefaults{Options: v, Level: krbd.LevelImage}, err
	}
	pool, err := conn.OpenIOContext(ref.Pool)
	if err != nil {
		return krbd.ClusterDefaults{}, cephconn.Classify(fmt.Errorf("open pool %s: %w", ref.Pool, err), "open pool "+ref.Pool, readCap)
	}
	defer pool.Destroy()
	v, err := rbd.GetPoolMetadata(pool, MetadataKey)
	switch {
	case err == nil && v != "":
		return krbd.ClusterDefaults{Options: v, Level: krbd.LevelPool}, nil
	case err != nil && !notFound(err):
		return krbd.ClusterDefaults{}, cephconn.Classify(fmt.Errorf("pool %s: metadata %s: %w", ref.Pool, MetadataKey, err), "read pool "+ref.Pool, readCap)
	}
	v, err = conn.GetConfigOption(Option)
	if err != nil {
		return krbd.ClusterDefaults{}, fmt.Errorf("client configuration %s: %w", Option, err)
	}
	return krbd.ClusterDefaults{Options: v, Level: krbd.LevelConfig}, nil
}

// imageLevel is the image's own setting, "" when it has none or does not exist.
func imageLevel(conn *rados.Conn, ref image.Ref) (string, error) {
	io, err := conn.OpenIOContext(ref.Pool)
	if err != nil {
		return "", cephconn.Classify(fmt.Errorf("open pool %s: %w", ref.Pool, err), "open pool "+ref.Pool, readCap)
	}
	defer io.Destroy()
	io.SetNamespace(ref.Namespace)
	im, err := rbd.OpenImageReadOnly(io, ref.Image, rbd.NoSnapshot)
	if notFound(err) {
		return "", nil
	}
	if err != nil {
		return "", cephconn.Classify(fmt.Errorf("open image %s: %w", ref.Head(), err), "open image "+ref.Head().String(), readCap)
	}
	defer func() { _ = im.Close() }() // opened read only: its close loses nothing
	v, err := im.GetMetadata(MetadataKey)
	if err != nil && !notFound(err) {
		return "", cephconn.Classify(fmt.Errorf("image %s: metadata %s: %w", ref.Head(), MetadataKey, err), "read image "+ref.Head().String(), readCap)
	}
	return v, nil
}

// notFound says whether err is the cluster's ENOENT.
func notFound(err error) bool {
	return err != nil && (errors.Is(err, rbd.ErrNotFound) || cephconn.Code(err) == -int(syscall.ENOENT))
}
