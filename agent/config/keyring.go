package config

import (
	"errors"
	"fmt"

	"github.com/rbd-owner/rbd-owner/agent/krbd"
)

// CheckKeys is what the agent refuses at start about its clusters' keys, beyond the config's
// own rules: a key this node's kernel (release, uname -r) cannot map with (an aes256k key before
// Linux 7.0), and a keyring librados would refuse to load (a pending key). A keyring that
// cannot be read or holds no key for the user is left to the connection, which says why (as it
// did before this check): it may be written after the agent starts.
func CheckKeys(c *Config, release string) error {
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
		if err := krbd.CheckKernelKey(typ, release); err != nil {
			return fmt.Errorf("clusters[%d] (%s): client.%s's key in %s: %w", i, cl.ID, cl.User, cl.Keyring, err)
		}
	}
	return nil
}
