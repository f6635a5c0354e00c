package hash4

import (
	"iter"
	"math/bits"
	"net/netip"
)

// Len returns the number of entries. Under concurrent writes it is a
// moment's count of each stripe, not a snapshot of the whole table.
func (t *Table[T]) Len() int {
	var n int64
	ss := t.array().b.stripes
	for i := range ss {
		n += int64(ss[i].count.Load())
	}
	return int(n)
}

// All returns an iterator over the entries. Like sync.Map.Range it is
// weakly consistent: an entry present for the whole iteration is yielded
// exactly once, even if Grow runs meanwhile; one inserted or deleted
// meanwhile may or may not be. The loop body may call any method of the
// table.
func (t *Table[T]) All() iter.Seq2[Tuple, *T] {
	return func(yield func(Tuple, *T) bool) {
		var chain []chainEntry[T]
		t.eachBucket(func(a *tableArray[T], _ *stripe, b uint32) {
			chain = t.copyChain(chain[:0], a, b)
		}, func() bool {
			for i := range chain {
				if !yield(chain[i].tuple(), chain[i].v) {
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
// [Table.CompareAndDelete]. It locks each stripe once per bucket, and again
// for each entry it deletes; a Lookup running meanwhile may still return a
// deleted value (see [Table]).
func (t *Table[T]) DeleteFunc(f func(Tuple, *T) bool) int {
	n := 0
	var chain []chainEntry[T]
	t.eachBucket(func(a *tableArray[T], _ *stripe, b uint32) {
		chain = t.copyChain(chain[:0], a, b)
	}, func() bool {
		for i := range chain {
			c := &chain[i]
			if f(c.tuple(), c.v) {
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
// with every other method, locks each stripe once per bucket, and keeps the
// nodes for reuse.
func (t *Table[T]) Clear() {
	t.eachBucket(func(a *tableArray[T], st *stripe, b uint32) {
		// N.B. remove may refill the home slot it frees with the entry
		// at the head of this chain (see free), so each delete starts
		// from the head again.
		for {
			prev := &a.b.heads[b]
			l := prev.load()
			for !l.isNulls() && t.nodes.at(l.index()).reserved() {
				prev = &t.nodes.at(l.index()).next
				l = prev.load()
			}
			if l.isNulls() {
				return
			}
			t.remove(a, st, prev, l)
		}
	}, func() bool { return true })
}

// eachBucket calls locked for each bucket b of the table under its stripe
// st's lock, after the stripe's entries have moved into the table's array
// a if a Grow is moving them (see lockStripe), and then after without the
// lock, until after returns false.
//
// N.B. it visits the buckets in the order of a counter whose bits are
// reversed (as Redis's SCAN): when Grow multiplies the bucket count by
// 2^j, the entries of bucket b go to the buckets that share b's low bits,
// which lie side by side in that order, where b lay. So the buckets of the
// new array left to visit hold exactly the entries of the old buckets left
// to visit, and an entry present throughout is visited exactly once.
func (t *Table[T]) eachBucket(locked func(a *tableArray[T], st *stripe, b uint32), after func() bool) {
	var c uint32 // the counter, bits reversed
	for {
		a, st, _, b := t.lockStripe(c, lockOnly)
		locked(a, st, b)
		st.mu.Unlock()
		if !after() {
			return
		}
		c = bits.Reverse32(bits.Reverse32(c|^a.b.mask) + 1)
		if c == 0 {
			return
		}
	}
}

// chainEntry is an entry copied out of its chain: its key and value.
type chainEntry[T any] struct {
	k key
	v *T
}

// tuple returns the tuple of c's key.
func (c *chainEntry[T]) tuple() Tuple {
	return Tuple{
		Local:  netip.AddrPortFrom(wordsAddr(c.k.local), uint16(c.k.meta>>16)),
		Remote: netip.AddrPortFrom(wordsAddr(c.k.remote), uint16(c.k.meta)),
	}
}

// copyChain appends the entries of bucket b of a to dst, but for
// reservations (see entry); the caller holds the bucket's stripe lock.
func (t *Table[T]) copyChain(dst []chainEntry[T], a *tableArray[T], b uint32) []chainEntry[T] {
	for l := a.b.heads[b].load(); !l.isNulls(); {
		e := t.nodes.at(l.index())
		if !e.reserved() {
			dst = append(dst, chainEntry[T]{k: e.key.load(), v: e.val.Load()})
		}
		l = e.next.load()
	}
	return dst
}

// Stats describes a table's shape.
type Stats struct {
	Buckets     int // bucket count, a power of two
	LockStripes int // writer lock count, a power of two
	Entries     int // entries counted in the chains, with the tuples ConnectFunc holds
	// LongestChain is the length of the longest chain.
	LongestChain int
	// ChainLengths[n] is the number of buckets whose chain holds n entries.
	ChainLengths []int
	// LookupRestarts counts lookups that started a chain walk again: they
	// met an entry deleted, recycled or moved under them, ended on the
	// nulls marker of another chain, or missed while an entry of their
	// stripe moved.
	LookupRestarts uint64
	// HomeEntries counts the entries found in their bucket's home slot,
	// which a lookup reaches without walking the chain.
	HomeEntries int
	// GroupEntries counts the entries found in the home slot of another
	// bucket of their home group, which a lookup also reaches without
	// walking the chain; zero in tables without home groups (home.go).
	GroupEntries int
	// Nodes counts the entry nodes the table holds, live or free: the
	// one reserved per bucket and those allocated beyond, less those
	// given back to the heap, by Grow (the old array's home slots) and
	// by Compact.
	Nodes int
}

// Stats walks every chain, one stripe lock at a time, and returns the
// table's shape. If Grow replaces the bucket array meanwhile, it walks the
// new one from the start.
func (t *Table[T]) Stats() Stats {
	for {
		if s, ok := t.stats(); ok {
			return s
		}
	}
}

// stats is Stats over the current array; false if Grow replaced it.
func (t *Table[T]) stats() (Stats, bool) {
	a := t.array()
	s := Stats{Buckets: len(a.b.heads), LockStripes: len(a.b.stripes)}
	for b := range a.b.heads {
		// N.B. lockStripe moves the stripe's entries into the table's
		// array if a Grow is moving them.
		la, st, _, _ := t.lockStripe(uint32(b), lockOnly)
		if la != a {
			st.mu.Unlock()
			return s, false
		}
		n := 0
		for l := a.b.heads[b].load(); !l.isNulls(); l = t.nodes.at(l.index()).next.load() {
			n++
			if hb, ok := a.home.isHome(l.index()); ok && hb == uint32(b) {
				s.HomeEntries++
			} else if ok && a.home.sameGroup(hb, uint32(b)) {
				s.GroupEntries++
			}
		}
		st.mu.Unlock()
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
