package krbd

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
)

// The cephx key types a keyring's key can be (Ceph's CEPH_CRYPTO_*: the key's first two bytes,
// little-endian). aes256k (AES-256 in Kerberos 5's profile) is the type operators move to after
// CVE-2025-30156; the kernel's libceph reads it from Linux 7.0, librados from Ceph 19.2.6 and
// 20.2.4.
const (
	KeyAES     = "aes"
	KeyAES256K = "aes256k"
)

// KeyType is the type of a base64 cephx secret: KeyAES, KeyAES256K, or "type N" for another.
func KeyType(secret string) (string, error) {
	b, err := DecodeSecret(secret)
	if err != nil {
		return "", err
	}
	switch t := binary.LittleEndian.Uint16(b); t {
	case 1:
		return KeyAES, nil
	case 2:
		return KeyAES256K, nil
	default:
		return fmt.Sprintf("type %d", t), nil
	}
}

// KeyID names a secret without revealing it: the first 12 hex digits of the SHA-256 of its
// bytes. A mapping records the id of the key it was made with, so that status can say how many
// mappings still use a key the keyring no longer holds.
func KeyID(secret string) string {
	b, err := DecodeSecret(secret)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:6])
}

// aes256kKernel is the first kernel release whose libceph reads aes256k keys.
const aes256kKernel = "7.0"

// CheckKernelKey says whether this node's kernel (release, uname -r) can map with a key of
// keyType: nil, or one line naming the key type, the kernel, what it needs and what to do.
func CheckKernelKey(keyType, release string) error {
	if keyType != KeyAES256K {
		return nil
	}
	var major, minor int
	if _, err := fmt.Sscanf(release, "%d.%d", &major, &minor); err == nil && major >= 7 {
		return nil
	}
	return fmt.Errorf("%w: the key is %s, which the kernel's libceph reads from Linux %s on (librados from Ceph 19.2.6 and 20.2.4), and this node runs kernel %q: keep this user's key %s until the nodes run Linux %s (Rook: its CSI key type; by hand: a new %s key for the user)",
		ErrInvalid, KeyAES256K, aes256kKernel, release, KeyAES, aes256kKernel, KeyAES)
}
