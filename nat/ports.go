package nat

import (
	"sync/atomic"

	"github.com/hash4/hash4"
)

// chunkPorts is how many ports' owners a chunk holds. A chunk is made when
// one of its ports is first taken, so an address whose ports a NAT uses
// few of (a port block, a large pool) costs few chunks.
const (
	chunkBits  = 9
	chunkPorts = 1 << chunkBits
	chunkMask  = chunkPorts - 1
)

// addrPorts holds which mapping owns each port of one external address in
// one protocol: the ports of endpoint-independent and address-dependent
// mappings, each one mapping's alone, as a port bind() holds. A mapping
// takes a port with a CompareAndSwap and an inbound packet finds the
// mapping of its destination in two loads, where a table keyed by external
// endpoint took a Connect and a lookup (docs/performance.md, "Flow
// creation"); VPP's NAT keeps its ports in per-address bitmaps alike. The
// zero value has no port taken; an addrPorts is 1 KiB, and each chunk
// 4 KiB more.
//
// Invariants:
//  1. An owner goes from nil to a mapping only by CompareAndSwap, so one
//     mapping holds a port; back to nil only by that mapping's release.
//  2. A chunk, once stored, stays: readers load it and its owners without
//     a lock.
//  3. taken counts a chunk's owners, updated after each owner's change: a
//     hint, read only to skip a chunk that was full.
type addrPorts struct {
	chunks [65536 / chunkPorts]atomic.Pointer[portChunk]
}

type portChunk struct {
	taken atomic.Int32
	owner [chunkPorts]atomic.Pointer[mapping]
}

// owner returns the mapping that holds port, or nil. The mapping may be
// pending or ending: its caller checks its state.
func (a *addrPorts) owner(port uint16) *mapping {
	c := a.chunks[port>>chunkBits].Load()
	if c == nil {
		return nil
	}
	return c.owner[port&chunkMask].Load()
}

// chunk returns port's chunk, making it if there is none.
func (a *addrPorts) chunk(port uint16) *portChunk {
	p := &a.chunks[port>>chunkBits]
	if c := p.Load(); c != nil {
		return c
	}
	p.CompareAndSwap(nil, new(portChunk)) // a loser's chunk is dropped
	return p.Load()
}

// take gives port to m if it is free, and reports whether it did.
func (a *addrPorts) take(port uint16, m *mapping) bool {
	c := a.chunk(port)
	o := &c.owner[port&chunkMask]
	if o.Load() != nil || !o.CompareAndSwap(nil, m) {
		return false
	}
	c.taken.Add(1)
	return true
}

// release frees port if m holds it.
func (a *addrPorts) release(port uint16, m *mapping) {
	if c := a.chunks[port>>chunkBits].Load(); c != nil && c.owner[port&chunkMask].CompareAndSwap(m, nil) {
		c.taken.Add(-1)
	}
}

// Parities takeAny may be asked for.
const (
	anyParity  = -1
	evenParity = 0
	oddParity  = 1
)

// takeAny gives m a free port of lo-hi, of the given parity unless it is
// anyParity, that alloc does not reserve, and returns it; ok is false if
// none of the first tries ports looked at was. It looks at the ports in
// order from start (a random number, reduced here), as RFC 6056's
// Algorithm 1 does, passing over the chunks that were full.
func (a *addrPorts) takeAny(lo, hi uint16, start uint32, parity int, tries uint32, m *mapping, alloc *hash4.PortAllocator) (port uint16, ok bool) {
	size := uint32(hi-lo) + 1
	start %= size
	for i := uint32(0); i < min(size, tries); {
		p := lo + uint16((start+i)%size)
		c := a.chunk(p)
		if c.taken.Load() == chunkPorts {
			// On to the chunk's end, or hi: the ports up to it come next.
			i += uint32(min(p|chunkMask, hi)-p) + 1
			continue
		}
		i++
		if parity != anyParity && int(p&1) != parity || alloc.Reserved(p) {
			continue
		}
		if o := &c.owner[p&chunkMask]; o.Load() == nil && o.CompareAndSwap(nil, m) {
			c.taken.Add(1)
			return p, true
		}
	}
	return 0, false
}
