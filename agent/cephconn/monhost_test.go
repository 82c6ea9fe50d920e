package cephconn

import "testing"

// librados is given v1 for the kernel's plain msgr1 form, and everything else as written.
func TestMonHost(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want string
	}{
		{[]string{"10.0.0.1:6789"}, "v1:10.0.0.1:6789"},
		{[]string{"10.0.0.1:6789,10.0.0.2:6789"}, "v1:10.0.0.1:6789,v1:10.0.0.2:6789"},
		{[]string{"10.0.0.1:3300", "10.0.0.2"}, "10.0.0.1:3300,10.0.0.2"},
		{[]string{"[2001:db8::1]:6789"}, "v1:[2001:db8::1]:6789"},
		{[]string{"[v2:10.0.0.1:3300/0,v1:10.0.0.1:6789/0] [v2:10.0.0.2:3300/0,v1:10.0.0.2:6789/0]"},
			"[v2:10.0.0.1:3300/0,v1:10.0.0.1:6789/0],[v2:10.0.0.2:3300/0,v1:10.0.0.2:6789/0]"},
		{[]string{"v2:10.0.0.1:3300", "v1:10.0.0.2:6789"}, "v2:10.0.0.1:3300,v1:10.0.0.2:6789"},
	} {
		if got := monHost(tc.in); got != tc.want {
			t.Errorf("monHost(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
