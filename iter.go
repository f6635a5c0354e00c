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
//
// N.B. it copies one bucket's chain at a time under the bucket's stripe
// lock (after the stripe's entries have moved into the table's array, if a
// Grow is moving them: see lockStripe), and visits the buckets in the order of a counter whose bits are
// reversed (as Redis's SCAN): when Grow multiplies the bucket count by 2^j,
// the entries of bucket b go to the buckets that share b's low bits, which
// lie side by side in that order, where b lay. So the buckets of the new
// array left to visit hold exactly the entries of the old buckets left to
// visit.
func (t *Table[T]) All() iter.Seq2[Tuple, *T] {
	return func(yield func(Tuple, *T) bool) {
		type pair struct {
			tup Tuple
			v   *T
		}
		var chain []pair
		var c uint32 // the counter, bits reversed
		for {
			// Copy one chain under its lock, then yield outside it, so
			// that the body may write to the table.
			chain = chain[:0]
			a, st, _, b := t.lockStripe(c, lockOnly)
			for l := a.b.heads[b].load(); !l.isNulls(); {
				e := t.nodes.at(l.index())
				k := e.key.load()
				chain = append(chain, pair{
					tup: Tuple{
						Local:  netip.AddrPortFrom(wordsAddr(k.local), uint16(k.meta>>16)),
						Remote: netip.AddrPortFrom(wordsAddr(k.remote), uint16(k.meta)),
					},
					v: e.val.Load(),
				})
				l = e.next.load()
			}
			st.mu.Unlock()
			for _, p := range chain {
				if !yield(p.tup, p.v) {
					return
				}
			}
			c = bits.Reverse32(bits.Reverse32(c|^a.b.mask) + 1)
			if c == 0 {
				return
			}
		}
	}
}

// Stats describes a table's shape.
type Stats struct {
	Buckets     int // bucket count, a power of two
	LockStripes int // writer lock count, a power of two
	Entries     int // entries counted in the chains
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
