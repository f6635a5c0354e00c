package nat

import (
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/hash4/hash4"
)

// host is an inside address's share of the NAT: its count of flows (for
// MaxFlowsPerHost) and its port block. A host exists while it has flows.
// n counts them: it goes up from above 0 without a lock (tryAdd), and down
// without one; from 0 it goes up, and the host is deleted at 0, only under
// the host's bucket lock in hosts.t (Compute), so a host that tryAdd
// counts a flow on is in the table. block, addr, lo and hi are set before
// it is inserted.
type host struct {
	inside netip.Addr
	n      atomic.Int32
	block  int        // -1: none
	addr   netip.Addr // the block's external address
	lo     uint16     // the block's ports
	hi     uint16
}

// hosts holds the inside hosts and hands out port blocks.
type hosts struct {
	cfg *Config
	t   *hash4.Table[host]
	// The blocks of each family: pool[f] holds the addresses, perAddr the
	// blocks per address, first and end the blocks this NAT uses.
	pool          *[2][]netip.Addr
	perAddr       int
	first, end    [2]int
	deterministic [2]netip.Prefix
	mu            sync.Mutex
	used          [2][]uint64 // dynamic blocks in use, bit b-first
}

func (hs *hosts) init(c *Config, pool *[2][]netip.Addr) error {
	hs.cfg, hs.pool = c, pool
	hs.t = hash4.New[host](hash4.WithCapacity(1024))
	b := c.Blocks
	if b.Size == 0 {
		return nil
	}
	hs.perAddr = c.Ports.Size() / b.Size
	for f := range 2 {
		total := len(pool[f]) * hs.perAddr
		hs.first[f] = b.First
		hs.end[f] = total
		if b.Count > 0 && b.Count < total-b.First {
			hs.end[f] = b.First + b.Count
		}
		if hs.end[f] < hs.first[f] {
			hs.end[f] = hs.first[f]
		}
		hs.used[f] = make([]uint64, (hs.end[f]-hs.first[f]+63)/64)
	}
	for _, p := range b.Deterministic {
		hs.deterministic[family(p.Addr())] = p.Masked()
	}
	if len(pool[0]) > 0 && hs.end[0] == hs.first[0] || len(pool[1]) > 0 && hs.end[1] == hs.first[1] {
		return cfgErr("blocks %d+%d: none of the %d blocks per address of the pool", b.First, b.Count, hs.perAddr)
	}
	return nil
}

// hostKey is the key of inside address a in the hosts table.
func hostKey(a netip.Addr) hash4.Tuple {
	return hash4.Tuple{Local: netip.AddrPortFrom(a, 1), Remote: sentinel(a)}
}

// acquire counts a new flow of inside address a, making its host (and
// giving it a block) if it has none, and returns it; or the reason it may
// not have another flow.
func (hs *hosts) acquire(a netip.Addr) (*host, Drop) {
	max := int32(hs.cfg.MaxFlowsPerHost)
	// Most new flows are of a host that has others: a lookup and an
	// increment, no lock.
	if h, ok := hs.t.Lookup(hostKey(a)); ok {
		if why, ok := h.tryAdd(max, 1); ok {
			if why != DropNone {
				return nil, why
			}
			return h, DropNone
		}
	}
	why := DropNone
	h, _, err := hs.t.Compute(hostKey(a), func(old *host, loaded bool) (*host, hash4.ComputeOp) {
		if loaded {
			// From 0 too: a host whose last flow is ending stays. The
			// table keeps old either way.
			why, _ = old.tryAdd(max, 0)
			return old, hash4.CancelOp
		}
		h := &host{inside: a, block: -1}
		h.n.Store(1)
		if hs.cfg.Blocks.Size > 0 {
			if why = hs.takeBlock(a, h); why != DropNone {
				return nil, hash4.CancelOp
			}
		}
		return h, hash4.UpdateOp
	})
	if why == DropNone && err != nil {
		why = DropBusy
	}
	if why != DropNone {
		return nil, why
	}
	return h, DropNone
}

