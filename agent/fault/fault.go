// Package fault is the agent's one error classification. Every error that a caller branches on
// is a sentinel made with New (or a type with a Kind method) of one Kind, and the API's codes,
// the CLI's exit codes and the map saga's undo decision are all read off that Kind:
//
//	KindOf(err)          which kind an error is (Internal when nothing says otherwise)
//	MayHaveApplied(err)  whether a failed write may still have taken effect in the cluster
//
// Packages declare their typed errors here or with New, and wrap them with context
// (fmt.Errorf("map %s: %w", spec, err)); nothing compares error strings.
package fault

import (
	"context"
	"errors"
)

// Kind is what went wrong, as a caller needs to know it.
type Kind int

// The kinds. Their order is not significant.
const (
	// Internal: nothing classified the error; a bug or an unexpected answer.
	Internal Kind = iota
	// Invalid: the request is malformed, or conflicts with what this node already holds.
	Invalid
	// PermissionDenied: the caller's role, or the agent's cephx user, does not allow it.
	PermissionDenied
	// NotFound: the pool, namespace, image, snapshot, claim or device does not exist.
	NotFound
	// ClaimedElsewhere: another node holds the image.
	ClaimedElsewhere
	// Busy: the device is open, the image has unexplained watchers, or a change lost too many
	// concurrent races.
	Busy
	// Fenced: this node's claim is gone, or its client is blocklisted.
	Fenced
	// Unavailable: the cluster did not answer, or the connection is gone.
	Unavailable
	// Timeout: the caller's deadline ran out.
	Timeout
	// Storage: this node's storage refused a write the agent must make before it acts (its
	// state file, on a full disk, over a quota or on a read-only file system): a person frees
	// space or remounts; neither the request nor the cluster is at fault.
	Storage
)

var names = map[Kind]string{
	Internal: "internal", Invalid: "invalid", PermissionDenied: "permission denied", NotFound: "not found",
	ClaimedElsewhere: "claimed elsewhere", Busy: "busy", Fenced: "fenced", Unavailable: "unavailable", Timeout: "timeout",
	Storage: "storage",
}

func (k Kind) String() string { return names[k] }

// Kinds lists every kind (for table tests).
func Kinds() []Kind {
	return []Kind{Internal, Invalid, PermissionDenied, NotFound, ClaimedElsewhere, Busy, Fenced, Unavailable, Timeout, Storage}
}

// sentinel is an error value of a kind. Two sentinels are equal only when they are the same
// value, so errors.Is tells packages' errors apart while KindOf groups them.
type sentinel struct {
	kind Kind
	msg  string
}

func (s *sentinel) Error() string { return s.msg }
func (s *sentinel) Kind() Kind    { return s.kind }

// New makes a sentinel error of kind k.
func New(k Kind, msg string) error { return &sentinel{kind: k, msg: msg} }

// The shared sentinels. Packages use these where the meaning is the same, and New where a
// more precise message helps (krbd.ErrUnsupported is Invalid, krbd.ErrTimeout Unavailable).
var (
	ErrInvalid          = New(Invalid, "invalid argument")
	ErrPermission       = New(PermissionDenied, "permission denied")
	ErrNotFound         = New(NotFound, "not found")
	ErrClaimedElsewhere = New(ClaimedElsewhere, "claimed by another node")
	ErrBusy             = New(Busy, "busy")
	// ErrBlocklisted: this node's client was blocklisted by the cluster (librados or the kernel).
	ErrBlocklisted = New(Fenced, "client blocklisted")
	ErrUnavailable = New(Unavailable, "cluster unavailable")
)

// Kinder is an error that knows its kind (typed errors such as claim.HeldError).
type Kinder interface {
	error
	Kind() Kind
}

// KindOf classifies err: the kind of the first error in its chain that has one (errors.As
// order, so the outermost classified wrap wins), with two rules on top: a cluster that did not
// answer before the caller's own deadline ran out is a Timeout, and an unclassified error
// carrying context.DeadlineExceeded is one too. nil is Internal; ask err != nil first.
func KindOf(err error) Kind {
	var k Kinder
	if errors.As(err, &k) {
		kind := k.Kind()
		if kind == Unavailable && errors.Is(err, context.DeadlineExceeded) {
			return Timeout
		}
		return kind
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return Timeout
	}
	return Internal
}

// Is reports whether err is of kind k.
func Is(err error, k Kind) bool { return err != nil && KindOf(err) == k }

// MayHaveApplied says whether a write that failed with err may still have taken effect: true
// unless the error is a definite refusal (the cluster, the kernel or the agent said no before
// anything was written). A saga keeps its intent, rather than undoing, when this is true.
func MayHaveApplied(err error) bool {
	if err == nil {
		return true
	}
	switch KindOf(err) {
	case Invalid, PermissionDenied, NotFound, ClaimedElsewhere, Busy, Fenced:
		return false
	}
	return true
}
