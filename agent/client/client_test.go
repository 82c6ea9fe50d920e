package client

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/rbd-owner/rbd-owner/agent/api"
)

// Code is "" for success alone: a caller's `case "":` must never take a failed call for a map.
func TestCodeIsEmptyOnlyWithoutError(t *testing.T) {
	_, unreachable := New(filepath.Join(t.TempDir(), "none")).Status(context.Background())
	if !errors.Is(unreachable, ErrUnreachable) {
		t.Fatalf("a call to a missing socket: %v, want ErrUnreachable", unreachable)
	}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{fmt.Errorf("map: %w", &api.Error{Code: api.CodeClaimedElsewhere, Message: "held"}), api.CodeClaimedElsewhere},
		{unreachable, CodeUnreachable},
		{fmt.Errorf("POST /v1/map: %w", context.DeadlineExceeded), api.CodeTimeout},
		{errors.New("POST /v1/map: bad answer"), api.CodeInternal},
	} {
		if got := Code(tc.err); got != tc.want {
			t.Errorf("Code(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