// tryAdd counts a flow on h if it has at least min flows, and fewer than
// max if max > 0; ok is false if it has fewer than min, why says if it
// has max.
func (h *host) tryAdd(max, min int32) (why Drop, ok bool) {
	for {
		r := h.n.Load()
		switch {
		case r < min:
			return DropNone, false
		case max > 0 && r >= max:
			return DropHostLimit, true
		case h.n.CompareAndSwap(r, r+1):
			return DropNone, true
		}
	}
}

// release uncounts a flow of h; the last one ends the host and frees its
// block.
func (hs *hosts) release(h *host) {
	if h.n.Add(-1) > 0 {
		return
	}
	a := h.inside
	hs.t.Compute(hostKey(a), func(old *host, loaded bool) (*host, hash4.ComputeOp) {
		if !loaded || old != h || old.n.Load() > 0 {
			return old, hash4.CancelOp // gone, or it has a flow again
		}
		if old.block >= 0 && !hs.deterministic[family(a)].IsValid() {
			hs.freeBlock(family(a), old.block)
		}
		return nil, hash4.DeleteOp
	})
}

// takeBlock gives h, the new host of inside address a, its block: the one
// its address computes (deterministic), or the lowest free one.
func (hs *hosts) takeBlock(a netip.Addr, h *host) Drop {
	f := family(a)
	if p := hs.deterministic[f]; p.IsValid() {
		off, ok := offsetIn(p, a)
		if !ok || off >= uint64(hs.end[f]-hs.first[f]) {
			return DropNoBlock
		}
		hs.setBlock(f, h, hs.first[f]+int(off))
		return DropNone
	}
	hs.mu.Lock()
	defer hs.mu.Unlock()
	for i, w := range hs.used[f] {
		if w == ^uint64(0) {
			continue
		}
		b := i*64 + bits.TrailingZeros64(^w)
		if hs.first[f]+b >= hs.end[f] {
			break
		}
		hs.used[f][i] |= 1 << (b % 64)
		hs.setBlock(f, h, hs.first[f]+b)
		return DropNone
	}
	return DropNoBlock
}

// setBlock gives h block b of family f.
func (hs *hosts) setBlock(f int, h *host, b int) {
	size := hs.cfg.Blocks.Size
	h.block = b
	h.addr = hs.pool[f][b/hs.perAddr]
	h.lo = hs.cfg.Ports.Low + uint16((b%hs.perAddr)*size)
	h.hi = h.lo + uint16(size-1)
}

// freeBlock returns dynamic block b of family f.
func (hs *hosts) freeBlock(f, b int) {
	hs.mu.Lock()
	i := b - hs.first[f]
	hs.used[f][i/64] &^= 1 << (i % 64)
	hs.mu.Unlock()
}

// offsetIn returns the offset of a in prefix p.
func offsetIn(p netip.Prefix, a netip.Addr) (uint64, bool) {
	if !p.Contains(a) {
		return 0, false
	}
	// The offset is the address's bits past the prefix. Of a prefix of
	// more than 2^64 addresses, an address whose offset needs more than
	// 64 bits has none: past every block, as no NAT has 2^64 of them.
	x := a.As16()
	off := binary.BigEndian.Uint64(x[8:])
	hostBits := 128 - p.Bits()
	if a.Is4() {
		hostBits = 32 - p.Bits()
	}
	if hostBits < 64 {
		off &= 1<<hostBits - 1
	} else if hi := binary.BigEndian.Uint64(x[:8]); hostBits < 128 && hi&(1<<(hostBits-64)-1) != 0 || hostBits == 128 && hi != 0 {
		return 0, false
	}
	return off, true
}

// randUint32 returns a random number for the start of a port scan.
func randUint32() uint32 { return rand.Uint32() }
