package hash4

import "math/bits"

// This file holds home slots, the one place where Table departs from the
// kernel's inet_ehash layout (docs/design.md, "Home slots" and "Home
// groups", says why and what it gains), and the placement of entries.
//
// Every bucket b owns one entry slot of the node store, its home slot,
// reserved with the bucket array. An entry goes to its bucket's home slot
// when that is free, so a lookup fetches the home slot with the chain head,
// from the hash alone. The chains are unchanged: an entry in a home slot is
// linked in its bucket's chain like any other.
//
// Rules, all applied under the one stripe lock:
//
//  1. A home slot whose bucket is empty may be taken (stolen) by an entry of
//     another bucket of the same stripe; an entry that no slot of its own
//     or of its group can hold takes a free home slot of its stripe before
//     a free node (Table.spareNode), so that the nodes a table holds stay
//     steady under churn.
//  2. An insert into the owner's bucket takes the slot back, moving the
//     stealer to a spare node (Table.evict, Table.move), unless the stealer
//     is of the owner's home group.
//  3. When a home slot is freed while its bucket has entries, the head of
//     that bucket's chain moves into it (Table.free). So a home slot is
//     free only while its bucket is empty.
//
// Home groups. In tables of homeGroupMinBuckets buckets or more, the four
// buckets whose indexes differ in the top two bits only form a group under
// one stripe. A lookup reads the group's four home slots, and an entry that
// cannot have its own home slot takes a free one of its group before any
// other node. Where every slot of the group is taken, an insert evicts a
// stealer from outside the group, from its own slot first (Table.place).
//
// N.B. the direct read relies on the order in which writers change an
// entry's seq (see entry): an entry turns live only once it is linked and
// turns free before it is unlinked, so an entry that is live while a reader
// reads it is in its chain, and a key any home slot shows is present.

// slot returns the index of bucket b's home slot.
func (h *homeSlots) slot(b uint32) uint32 { return h.base + b }

// homeAt returns bucket b's home slot, t.nodes.at(a.home.slot(b)), with
// no test of the index: home slots are reserved nodes (see slab.reserve).
func (a *tableArray[T]) homeAt(b uint32) *entry[T] {
	return &a.homes[b]
}

// homeSlots records which home slots are free: one bit per bucket, set
// while its home slot holds no entry. The bits of one stripe's buckets are
// a run of words of their own, whole cache lines so that writers under
// different stripes do not share lines (the bitmap's size is a power of two
// times 64 bytes, which Go's allocator places on a 64-byte boundary); bucket
// b is bit b>>stripeShift of the run of stripe b&stripeMask. The run of a
// stripe is accessed only under that stripe's lock.
//
// Where a stripe covers 64 buckets or fewer, its run is one word, the
// stripe's own homeBits, in the line its lock is in: insert and delete take
// and free home slots under the lock anyway, so the bits cost them no line
// of their own.
type homeSlots struct {
	free        []uint64 // the runs, or nil where they are stripes' homeBits
	words       uint32   // words per stripe run
	stripeShift uint8
	stripeMask  uint32
	buckets     uint32
	base        uint32 // node index of bucket 0's home slot
	// group holds the XOR distances from a bucket to the other buckets of
	// its home group, or zeros in a table without groups.
	group [homeGroupSize - 1]uint32
}

// homeGroupSize is the number of buckets in a home group.
const homeGroupSize = 4

// homeGroupMinBuckets is the smallest bucket count whose tables have home
// groups: beyond it a table's home slots (56 bytes per bucket, 3.5 MB here)
// outgrow a core's L2 cache, and a chain walk costs misses that reading the
// group saves.
const homeGroupMinBuckets = 1 << 16

// init lays out the home slots of a table with the given (power-of-two)
// bucket and stripe counts, the first being node base, with home groups if
// grouped is set and a group's buckets can share a stripe; then the slots
// of each stripe are free once initStripe has run for it. N.B. init writes
// no stripe: Table.Grow lays out a new array while writers still use the
// stripes' home fields for the old one, until each stripe moves.
func (h *homeSlots) init(buckets, stripes int, base uint32, grouped bool) {
	h.base = base
	if grouped && stripes <= buckets/homeGroupSize {
		h.group = [...]uint32{uint32(buckets / 2), uint32(buckets / 4), uint32(buckets/2 + buckets/4)}
	}
	h.stripeShift = uint8(bits.TrailingZeros(uint(stripes)))
	h.stripeMask = uint32(stripes - 1)
	h.buckets = uint32(buckets)
	h.words = uint32(len(stripe{}.homeBits))
	if perStripe := buckets / stripes; perStripe > 64*len(stripe{}.homeBits) {
		h.words = uint32((perStripe+511)/512) * 8 // whole cache lines
		h.free = make([]uint64, int(h.words)*stripes)
	}
}

