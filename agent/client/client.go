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
	"net/url"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
)

// ErrUnreachable says nothing answers on the socket (agent not running, or no access to it).
var ErrUnreachable = errors.New("rbd-owner agent not reachable")

// CodeUnreachable is Code's answer for ErrUnreachable. It is not one of the agent's codes (no
// agent answered); the CLI's --json error objects carry it.
const CodeUnreachable = "unreachable"

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
	resp, err := c.hc.Do(req)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return fmt.Errorf("%w at %s: %w", ErrUnreachable, c.socket, err)
		}
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer func() { _ = resp.Body.Close() }() // read to its end or failed: its close loses nothing
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
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
// api.CodeTimeout when the call's context or the client's backstop ran out; else api.CodeInternal.
// So a caller's `case "":` is reached on success alone.
func Code(err error) string {
	if err == nil {
		return ""
	}
	var ae *api.Error
	if errors.As(err, &ae) {
		return ae.Code
	}
	if errors.Is(err, ErrUnreachable) {
		return CodeUnreachable
	}
	var te interface{ Timeout() bool }
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &te) && te.Timeout()) {
		return api.CodeTimeout
	}
	return api.CodeInternal
}
