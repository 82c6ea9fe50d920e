// Package image is the agent's one image reference: an RBD image, or one of its snapshots, in
// a pool and a RADOS namespace. The kernel layer (krbd.Spec), the claim protocol (claim.Image),
// the persisted state (state.Key) and the API's boundary all use this type; the wire types of
// the API convert to it with their Ref methods, and nothing else converts. Its names are
// checked here alone: Ref.Validate, which Parse and ParseWithDefaults apply, is the one check
// the kernel layer, the claim protocol, the agent and the drop-in rbd make.
package image

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/rbd-owner/rbd-owner/agent/fault"
)

// ErrInvalid is the kind of every validation error (fault.ErrInvalid).
var ErrInvalid = fault.ErrInvalid

// MaxNameLen bounds each name of a Ref (bytes). Ceph allows longer names, but a name this
// long in a kernel add string or a /dev path is a mistake, not a use case.
const MaxNameLen = 255

// Ref names an RBD image (or one of its snapshots): POOL[/NAMESPACE]/IMAGE[@SNAP]. Its JSON
// is the claim record's and the state file's form of an image.
type Ref struct {
	Pool      string `json:"pool"`
	Namespace string `json:"namespace"` // "" for the pool's default namespace
	Image     string `json:"image"`
	Snap      string `json:"snap,omitempty"` // "" for the image head
}

// Head is the image itself (no snapshot): what a claim is for.
func (s Ref) Head() Ref { s.Snap = ""; return s }

// String renders the reference in the POOL[/NAMESPACE]/IMAGE[@SNAP] form Parse reads.
func (s Ref) String() string {
	var b strings.Builder
	b.WriteString(s.Pool)
	b.WriteByte('/')
	if s.Namespace != "" {
		b.WriteString(s.Namespace)
		b.WriteByte('/')
	}
	b.WriteString(s.Image)
	if s.Snap != "" {
		b.WriteByte('@')
		b.WriteString(s.Snap)
	}
	return b.String()
}

// Parse parses POOL[/NAMESPACE]/IMAGE[@SNAP] and validates every part (see Ref.Validate).
func Parse(s string) (Ref, error) {
	return parse(s, Ref{}, 2, "POOL[/NAMESPACE]/IMAGE[@SNAP]")
}

// ParseWithDefaults parses an image spec as Ceph's rbd command reads one,
// [POOL/[NAMESPACE/]]IMAGE[@SNAP]: what s leaves out (the pool, the namespace, the snapshot) is
// d's, as rbd takes it from --pool, --namespace and --snap. Every part of the result is
// validated (see Ref.Validate); d.Image is not used.
func ParseWithDefaults(s string, d Ref) (Ref, error) {
	return parse(s, d, 1, "[POOL/[NAMESPACE/]]IMAGE[@SNAP]")
}

// parse reads s over d: a spec of at least minParts of POOL, NAMESPACE and IMAGE (IMAGE last),
// then validates the result. form is the spec's form, for the error.
func parse(s string, d Ref, minParts int, form string) (Ref, error) {
	sp := d
	rest := s
	if i := strings.IndexByte(rest, '@'); i >= 0 {
		sp.Snap = rest[i+1:]
		rest = rest[:i]
		if sp.Snap == "" {
			return Ref{}, fmt.Errorf("image spec %q: %w: snapshot: empty after '@'", s, ErrInvalid)
		}
	}
	parts := strings.Split(rest, "/")
	if len(parts) < minParts || len(parts) > 3 {
		return Ref{}, fmt.Errorf("image spec %q: %w: want %s", s, ErrInvalid, form)
	}
	switch len(parts) {
	case 1:
		sp.Image = parts[0]
	case 2:
		sp.Pool, sp.Image = parts[0], parts[1]
	case 3:
		sp.Pool, sp.Namespace, sp.Image = parts[0], parts[1], parts[2]
		if sp.Namespace == "" {
			return Ref{}, fmt.Errorf("image spec %q: %w: namespace: empty", s, ErrInvalid)
		}
	}
	if err := sp.Validate(); err != nil {
		return Ref{}, fmt.Errorf("image spec %q: %w", s, err)
	}
	return sp, nil
}

// Validate refuses any name that could change the meaning of a kernel add string or of a
// /dev/rbd-owner path: empty (pool, image), over-long, not UTF-8, whitespace, control
// characters (NUL included), ',', '=', '/', '@', and the path names "." and "..". The snapshot
// may not be "-" (the kernel's word for "no snapshot"). The error names the bad field.
func (s Ref) Validate() error {
	if err := validateName("pool", s.Pool, false); err != nil {
		return err
	}
	if err := validateName("namespace", s.Namespace, true); err != nil {
		return err
	}
	if err := validateName("image", s.Image, false); err != nil {
		return err
	}
	if err := validateName("snapshot", s.Snap, true); err != nil {
		return err
	}
	if s.Snap == "-" {
		return fmt.Errorf("%w: snapshot: %q means \"no snapshot\" to the kernel", ErrInvalid, s.Snap)
	}
	return nil
}

func validateName(field, v string, optional bool) error {
	if v == "" {
		if optional {
			return nil
		}
		return fmt.Errorf("%w: %s: empty", ErrInvalid, field)
	}
	if len(v) > MaxNameLen {
		return fmt.Errorf("%w: %s: %d bytes, more than %d", ErrInvalid, field, len(v), MaxNameLen)
	}
	if !utf8.ValidString(v) {
		return fmt.Errorf("%w: %s %q: not valid UTF-8", ErrInvalid, field, v)
	}
	if v == "." || v == ".." {
		return fmt.Errorf("%w: %s %q: not usable as a path component", ErrInvalid, field, v)
	}
	for i, r := range v {
		switch {
		case r == ',' || r == '=' || r == '/' || r == '@':
			return fmt.Errorf("%w: %s %q: character %q at byte %d is not allowed", ErrInvalid, field, v, r, i)
		case unicode.IsSpace(r):
			return fmt.Errorf("%w: %s %q: whitespace at byte %d is not allowed", ErrInvalid, field, v, i)
		case unicode.IsControl(r) || r == unicode.ReplacementChar || !unicode.IsPrint(r):
			return fmt.Errorf("%w: %s %q: control or non-printable character at byte %d is not allowed", ErrInvalid, field, v, i)
		}
	}
	return nil
}
