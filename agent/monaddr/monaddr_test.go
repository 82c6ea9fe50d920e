package monaddr

import (
	"reflect"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []Addr
	}{
		{"10.0.0.1:6789", []Addr{{"", "10.0.0.1", 6789}}},
		{"10.0.0.1", []Addr{{"", "10.0.0.1", 0}}},
		{"[2001:db8::1]:6789", []Addr{{"", "2001:db8::1", 6789}}},
		{"2001:db8::1", []Addr{{"", "2001:db8::1", 0}}},
		{"[2001:DB8::1]", []Addr{{"", "2001:db8::1", 0}}},
		{"mon-a.example.org:3300", []Addr{{"", "mon-a.example.org", 3300}}},
		{"v2:10.0.0.1:3300", []Addr{{V2, "10.0.0.1", 3300}}},
		{"v1:10.0.0.1:6789/0", []Addr{{V1, "10.0.0.1", 6789}}},
		{"v2:10.0.0.1", []Addr{{V2, "10.0.0.1", 0}}},
		// mon_host as Ceph writes it, and the lists users write
		{"[v2:10.0.0.1:3300/0,v1:10.0.0.1:6789/0]", []Addr{{V2, "10.0.0.1", 3300}, {V1, "10.0.0.1", 6789}}},
		{"[v2:10.0.0.1:3300/0,v1:10.0.0.1:6789/0] [v2:10.0.0.2:3300/0,v1:10.0.0.2:6789/0]",
			[]Addr{{V2, "10.0.0.1", 3300}, {V1, "10.0.0.1", 6789}, {V2, "10.0.0.2", 3300}, {V1, "10.0.0.2", 6789}}},
		{"[v2:[2001:db8::1]:3300/1234,v1:[2001:db8::1]:6789/1234]", []Addr{{V2, "2001:db8::1", 3300}, {V1, "2001:db8::1", 6789}}},
		{"10.0.0.1:3300,10.0.0.2:3300;10.0.0.3:3300", []Addr{{"", "10.0.0.1", 3300}, {"", "10.0.0.2", 3300}, {"", "10.0.0.3", 3300}}},
		{" 10.0.0.1 , [::1]:6789 ", []Addr{{"", "10.0.0.1", 0}, {"", "::1", 6789}}},
	} {
		got, err := Parse(c.in)
		if err != nil {
			t.Errorf("Parse(%q): %v", c.in, err)
			continue
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("Parse(%q) = %+v, want %+v", c.in, got, c.want)
		}
	}
}

func TestParseRefuses(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"", "no address"},
		{" , ", "no address"},
		{"10.0.0.1:99999", `port "99999"`},
		{"10.0.0.1:0", `port "0"`},
		{"10.0.0.1:06789", `port "06789"`},
		{"10.0.0.1:", "empty port"},
		{"10.0.0.1:6789/x", "not a nonce"},
		{"v3:10.0.0.1:6789", "not an IP address or host name"},
		{"mon_a:6789", "not an IP address or host name"},
		{"10.0.0.256:6789", "not an IP address or host name"},
		{"6789", "not an IP address or host name"},
		{"v1", "not an IP address or host name"}, // a type, not a host
		{"[2001:db8::1", "not an address"},
		{"[mon-a]:6789", "not an IPv6 address"},
		{"[10.0.0.1]:6789", "not an IPv6 address"},
		{"[v2:10.0.0.1:3300/0,v1:10.0.0.1:6789/0", "must end with ']'"},
		{"[v2:10.0.0.1:3300/0,10.0.0.1:6789/0]", "has no type"},
		{"10.0.0.1:6789,bad host!", `"host!" is not`}, // split at the space
	} {
		_, err := Parse(c.in)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Parse(%q) = %v, want an error with %q", c.in, err, c.want)
		}
	}
	if _, err := ParseAll(nil); err == nil {
		t.Error("ParseAll(nil): no error")
	}
}

func TestAddr(t *testing.T) {
	for _, c := range []struct {
		a    Addr
		want string
	}{
		{Addr{"", "10.0.0.1", 0}, "10.0.0.1:6789"},
		{Addr{V1, "10.0.0.1", 0}, "10.0.0.1:6789"},
		{Addr{V2, "10.0.0.1", 0}, "10.0.0.1:3300"},
		{Addr{V2, "2001:db8::1", 3301}, "[2001:db8::1]:3301"},
		{Addr{"", "mon-a", 6790}, "mon-a:6790"},
	} {
		if got := c.a.HostPort(); got != c.want {
			t.Errorf("%+v.HostPort() = %q, want %q", c.a, got, c.want)
		}
	}
	same := func(x, y string) bool {
		a, err := Parse(x)
		if err != nil {
			t.Fatal(err)
		}
		b, err := Parse(y)
		if err != nil {
			t.Fatal(err)
		}
		return a[0].Same(b[0])
	}
	for _, c := range []struct {
		x, y string
		want bool
	}{
		{"10.0.0.1", "v2:10.0.0.1:3300/0", true},
		{"10.0.0.1:6789", "10.0.0.1:3300", false},
		{"[2001:db8:0::1]:6789", "2001:db8::1", true},
		{"MON-A:6789", "mon-a", true},
		{"10.0.0.1", "10.0.0.2", false},
		{"mon-a", "10.0.0.1", false},
	} {
		if got := same(c.x, c.y); got != c.want {
			t.Errorf("Same(%q, %q) = %v, want %v", c.x, c.y, got, c.want)
		}
	}
}

// FuzzParse: whatever it reads, it reads again the same from the addresses it gives.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"10.0.0.1:6789", "[v2:10.0.0.1:3300/0,v1:10.0.0.1:6789/0]", "[::1]", "v2:mon-a", "a,b;c d"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		addrs, err := Parse(s)
		if err != nil {
			return
		}
		for _, a := range addrs {
			again, err := Parse(a.HostPort())
			if err != nil || len(again) != 1 || again[0].Host != a.Host || again[0].PortOr() != a.PortOr() {
				t.Fatalf("Parse(%q) gave %+v; its HostPort %q reads as %+v, %v", s, a, a.HostPort(), again, err)
			}
		}
	})
}
