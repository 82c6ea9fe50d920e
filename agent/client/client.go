// Package client calls the rbd-owner agent over its unix socket. A CSI plugin imports it:
// Map in NodeStageVolume, Unmap in NodeUnstageVolume. Both are idempotent, so retrying after
// an error or a timeout is always safe. It depends only on the standard library and agent/api.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
)

// The calls that got no answer from the agent, each with its cause (a syscall.Errno, io.EOF)
// in the error's chain for errors.Is, and a message that says what happened without Go's dial
// text ("dial unix ...: connect: ...").
var (
	// ErrUnreachable says nothing answers on the socket: it does not exist (no agent, or its
	// socket unit not started: syscall.ENOENT) or nothing listens on it (ECONNREFUSED).
	ErrUnreachable = errors.New("rbd-owner agent not reachable")
	// ErrNoAccess says the caller may not connect to the socket (EACCES, EPERM): it is neither
	// root nor in the socket's group. Code answers api.CodePermissionDenied.
	ErrNoAccess = errors.New("no permission on the rbd-owner agent's socket")
	// ErrCutOff says the request was sent and the connection closed before the answer (io.EOF,
	// io.ErrUnexpectedEOF, ECONNRESET, EPIPE): the agent went away during the call, so what it
	// had begun may be done, or undone by its recovery. Every call may be repeated.
	ErrCutOff = errors.New("the rbd-owner agent went away during the call")
)

// CodeUnreachable is Code's answer for ErrUnreachable, and CodeInterrupted for ErrCutOff. They
// are not among the agent's codes (no agent answered); the CLI's --json error objects carry them.
const (
	CodeUnreachable = "unreachable"
	CodeInterrupted = "interrupted"
)

// noAnswer is a call that got no answer: kind is one of the sentinels above, msg what a person
// reads, cause the error the transport returned (kept for errors.Is, not printed).
type noAnswer struct {
	kind  error
	msg   string
	cause error
}

func (e *noAnswer) Error() string   { return e.msg }
func (e *noAnswer) Unwrap() []error { return []error{e.kind, e.cause} }

// dialFailed classifies a failed connection to the socket by its errno.
func (c *Client) dialFailed(err error) error {
	switch {
	case errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM):
		return &noAnswer{ErrNoAccess, "no permission to connect to the rbd-owner agent's socket " + c.socket, err}
	case errors.Is(err, syscall.ENOENT):
		return &noAnswer{ErrUnreachable, "no rbd-owner agent answers on " + c.socket + ": the socket does not exist", err}
	case errors.Is(err, syscall.ECONNREFUSED):
		return &noAnswer{ErrUnreachable, "no rbd-owner agent answers on " + c.socket + ": nothing listens on the socket (connection refused)", err}
	}
	return &noAnswer{ErrUnreachable, fmt.Sprintf("no rbd-owner agent answers on %s: %v", c.socket, err), err}
}

