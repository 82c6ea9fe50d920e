package cephconn

import (
	"encoding/base64"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestALibradosThatCannotReadTheKeySaysSo runs this machine's own librados: an aes256k key it
// cannot read (Ceph before 19.2.6 and 20.2.4) fails the connection at once with a line naming
// librados's release, the key type, the keyring and what to do; an aes key is tried against the
// monitors (none answers here: a timeout, not that line).
func TestALibradosThatCannotReadTheKeySaysSo(t *testing.T) {
	dir := t.TempDir()
	keyring := func(typ uint16, n int) string {
		b := make([]byte, 12+n)
		binary.LittleEndian.PutUint16(b, typ)
		binary.LittleEndian.PutUint16(b[10:], uint16(n))
		for i := range n {
			b[12+i] = byte(i + 1)
		}
		p := filepath.Join(dir, "keyring"+string(rune('0'+typ)))
		if err := os.WriteFile(p, []byte("[client.x]\n\tkey = "+base64.StdEncoding.EncodeToString(b)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	o := Options{User: "x", Monitors: []string{"127.0.0.1:1"}, Timeout: 2 * time.Second}
	o.Keyring = keyring(2, 32)
	_, err := Connect(o)
	if err == nil {
		t.Skip("this machine's librados reads aes256k keys (Ceph 19.2.6, 20.2.4 or later): nothing to refuse")
	}
	want := "this node's librados " + LibradosRelease() + " cannot read the user's aes256k key in " + o.Keyring + " (it needs Ceph 19.2.6 or 20.2.4 libraries"
	if LibradosRelease() == "" || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "keep this user's key aes") {
		t.Errorf("aes256k key: %v; want the line naming librados's release, the key type, the keyring and what to do: %s...", err, want)
	}
	o.Keyring = keyring(1, 16)
	if _, err := Connect(o); err == nil || strings.Contains(err.Error(), "cannot read the user's") {
		t.Errorf("aes key against no monitor: %v; want a failed connection, not the key's line", err)
	}
}
