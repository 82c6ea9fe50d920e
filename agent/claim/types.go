package claim

import "github.com/rbd-owner/rbd-owner/agent/claim/record"

// The claim protocol's shared types live on the floor below (package record): the record, its
// holders and fences, the blocklist entry, object names, the errors and the Backend a store
// runs on. They are named here too, so that callers of the protocol import one package.

type (
	// Access is record.Access.
	Access = record.Access
	// Backend is record.Backend.
	Backend = record.Backend
	// Block is record.Block.
	Block = record.Block
	// BlockEntry is record.BlockEntry.
	BlockEntry = record.BlockEntry
	// Fence is record.Fence.
	Fence = record.Fence
	// FencedElsewhereError is record.FencedElsewhereError.
	FencedElsewhereError = record.FencedElsewhereError
	// HeldError is record.HeldError.
	HeldError = record.HeldError
	// Holder is record.Holder.
	Holder = record.Holder
	// Image is record.Image.
	Image = record.Image
	// Intruder is record.Intruder.
	Intruder = record.Intruder
	// LeaseView is record.LeaseView.
	LeaseView = record.LeaseView
	// LostError is record.LostError.
	LostError = record.LostError
	// NotFencedError is record.NotFencedError.
	NotFencedError = record.NotFencedError
	// NotFoundError is record.NotFoundError.
	NotFoundError = record.NotFoundError
	// Record is record.Record.
	Record = record.Record
	// StillMappedError is record.StillMappedError.
	StillMappedError = record.StillMappedError
	// UnlistedHoldsError is record.UnlistedHoldsError.
	UnlistedHoldsError = record.UnlistedHoldsError
	// SwapMark is record.SwapMark.
	SwapMark = record.SwapMark
)

const (
	// BlockAlive is record.BlockAlive.
	BlockAlive = record.BlockAlive
	// BlockLeaseLive is record.BlockLeaseLive.
	BlockLeaseLive = record.BlockLeaseLive
	// BlockNoFenceAddr is record.BlockNoFenceAddr.
	BlockNoFenceAddr = record.BlockNoFenceAddr
	// BlockNoLeaseLook is record.BlockNoLeaseLook.
	BlockNoLeaseLook = record.BlockNoLeaseLook
	// BlockNoMappingAddr is record.BlockNoMappingAddr.
	BlockNoMappingAddr = record.BlockNoMappingAddr
	// BlockNoTakeover is record.BlockNoTakeover.
	BlockNoTakeover = record.BlockNoTakeover
	// BlockNotCovered is record.BlockNotCovered.
	BlockNotCovered = record.BlockNotCovered
	// FormatVersion is record.FormatVersion.
	FormatVersion = record.FormatVersion
	// HeartbeatFormat is record.HeartbeatFormat.
	HeartbeatFormat = record.HeartbeatFormat
	// HeartbeatPrefix is record.HeartbeatPrefix.
	HeartbeatPrefix = record.HeartbeatPrefix
	// IndexObject is record.IndexObject.
	IndexObject = record.IndexObject
	// NoticePrefix is record.NoticePrefix.
	NoticePrefix = record.NoticePrefix
	// ObjectPrefix is record.ObjectPrefix.
	ObjectPrefix = record.ObjectPrefix
	// ROX is record.ROX.
	ROX = record.ROX
	// RWO is record.RWO.
	RWO = record.RWO
	// RWX is record.RWX.
	RWX = record.RWX
	// SwapFormat is record.SwapFormat.
	SwapFormat = record.SwapFormat
)

var (
	// ErrBusy is record.ErrBusy.
	ErrBusy = record.ErrBusy
	// ErrClaimedElsewhere is record.ErrClaimedElsewhere.
	ErrClaimedElsewhere = record.ErrClaimedElsewhere
	// ErrConflict is record.ErrConflict.
	ErrConflict = record.ErrConflict
	// ErrFenced is record.ErrFenced.
	ErrFenced = record.ErrFenced
	// ErrInvalid is record.ErrInvalid.
	ErrInvalid = record.ErrInvalid
	// ErrNoClaim is record.ErrNoClaim.
	ErrNoClaim = record.ErrNoClaim
	// ErrNotFound is record.ErrNotFound.
	ErrNotFound = record.ErrNotFound
)

// Covering is record.Covering.
var Covering = record.Covering

// ObjectKind is record.ObjectKind.
var ObjectKind = record.ObjectKind

// ParseAccess is record.ParseAccess.
var ParseAccess = record.ParseAccess

// ParseBlocklist is record.ParseBlocklist.
var ParseBlocklist = record.ParseBlocklist

// KeptFence is record.KeptFence.
type KeptFence = record.KeptFence
