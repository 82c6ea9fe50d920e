package fault

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

type kinded struct{ k Kind }

func (e kinded) Error() string { return "typed " + e.k.String() }
func (e kinded) Kind() Kind    { return e.k }

func TestKindOf(t *testing.T) {
	mine := New(Busy, "device busy")
	for _, tc := range []struct {
		name    string
		err     error
		kind    Kind
		applied bool
	}{
		{"unclassified", errors.New("boom"), Internal, true},
		{"nil", nil, Internal, true},
		{"invalid, wrapped twice", fmt.Errorf("map x: %w", fmt.Errorf("spec: %w", ErrInvalid)), Invalid, false},
		{"permission", ErrPermission, PermissionDenied, false},
		{"not found", fmt.Errorf("open: %w", ErrNotFound), NotFound, false},
		{"claimed elsewhere", ErrClaimedElsewhere, ClaimedElsewhere, false},
		{"a package's own busy", fmt.Errorf("unmap: %w", mine), Busy, false},
		{"blocklisted is fenced", fmt.Errorf("write: %w", ErrBlocklisted), Fenced, false},
		{"unavailable", fmt.Errorf("connect: %w", ErrUnavailable), Unavailable, true},
		{"unavailable after the caller's deadline", fmt.Errorf("%w: %w", ErrUnavailable, context.DeadlineExceeded), Timeout, true},
		{"deadline alone", fmt.Errorf("wait: %w", context.DeadlineExceeded), Timeout, true},
		{"outermost kind wins", fmt.Errorf("%w: %w", ErrInvalid, ErrUnavailable), Invalid, false},
		{"typed error", fmt.Errorf("acquire: %w", kinded{ClaimedElsewhere}), ClaimedElsewhere, false},
		{"a definite refusal with a deadline behind it", fmt.Errorf("%w: %w", ErrNotFound, context.DeadlineExceeded), NotFound, false},
	} {
		if got := KindOf(tc.err); got != tc.kind {
			t.Errorf("%s: kind %v, want %v", tc.name, got, tc.kind)
		}
		if got := MayHaveApplied(tc.err); got != tc.applied {
			t.Errorf("%s: may have applied %v, want %v", tc.name, got, tc.applied)
		}
	}
	if errors.Is(mine, ErrBusy) || !errors.Is(fmt.Errorf("x: %w", mine), mine) {
		t.Error("sentinels of one kind must stay distinct values")
	}
	for _, k := range Kinds() {
		if k.String() == "" {
			t.Errorf("kind %d has no name", k)
		}
	}
}