// cutOff says whether a call whose request was sent failed because the connection closed
// before the whole answer came.
func cutOff(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// cutOffError is ErrCutOff for a call, saying what may have become of it: a map or an unmap
// the agent had begun is finished or undone by its recovery, and repeating it is safe.
func cutOffError(method, path string, err error) error {
	msg := fmt.Sprintf("the rbd-owner agent went away during %s %s (its connection closed before the answer: it stopped or restarted)", method, path)
	switch path {
	case api.PathMap:
		msg += "; its recovery may have finished the map or undone it: repeat the map (a map of an image this node holds is answered with its device)"
	case api.PathUnmap:
		msg += "; its recovery may have finished the unmap or undone it: repeat the unmap (an image no longer mapped is answered unmapped: false)"
	default:
		msg += "; what it had begun may be done or not: repeat the call"
	}
	return &noAnswer{ErrCutOff, msg, err}
}

// Client talks to one agent. It is safe for concurrent use.
type Client struct {
	socket string
	hc     *http.Client
}

// New returns a client for the agent listening on socket ("" means the default path).
func New(socket string) *Client {
	if socket == "" {
		socket = api.DefaultSocket
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		MaxIdleConns:    4,
		IdleConnTimeout: 30 * time.Second,
	}
	// A map can take as long as the agent's map_timeout plus cluster round trips; the
	// caller's context is the real deadline, this is only the backstop.
	return &Client{socket: socket, hc: &http.Client{Transport: tr, Timeout: 5 * time.Minute}}
}

// Map claims and maps an image and returns its device. An image claimed by another node fails
// with an *api.Error whose Code is api.CodeClaimedElsewhere and whose Owner names the node.
func (c *Client) Map(ctx context.Context, req api.MapRequest) (*api.MapResponse, error) {
	var out api.MapResponse
	return &out, c.do(ctx, http.MethodPost, api.PathMap, req, &out)
}

// Unmap unmaps an image (or a device) and releases its claim. Unmapped is false when it was
// not mapped: that is not an error.
func (c *Client) Unmap(ctx context.Context, req api.UnmapRequest) (*api.UnmapResponse, error) {
	var out api.UnmapResponse
	return &out, c.do(ctx, http.MethodPost, api.PathUnmap, req, &out)
}

// Status returns this node's devices and claims.
func (c *Client) Status(ctx context.Context) (*api.Status, error) {
	var out api.Status
	return &out, c.do(ctx, http.MethodGet, api.PathStatus, nil, &out)
}

// Claims lists the claims of a pool, cluster-wide.
func (c *Client) Claims(ctx context.Context, cluster, pool string) ([]api.Claim, error) {
	return c.ClaimsOf(ctx, cluster, pool, "")
}

// ClaimsOf lists the claims of a pool (every pool when ""), or the holds of one node
// cluster-wide (node != "": found through its heartbeats, without listing pools).
func (c *Client) ClaimsOf(ctx context.Context, cluster, pool, node string) ([]api.Claim, error) {
	q := url.Values{}
	if node != "" {
		q.Set("node", node)
	}
	if cluster != "" {
		q.Set("cluster", cluster)
	}
	if pool != "" {
		q.Set("pool", pool)
	}
	path := api.PathClaims
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out []api.Claim
	return out, c.do(ctx, http.MethodGet, path, nil, &out)
}

// Fence blocklists the mapping of the node that holds an image (admin).
func (c *Client) Fence(ctx context.Context, req api.ImageRequest) (*api.FenceResponse, error) {
	var out api.FenceResponse
	return &out, c.do(ctx, http.MethodPost, api.PathFence, req, &out)
}

// Unfence lifts the fences on this node's unmapped intruders of an image (admin).
func (c *Client) Unfence(ctx context.Context, req api.ImageRequest) (*api.UnfenceResponse, error) {
	var out api.UnfenceResponse
	return &out, c.do(ctx, http.MethodPost, api.PathUnfence, req, &out)
}

// UnfenceNode lifts a node's whole-node fences (admin).
func (c *Client) UnfenceNode(ctx context.Context, req api.UnfenceNodeRequest) (*api.UnfenceNodeResponse, error) {
	var out api.UnfenceNodeResponse
	return &out, c.do(ctx, http.MethodPost, api.PathUnfenceNode, req, &out)
}

// Release drops a claim (admin; Force drops a fenced dead owner's claim).
func (c *Client) Release(ctx context.Context, req api.ImageRequest) (*api.ReleaseResponse, error) {
	var out api.ReleaseResponse
	return &out, c.do(ctx, http.MethodPost, api.PathRelease, req, &out)
}

// RemoveOrphans removes the claims of deleted images in a pool (admin).
func (c *Client) RemoveOrphans(ctx context.Context, req api.OrphansRequest) (*api.OrphansResponse, error) {
	var out api.OrphansResponse
	return &out, c.do(ctx, http.MethodPost, api.PathOrphans, req, &out)
}

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://rbd-owner"+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	var sent atomic.Bool // the whole request was written to the agent
	req = req.WithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteRequest: func(i httptrace.WroteRequestInfo) { sent.Store(i.Err == nil) },
	}))
	resp, err := c.hc.Do(req)
	if err != nil {
		var op *net.OpError
		switch {
		case errors.As(err, &op) && op.Op == "dial":
			return c.dialFailed(err)
		case sent.Load() && cutOff(err):
			return cutOffError(method, path, err)
		}
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer func() { _ = resp.Body.Close() }() // read to its end or failed: its close loses nothing
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		if cutOff(err) {
			return cutOffError(method, path, err)
		}
		return fmt.Errorf("%s %s: read answer: %w", method, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		var eb api.ErrorBody
		if json.Unmarshal(data, &eb) == nil && eb.Error != nil {
			return eb.Error
		}
		return &api.Error{Code: api.CodeInternal, Message: fmt.Sprintf("%s %s: HTTP %d: %s", method, path, resp.StatusCode, bytes.TrimSpace(data))}
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s %s: bad answer: %w", method, path, err)
	}
	return nil
}

// Code returns the code of a call's error: "" only when err is nil; the agent's code (api.Code*)
// when the agent answered with an error; CodeUnreachable when nothing answered on the socket;
// api.CodePermissionDenied when the caller may not connect to it; CodeInterrupted when the agent
// went away during the call; api.CodeTimeout when the call's context or the client's backstop
// ran out; else api.CodeInternal. So a caller's `case "":` is reached on success alone.
func Code(err error) string {
	if err == nil {
		return ""
	}
	var ae *api.Error
	if errors.As(err, &ae) {
		return ae.Code
	}
	switch {
	case errors.Is(err, ErrUnreachable):
		return CodeUnreachable
	case errors.Is(err, ErrNoAccess):
		return api.CodePermissionDenied
	case errors.Is(err, ErrCutOff):
		return CodeInterrupted
	}
	var te interface{ Timeout() bool }
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &te) && te.Timeout()) {
		return api.CodeTimeout
	}
	return api.CodeInternal
}
