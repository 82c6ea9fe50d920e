package daemon

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/cephconn"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/claim/radosbackend"
	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/image"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/mapdefault"
	"github.com/rbd-owner/rbd-owner/agent/metrics"
	"github.com/rbd-owner/rbd-owner/agent/nodeaddr"
	"github.com/rbd-owner/rbd-owner/agent/state"
	"github.com/rbd-owner/rbd-owner/agent/version"
	"github.com/sirupsen/logrus"
)

// Connection is one cluster as the daemon uses it: the claim store's backend, the agent's
// cephx secret (for the kernel's keyring) and how to close it.
type Connection struct {
	Backend claim.Backend
	Secret  string
	Close   func()
	// MapDefaults reads the cluster's rbd_default_map_options for an image (nil: none, as
	// the in-memory cluster of the tests has).
	MapDefaults func(image.Ref) (krbd.ClusterDefaults, error)
	// Key reads the agent's key from its keyring now (nil: Secret is the key): a map uses the
	// key the keyring holds at that moment, so that a rotated key needs no restart.
	Key func() (string, error)
}

// connectRados is the default Options.Connect: the cluster's keyring and a RADOS connection.
func connectRados(ctx context.Context, c config.Cluster) (Connection, error) {
	secret, err := krbd.ReadKeyringFile(c.Keyring, "client."+c.User)
	if err != nil {
		return Connection{}, fmt.Errorf("keyring: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return Connection{}, err
	}
	conn, err := cephconn.Connect(cephconn.Options{User: c.User, Keyring: c.Keyring, Monitors: c.Monitors})
	if err != nil {
		return Connection{}, err
	}
	b, err := radosbackend.New(conn)
	if err != nil {
		conn.Shutdown()
		return Connection{}, err
	}
	read := func(ref image.Ref) (krbd.ClusterDefaults, error) { return mapdefault.Read(conn, ref) }
	key := func() (string, error) { return krbd.ReadKeyringFile(c.Keyring, "client."+c.User) }
	return Connection{Backend: b, Secret: secret, Close: conn.Shutdown, MapDefaults: read, Key: key}, nil
}

// cluster is one configured cluster: its connection and claim store, made on first use. No
// lock is held across a cluster call: one caller connects while the others wait for that
// attempt (or their own deadline), and status reads what is there without waiting.
type cluster struct {
	cfg config.Cluster
	env *clusterEnv

	mu         sync.Mutex
	conn       Connection
	store      *claim.Store
	lastTry    time.Time
	lastErr    error
	connecting chan struct{} // closed when the attempt in flight ends
}

// clusterEnv is what a cluster's connection takes from the agent: its settings and its
// node's facts for the claim store, and where the store reports.
type clusterEnv struct {
	connect func(ctx context.Context, c config.Cluster) (Connection, error) // nil: connectRados
	cfg     *config.Config
	state   *state.Store
	addrs   *nodeaddr.Resolver
	bootID  string
	now     func() time.Time
	mono    func() time.Duration
	log     *logrus.Logger
	metrics *metrics.Metrics
	onSkew  func(cluster, node string, skew time.Duration)
}

// reconnectEvery limits how often a failed cluster connection is retried.
const reconnectEvery = 5 * time.Second

// Claims returns the cluster's claim store, connecting when needed. It waits for a connection
// attempt already in flight at most until ctx ends.
func (c *cluster) Claims(ctx context.Context) (*claim.Store, error) {
	for {
		c.mu.Lock()
		if c.store != nil {
			s := c.store
			c.mu.Unlock()
			return s, nil
		}
		if ch := c.connecting; ch != nil {
			c.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return nil, fmt.Errorf("cluster %s: %w: still connecting: %w", c.cfg.ID, cephconn.ErrUnavailable, ctx.Err())
			}
		}
		if c.lastErr != nil && time.Since(c.lastTry) < reconnectEvery {
			err := c.lastErr
			c.mu.Unlock()
			return nil, fmt.Errorf("cluster %s: %w", c.cfg.ID, err)
		}
		ch := make(chan struct{})
		c.connecting, c.lastTry = ch, time.Now()
		c.mu.Unlock()

		store, conn, err := c.connect(ctx)

		c.mu.Lock()
		c.connecting, c.lastErr = nil, err
		if err == nil {
			c.store, c.conn = store, conn
		}
		close(ch)
		c.mu.Unlock()
		if err != nil {
			return nil, fmt.Errorf("cluster %s: %w", c.cfg.ID, err)
		}
		return store, nil
	}
}