// initStripe marks every home slot of stripe s (st) free and resets st's
// home fields for this array. The caller holds st's lock if the table is
// shared.
func (h *homeSlots) initStripe(st *stripe, s uint32) {
	perStripe := h.buckets >> h.stripeShift
	st.homeBits = [len(stripe{}.homeBits)]uint64{}
	run := h.run(st, s)
	clear(run)
	for j := range perStripe / 64 {
		run[j] = ^uint64(0)
	}
	if r := perStripe % 64; r != 0 {
		run[perStripe/64] = 1<<r - 1
	}
	st.homeFree = perStripe
	st.homeCursor, st.homeLast = 0, 0
}

// groupOthers returns the number of other buckets in a bucket's home group:
// homeGroupSize-1, or 0 in a table without groups.
func (h *homeSlots) groupOthers() int {
	if h.grouped() {
		return homeGroupSize - 1
	}
	return 0
}

// grouped reports whether the table has home groups.
func (h *homeSlots) grouped() bool { return h.group[0] != 0 }

// sameGroup reports whether buckets b and c are in one home group.
func (h *homeSlots) sameGroup(b, c uint32) bool { return (b^c)&^h.group[2] == 0 }

// isHome reports whether node i is a home slot, and of which bucket.
func (h *homeSlots) isHome(i uint32) (bucket uint32, ok bool) {
	return i - h.base, i-h.base < h.buckets
}

// run returns the bitmap run of stripe s (st).
func (h *homeSlots) run(st *stripe, s uint32) []uint64 {
	if h.free == nil {
		return st.homeBits[:]
	}
	return h.free[s*h.words : (s+1)*h.words]
}

// bit returns the word and mask of bucket b's bit; st is b's stripe.
func (h *homeSlots) bit(st *stripe, b uint32) (*uint64, uint64) {
	j := b >> h.stripeShift
	return &h.run(st, b&h.stripeMask)[j/64], 1 << (j % 64)
}

// take marks bucket b's home slot used and reports whether it was free.
// The caller holds the lock of b's stripe st.
func (h *homeSlots) take(st *stripe, b uint32) bool {
	w, m := h.bit(st, b)
	if *w&m == 0 {
		return false
	}
	*w &^= m
	st.homeFree--
	return true
}

// release marks bucket b's home slot free. The caller holds the lock of b's
// stripe st. (In a table with home groups, Table.free records b for
// steal.)
func (h *homeSlots) release(st *stripe, b uint32) {
	w, m := h.bit(st, b)
	*w |= m
	st.homeFree++
}

// steal takes a free home slot of a bucket of stripe s (st) and returns that
// bucket. The caller holds st's lock. It takes the slot that Table.free
// released last, if that is still free: in a table with home groups, whose
// slots are beyond the caches, the delete that freed it wrote its lines,
// which may still be cached, while any other free slot is most likely a
// miss under the lock. Otherwise the search resumes where the last one
// ended, so it costs a few words on average. Tables without groups do not
// record the slot: there a stripe covers few buckets, and the search finds
// the same slots (docs/performance.md has both measurements).
func (h *homeSlots) steal(st *stripe, s uint32) (uint32, bool) {
	if st.homeFree == 0 {
		return 0, false
	}
	if st.homeLast != 0 {
		b := st.homeLast - 1
		st.homeLast = 0
		if w, m := h.bit(st, b); *w&m != 0 {
			*w &^= m
			st.homeFree--
			return b, true
		}
	}
	run := h.run(st, s)
	for n := range h.words {
		wi := (st.homeCursor + n) % h.words
		if w := run[wi]; w != 0 {
			j := wi*64 + uint32(bits.TrailingZeros64(w))
			run[wi] = w &^ (1 << (j % 64))
			st.homeFree--
			st.homeCursor = wi
			return j<<h.stripeShift | s, true
		}
	}
	panic("hash4: home slot count out of step with its bitmap")
}

// place returns a free node for a new entry of bucket b, of stripe s (st),
// whose lock the caller holds: b's home slot if it is free; else a free home
// slot of another bucket of b's home group; else one of those slots, b's
// own first, that holds an entry of a bucket outside the group (a
// stealer), which moves to a spare node (it is evicted); else a spare node.
//
// N.B. a stealer from b's own group stays: it is in a slot that lookups of
// its key read. A free slot of the group is taken before any stealer is
// evicted: lookups read it as they read b's own, and taking it costs no
// move.
func (t *Table[T]) place(a *tableArray[T], st *stripe, s, b uint32) (uint32, bool) {
	if a.home.take(st, b) {
		return a.home.slot(b), true
	}
	if i, ok := t.groupSlot(a, st, b); ok {
		return i, true
	}
	if i, ok, done := t.evict(a, st, s, b, b); done {
		return i, ok
	}
	for _, x := range a.home.group[:a.home.groupOthers()] {
		if i, ok, done := t.evict(a, st, s, b, b^x); done {
			return i, ok
		}
	}
	return t.spareNode(a, st, s)
}

