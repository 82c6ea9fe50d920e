package radosbackend

import (
	"testing"
	"time"
)

// TestBlocklistExpiryIsReadFromTheMonitorsList: the expiry is the monitors' own, read from the
// JSON of `osd blocklist ls` as Pacific writes it, as later releases write it (a second list of
// ranges), and whatever the address's type prefix.
func TestBlocklistExpiryIsReadFromTheMonitorsList(t *testing.T) {
	want := time.Date(2026, 12, 9, 5, 7, 52, 123456000, time.UTC)
	for name, out := range map[string]string{
		"pacific": `[{"addr":"127.0.0.2:0/1007","until":"2026-12-02T05:00:00.000000+0000"},{"addr":"10.0.0.1:0/42","until":"2026-12-09T05:07:52.123456+0000"}]`,
		"ranges":  `[{"addr":"10.0.0.1:0/42","until":"2026-12-09T07:07:52.123456+0200"}]` + "\n" + `[{"range":"10.0.0.0/24","until":"2026-12-09T05:07:52.000000+0000"}]`,
		"typed":   `[{"addr":"any:10.0.0.1:0/42","until":"2026-12-09T05:07:52.123456+0000"}]`,
	} {
		got, ok, err := parseBlocklistExpiry([]byte(out), "10.0.0.1:0/42")
		if err != nil || !ok || !got.Equal(want) {
			t.Errorf("%s: %v %v %v, want %v", name, got, ok, err, want)
		}
	}
	if _, ok, err := parseBlocklistExpiry([]byte(`[{"addr":"10.0.0.1:0/43","until":"2026-12-09T05:07:52.123456+0000"}]`), "10.0.0.1:0/4"); ok || err != nil {
		t.Errorf("an address not listed: %v %v", ok, err)
	}
}
