package hash4

import (
	"iter"
	"math/bits"
	"unsafe"
)

// Len returns the number of entries. Under concurrent writes it is a
// moment's count of each processor's shard, not a snapshot of the table.
func (t *Table[T]) Len() int {
	t.array() // a nil or zero Table panics here, named
	return int(t.count())
}

// All returns an iterator over the entries. Like sync.Map.Range it is
// weakly consistent: an entry present for the whole iteration is yielded
// exactly once, even if the table grows meanwhile; one inserted or deleted
// meanwhile may or may not be. The loop body may call any method of the
// table.
func (t *Table[T]) All() iter.Seq2[Tuple, *T] {
	t.array()
	return func(yield func(Tuple, *T) bool) {
		var chain []chainEntry[T]
		t.eachBucket(func(b *bucket[T]) {
			chain = t.copyChain(chain[:0], b)
		}, func() bool {
			for i := range chain {
				if !yield(chain[i].k.tuple(), chain[i].v) {
					return false
				}
			}
			return true
		})
	}
}

// DeleteFunc deletes every entry for which f returns true and returns how
// many it deleted: the sweep of a flow reaper. It visits the entries as
// [Table.All] does, weakly consistent, and f may call any method of the
// table. An entry whose value changed after f saw it stays, as with
// [Table.CompareAndDelete]. It locks each bucket once, and again for each
// entry it deletes; a Lookup running meanwhile may still return a deleted
// value (see [Table]). It panics for a nil f, naming it.
func (t *Table[T]) DeleteFunc(f func(Tuple, *T) bool) int {
	t.array()
	if f == nil {
		panic("hash4: DeleteFunc(nil): nil function")
	}
	n := 0
	var chain []chainEntry[T]
	t.eachBucket(func(b *bucket[T]) {
		chain = t.copyChain(chain[:0], b)
	}, func() bool {
		for i := range chain {
			c := &chain[i]
			if f(c.k.tuple(), c.v) {
				if _, ok := t.delete(&c.k, c.v); ok {
					n++
				}
			}
		}
		return true
	})
	return n
}

// Clear deletes every entry. Like [Table.All] it is weakly consistent: an
// entry present for the whole call is deleted, one inserted meanwhile may
// stay, and the flow of a [Table.ConnectFunc] in progress stays. It is safe
// with every other method, locks each bucket once, and keeps the nodes for
// reuse.
func (t *Table[T]) Clear() {
	t.array()
	removed := 0
	t.eachBucket(func(b *bucket[T]) {
		// N.B. a delete of the line's own entry refills it from the
		// chain (unlinkEntry), so each delete starts from the line again.
		for {
			e, prev, i := &b.entry, (*linkField)(nil), uint32(0)
			if !e.live() {
				return
			}
			for e.reserved() {
				l := e.next.load()
				if l.isNulls() {
					return
				}
				prev, i = &e.next, l.index()
				e = &t.nodes.at(i).entry
			}
			k := e.key.load()
			t.remove(b, e, prev, i, &k)
			removed++
		}
	}, func() bool { return true })
	t.counted(-int64(removed))
}

// eachBucket calls locked for each bucket, under its lock and moved into
// the current array (lockBucket), then after without it, until after returns
// false. N.B. it visits buckets in bit-reversed counter order (as Redis's
// SCAN): growth sends bucket b's entries to the buckets sharing b's low
// bits, adjacent in that order where b lay, so an entry present throughout
// is visited exactly once.
//
// The order scatters consecutive visits over the array, so each would wait
// for its line: the line sweepAhead visits ahead is asked for first, and
// their misses overlap.
func (t *Table[T]) eachBucket(locked func(b *bucket[T]), after func() bool) {
	var c uint32 // the counter, bits reversed
	var p uint32 // the counter of the last line asked for; 0 past the end
	for i := 0; canPrefetch && i < sweepAhead; i++ {
		if p = t.askAhead(p); p == 0 {
			break
		}
	}
	for {
		a, b := t.lockBucket(c)
		locked(b)
		b.unlock()
		if !after() {
			return
		}
		if c = nextReversed(c, a.mask); c == 0 {
			return
		}
		if canPrefetch && p != 0 {
			p = t.askAhead(p)
		}
	}
}

