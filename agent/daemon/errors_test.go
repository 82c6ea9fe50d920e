package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/ceph/go-ceph/rados"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/cephconn"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/fault"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
	"github.com/rbd-owner/rbd-owner/agent/server"
	"github.com/rbd-owner/rbd-owner/agent/state"
)

// TestEveryKindHasAContractCode: the one classification covers the contract's codes, and every
// package's typed errors land on the code the contract gives them (blocklisted included).
func TestEveryKindHasAContractCode(t *testing.T) {
	seen := map[string]bool{}
	for _, k := range fault.Kinds() {
		code := api.CodeOf(k)
		if code == api.CodeInternal && k != fault.Internal {
			t.Errorf("kind %v has no code of its own", k)
		}
		seen[code] = true
	}
	for _, code := range []string{api.CodeInvalidArgument, api.CodePermissionDenied, api.CodeNotFound, api.CodeClaimedElsewhere,
		api.CodeBusy, api.CodeFenced, api.CodeClusterUnavailable, api.CodeTimeout, api.CodeStateUnwritable, api.CodeInternal} {
		if !seen[code] {
			t.Errorf("contract code %s is no kind's", code)
		}
	}
	held := &claim.HeldError{Image: claim.Image{Pool: "rbd", Image: "x"}, Access: claim.RWO,
		Holders: []claim.Holder{{NodeID: "node-a", Epoch: 3}}, Takeover: true,
		Leases: map[string]claim.LeaseView{"node-a": {Unchanged: 4 * time.Second, RetryAfter: 11*time.Second + 300*time.Millisecond}}}
	for _, tc := range []struct {
		name   string
		err    error
		code   string
		status int
	}{
		{"daemon invalid", fmt.Errorf("%w: bad", errInvalid), api.CodeInvalidArgument, 400},
		{"daemon role refusal", fmt.Errorf("%w: fence needs admin", server.ErrDenied), api.CodePermissionDenied, 403},
		{"claim held elsewhere", fmt.Errorf("acquire rbd/x: %w", held), api.CodeClaimedElsewhere, 409},
		{"claim lost", &claim.LostError{Image: claim.Image{Pool: "rbd", Image: "x"}, Epoch: 2, Why: "taken over"}, api.CodeFenced, 409},
		{"claim fenced", claim.ErrFenced, api.CodeFenced, 409},
		{"claim busy", claim.ErrBusy, api.CodeBusy, 409},
		{"claim invalid", claim.ErrInvalid, api.CodeInvalidArgument, 400},
		{"no claim", claim.ErrNoClaim, api.CodeNotFound, 404},
		{"image not found", claim.ErrNotFound, api.CodeNotFound, 404},
		{"cluster unavailable", cephconn.Classify(rados.ErrNotConnected, "connect", "-"), api.CodeClusterUnavailable, 503},
		{"librados ETIMEDOUT", cephconn.Classify(radosErr(syscall.ETIMEDOUT), "write", "-"), api.CodeClusterUnavailable, 503},
		{"librados ENOENT", cephconn.Classify(radosErr(syscall.ENOENT), "read", "-"), api.CodeNotFound, 404},
		{"librados EACCES names the cap", cephconn.Classify(radosErr(syscall.EACCES), "blocklist", cephconn.BlocklistCap), api.CodePermissionDenied, 403},
		{"librados blocklisted (ESHUTDOWN)", cephconn.Classify(radosErr(syscall.ESHUTDOWN), "write", "-"), api.CodeFenced, 409},
		{"cephconn blocklisted", cephconn.ErrBlocklisted, api.CodeFenced, 409},
		{"kernel blocklisted", krbd.ErrFenced, api.CodeFenced, 409},
		{"kernel busy", fmt.Errorf("unmap: %w", krbd.ErrBusy), api.CodeBusy, 409},
		{"kernel not found", krbd.ErrNotFound, api.CodeNotFound, 404},
		{"kernel invalid", krbd.ErrInvalid, api.CodeInvalidArgument, 400},
		{"kernel unsupported features", krbd.ErrUnsupported, api.CodeInvalidArgument, 400},
		{"kernel permission", krbd.ErrPermission, api.CodePermissionDenied, 403},
		{"kernel mount_timeout", krbd.ErrTimeout, api.CodeClusterUnavailable, 503},
		{"kernel wait past the caller's deadline", fmt.Errorf("%w: %w", krbd.ErrTimeout, context.DeadlineExceeded), api.CodeTimeout, 504},
		{"caller's deadline", context.DeadlineExceeded, api.CodeTimeout, 504},
		{"no kernel support", krbd.ErrNoKernelSupport, api.CodeInternal, 500},
		{"state file on a full disk", fmt.Errorf("%w; free space", &state.WriteError{Path: "/s", Err: syscall.ENOSPC}), api.CodeStateUnwritable, 507},
		{"state file on a read-only file system", &state.WriteError{Path: "/s", Err: fmt.Errorf("create x.tmp: %w", syscall.EROFS)}, api.CodeStateUnwritable, 507},
		{"state file, another failure", &state.WriteError{Path: "/s", Err: syscall.EIO}, api.CodeInternal, 500},
		{"unclassified", errors.New("boom"), api.CodeInternal, 500},
	} {
		e := server.APIError(tc.err)
		if e.Code != tc.code || api.HTTPStatus(e.Code) != tc.status {
			t.Errorf("%s: %s %d, want %s %d", tc.name, e.Code, api.HTTPStatus(e.Code), tc.code, tc.status)
		}
		if tc.code == api.CodeClaimedElsewhere && (e.Owner == nil || e.Owner.NodeID != "node-a" || e.Owner.Epoch != 3 ||
			e.Owner.Expired || e.Owner.LeaseAge != 4 || e.RetryAfterSeconds != 12) {
			t.Errorf("%s: owner %+v, retry after %d", tc.name, e.Owner, e.RetryAfterSeconds)
		}
	}
	if http.StatusConflict != api.HTTPStatus(api.CodeOf(fault.KindOf(cephconn.ErrBlocklisted))) {
		t.Error("blocklisted is not 409")
	}
}

// radosCode is a librados return code as go-ceph reports it (an error with ErrorCode).
type radosCode int

func (c radosCode) Error() string  { return fmt.Sprintf("rados: ret=%d", int(c)) }
func (c radosCode) ErrorCode() int { return int(c) }

func radosErr(errno syscall.Errno) error { return radosCode(-int(errno)) }
