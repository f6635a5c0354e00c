package hash4

import (
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
)

// This file holds the other half of the bind table that a PortAllocator
// and the tables made WithPortAllocator share: the local addresses and
// ports of their flows, which Bind and BindEphemeral must not hand out, as
// the kernel's connect() leaves a bind bucket for its port that bind()
// then meets (inet_csk_bind_conflict).
//
// Lock order: a UDPSocket's lock; a TCPTable's or UDPTable's port slot
// lock; a table's bucket (or stripe) lock; the allocator's mu; a portUse
// shard's mu. The table counts a flow (use, unuse) under its bucket lock;
// Bind and BindEphemeral read the counts under mu; Connect checks a hold
// (heldFor, which takes mu) after its bucket lock is released. No code
// takes a lock of the order while it holds a later one.

// portUseShards is the number of locks the counts are spread over, by
// port: tables that connect or delete flows of different ports at once
// rarely meet on one.
const portUseShards = 64

// portUse counts the flows of the tables that share an allocator, by local
// address and port and by family and port.
type portUse struct {
	n      atomic.Int64 // flows counted; 0 lets Bind skip the shards
	shards [portUseShards]portUseShard
}

// portUseShard holds the counts of the ports p with p%portUseShards equal
// to its index.
type portUseShard struct {
	mu       sync.Mutex
	byAddr   map[addrPortWords]int32 // flows per local address and port
	byFamily map[familyPort]int32    // flows per family and port
	_        [cacheLineSize - 24]byte
}

// addrPortWords is a local address, in the words of a key (setWords), and
// port.
type addrPortWords struct {
	addr [2]uint64
	port uint16
}

// use counts a flow from local (words of a key) and port. The caller
// holds the flow's bucket lock.
func (a *PortAllocator) use(local *[2]uint64, port uint16) {
	sh := &a.used.shards[port%portUseShards]
	sh.mu.Lock()
	if sh.byAddr == nil {
		sh.byAddr = make(map[addrPortWords]int32)
		sh.byFamily = make(map[familyPort]int32)
	}
	sh.byAddr[addrPortWords{*local, port}]++
	sh.byFamily[familyPort{!wordsAreIPv4(local), port}]++
	sh.mu.Unlock()
	a.used.n.Add(1)
}

// unuse undoes one use of the same flow.
func (a *PortAllocator) unuse(local *[2]uint64, port uint16) {
	sh := &a.used.shards[port%portUseShards]
	sh.mu.Lock()
	ak := addrPortWords{*local, port}
	if sh.byAddr[ak]--; sh.byAddr[ak] <= 0 {
		delete(sh.byAddr, ak)
	}
	fk := familyPort{!wordsAreIPv4(local), port}
	if sh.byFamily[fk]--; sh.byFamily[fk] <= 0 {
		delete(sh.byFamily, fk)
	}
	sh.mu.Unlock()
	a.used.n.Add(-1)
}

// usedConflicts reports whether a flow of a table sharing a uses port from
// local, or, when local is the wildcard, from any address of its family:
// the flows that keep bind() of local:port from succeeding.
func (a *PortAllocator) usedConflicts(local netip.Addr, port uint16) bool {
	if a.used.n.Load() == 0 {
		return false
	}
	sh := &a.used.shards[port%portUseShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if isWildcard(local) {
		return sh.byFamily[familyPort{!isIPv4(local), port}] > 0
	}
	var w [2]uint64
	setWords(&w, local.WithZone(""))
	return sh.byAddr[addrPortWords{w, port}] > 0
}

// WithPortAllocator makes the table share a's bind table, as a network
// namespace's sockets share the kernel's: the table counts the local
// address and port of every flow it holds, however inserted, so that
// [PortAllocator.Bind] refuses and [PortAllocator.BindEphemeral] skips the
// ports its flows use, and [Table.Connect] given a nil allocator uses a.
// Each insert and delete then also updates a's count under a lock of a's
// own. Given to [NewTCPTable], it also makes
// the listeners hold their ports in a ([TCPTable.Listen]); given to
// [NewUDPTable], the sockets ([UDPTable.Bind]). An allocator is one
// protocol's ports, as Linux keeps TCP's and UDP's apart: NewTCPTable and
// NewUDPTable panic for an allocator that serves the other protocol's
// table, and the plain tables sharing it should hold flows of that
// protocol only. New panics for a nil a or one that NewPortAllocator did
// not make.
func WithPortAllocator(a *PortAllocator) Option {
	return func(c *tableConfig) {
		if why := a.unusable(); why != "" {
			panic("hash4: WithPortAllocator: " + why)
		}
		c.alloc = a
	}
}

// connectAllocator returns the allocator a Connect given a uses: a table
// made WithPortAllocator takes its own for a nil a and refuses another, so
// that the ports it counts are those its allocator scans.
func (t *Table[T]) connectAllocator(a *PortAllocator) (*PortAllocator, error) {
	switch own := t.PortAllocator(); {
	case own == nil || a == own:
		return a, a.check()
	case a == nil:
		return own, nil
	}
	return nil, fmt.Errorf("%w: not the one the table was made with (WithPortAllocator)", ErrNilAllocator)
}

// boundMeanwhile is called by a Connect of a table with an allocator, a,
// that has just inserted k (with value v, or reserved it for a nil v) for
// the flow from local:port: if a Bind of that port for local ran meanwhile
// and kept it, it takes the entry out again and returns true, and the
// Connect goes on to the next port.
//
// N.B. this is what makes the two exclusive. The insert counted the flow
// (use) under a shard lock before this reads the held bit; Bind sets the
// bit before it reads the count under the same lock (see Bind). So either
// Bind sees the flow and refuses, or this sees the bit and waits on mu
// for Bind's outcome. An entry inserted with its value is seen by lookups
// in between: only when a Bind of its very port races with the Connect.
func (t *Table[T]) boundMeanwhile(a *PortAllocator, k *key, v *T, local netip.Addr, port uint16) bool {
	if t.PortAllocator() == nil || !a.mayBeHeld(port) || !a.heldFor(local, port) {
		return false
	}
	if v == nil {
		t.unreserve(k)
	} else {
		t.delete(k, v)
	}
	return true
}