// askAhead asks for the line of the bucket after counter p (nextReversed)
// and returns its counter, or 0 past the end. A hint only: growth may
// change the array meanwhile.
func (t *Table[T]) askAhead(p uint32) uint32 {
	a := t.arr.Load()
	if p = nextReversed(p, a.mask); p != 0 {
		line := [1]unsafe.Pointer{unsafe.Pointer(&a.lines[p&a.mask])}
		prefetch(line[:])
	}
	return p
}

// sweepAhead is how many buckets ahead eachBucket asks for lines: enough
// misses in flight to cover a visit's work, few enough to stay in cache.
const sweepAhead = 16

// nextReversed returns the bucket counter after c, bits reversed, in an
// array of mask+1 buckets; 0 once every bucket was visited.
func nextReversed(c, mask uint32) uint32 {
	return bits.Reverse32(bits.Reverse32(c|^mask) + 1)
}

// chainEntry is an entry copied out of its bucket: its key and value.
type chainEntry[T any] struct {
	k key
	v *T
}

// copyChain appends the entries of bucket b to dst, but for reservations
// (see entry); the caller holds b's lock.
func (t *Table[T]) copyChain(dst []chainEntry[T], b *bucket[T]) []chainEntry[T] {
	if !b.live() {
		return dst
	}
	for e := &b.entry; ; {
		if !e.reserved() {
			dst = append(dst, chainEntry[T]{k: e.key.load(), v: e.val.Load()})
		}
		l := e.next.load()
		if l.isNulls() {
			return dst
		}
		e = &t.nodes.at(l.index()).entry
	}
}

// Stats describes a table's shape.
type Stats struct {
	Buckets int // bucket count, a power of two
	Entries int // entries counted in the buckets, with the tuples ConnectFunc holds
	// InLine counts the entries held in their bucket's own line, which a
	// lookup reads without walking a chain: every non-empty bucket holds
	// one.
	InLine int
	// LongestChain is the most entries a bucket holds, its own and its
	// chain's.
	LongestChain int
	// ChainLengths[n] is the number of buckets that hold n entries.
	ChainLengths []int
	// LookupRestarts counts lookups that walked a bucket again: they met
	// an entry deleted, recycled or moved under them, ended on the nulls
	// marker of another chain, or missed while their bucket's line changed.
	LookupRestarts uint64
	// Nodes counts the chain nodes the table holds, live or free, less
	// those given back to the heap by Compact.
	Nodes int
}

// Stats walks every bucket, one lock at a time, and returns the table's
// shape. If the table grows meanwhile, it walks the new array from the
// start.
func (t *Table[T]) Stats() Stats {
	for {
		if s, ok := t.stats(); ok {
			return s
		}
	}
}

// stats is Stats over the current array; false if growth replaced it.
func (t *Table[T]) stats() (Stats, bool) {
	a := t.array()
	s := Stats{Buckets: len(a.lines)}
	for i := range a.lines {
		// N.B. lockBucket moves the bucket's entries into the table's
		// array if a growth is moving them.
		la, b := t.lockBucket(uint32(i))
		if la != a {
			b.unlock()
			return s, false
		}
		n := 0
		if b.live() {
			s.InLine++
			n = 1
			for l := b.next.load(); !l.isNulls(); l = t.nodes.at(l.index()).next.load() {
				n++
			}
		}
		b.unlock()
		for len(s.ChainLengths) <= n {
			s.ChainLengths = append(s.ChainLengths, 0)
		}
		s.ChainLengths[n]++
		s.Entries += n
		s.LongestChain = max(s.LongestChain, n)
	}
	s.LookupRestarts = t.restarts.Load()
	s.Nodes, _ = t.nodes.stats()
	return s, true
}
