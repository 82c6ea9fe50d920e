// Package state persists what the agent has claimed and mapped on this node, so that after a
// restart or a crash it can finish or undo what it was doing. The file is replaced atomically
// (write, fsync, rename, fsync the directory) on every change.
package state

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/fault"
	"github.com/rbd-owner/rbd-owner/agent/image"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
)

// Phase is where a mapping's saga stands; each names what recovery must finish.
type Phase string

// Phases of a mapping, in the order the map saga goes through them.
const (
	// Claiming: about to write the claim (the epoch is not known yet).
	Claiming Phase = "claiming"
	// Claimed: the claim is ours at Epoch; the kernel map may or may not have happened.
	Claimed Phase = "claimed"
	// Mapped: the device exists and its address is recorded in the claim.
	Mapped Phase = "mapped"
	// Unmapping: an unmap was asked for and is under way.
	Unmapping Phase = "unmapping"
)

// Valid says whether p is one of the phases (a state file from a newer agent may hold others).
func (p Phase) Valid() bool {
	switch p {
	case Claiming, Claimed, Mapped, Unmapping:
		return true
	}
	return false
}

// Key names one image (or snapshot) on one cluster.
type Key struct {
	Cluster string `json:"cluster"`
	image.Ref
}

func (k Key) String() string { return k.Cluster + ":" + k.Ref.String() }

// Mapping is one image this node has claimed (and usually mapped).
type Mapping struct {
	Key
	FSID       string    `json:"cluster_fsid"`
	Phase      Phase     `json:"phase"`
	Epoch      uint64    `json:"epoch"`
	Access     string    `json:"access"`
	ReadOnly   bool      `json:"read_only"`
	Claimed    bool      `json:"claimed"` // false for snapshot maps, which take no claim
	DeviceID   int       `json:"device_id"`
	Device     string    `json:"device"`
	ClientAddr string    `json:"client_addr"`
	VolumeID   string    `json:"volume_id,omitempty"`
	UpdatedAt  time.Time `json:"updated_at"`
	// Options are the kernel options the mapping was made with and where each came from
	// (krbd.Compose); absent in a state an older agent wrote.
	Options []krbd.OptionSource `json:"options,omitempty"`
	// KeyID names the agent's key the mapping was made with (krbd.KeyID): status counts the
	// mappings made with a key the keyring no longer holds. Absent from older agents' states.
	KeyID string `json:"key_id,omitempty"`
}

type file struct {
	Format   int       `json:"format"`
	Mappings []Mapping `json:"mappings"`
	// ClaimPools are the pools this node holds or has held claims in (the orphan sweep's
	// list); an older agent ignores the field.
	ClaimPools []Pool `json:"claim_pools,omitempty"`
	// Incarnation names this state: a node whose state is lost comes back with a new one.
	Incarnation string `json:"incarnation,omitempty"`
	// BootID is the kernel's boot id when the file was written: another one at start means
	// the node rebooted since, which took every device with it.
	BootID string `json:"boot_id,omitempty"`
}

// Pool is one pool of one cluster.
type Pool struct {
	Cluster string `json:"cluster"`
	Pool    string `json:"pool"`
}

// Store is the persisted set of mappings. Safe for concurrent use. Readers see what is on
// disk and never wait for a write. Writers queue their change and return once a write that
// holds it is durable: one writer at a time writes every change queued by then (a group
// commit: 64 maps at once cost a few writes, not 192 one after another), and only once that
// write is durable does the new set become what readers see.
type Store struct {
	path    string
	wmu     sync.Mutex // held by the writer whose write is under way
	qmu     sync.Mutex // guards queue
	queue   []*change  // changes waiting for a write
	mu      sync.Mutex // guards m, pools and inc; held only for moments
	m       map[Key]Mapping
	pools   map[Pool]bool
	inc     string
	writing func()       // when set (tests), called by a writer just before its disk write
	fault   func() error // FailWrites (tests); guarded by wmu
	aside   *SetAside    // the file Open could not use; set before the store is shared
	boot    string       // the boot id written with every write
	// priorBoot is the boot id the file had at Open ("" when none was recorded)
	priorBoot string
	onFail    func(error) // OnWriteFailure; guarded by mu
	dirty     bool        // memory holds changes the disk does not (Observe, Forget); guarded by mu
	werr      error       // the last write's error while writes fail; guarded by mu
	wsince    time.Time   // when writes started failing; guarded by mu
}

// change is one writer's change, and where it learns its write's result.
type change struct {
	apply func(*next)
	// keep: the change stands in memory even when its write fails (it says what is so, not
	// what is about to be done); it is written with the next write that succeeds
	keep bool
	done chan error // buffered: the result of the write that held it
}

