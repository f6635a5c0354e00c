package hash4

import (
	"math/bits"
	"sync"
	"sync/atomic"
)

// This file holds the occupancy indexes of busy destinations: per
// destination (local address, remote address, remote port), a bitmap of
// the local ports its tuples use, which lets Connect find the first free
// candidate of the kernel's scan with word operations instead of one
// lookup per candidate.
//
// Invariants, relied on by connectIndexed:
//
//   - A writer that adds or removes a live tuple, or a reservation
//     (ConnectFunc), does it under the tuple's bucket lock and loads the
//     table's indexes under that same lock (clients.added, removing): so
//     it sees every index published before it took the lock.
//   - buildIndex publishes an index empty, then sets the bit of each port it
//     finds present under that port's bucket lock. A tuple added before the
//     builder's look at its bucket is seen by the builder; one added or
//     removed after it is seen by a writer that sees the index. So once
//     writers quiesce, a bit is set exactly when its tuple is present.
//   - Between, a bit may be clear for a present tuple but is never left set
//     for an absent one: a clear bit costs Connect a failed confirmation,
//     while a set bit is trusted.
//   - Moves of entries (growth, compaction, promotion) keep their tuples
//     and do not touch the indexes.

// indexAfter is the number of candidates a scan tries before Connect builds
// an index for the destination: scans shorter than that cost less than
// keeping the index up to date.
const indexAfter = 64

// maxIndexes bounds the number of destinations with an index, 16 KiB each;
// building one more drops the one with the fewest flows.
const maxIndexes = 64

// destKey names a destination: the words of the key of its tuples but the
// local port, and its hash with local port 0.
type destKey struct {
	local, remote [2]uint64
	rport         uint16
	hash0         uint32
}

// destOf returns the destination of k, a live entry's key or a key set
// with setPort.
func destOf(k *key) destKey {
	lport := uint32(k.meta>>16) & 0xffff
	return destKey{local: k.local, remote: k.remote, rport: uint16(k.meta), hash0: uint32(k.meta>>32) - lport}
}

// portIndex is the occupancy index of one destination: bit p of used is set
// while the tuple with local port p is in the table, live or reserved (see
// the invariants above). Words are shared by tuples of several buckets, so
// they change atomically.
type portIndex struct {
	dest destKey
	used [65536 / 64]atomic.Uint64
	// reuse has bit p set while the tuple of port p is in TIME_WAIT
	// (timewait.go), and not claimed: a Connect with a reuse policy
	// takes it for a candidate.
	reuse [65536 / 64]atomic.Uint64
	n     atomic.Int64 // set bits of used
}

// note sets (on) or clears bit port.
func (p *portIndex) note(port uint16, on bool) {
	w, m := &p.used[port/64], uint64(1)<<(port%64)
	if on {
		if w.Or(m)&m == 0 {
			p.n.Add(1)
		}
	} else if w.And(^m)&m != 0 {
		p.n.Add(-1)
	}
}

// noteReuse sets (on) or clears bit port of reuse.
func (p *portIndex) noteReuse(port uint16, on bool) {
	w, m := &p.reuse[port/64], uint64(1)<<(port%64)
	if on {
		w.Or(m)
	} else {
		w.And(^m)
	}
}

// portIndexes is the set of a table's indexes, by hash with local port 0.
// It is never changed once published: buildIndex and dropIndex publish a
// new one under indexSet.mu.
type portIndexes struct {
	byHash map[uint32][]*portIndex
	n      int
}

// find returns the index of destination d, or nil.
func (x *portIndexes) find(d *destKey) *portIndex {
	for _, p := range x.byHash[d.hash0] {
		if p.dest == *d {
			return p
		}
	}
	return nil
}

// indexSet is a table's indexes: the published set, and the lock that
// serializes its building and dropping.
type indexSet struct {
	set atomic.Pointer[portIndexes]
	mu  sync.Mutex
}

// note records in the index of k's destination, if it has one, that the
// tuple of k, or of k with local port port (a reservation's key), is now
// present (on) or absent. The caller holds k's bucket lock. N.B. without
// indexes it is one load and one branch.
func (s *indexSet) note(k *key, port uint16, on bool) {
	if x := s.set.Load(); x != nil {
		d := destOf(k)
		d.hash0 = k.hash() - uint32(port)
		if p := x.find(&d); p != nil {
			p.note(port, on)
		}
	}
}

// noteReuse is note for the reuse bit of k's port: k's tuple is now in
// TIME_WAIT and unclaimed (on), or not.
func (s *indexSet) noteReuse(k *key, on bool) {
	if x := s.set.Load(); x != nil {
		d := destOf(k)
		if p := x.find(&d); p != nil {
			p.noteReuse(k.port(), on)
		}
	}
}

// publish publishes a copy of old (which may be nil) with add added and
// drop left out. The caller holds s.mu.
func (s *indexSet) publish(old *portIndexes, add, drop *portIndex) {
	x := &portIndexes{byHash: make(map[uint32][]*portIndex)}
	if old != nil {
		for h, ps := range old.byHash {
			for _, p := range ps {
				if p != drop {
					x.byHash[h] = append(x.byHash[h], p)
					x.n++
				}
			}
		}
	}
	if add != nil {
		x.byHash[add.dest.hash0] = append(x.byHash[add.dest.hash0], add)
		x.n++
	}
	if x.n == 0 {
		s.set.Store(nil) // writers are back to one load and a branch
		return
	}
	s.set.Store(x)
}

