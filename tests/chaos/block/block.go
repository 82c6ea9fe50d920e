// Package block is the chaos campaign's on-disk stamp: every 4 KiB block a writer writes says
// who wrote it (node, image, claim epoch, sequence number, block number) and carries a checksum,
// so the checker can read from the image itself which write landed last on each block.
package block

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"strconv"
	"strings"
)

// Size is one block; Count blocks (1 MiB) are written at random in each image.
const (
	Size  = 4096
	Count = 256
)

var magic = []byte("rbd-owner-chaos1")

// Stamp is one write.
type Stamp struct {
	Node  string
	Image string
	Epoch uint64
	Seq   uint64 // per node, strictly increasing over its whole run
	Block uint64
}

// String is the stamp as the writer logs it ("node=… image=… epoch=… seq=… block=…").
func (s Stamp) String() string {
	return fmt.Sprintf("node=%s image=%s epoch=%d seq=%d block=%d", s.Node, s.Image, s.Epoch, s.Seq, s.Block)
}

// Fill writes the stamp into buf (Size bytes): a header, a filler derived from the stamp (so a
// torn or mixed block fails its checksum), and a CRC32 of everything before it.
func (s Stamp) Fill(buf []byte) {
	for i := range buf {
		buf[i] = 0
	}
	h := []byte(s.String() + "\n")
	copy(buf, magic)
	copy(buf[len(magic):], h)
	x := s.Seq*0x9E3779B97F4A7C15 ^ s.Epoch<<32 ^ s.Block
	for i := len(magic) + len(h); i < Size-4; i++ {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		buf[i] = byte(x)
	}
	binary.LittleEndian.PutUint32(buf[Size-4:], crc32.ChecksumIEEE(buf[:Size-4]))
}

// ErrCorrupt says the block holds neither zeros nor a whole stamp (a torn or foreign write).
var ErrCorrupt = errors.New("block is corrupt")

// Read parses one block: (nil, nil) for a block never written (all zeros).
func Read(buf []byte) (*Stamp, error) {
	if len(buf) != Size {
		return nil, fmt.Errorf("%w: %d bytes", ErrCorrupt, len(buf))
	}
	if bytes.Count(buf, []byte{0}) == Size {
		return nil, nil
	}
	if !bytes.HasPrefix(buf, magic) {
		return nil, fmt.Errorf("%w: no stamp", ErrCorrupt)
	}
	if crc32.ChecksumIEEE(buf[:Size-4]) != binary.LittleEndian.Uint32(buf[Size-4:]) {
		return nil, fmt.Errorf("%w: checksum mismatch", ErrCorrupt)
	}
	line, _, _ := bytes.Cut(buf[len(magic):], []byte("\n"))
	s, err := Parse(string(line))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	var again [Size]byte
	s.Fill(again[:])
	if !bytes.Equal(again[:], buf) {
		return nil, fmt.Errorf("%w: content does not match its stamp", ErrCorrupt)
	}
	return &s, nil
}

// Parse reads a stamp from its String form (extra fields are ignored).
func Parse(line string) (Stamp, error) {
	var s Stamp
	seen := 0
	for _, f := range strings.Fields(line) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			continue
		}
		var err error
		switch k {
		case "node":
			s.Node = v
		case "image":
			s.Image = v
		case "epoch":
			s.Epoch, err = strconv.ParseUint(v, 10, 64)
		case "seq":
			s.Seq, err = strconv.ParseUint(v, 10, 64)
		case "block":
			s.Block, err = strconv.ParseUint(v, 10, 64)
		default:
			continue
		}
		if err != nil {
			return Stamp{}, fmt.Errorf("stamp field %s: %w", k, err)
		}
		seen++
	}
	if seen != 5 {
		return Stamp{}, fmt.Errorf("stamp %q: want node, image, epoch, seq and block", line)
	}
	return s, nil
}

// After says whether s was written after o in the only order the protocol allows: a higher
// claim epoch is a later owner; within one epoch one node writes, in sequence order.
func (s Stamp) After(o Stamp) bool {
	if s.Epoch != o.Epoch {
		return s.Epoch > o.Epoch
	}
	return s.Seq > o.Seq
}