// Incarnation is this state's random name, made when the state was first written: claims
// record it, so that a node that lost its state is told apart from the one that claimed.
func (s *Store) Incarnation() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inc
}

// SetAside describes a state file this agent could not use at start (cut short, not JSON, a
// format it does not read, unreadable): it was kept beside the new one under KeptAs, and the
// store started empty, so that the agent rebuilds its view from the kernel and the clusters
// instead of refusing to start (which would stop its heartbeats, and with them its leases).
type SetAside struct {
	// Path is the state file that could not be used; KeptAs where it is now ("" when it
	// could not be moved: then it is overwritten by the next write).
	Path, KeptAs string
	// Reason is why it could not be used.
	Reason error
}

// FileName is the state file's name in the state directory.
const FileName = "mappings.json"

// Open is OpenAt with no boot id.
func Open(dir string) (*Store, error) { return OpenAt(dir, "") }

// OpenAt loads dir/mappings.json (creating dir when needed); bootID is the kernel's boot id,
// written with every write (PriorBoot is the one the file had). A file that cannot be used does not
// stop it: it is renamed to mappings.json.corrupt-<UTC time> and the store starts empty
// (SetAside says so). Nor does a first write that fails (a full disk, a read-only file system):
// the store works in memory and says so in WriteFailure until a write succeeds. Open fails only
// when it cannot make the incarnation's random name.
func OpenAt(dir, bootID string) (*Store, error) {
	s := &Store{path: filepath.Join(dir, FileName), m: map[Key]Mapping{}, pools: map[Pool]bool{}, boot: bootID}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		s.noteWrite(fmt.Errorf("create state directory: %w", err))
	}
	// a write cut short by a crash leaves its temporary file: it never holds the only copy
	if err := os.Remove(s.path + ".tmp"); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.noteWrite(fmt.Errorf("remove %s: %w", s.path+".tmp", err))
	}
	data, err := os.ReadFile(s.path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return s, s.newIncarnation()
	case err != nil:
		// unreadable is as good as corrupt: start from the kernel and the clusters
		s.setAside(err)
		return s, s.newIncarnation()
	}
	var f file
	if err := json.Unmarshal(data, &f); err != nil {
		s.setAside(fmt.Errorf("not valid JSON (%d bytes): %w", len(data), err))
		return s, s.newIncarnation()
	}
	if f.Format != 1 {
		s.setAside(fmt.Errorf("format %d, this agent reads format 1", f.Format))
		return s, s.newIncarnation()
	}
	s.priorBoot = f.BootID
	for _, m := range f.Mappings {
		s.m[m.Key] = m
	}
	for _, p := range f.ClaimPools {
		s.pools[p] = true
	}
	if s.inc = f.Incarnation; s.inc == "" { // a state from before incarnations
		return s, s.newIncarnation()
	}
	return s, nil
}

// setAside keeps an unusable state file as mappings.json.corrupt-<UTC time>.
func (s *Store) setAside(reason error) {
	sa := &SetAside{Path: s.path, Reason: reason}
	kept := s.path + ".corrupt-" + time.Now().UTC().Format("20060102T150405Z")
	if err := os.Rename(s.path, kept); err != nil {
		sa.Reason = fmt.Errorf("%w; it could not be kept aside (%w) and is replaced at the next write", reason, err)
	} else {
		sa.KeptAs = kept
	}
	s.aside = sa
}

// PriorBoot is the kernel's boot id the state file was last written in, as found at Open (""
// when it recorded none: a new or set-aside file, or one from an older agent).
func (s *Store) PriorBoot() string { return s.priorBoot }

// Path is the state file's path.
func (s *Store) Path() string { return s.path }

// SetAside returns the state file this store could not use at Open, or nil.
func (s *Store) SetAside() *SetAside { return s.aside }

// WriteFailure returns the error of the last write and since when writes have failed, when
// the last write failed; nil once one succeeds.
func (s *Store) WriteFailure() (error, time.Time) { //nolint:revive,staticcheck // a fact and its date, not a call that fails
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.werr, s.wsince
}

// FailWrites makes every write call f first and fail with its error (an errno such as
// syscall.ENOSPC), as a full disk or a read-only file system would (tests; nil: writes go to
// disk again).
func (s *Store) FailWrites(f func() error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.fault = f
}

// OnWriteFailure makes f hear of every write that fails (to count and log it).
func (s *Store) OnWriteFailure(f func(error)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onFail = f
}

