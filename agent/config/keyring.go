package config

import (
	"errors"
	"fmt"

	"github.com/rbd-owner/rbd-owner/agent/krbd"
)

// CheckKeys is what the agent refuses at start about its clusters' keys, beyond the config's
// own rules: a key this node cannot use (krbd.CheckNodeKey: an aes256k key before Linux 7.0, or
// with a librados before Ceph 19.2.6 and 20.2.4; node has the kernel's release, uname -r, and
// the librados's, "" when not known), and a keyring librados would refuse to load (a pending
// key). A keyring that cannot be read or holds no key for the user is left to the connection,
// which says why (as it did before this check): it may be written after the agent starts.
func CheckKeys(c *Config, node krbd.NodeVersions) error {
	for i, cl := range c.Clusters {
		secret, err := krbd.ReadKeyringFile(cl.Keyring, "client."+cl.User)
		if errors.Is(err, krbd.ErrPendingKey) {
			return fmt.Errorf("clusters[%d] (%s): %w", i, cl.ID, err)
		}
		if err != nil {
			continue
		}
		typ, err := krbd.KeyType(secret)
		if err != nil {
			return fmt.Errorf("clusters[%d] (%s): %s: %w", i, cl.ID, cl.Keyring, err)
		}
		if err := krbd.CheckNodeKey(typ, node); err != nil {
			return fmt.Errorf("clusters[%d] (%s): client.%s's key in %s: %w", i, cl.ID, cl.User, cl.Keyring, err)
		}
	}
	return nil
}