// connect opens the cluster; it holds no lock.
func (c *cluster) connect(ctx context.Context) (*claim.Store, Connection, error) {
	connect := c.env.connect
	if connect == nil {
		connect = connectRados
	}
	conn, err := connect(ctx, c.cfg)
	if err != nil {
		return nil, Connection{}, err
	}
	hostname, err := os.Hostname()
	if err != nil {
		c.env.log.WithError(err).Warn("hostname unknown; claim records will show none")
	}
	counted := claim.Counted(conn.Backend, func(op, object string) { c.env.metrics.ClusterOp(c.cfg.ID, op, object) })
	store, err := claim.NewStoreOn(counted, claim.Config{
		Node: claim.Node{
			ID: c.env.cfg.NodeID, Hostname: hostname, AgentVersion: version.Version, Incarnation: c.env.state.Incarnation(), BootID: c.env.bootID,
			Addr: func() string {
				a, err := c.env.addrs.SourceFor(c.cfg.Monitors)
				if err != nil {
					c.env.log.WithError(err).Warn("node address unknown")
				}
				return a
			},
		},
		Lease:       c.env.cfg.LeaseDuration.D(),
		FenceExpiry: c.env.cfg.FenceExpiry.D(),
		FenceCheck:  c.env.cfg.RenewInterval.D(),
		Now:         c.env.now,
		Mono:        c.env.mono,
		OnSkew:      func(node string, skew time.Duration) { c.env.onSkew(c.cfg.ID, node, skew) },
		OnNoticeFailed: func(err error) {
			c.env.log.WithError(err).WithField("cluster", c.cfg.ID).Warn("notice not left for a node whose hold changed: tried again every renew interval (that node also finds the change at its slow claim check)")
		},
		OnIndexBuilt: func(pool, ns string, found int, took time.Duration) {
			c.env.log.WithFields(map[string]any{"cluster": c.cfg.ID, "pool": pool, "namespace": ns, "claims_found": found, "took_ms": took.Milliseconds()}).
				Info("claim index built: the namespace's objects were listed once to index the claims agents before the index made (never again: its claims are read through the index)")
		},
	})
	if err != nil {
		if conn.Close != nil {
			conn.Close()
		}
		return nil, Connection{}, err
	}
	// the holds this node's state names, listed by its first heartbeat in each place whatever
	// that heartbeat listed before (an agent before the list, a list cut short by a crash), so
	// that `fence --node` finds them all
	for _, m := range c.env.state.All() {
		if m.Cluster == c.cfg.ID && m.Claimed {
			store.NoteHold(m.Ref.Head(), true)
		}
	}
	return store, conn, nil
}

// connected returns the store and connection if the cluster is connected, without waiting.
func (c *cluster) connected() (*claim.Store, Connection, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.store, c.conn, c.store != nil
}

// secret is the agent's cephx secret for this cluster as its keyring holds it now (the one
// read at the connection where it is not read again; "" before the first connection).
func (c *cluster) secret() (string, error) {
	c.mu.Lock()
	conn := c.conn
	c.mu.Unlock()
	if conn.Key == nil {
		return conn.Secret, nil
	}
	return conn.Key()
}

// priorKeyMappings counts this node's mappings of the cluster made with a key its keyring no
// longer holds (a rotation's prior key): 0 when the keyring cannot be read.
func (c *cluster) priorKeyMappings() int {
	s, err := c.secret()
	cur := krbd.KeyID(s)
	if err != nil || cur == "" {
		return 0
	}
	n := 0
	for _, m := range c.env.state.All() {
		if m.Cluster == c.cfg.ID && m.Phase == state.Mapped && m.KeyID != "" && m.KeyID != cur {
			n++
		}
	}
	return n
}

// mapDefaults is the cluster's rbd_default_map_options for ref, on the connection Claims made.
func (c *cluster) mapDefaults(ref image.Ref) (krbd.ClusterDefaults, error) {
	c.mu.Lock()
	read := c.conn.MapDefaults
	c.mu.Unlock()
	if read == nil {
		return krbd.ClusterDefaults{}, nil
	}
	return read(ref)
}

func (c *cluster) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.store != nil && c.conn.Close != nil {
		c.conn.Close()
	}
	c.conn, c.store = Connection{}, nil
}

// clusterByFSID finds a connected cluster of clusters by fsid, without connecting.
func clusterByFSID(clusters map[string]*cluster, fsid string) *cluster {
	for _, c := range clusters {
		if s, _, ok := c.connected(); ok && s.FSID() == fsid {
			return c
		}
	}
	return nil
}