// noteWrite records a write's result for WriteFailure.
func (s *Store) noteWrite(err error) {
	s.mu.Lock()
	onFail := s.onFail
	s.noteWriteLocked(err)
	s.mu.Unlock()
	if err != nil && onFail != nil {
		onFail(err) // never under the lock: readers (the renewals among them) do not wait for it
	}
}

func (s *Store) noteWriteLocked(err error) {
	switch {
	case err == nil:
		s.werr, s.wsince = nil, time.Time{}
	case s.werr == nil:
		s.werr, s.wsince = err, time.Now()
	default:
		s.werr = err
	}
}

func (s *Store) newIncarnation() error {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return fmt.Errorf("state: incarnation: %w", err)
	}
	inc := hex.EncodeToString(b)
	if err := s.commit(func(n *next) { n.inc = inc }); err != nil {
		// not persisted (WriteFailure says why): kept in memory, written with the next change
		s.mu.Lock()
		s.inc = inc
		s.mu.Unlock()
	}
	return nil
}

// next is the set a write is about to persist.
type next struct {
	m     map[Key]Mapping
	pools map[Pool]bool
	inc   string
}

// commit queues a change and returns once a write holding it is durable (or failed: then
// readers and the file keep the set as it was before that write).
func (s *Store) commit(apply func(*next)) error { return s.commitChange(&change{apply: apply}) }

// commitChange queues c and returns once a write holding it is durable, or failed.
func (s *Store) commitChange(c *change) error {
	c.done = make(chan error, 1)
	s.qmu.Lock()
	s.queue = append(s.queue, c)
	s.qmu.Unlock()
	s.wmu.Lock()
	defer s.wmu.Unlock()
	select {
	case err := <-c.done: // the writer before us wrote it
		return err
	default:
	}
	s.qmu.Lock()
	batch := s.queue
	s.queue = nil
	s.qmu.Unlock()
	s.mu.Lock()
	n := next{m: maps.Clone(s.m), pools: maps.Clone(s.pools), inc: s.inc}
	s.mu.Unlock()
	for _, b := range batch {
		b.apply(&n)
	}
	if s.writing != nil {
		s.writing()
	}
	var err error
	if s.fault != nil {
		if ferr := s.fault(); ferr != nil {
			err = &WriteError{Path: s.path, Err: ferr}
		}
	}
	if err == nil {
		err = save(s.path, s.boot, n)
	}
	s.noteWrite(err)
	s.mu.Lock()
	if err == nil {
		s.m, s.pools, s.inc, s.dirty = n.m, n.pools, n.inc, false
	} else {
		// what is so stands in memory all the same (Observe, Forget): not on disk yet
		k := next{m: s.m, pools: s.pools, inc: s.inc}
		cloned := false
		for _, b := range batch {
			if !b.keep {
				continue
			}
			if !cloned {
				k.m, k.pools, cloned = maps.Clone(s.m), maps.Clone(s.pools), true
			}
			b.apply(&k)
		}
		if cloned {
			s.m, s.pools, s.inc, s.dirty = k.m, k.pools, k.inc, true
		}
	}
	s.mu.Unlock()
	for _, b := range batch {
		b.done <- err
	}
	return <-c.done
}

// Get returns the mapping of k.
func (s *Store) Get(k Key) (Mapping, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.m[k]
	return m, ok
}

// All returns every mapping, sorted by key.
func (s *Store) All() []Mapping {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Mapping, 0, len(s.m))
	for _, m := range s.m {
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key.String() < out[j].Key.String() })
	return out
}

// Put stores m and persists the whole set before returning.
func (s *Store) Put(m Mapping) error {
	m.UpdatedAt = time.Now().UTC()
	return s.commit(func(n *next) {
		n.m[m.Key] = m
		if m.Claimed {
			n.pools[Pool{Cluster: m.Cluster, Pool: m.Pool}] = true
		}
	})
}

// RememberPool adds p to the pools this node sweeps (ClaimPools), persisted: an admin's fence
// or forced release on this node makes it a keeper of that pool's fences, mapping or not.
func (s *Store) RememberPool(p Pool) error {
	s.mu.Lock()
	known := s.pools[p]
	s.mu.Unlock()
	if known {
		return nil
	}
	return s.commit(func(n *next) { n.pools[p] = true })
}

// ClaimPools returns the pools this node holds or has held claims in, sorted.
func (s *Store) ClaimPools() []Pool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Pool, 0, len(s.pools))
	for p := range s.pools {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].Cluster < out[j].Cluster || (out[i].Cluster == out[j].Cluster && out[i].Pool < out[j].Pool)
	})
	return out
}