// buildIndex makes the index of destination d, unless it has one, and
// fills it from the table (see the invariants above). At maxIndexes it
// first drops the index with the fewest flows.
func (t *Table[T]) buildIndex(d destKey) {
	c := t.attach()
	s := &c.indexes
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.set.Load()
	if old != nil && old.find(&d) != nil {
		return
	}
	var drop *portIndex
	if old != nil && old.n >= maxIndexes {
		for _, ps := range old.byHash {
			for _, q := range ps {
				if drop == nil || q.n.Load() < drop.n.Load() {
					drop = q
				}
			}
		}
	}
	p := &portIndex{dest: d}
	s.publish(old, p, drop)
	k := key{local: d.local, remote: d.remote}
	for port := uint32(1); port < 65536; port++ {
		k.setPort(d.hash0, uint16(port), d.rport)
		_, b := t.lockBucket(k.hash())
		if e, _, _ := t.findLocked(b, &k); e != nil {
			// N.B. the reuse bit first: taken loads the reuse bits
			// before the used ones, so a Connect sees a flow in
			// TIME_WAIT as one in use only if both stores fall
			// between its two loads.
			if c.marks.reusable(&k) {
				p.noteReuse(uint16(port), true)
			}
			p.note(uint16(port), true)
		}
		b.unlock()
	}
}

// dropIndex drops index p, if it is still published.
func (t *Table[T]) dropIndex(p *portIndex) {
	s := &t.attach().indexes
	s.mu.Lock()
	defer s.mu.Unlock()
	if old := s.set.Load(); old != nil && old.find(&p.dest) == p {
		s.publish(old, nil, p)
	}
}

// findIndex returns the published index of destination d, or nil.
func (t *Table[T]) findIndex(d *destKey) *portIndex {
	if c := t.clients(); c != nil {
		if x := c.indexes.set.Load(); x != nil {
			return x.find(d)
		}
	}
	return nil
}

// connectIndexed is the scan of connectFlow over the index p of the flow's
// destination: it visits the candidates in the scan's order, as runs of
// ports step apart, takes from the bitmaps the first that is not reserved
// and not in use (or in TIME_WAIT, for a reuse policy), skips it if it is
// held (see PortAllocator.Bind), and tries it under its bucket lock as
// the scan does (tryPort); a lost race moves on to the next. It records
// the port taken with the index in its pass that the scan would have
// reached, so the perturb slot moves as the kernel's. It reports whether c
// is done (see tryPort).
func (t *Table[T]) connectIndexed(p *portIndex, s *portScan, k *key, hash0 uint32, c *connectCall[T]) bool {
	a := s.a
	try := func(port uint16, i uint32) bool {
		if a.mayBeHeld(port) {
			return false
		}
		k.setPort(hash0, port, c.remote.Port())
		c.tried++
		if !t.tryPort(c, k, port) {
			return false
		}
		if c.err == nil {
			s.runAt = i
			s.taken(0)
		}
		return true
	}
	reuse := c.allow != nil
	// The passes: of the scan's offset, then under step 2 of the other
	// parity, then the port the first left out (see portScan).
	passes := 1
	if s.step == 2 && s.remaining > 1 {
		passes = 2
	}
	for pass := 0; pass < passes; pass++ {
		off := s.offset + uint32(pass)
		start := s.low + off
		endA := min(s.remaining, s.high-start)
		if p.search(a, reuse, start, 0, endA, s.step, try) {
			return c.err == nil
		}
		// After the wrap: index i is at port start+i-remaining.
		iB := (endA + s.step - 1) / s.step * s.step
		if iB < s.remaining && p.search(a, reuse, start+iB-s.remaining, iB, s.remaining, s.step, try) {
			return c.err == nil
		}
	}
	if s.step == 2 && s.remaining > 1 && (s.high-s.low)&1 != 0 {
		port := s.low
		if s.offset == 0 {
			port = s.high - 1
		}
		if !a.isReserved(uint16(port)) && p.freeBit(port, reuse) && try(uint16(port), s.remaining-1) {
			return c.err == nil
		}
	}
	return false
}

// freeBit reports whether port is a candidate by p's bitmaps: unused, or
// with reuse in TIME_WAIT.
func (p *portIndex) freeBit(port uint32, reuse bool) bool {
	return p.taken(port/64, reuse)&(1<<(port%64)) == 0
}

// taken returns word w of the ports that are not candidates by p's
// bitmaps: those in use, but with reuse those in TIME_WAIT.
func (p *portIndex) taken(w uint32, reuse bool) uint64 {
	if reuse {
		// N.B. the reuse bits first, as the scan loads the marks' count
		// before the entry (see timewait.go).
		r := p.reuse[w].Load()
		return p.used[w].Load() &^ r
	}
	return p.used[w].Load()
}

// search calls try, in order, for the ports from, from+step, ... of the
// indexes i0, i0+step, ... below iEnd in their pass that are neither
// reserved in a nor taken in p (see taken), until try returns true; it
// reports whether it did.
func (p *portIndex) search(a *PortAllocator, reuse bool, from, i0, iEnd, step uint32, try func(port uint16, i uint32) bool) bool {
	if i0 >= iEnd {
		return false
	}
	last := from + (iEnd-1-i0)/step*step // the last port
	parity := ^uint64(0)
	if step == 2 {
		parity = 0x5555555555555555 << (from & 1)
	}
	port := from
	for port <= last {
		w := port / 64
		m := parity &^ (1<<(port%64) - 1) // from port on
		if last/64 == w {
			m &= ^uint64(0) >> (63 - last%64) // up to last
		}
		free := ^(p.taken(w, reuse) | a.reserved[w]) & m
		for free != 0 {
			q := w*64 + uint32(bits.TrailingZeros64(free))
			free &= free - 1
			if try(uint16(q), i0+(q-from)) {
				return true
			}
		}
		port = (w + 1) * 64
		if step == 2 && port&1 != from&1 {
			port++
		}
	}
	return false
}
