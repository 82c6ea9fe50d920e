package krbd

import (
	"bufio"
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// KeyStore puts a cephx secret into the kernel keyring so that the add string can name it
// (key=<name>) instead of carrying it (secret=). The real one is KernelKeyring; the fake
// kernel records what was added. Every map uses a key of its own, dropped once the kernel
// has read it (libceph copies the secret while it parses the add string).
type KeyStore interface {
	// AddCephKey adds a key of type "ceph" described as name, with payload the decoded cephx
	// secret. It is called on the same OS thread as the following write.
	AddCephKey(name string, payload []byte) error
	// DropCephKey invalidates the key described as name.
	DropCephKey(name string) error
}

// KernelKeyring adds keys to the calling process's keyring with add_key(2), as Ceph's
// rbd CLI does (KEY_SPEC_PROCESS_KEYRING).
type KernelKeyring struct{}

// AddCephKey implements KeyStore.
func (KernelKeyring) AddCephKey(name string, payload []byte) error {
	if _, err := unix.AddKey("ceph", name, payload, unix.KEY_SPEC_PROCESS_KEYRING); err != nil {
		return fmt.Errorf("add_key ceph %s: %w", name, err)
	}
	return nil
}

// DropCephKey implements KeyStore: it finds the key in the process keyring and invalidates it.
func (KernelKeyring) DropCephKey(name string) error {
	id, err := unix.KeyctlSearch(unix.KEY_SPEC_PROCESS_KEYRING, "ceph", name, 0)
	if err != nil {
		return fmt.Errorf("keyctl search ceph %s: %w", name, err)
	}
	if _, err := unix.KeyctlInt(unix.KEYCTL_INVALIDATE, id, 0, 0, 0); err != nil {
		return fmt.Errorf("keyctl invalidate ceph %s: %w", name, err)
	}
	return nil
}

// DecodeSecret checks a base64 cephx secret and returns the keyring payload.
func DecodeSecret(secret string) ([]byte, error) {
	if secret == "" {
		return nil, fmt.Errorf("%w: empty cephx secret", ErrInvalid)
	}
	if !secretRE.MatchString(secret) {
		return nil, fmt.Errorf("%w: cephx secret is not base64", ErrInvalid)
	}
	b, err := base64.StdEncoding.DecodeString(secret)
	if err != nil || len(b) < 12 {
		return nil, fmt.Errorf("%w: cephx secret is not a base64 Ceph key", ErrInvalid)
	}
	return b, nil
}

// ParseKeyring reads a Ceph ini keyring and returns the base64 secret of entity
// ("client.rbdowner"):
//
//	[client.rbdowner]
//		key = AQ...==
//		caps mon = "profile rbd"
//
// A "pending key" line, in any section, is refused: Ceph 20.2's `ceph auth get` writes one while
// a rotation is pending, and librados then refuses the whole file (no key, no connection), so
// the kernel must not be handed the file's key either.
func ParseKeyring(r io.Reader, entity string) (string, error) {
	sc := bufio.NewScanner(r)
	section, found, secret := "", false, ""
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		if line[0] == '[' {
			if !strings.HasSuffix(line, "]") {
				return "", fmt.Errorf("keyring line %d: %w: unterminated section %q", n, ErrInvalid, line)
			}
			section = strings.TrimSpace(line[1 : len(line)-1])
			if section == entity {
				found = true
			}
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		switch name := strings.Join(strings.Fields(k), " "); {
		case name == "pending key":
			return "", fmt.Errorf("keyring line %d ([%s]): %w (what ceph auth get prints while a rotation is pending), which librados refuses to load: write the key this node should use alone, as key = … (ceph auth get-key %s, or the pending key itself)",
				n, section, ErrPendingKey, section)
		case name == "key" && section == entity && secret == "":
			v = strings.Trim(strings.TrimSpace(v), `"`)
			if _, err := DecodeSecret(v); err != nil {
				return "", fmt.Errorf("keyring line %d (%s): %w", n, entity, err)
			}
			secret = v
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("read keyring: %w", err)
	}
	if secret != "" {
		return secret, nil
	}
	if found {
		return "", fmt.Errorf("keyring: %w: section [%s] has no key", ErrInvalid, entity)
	}
	return "", fmt.Errorf("keyring: %w: no section [%s]", ErrNotFound, entity)
}

// ReadKeyringFile is ParseKeyring on a file.
func ReadKeyringFile(path, entity string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("keyring: %w", err)
	}
	defer func() { _ = f.Close() }() // read only: its close loses nothing
	s, err := ParseKeyring(f, entity)
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}