// Observe stores m, a mapping that exists (a device adopted, its claim this node's), and
// persists the whole set. Unlike Put, m stays in memory even when the write fails (the error
// says so): a mapping that exists must be renewed whatever the disk says. The next write that
// succeeds (Flush) writes it.
func (s *Store) Observe(m Mapping) error {
	m.UpdatedAt = time.Now().UTC()
	return s.commitChange(&change{keep: true, apply: func(n *next) {
		n.m[m.Key] = m
		if m.Claimed {
			n.pools[Pool{Cluster: m.Cluster, Pool: m.Pool}] = true
		}
	}})
}

// Forget drops k, a mapping that is gone (its device and its claim), and persists. Unlike
// Delete, it is dropped from memory even when the write fails.
func (s *Store) Forget(k Key) error {
	return s.commitChange(&change{keep: true, apply: func(n *next) { delete(n.m, k) }})
}

// Flush writes the set when memory is ahead of the disk (an Observe or Forget whose write
// failed); nil when there is nothing to write.
func (s *Store) Flush() error {
	s.mu.Lock()
	dirty := s.dirty
	s.mu.Unlock()
	if !dirty {
		return nil
	}
	return s.commit(func(*next) {})
}

// Delete drops k and persists.
func (s *Store) Delete(k Key) error {
	return s.commit(func(n *next) { delete(n.m, k) })
}

// save writes n (and the boot id) to path durably (temp file, fsync, rename, directory fsync).
func save(path, bootID string, n next) error {
	f := file{Format: 1, Mappings: make([]Mapping, 0, len(n.m)), Incarnation: n.inc, BootID: bootID}
	for _, m := range n.m {
		f.Mappings = append(f.Mappings, m)
	}
	for p := range n.pools {
		f.ClaimPools = append(f.ClaimPools, p)
	}
	sort.Slice(f.ClaimPools, func(i, j int) bool {
		return f.ClaimPools[i].Cluster+"\x00"+f.ClaimPools[i].Pool < f.ClaimPools[j].Cluster+"\x00"+f.ClaimPools[j].Pool
	})
	sort.Slice(f.Mappings, func(i, j int) bool { return f.Mappings[i].Key.String() < f.Mappings[j].Key.String() })
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return &WriteError{Path: path, Err: err}
	}
	if err := replace(path, append(data, '\n')); err != nil {
		return &WriteError{Path: path, Err: err}
	}
	return nil
}

// WriteError is a write of the state file that failed. Its kind, by the errno in its chain, is
// fault.Storage when the node's storage refused it (ENOSPC, EDQUOT, EROFS): the API answers
// state_unwritable, not internal. Any other failure is unclassified (fault.Internal).
type WriteError struct {
	Path string
	Err  error
}

func (e *WriteError) Error() string {
	return "cannot write the state file " + e.Path + ": " + e.Err.Error()
}
func (e *WriteError) Unwrap() error { return e.Err }

// Kind classifies the failure (fault.Kinder).
func (e *WriteError) Kind() fault.Kind {
	if errors.Is(e.Err, syscall.ENOSPC) || errors.Is(e.Err, syscall.EDQUOT) || errors.Is(e.Err, syscall.EROFS) {
		return fault.Storage
	}
	return fault.Internal
}

// replace makes data path's content durably: a temporary file beside it, fsynced, renamed
// over it, and the directory fsynced. A failure leaves path as it was and no temporary file.
// Its errors name the step, not the paths (the caller names the file once).
func replace(path string, data []byte) (err error) {
	tmp := path + ".tmp"
	fh, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", filepath.Base(tmp), bare(err))
	}
	defer func() {
		if err == nil {
			return
		}
		_ = fh.Close() // after a failure, and maybe closed already: err is what went wrong
		if rerr := os.Remove(tmp); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			err = fmt.Errorf("%w (and %s stays: %v)", err, filepath.Base(tmp), bare(rerr))
		}
	}()
	if _, err := fh.Write(data); err != nil {
		return bare(err)
	}
	if err := fh.Sync(); err != nil {
		return fmt.Errorf("fsync: %w", bare(err))
	}
	if err := fh.Close(); err != nil {
		return bare(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename: %w", bare(err))
	}
	// the rename is durable only once the directory is synced
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return fmt.Errorf("open its directory to fsync it: %w", bare(err))
	}
	defer func() { _ = d.Close() }() // read only: its fsync is what counts, checked below
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync its directory: %w", bare(err))
	}
	return nil
}

// bare drops the operation and paths an *os.PathError or *os.LinkError repeats, keeping the errno (errors.Is
// still finds it): "no space left on device", not "write /x.tmp: no space left on device".
func bare(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	var le *os.LinkError
	if errors.As(err, &le) {
		return le.Err
	}
	return err
}
