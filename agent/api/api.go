// Package api holds the types of rbd-owner's v1 API: HTTP/1.1 + JSON over the agent's unix
// socket. It has no dependencies beyond the standard library, so that a CSI plugin can
// import the client package built on it cheaply.
package api

import (
	"fmt"
	"net/http"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/fault"
	"github.com/rbd-owner/rbd-owner/agent/image"
)

// Paths of the v1 calls.
const (
	PathMap    = "/v1/map"
	PathUnmap  = "/v1/unmap"
	PathStatus = "/v1/status"
	PathClaims = "/v1/claims"
	PathFence  = "/v1/fence"
	// PathUnfence lifts the fences put on mappings made outside rbd-owner, once unmapped (admin).
	PathUnfence = "/v1/unfence"
	// PathUnfenceNode lifts a node's whole-node fences (ip:0/0), once it rebooted (admin).
	PathUnfenceNode = "/v1/unfence-node"
	PathRelease     = "/v1/release"
	// PathOrphanList lists the claims of deleted images (GET ?cluster=&pool=).
	PathOrphanList = "/v1/orphans"
	// PathOrphans removes the claims of deleted images (admin).
	PathOrphans = "/v1/orphans/remove"
	// PathMetrics serves the Prometheus metrics (text exposition format), CSI role or more.
	PathMetrics = "/metrics"
)

// The agent's sockets: where it listens unless the config's socket and csi_socket say
// otherwise, and where its clients (the CLI, the drop-in rbd) call it unless told otherwise.
// These are the only definitions of the two paths (config's defaults are these).
const (
	// DefaultSocket is the main socket: each caller gets the role its uid and groups give it.
	DefaultSocket = "/run/rbd-owner/rbd-owner.sock"
	// DefaultCSISocket serves the CSI role only, whoever calls; it sits in a directory of its
	// own so that a CSI plugin's pod can mount that directory and nothing else.
	DefaultCSISocket = "/run/rbd-owner/csi/csi.sock"
)

// MaxBodyBytes bounds every request body.
const MaxBodyBytes = 64 << 10

// MapRequest asks the agent to claim and map an image.
type MapRequest struct {
	Cluster   string `json:"cluster,omitempty"`
	Pool      string `json:"pool"`
	Namespace string `json:"namespace,omitempty"`
	Image     string `json:"image"`
	Snapshot  string `json:"snapshot,omitempty"`
	// Access is rwo (default), rox or rwx.
	Access   string `json:"access,omitempty"`
	ReadOnly bool   `json:"read_only,omitempty"`
	// VolumeID and Requester are recorded in the audit trail (e.g. the CSI volume id and
	// "csi-rbdplugin").
	VolumeID  string `json:"volume_id,omitempty"`
	Requester string `json:"requester,omitempty"`
	// Takeover allows taking the image from a node whose lease has expired (fencing it). It
	// needs the admin role: a CSI-role request that sets it is refused (permission_denied).
	Takeover bool `json:"takeover,omitempty"`
	// Monitors, when Cluster is empty, name the cluster by one of its monitors' addresses
	// (a CSI plugin's `rbd -m`); exactly one configured cluster must have one of them.
	Monitors []string `json:"monitors,omitempty"`
	// Options are extra krbd map options ("queue_depth=128"), filtered by the agent's rules:
	// noshare is always set; read_only/ro map read-only; exclusive, share, name=, key=,
	// secret= and the options the agent sets itself are refused.
	Options []string `json:"options,omitempty"`
}

// Ref is the image the request names (the wire fields, converted here and nowhere else).
func (r MapRequest) Ref() image.Ref {
	return image.Ref{Pool: r.Pool, Namespace: r.Namespace, Image: r.Image, Snap: r.Snapshot}
}

// MapResponse is the answer to a successful map.
type MapResponse struct {
	Device        string `json:"device"`
	Link          string `json:"link"`
	AlreadyMapped bool   `json:"already_mapped"`
	Claim         *Claim `json:"claim,omitempty"`
}

