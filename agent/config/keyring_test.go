package config

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/rbd-owner/rbd-owner/agent/krbd"
)

// TestCheckKeysNamesTheKernelAndLibrados: a cluster's aes256k key this node cannot use is refused
// in one line naming the cluster, the user, the keyring, the key type, the kernel's and
// librados's releases and what each needs; a node whose kernel and librados read it, or whose
// librados release is not known (left to the connection), accepts it; an aes key passes on any
// node; a keyring that cannot be read is left to the connection.
func TestCheckKeysNamesTheKernelAndLibrados(t *testing.T) {
	dir := t.TempDir()
	write := func(name, key string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("[client.u]\n\tkey = "+key+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	aes := write("aes", "AQBzXHxlAAAAABAAAQIDBAUGBwgJCgsMDQ4PEA==")
	aes256k := write("aes256k", "AgAAAAAAAAAAACAAAQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA=")
	cfg := func(keyring string) *Config {
		return &Config{Clusters: []Cluster{
			{ID: "a", User: "u", Keyring: filepath.Join(dir, "absent")},
			{ID: "b", User: "u", Keyring: keyring},
		}}
	}
	const why = "invalid argument: the key is aes256k, which this node cannot use: "
	const todo = ": keep this user's key aes until the nodes run "
	const rook = " (Rook: its CSI key type; by hand: a new aes key for the user)"
	prefix := "clusters[1] (b): client.u's key in " + aes256k + ": " + why
	for _, tc := range []struct {
		keyring, kernel, librados string
		want                      string // the refusal, "" for none
	}{
		{aes, "6.1.0-50-amd64", "16.2.15", ""},
		{aes256k, "7.2.12-amd64", "20.2.4", ""},
		{aes256k, "7.0.0", "", ""},
		{aes256k, "6.1.0-50-amd64", "16.2.15", prefix + "its kernel 6.1.0-50-amd64 needs Linux 7.0 and its librados 16.2.15 needs " +
			"Ceph 19.2.6 or 20.2.4" + todo + "Linux 7.0 and those libraries" + rook},
		{aes256k, "7.2.12-amd64", "19.2.3", prefix + "its librados 19.2.3 needs Ceph 19.2.6 or 20.2.4 (its kernel 7.2.12-amd64 reads it)" +
			todo + "those libraries" + rook},
		{aes256k, "6.12.48+deb13-amd64", "", prefix + "its kernel 6.12.48+deb13-amd64 needs Linux 7.0 (librados version unknown; " +
			"it needs Ceph 19.2.6 or 20.2.4)" + todo + "Linux 7.0" + rook},
	} {
		err := CheckKeys(cfg(tc.keyring), krbd.NodeVersions{Kernel: tc.kernel, Librados: tc.librados})
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s on kernel %q, librados %q: %v, want accepted", tc.keyring, tc.kernel, tc.librados, err)
		case tc.want == "":
		case err == nil || err.Error() != tc.want || !errors.Is(err, krbd.ErrInvalid):
			t.Errorf("%s on kernel %q, librados %q:\n %v\nwant (wrapping ErrInvalid)\n %s", tc.keyring, tc.kernel, tc.librados, err, tc.want)
		}
	}
}