// evict takes the home slot of bucket c, which holds a live entry, for a new
// entry of bucket b of c's home group, if the entry is of a bucket outside
// the group: it moves to a spare node. It reports whether it took the slot,
// and done if place should stop there: the slot is taken, or no spare node
// is left for the evicted entry.
//
// Any stealer moves, wherever it is in its chain: lookups that a move
// misleads restart on the move count (see move). Evicting only a stealer
// at the head of its chain, whose move could mislead no reader past other
// keys, left 4 points more of the entries of a churned table out of the
// home slots they could have (of their group, or without groups their
// own): a new entry of the stealer's bucket goes in front of it. The walk
// to the stealer is short: at one entry per bucket a chain holds one or
// two entries.
func (t *Table[T]) evict(a *tableArray[T], st *stripe, s, b, c uint32) (i uint32, ok, done bool) {
	home := a.home.slot(c)
	d := a.b.bucket(uint32(t.nodes.at(home).key.meta.Load() >> 32))
	if a.home.sameGroup(b, d) {
		return 0, false, false
	}
	prev := &a.b.heads[d]
	for prev.load() != nodeLink(home) {
		prev = &t.nodes.at(prev.load().index()).next
	}
	to, ok := t.spare(a, st, s, d)
	if !ok {
		return 0, false, true
	}
	t.move(a, prev, d, home, to)
	return home, true, true
}

// move moves the entry in node from, linked in bucket d's chain at field
// prev (the head or its predecessor's next), to free node to, and leaves
// from free and unlinked. The caller holds the chain's stripe lock.
//
// N.B. a move can hide keys from a walk that overlaps it: node to may be
// recycled from the chain a reader walks, and a reader standing on it has
// read its old key and goes on from the copy's place, right behind the
// original: past the moved key, and past any keys between node to's old
// place in the chain and the original's. So move first counts itself in
// the stripe's moves, and a lookup that ends in a miss restarts if the
// count changed since it began. The count goes up before any write of the
// move, and lookups load it before the head: incremented at the end, or
// loaded after the head, it would miss a move that recycles a node under a
// reader. A hit is never wrong (a reader trusts a match only across an
// unchanged seq), and a reader that comes to node to from another chain
// ends on d's marker and restarts. Lookups that skip the count (present)
// trust only their hits.
func (t *Table[T]) move(a *tableArray[T], prev *linkField, d, from, to uint32) {
	mc := &t.moves[d&a.b.stripeMask].n
	mc.Store(mc.Load() + 1)
	e := t.nodes.at(from)
	k := e.key.load()
	// N.B. the key is in two live entries for a moment, with one value:
	// a lookup may find either. The copy is linked right behind the
	// original and made live before the original is freed and unlinked,
	// so that a reader that would have reached the original reaches one
	// of them.
	t.fill(to, &k, e.val.Load(), &e.next)
	t.unlinkLocked(prev, nodeLink(from))
}

// spare returns a free node for an entry of bucket b that cannot have its
// home slot: the free home slot of another bucket of b's home group, else a
// spare node. The caller holds the lock of stripe s (st).
func (t *Table[T]) spare(a *tableArray[T], st *stripe, s, b uint32) (uint32, bool) {
	if i, ok := t.groupSlot(a, st, b); ok {
		return i, true
	}
	return t.spareNode(a, st, s)
}

// groupSlot takes a free home slot of another bucket of b's home group, if
// there is one; the caller holds the lock of b's stripe st.
func (t *Table[T]) groupSlot(a *tableArray[T], st *stripe, b uint32) (uint32, bool) {
	for _, x := range a.home.group[:a.home.groupOthers()] {
		if a.home.take(st, b^x) {
			return a.home.slot(b ^ x), true
		}
	}
	return 0, false
}

// spareNode returns a node for an entry that no home slot of its group can
// hold: the free home slot of a bucket of stripe s (st), stolen (see
// home.go); else a node freed under the stripe before; else a node from the
// store. The caller holds st's lock.
//
// N.B. free home slots come first so that the nodes a table holds beyond
// them do not grow under churn. Taken after the stripe's cached nodes, the
// slots stayed free wherever entries in nodes of their own were deleted and
// their nodes taken again, while stripes whose entries outnumber their
// buckets took more nodes from the store, round after round of churn.
func (t *Table[T]) spareNode(a *tableArray[T], st *stripe, s uint32) (uint32, bool) {
	if b, ok := a.home.steal(st, s); ok {
		return a.home.slot(b), true
	}
	if i, ok := st.cache.cached(); ok {
		return i, true
	}
	return t.nodes.get(&st.cache)
}