// UnmapRequest names an image, or a device, to unmap. It needs no secret.
type UnmapRequest struct {
	Cluster   string `json:"cluster,omitempty"`
	Pool      string `json:"pool,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	Image     string `json:"image,omitempty"`
	Snapshot  string `json:"snapshot,omitempty"`
	Device    string `json:"device,omitempty"`
	Force     bool   `json:"force,omitempty"`
}

// Ref is the image the request names (empty when it names a device).
func (r UnmapRequest) Ref() image.Ref {
	return image.Ref{Pool: r.Pool, Namespace: r.Namespace, Image: r.Image, Snap: r.Snapshot}
}

// UnmapResponse says whether something was unmapped (false: it was not mapped).
type UnmapResponse struct {
	Unmapped bool `json:"unmapped"`
}

// ImageRequest names an image for fence and release.
type ImageRequest struct {
	Cluster   string `json:"cluster,omitempty"`
	Pool      string `json:"pool"`
	Namespace string `json:"namespace,omitempty"`
	Image     string `json:"image"`
	Force     bool   `json:"force,omitempty"`
	// Node, for a fence, names a node instead of an image: every hold of that node, cluster-wide
	// (admin; Pool and Image stay empty).
	Node string `json:"node,omitempty"`
}

// Ref is the image the request names.
func (r ImageRequest) Ref() image.Ref {
	return image.Ref{Pool: r.Pool, Namespace: r.Namespace, Image: r.Image}
}

// UnfenceNodeRequest asks to lift the whole-node fences (ip:0/0) of Node recorded in the
// claims of a cluster: refused unless the node's heartbeats show it rebooted since, or Force.
type UnfenceNodeRequest struct {
	Cluster string `json:"cluster,omitempty"`
	Node    string `json:"node"`
	Force   bool   `json:"force,omitempty"`
}

// UnfenceNodeResponse lists the whole-node fences lifted.
type UnfenceNodeResponse struct {
	Node   string      `json:"node"`
	Fences []NodeFence `json:"fences"`
	Lifted []string    `json:"lifted"`
	Forced bool        `json:"forced"`
}

// NodeFence is one whole-node fence, and whether its node is known rebooted since.
type NodeFence struct {
	image.Ref
	Addr     string    `json:"addr"`
	FencedAt time.Time `json:"fenced_at"`
	FencedBy string    `json:"fenced_by"`
	// Rebooted says how the node is known rebooted since ("" when it is not: lifted by force).
	Rebooted string `json:"rebooted,omitempty"`
}

// FenceResponse says which mapping address was blocklisted, and until when.
type FenceResponse struct {
	FencedAddr string    `json:"fenced_addr"`
	Expires    time.Time `json:"expires"`
	// FencedAddrs lists every address when several holders (rox/rwx) were fenced.
	FencedAddrs []string `json:"fenced_addrs,omitempty"`
	// Node, Holds and Incomplete answer a node's fence: each of its holds fenced, and what could
	// not be found or fenced (the fence is then not complete: run it again, or fence those images
	// one at a time).
	Node       string       `json:"node,omitempty"`
	Holds      []FencedHold `json:"holds,omitempty"`
	Incomplete []string     `json:"incomplete,omitempty"`
	// NoLongerHeld answers a node's fence that found nothing to fence although the node's
	// heartbeats list holds: the images they list, none of whose claims names the node as a
	// holder any more (taken over or released). Nothing was fenced, and Note says so.
	NoLongerHeld []image.Ref `json:"no_longer_held,omitempty"`
	Note         string      `json:"note,omitempty"`
}

// FencedHold is one hold a node's fence blocklisted.
type FencedHold struct {
	image.Ref
	Epoch   uint64    `json:"epoch"`
	Addr    string    `json:"addr"`
	Expires time.Time `json:"expires"`
	// Again: it was fenced already (its entry was added again, moving its expiry).
	Again bool `json:"again,omitempty"`
}

// UnfenceResponse lists the fenced mappings whose fences were lifted.
type UnfenceResponse struct {
	Unfenced []Intruder `json:"unfenced"`
}

// Intruder is a mapping made outside rbd-owner that its node's agent fenced, as the image's
// claim records it.
type Intruder struct {
	NodeID     string `json:"node_id"`
	Device     string `json:"device"`
	ClientAddr string `json:"client_addr"`
	// SharedClient: its kernel client served other mappings too, fenced with it.
	SharedClient bool      `json:"shared_client,omitempty"`
	Holders      string    `json:"holders"` // who held the image then, "node@epoch,…"
	FencedAt     time.Time `json:"fenced_at"`
	Expires      time.Time `json:"expires"`
}

// OrphansRequest names the pool whose orphaned claims are removed ("" for every pool).
type OrphansRequest struct {
	Cluster string `json:"cluster,omitempty"`
	Pool    string `json:"pool,omitempty"`
	// Force removes the orphans the automatic sweep keeps too: claims still held, or still
	// keeping live fences (an image only renamed or moved to the trash keeps its data, and a
	// fenced mapping of it could write). Each such removal is audited as forced.
	Force bool `json:"force,omitempty"`
}

// OrphansResponse lists the claims removed ("pool/[namespace/]image") and, without Force, the
// orphans kept as the automatic sweep keeps them.
type OrphansResponse struct {
	Removed []string     `json:"removed"`
	Kept    []KeptOrphan `json:"kept"`
}

// KeptOrphan is the claim of an image gone by name that was not removed: still held, or still
// keeping live fences.
type KeptOrphan struct {
	Image string `json:"image"` // pool/[namespace/]image
	// HeldBy are the nodes that hold it; FencesOf the nodes whose live fences it keeps (a
	// mapping made outside rbd-owner counts as its node's).
	HeldBy   []string `json:"held_by,omitempty"`
	FencesOf []string `json:"fences_of,omitempty"`
	Why      string   `json:"why"`
	NextStep string   `json:"next_step"`
}

// ReleaseResponse says whether a claim was dropped.
type ReleaseResponse struct {
	Released bool `json:"released"`
}

// Holder is one node's hold on an image.
type Holder struct {
	NodeID       string    `json:"node_id"`
	Hostname     string    `json:"hostname"`
	NodeAddr     string    `json:"node_addr"`
	ClientAddr   string    `json:"client_addr"`
	Device       string    `json:"device"`
	ReadOnly     bool      `json:"read_only"`
	Epoch        uint64    `json:"epoch"`
	AcquiredAt   time.Time `json:"acquired_at"`
	RenewedAt    time.Time `json:"renewed_at"`
	LeaseSeconds int64     `json:"lease_seconds"`
	AgentVersion string    `json:"agent_version"`
	Fenced       bool      `json:"fenced,omitempty"`
}

// Claim is an image's claim record.
type Claim struct {
	Cluster     string   `json:"cluster"`
	ClusterFSID string   `json:"cluster_fsid"`
	Pool        string   `json:"pool"`
	Namespace   string   `json:"namespace"`
	Image       string   `json:"image"`
	ImageID     string   `json:"image_id"`
	Access      string   `json:"access"`
	Epoch       uint64   `json:"epoch"`
	Holders     []Holder `json:"holders"`
	// Orphan is set in listings when the image no longer exists.
	Orphan bool `json:"orphan,omitempty"`
	// Intruders are mappings made outside rbd-owner that were fenced (until unfenced).
	Intruders []Intruder `json:"intruders,omitempty"`
	// Fences are the takeovers' and admins' fences the claim records: live ones (Gone empty)
	// are kept on the blocklist until their mappings are known gone.
	Fences []Fence `json:"fences,omitempty"`
}

// Fence is one blocklisting a claim records (see docs/claim-record.md, Fence lifetimes).
type Fence struct {
	NodeID    string    `json:"node_id"`
	Addr      string    `json:"addr"`
	Epoch     uint64    `json:"epoch"`
	At        time.Time `json:"at"`
	By        string    `json:"by"`
	Expires   time.Time `json:"expires"`
	BootID    string    `json:"boot_id,omitempty"`
	RenewedAt time.Time `json:"renewed_at,omitzero"`
	RenewedBy string    `json:"renewed_by,omitempty"`
	// Gone says why the fenced mapping is known gone ("" while it is kept).
	Gone   string    `json:"gone,omitempty"`
	GoneAt time.Time `json:"gone_at,omitzero"`
}

// Device is a mapped rbd device on this node.
type Device struct {
	Device     string `json:"device"`
	Link       string `json:"link,omitempty"`
	Cluster    string `json:"cluster,omitempty"`
	FSID       string `json:"cluster_fsid"`
	Pool       string `json:"pool"`
	Namespace  string `json:"namespace"`
	Image      string `json:"image"`
	Snapshot   string `json:"snapshot,omitempty"`
	ClientAddr string `json:"client_addr"`
	// Managed is false for a device mapped behind the agent's back.
	Managed bool   `json:"managed"`
	Epoch   uint64 `json:"epoch,omitempty"`
	// Problem explains what is wrong with this device's claim, if anything, and ProblemSince
	// says since when something has been.
	Problem      string     `json:"problem,omitempty"`
	ProblemSince *time.Time `json:"problem_since,omitempty"`
	// FencedUntil is set on a device mapped outside rbd-owner that the agent fenced.
	FencedUntil *time.Time `json:"fenced_until,omitempty"`
	// Options are the kernel options the mapping was made with, each with where it came from
	// (the caller, the agent's map_options, the cluster's rbd_default_map_options and its
	// level, the agent's msgr2 default); cluster defaults the agent did not apply say why.
	Options []MapOption `json:"options,omitempty"`
}

// ProblemLine is how the node's list of problems (Status.Problems) names this device's problem,
// "" when it has none: a managed device by its cluster and image ("c1:rbd/img1: …"), one mapped
// outside rbd-owner by its device node ("/dev/rbd1: …"), then the problem and, when known, since
// when. The agent lists a device's problem with it, and the CLI finds that line with it: by the
// same data, not by reading the text.
func (d Device) ProblemLine() string {
	if d.Problem == "" {
		return ""
	}
	subject := d.Device
	if d.Managed {
		subject = d.Cluster + ":" + image.Ref{Pool: d.Pool, Namespace: d.Namespace, Image: d.Image, Snap: d.Snapshot}.String()
	}
	line := subject + ": " + d.Problem
	if d.ProblemSince != nil {
		line += SinceText(*d.ProblemSince)
	}
	return line
}

// SinceText is how a problem line ends: " (since <UTC time, RFC 3339>)".
func SinceText(t time.Time) string {
	return " (since " + t.UTC().Format(time.RFC3339) + ")"
}

// MapOption is one kernel option of a mapping and where it came from.
type MapOption struct {
	Option string `json:"option"`
	From   string `json:"from"`
}

// ClusterStatus is the agent's view of one configured cluster.
type ClusterStatus struct {
	ID        string `json:"id"`
	FSID      string `json:"fsid,omitempty"`
	Connected bool   `json:"connected"`
	// Connecting: not connected yet, and the attempt under way has not failed (just after the
	// agent started, or while it reconnects).
	Connecting bool   `json:"connecting,omitempty"`
	NodeAddr   string `json:"node_addr,omitempty"`
	Error      string `json:"error,omitempty"`
	// LivenessWriteAge is how long this node's liveness record went unwritten in the stalest
	// pool of the cluster where it holds claims (the metric rbd_owner_liveness_write_age_seconds);
	// absent when it holds none there.
	LivenessWriteAge *float64 `json:"liveness_write_age_seconds,omitempty"`
	// PriorKeyMappings counts this node's mappings of the cluster made with a key its keyring no
	// longer holds (the prior key of a rotation): once 0 on every node, the prior key can go.
	PriorKeyMappings int `json:"prior_key_mappings,omitempty"`
}

// Status is the answer to GET /v1/status.
type Status struct {
	Node       string          `json:"node"`
	Version    string          `json:"version"`
	Clusters   []ClusterStatus `json:"clusters"`
	Devices    []Device        `json:"devices"`
	ClaimsHeld int             `json:"claims_held"`
	// Problems are every current problem, one line each, ending "(since <time>)": those of
	// devices, of claims without a device, and of the node (its state file, clock skews).
	// Each goes away when its cause does.
	Problems []string `json:"problems"`
}

// Error codes, each with its HTTP status.
const (
	CodeInvalidArgument    = "invalid_argument"
	CodePermissionDenied   = "permission_denied"
	CodeNotFound           = "not_found"
	CodeClaimedElsewhere   = "claimed_elsewhere"
	CodeBusy               = "busy"
	CodeFenced             = "fenced"
	CodeClusterUnavailable = "cluster_unavailable"
	CodeTimeout            = "timeout"
	// CodeStateUnwritable: the agent cannot write its state file (a full disk or quota, a
	// read-only file system); the message names the directory and what to do.
	CodeStateUnwritable = "state_unwritable"
	CodeInternal        = "internal"
)

// CodeOf is the contract's code for an error kind (the agent's one classification).
func CodeOf(k fault.Kind) string {
	switch k {
	case fault.Invalid:
		return CodeInvalidArgument
	case fault.PermissionDenied:
		return CodePermissionDenied
	case fault.NotFound:
		return CodeNotFound
	case fault.ClaimedElsewhere:
		return CodeClaimedElsewhere
	case fault.Busy:
		return CodeBusy
	case fault.Fenced:
		return CodeFenced
	case fault.Unavailable:
		return CodeClusterUnavailable
	case fault.Timeout:
		return CodeTimeout
	case fault.Storage:
		return CodeStateUnwritable
	}
	return CodeInternal
}

// HTTPStatus returns the status that goes with an error code.
func HTTPStatus(code string) int {
	switch code {
	case CodeInvalidArgument:
		return http.StatusBadRequest
	case CodePermissionDenied:
		return http.StatusForbidden
	case CodeNotFound:
		return http.StatusNotFound
	case CodeClaimedElsewhere, CodeBusy, CodeFenced:
		return http.StatusConflict
	case CodeClusterUnavailable:
		return http.StatusServiceUnavailable
	case CodeTimeout:
		return http.StatusGatewayTimeout
	case CodeStateUnwritable:
		return http.StatusInsufficientStorage
	}
	return http.StatusInternalServerError
}

// Owner names the node that holds an image, in claimed_elsewhere errors.
type Owner struct {
	NodeID     string    `json:"node_id"`
	Hostname   string    `json:"hostname"`
	NodeAddr   string    `json:"node_addr,omitempty"`
	ClientAddr string    `json:"client_addr,omitempty"`
	Epoch      uint64    `json:"epoch"`
	AcquiredAt time.Time `json:"acquired_at"`
	// RenewedAt is the holder's own timestamp of its claim: for people, never compared.
	RenewedAt time.Time `json:"renewed_at"`
	// LeaseAge is how long this node has watched the owner's liveness without seeing it
	// change (this node's own clock).
	LeaseAge float64 `json:"lease_age_seconds"`
	// Expired: the owner's liveness has not changed for a whole lease, as this node saw it.
	Expired bool `json:"expired"`
}

// Error is the body of every error answer: {"error": {...}}. It is also the error the client
// returns, so callers can branch on Code.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// Image, on a refusal (claimed_elsewhere): the image asked for, as a command's argument
	// (POOL[/NAMESPACE]/IMAGE).
	Image string `json:"image,omitempty"`
	// Owner is the first of Holders (the only one of an rwo image).
	Owner   *Owner  `json:"owner,omitempty"`
	Holders []Owner `json:"holders,omitempty"`
	// Block, on a refusal: why this request may not have the image, as a kind (no_takeover,
	// not_covered, no_mapping_addr, no_lease_look, lease_live, no_fence_addr, alive); Reason
	// says it in facts, when Message does ("" for no_takeover).
	Block  string `json:"block,omitempty"`
	Reason string `json:"reason,omitempty"`
	// RetryAfterSeconds, on a refusal: the agent is watching the owner's lease; a takeover
	// is possible after this long unless the owner renews.
	RetryAfterSeconds int64 `json:"retry_after_seconds,omitempty"`
	// NextSteps, on a refusal: what this caller may do, for its role and the node's
	// takeover_policy, in order; Advice says them in the one phrase Message ends with ("" when
	// the reason says it: a takeover that waits for a lease).
	NextSteps []Step `json:"next_steps,omitempty"`
	Advice    string `json:"advice,omitempty"`
}

// Step is one thing to do about a refusal: Run, a command line ("" for what is no command,
// such as a setting), and Why, when and what it does.
type Step struct {
	Run string `json:"run,omitempty"`
	Why string `json:"why"`
}

// Detailer is an error that fills in an answer's details beyond its code and message (a
// refusal's image, holders and next steps): the server asks it, knowing no error type.
type Detailer interface {
	Details(e *Error)
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s (%s)", e.Message, e.Code)
}

// ErrorBody wraps Error on the wire.
type ErrorBody struct {
	Error *Error `json:"error"`
}
