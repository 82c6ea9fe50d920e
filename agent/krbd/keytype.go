package krbd

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"regexp"
	"strconv"
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

// What reads an aes256k key: the kernel's libceph from Linux 7.0, librados from Ceph 19.2.6 in
// 19.x, 20.2.4 in 20.x, and any release from 21 on.
const (
	AES256KKernel   = "Linux 7.0"
	AES256KLibrados = "Ceph 19.2.6 or 20.2.4"
)

// NodeVersions are the releases of this node's two readers of the agent's key: the kernel's
// (uname -r), whose libceph maps with it, and the Ceph release of the librados the agent loads
// (cephconn.LibradosRelease), which connects with it; "" when not known.
type NodeVersions struct {
	Kernel   string
	Librados string
}

// KernelReadsKey says whether a kernel of release (uname -r) maps with a key of keyType: an
// aes256k key from Linux 7.0. A release it cannot read is taken as older.
func KernelReadsKey(keyType, release string) bool {
	if keyType != KeyAES256K {
		return true
	}
	var major, minor int
	_, err := fmt.Sscanf(release, "%d.%d", &major, &minor)
	return err == nil && major >= 7
}

// cephRelease is major, minor and patch of a Ceph release as Ceph writes it ("19.2.6", or
// "19.2.6-123-gabcdef" for a development build); ok false when it does not start so.
func cephRelease(release string) (v [3]int, ok bool) {
	m := cephReleaseRE.FindStringSubmatch(release)
	if m == nil {
		return v, false
	}
	for i := range v {
		v[i], _ = strconv.Atoi(m[i+1]) // at most 6 digits
	}
	return v, true
}

var cephReleaseRE = regexp.MustCompile(`^(\d{1,6})\.(\d{1,6})\.(\d{1,6})(?:$|[^.\d])`)

// LibradosReadsKey says whether librados of a Ceph release (release, as cephRelease reads it)
// connects with a key of keyType: an aes256k key from 19.2.6 in 19.x, from 20.2.4 in 20.x, and
// in any release from 21 on. An unknown release ("", or one cephRelease cannot read) is not
// refused: the connection says whether it reads the key (cephconn.Connect).
func LibradosReadsKey(keyType, release string) bool {
	v, ok := cephRelease(release)
	if keyType != KeyAES256K || !ok {
		return true
	}
	switch {
	case v[0] >= 21:
		return true
	case v[0] == 20:
		return v[1] > 2 || v[1] == 2 && v[2] >= 4
	case v[0] == 19:
		return v[1] > 2 || v[1] == 2 && v[2] >= 6
	}
	return false
}

// CheckNodeKey says whether this node can use a key of keyType, its kernel to map with it and
// its librados to connect with it: nil, or one line (wrapping ErrInvalid) naming the key type,
// the kernel's and librados's releases, what each needs and what to do. A librados release not
// known does not refuse the key (LibradosReadsKey) but is named as unknown.
func CheckNodeKey(keyType string, node NodeVersions) error {
	kernelOK, libOK := KernelReadsKey(keyType, node.Kernel), LibradosReadsKey(keyType, node.Librados)
	if kernelOK && libOK {
		return nil
	}
	kernel := "its kernel " + node.Kernel
	if node.Kernel == "" {
		kernel = "its kernel (release unknown)"
	}
	lib := "its librados " + node.Librados
	var cannot, until, fine string
	switch _, known := cephRelease(node.Librados); {
	case !kernelOK && !libOK:
		cannot = fmt.Sprintf("%s needs %s and %s needs %s", kernel, AES256KKernel, lib, AES256KLibrados)
		until = AES256KKernel + " and those libraries"
	case !known:
		cannot, until = kernel+" needs "+AES256KKernel, AES256KKernel
		fine = " (librados version unknown; it needs " + AES256KLibrados + ")"
	case !kernelOK:
		cannot, until, fine = kernel+" needs "+AES256KKernel, AES256KKernel, " ("+lib+" reads it)"
	default:
		cannot, until, fine = lib+" needs "+AES256KLibrados, "those libraries", " ("+kernel+" reads it)"
	}
	return fmt.Errorf("%w: the key is %s, which this node cannot use: %s%s: keep this user's key %s until the nodes run %s (Rook: its CSI key type; by hand: a new %s key for the user)",
		ErrInvalid, keyType, cannot, fine, KeyAES, until, KeyAES)
}
