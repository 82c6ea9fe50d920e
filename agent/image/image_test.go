package image

import (
	"errors"
	"strings"
	"testing"
)

// ParseWithDefaults reads the forms Ceph's rbd reads, taking what the spec leaves out from the
// defaults; Parse reads only specs that name their pool.
func TestParseWithDefaults(t *testing.T) {
	d := Ref{Pool: "rbd", Namespace: "ns0", Snap: "s0"}
	for _, c := range []struct {
		in   string
		want Ref
	}{
		{"img", Ref{Pool: "rbd", Namespace: "ns0", Image: "img", Snap: "s0"}},
		{"img@s1", Ref{Pool: "rbd", Namespace: "ns0", Image: "img", Snap: "s1"}},
		{"p/img", Ref{Pool: "p", Namespace: "ns0", Image: "img", Snap: "s0"}},
		{"p/ns/img", Ref{Pool: "p", Namespace: "ns", Image: "img", Snap: "s0"}},
		{"p/ns/img@s1", Ref{Pool: "p", Namespace: "ns", Image: "img", Snap: "s1"}},
	} {
		got, err := ParseWithDefaults(c.in, d)
		if err != nil || got != c.want {
			t.Errorf("ParseWithDefaults(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
	for _, c := range []struct{ in, field string }{
		{"p/a/b/c", "want [POOL/[NAMESPACE/]]IMAGE[@SNAP]"},
		{"/img", "pool"},
		{"p//img", "namespace"},
		{"img@", "snapshot"},
		{"a,b", "image"},
	} {
		_, err := ParseWithDefaults(c.in, d)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("ParseWithDefaults(%q) err = %v, want ErrInvalid naming %q", c.in, err, c.field)
		}
	}
	if _, err := ParseWithDefaults("img", Ref{Pool: "a b"}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "pool") {
		t.Errorf("a default pool with a space: %v", err)
	}
	if _, err := Parse("img"); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "want POOL[/NAMESPACE]/IMAGE[@SNAP]") {
		t.Errorf("Parse of an image alone: %v", err)
	}
}
