// Package saga is the map and the unmap of one image on this node, each a run of named steps
// with its undo beside each step: no claim is left without a device and no device without a
// claim. A map resolves the image and what this node already has, writes its intent, claims,
// writes the claim, maps in the kernel, records the mapping's client in the claim and writes
// the mapping; an unmap finds the device, writes its intent, unmaps, releases the claim and
// forgets the mapping. What an interrupted saga leaves (its persisted phase) is finished or
// undone by Resume (resume.go). The outcome (audit entry, metrics, log) is recorded once, at
// the end; a claim made, and a takeover's fences, are audited the moment they are made.
// Sagas of one image are serialised by its lock (Locks); other images proceed in parallel.
package saga

import (
	"context"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/rbd-owner/rbd-owner/agent/audit"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/fault"
	"github.com/rbd-owner/rbd-owner/agent/image"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/metrics"
	"github.com/rbd-owner/rbd-owner/agent/nodestate"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// Cluster is a configured cluster as the sagas use it.
type Cluster interface {
	// ID is the cluster's id in the config.
	ID() string
	// Claims is its claim store, connecting when needed.
	Claims(ctx context.Context) (*claim.Store, error)
	// MapOptions is how the kernel reaches it: monitors, user and the cluster's own map
	// options (after the config's global ones); not the secret.
	MapOptions() krbd.MapOptions
	// Secret is the agent's cephx key for it as its keyring holds it now, known once Claims
	// has connected.
	Secret() (string, error)
	// MapDefaults is the cluster's rbd_default_map_options for an image (mapdefault.Read),
	// read once Claims has connected.
	MapDefaults(ref image.Ref) (krbd.ClusterDefaults, error)
	// Connected is its claim store when connected now (it never connects).
	Connected() (*claim.Store, bool)
}

// Agent is what the sagas use of the running agent beyond the parts in Sagas.
type Agent interface {
	// Cluster is a configured cluster ("" for the only one); an unknown one is invalid input.
	Cluster(id string) (Cluster, error)
	// ClusterByFSID is the configured cluster connected with that fsid, nil when none is.
	ClusterByFSID(fsid string) Cluster
	// FencedMappingGone reports that this node's fenced mapping m no longer exists.
	FencedMappingGone(ctx context.Context, store *claim.Store, m state.Mapping)
	// WatchHeld starts (held) or ends the watch of an image a map was refused for because
	// another node holds it.
	WatchHeld(k state.Key, held bool)
	// ClusterLabel is the metrics label of a cluster id as a caller gave it.
	ClusterLabel(id string) string
}

// Caller is who asked for a saga: its credentials (nil when unknown) and whether it has the
// admin role.
type Caller struct {
	Peer  *peercred.Cred
	Admin bool
	// Denied records the refusal of what to this caller and returns the error to answer.
	Denied func(what string) error
}

// Sagas runs this node's maps and unmaps.
type Sagas struct {
	Agent   Agent
	Config  *config.Config
	Kernel  *krbd.Client
	State   *state.Store
	Node    *nodestate.Node
	Locks   *Locks
	Audit   *audit.Log
	Metrics *metrics.Metrics
	Log     *logrus.Logger
	// KernelRelease is this node's kernel release (uname -r): whether it speaks msgr2 (a
	// cluster whose monitors offer it is then mapped with ms_mode=prefer-crc by default) and
	// which key types it reads.
	KernelRelease string
	// LibradosRelease is the Ceph release of the librados the agent loads ("" when not known):
	// with KernelRelease, which key types this node uses (krbd.CheckNodeKey).
	LibradosRelease string
	// RebootedBefore, when set, is when the agent found the node rebooted since the state was
	// last written: a mapping written before it lost its device to the reboot (DeviceGone).
	RebootedBefore time.Time
	// Fault, when set, is called before every step; an error fails the step, and ErrCrash
	// makes the saga stop dead as if the process had been killed (tests).
	Fault func(saga, step string) error
}

// target is a validated image on a configured cluster.
type target struct {
	cl   Cluster
	spec image.Ref
	key  state.Key
	img  claim.Image
}

func (s *Sagas) target(clusterID string, spec image.Ref) (target, error) {
	if err := spec.Validate(); err != nil {
		return target{}, fmt.Errorf("%w: %w", fault.ErrInvalid, err)
	}
	cl, err := s.Agent.Cluster(clusterID)
	if err != nil {
		return target{}, err
	}
	return target{cl: cl, spec: spec, key: state.Key{Cluster: cl.ID(), Ref: spec}, img: spec.Head()}, nil
}
