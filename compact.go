package hash4

// This file holds Compact, the compaction of a table's node store, as the
// kernel's memory compaction moves pages out of a block to free it whole:
// entries move out of chunks of nodes that are mostly free, and the emptied
// chunks go back to the heap.
//
// Why: a table keeps the nodes of deleted entries for reuse, and after a
// growth the nodes that held entries beyond the old home slots, most of
// which the new array holds in its own: about a third of the entries' worth
// when the table grew at two entries per bucket.
// Those nodes lie in chunks among nodes still in use, so the store cannot
// give them back as they are.

// Compact gives back to the heap the free nodes the table keeps beyond
// what its entries are likely to need soon: call it after the flows have
// peaked and many have gone, or after a growth the table will not fill. It
// moves entries out of chunks of nodes at least half free and releases
// them, keeping free nodes for an eighth of the entries beyond one per
// bucket. Every method may run meanwhile; writers wait only for two brief
// passes over the stripe locks and for the move of one entry. The table
// never compacts by itself, as a filling table would allocate again.
func (t *Table[T]) Compact() { t.compact() }

// compact is Compact; it returns the entries it moved and the chunks it
// released.
func (t *Table[T]) compact() (moved, released int) {
	t.growMu.Lock()
	defer t.growMu.Unlock()
	return t.compactNodes(t.array())
}

// compactNodes is compact on a, the table's array, with growMu held, so no
// growth runs and no entry is in an older array: it marks the chunks to
// empty (slab.beginCompaction), moves each entry still in them to another
// node under its stripe's lock, as an eviction from a home slot does
// (Table.move), and releases them (slab.endCompaction).
//
// N.B. writers go on meanwhile, stalled only while every stripe is locked
// at the start and at the end: no node moves between caches and the depot
// then, so the nodes of the victims leave them all at once, and an entry
// that stayed in a victim (a listener of a TCPTable, whose nodes are in
// this store, or one that found no node to move to) cannot be freed while
// endCompaction gives its chunk's free nodes back. Between the two, no
// writer can take a victim's node (none is in a cache or the depot, and
// put drops any that is freed), so a node seen free stays free, and a move
// that finds a victim's entry under the lock finds it where it was. Lookups
// that stood on a moved entry are covered by the move count (see move), and
// those that read a released chunk end on releasedNullsValue and restart.
func (t *Table[T]) compactNodes(a *tableArray[T]) (moved, released int) {
	ss := a.b.stripes
	var all []*stripe // every stripe whose cache holds nodes of the store
	for _, group := range [][]stripe{ss, t.listenerStripes} {
		for s := range group {
			all = append(all, &group[s])
		}
	}
	caches := make([]*slabCache, len(all))
	for i, st := range all {
		caches[i] = &st.cache
	}
	lockAll := func() {
		for _, st := range all {
			st.mu.Lock()
		}
	}
	unlockAll := func() {
		for _, st := range all {
			st.mu.Unlock()
		}
	}
	lockAll()
	beyond := -len(a.homes) // the entries beyond the home slots
	for s := range ss {
		beyond += int(ss[s].count.Load()) + int(ss[s].homeFree)
	}
	v := t.nodes.beginCompaction(caches, max(beyond/8, 2<<t.nodes.shift()))
	unlockAll()
	if v == nil {
		return 0, 0
	}
	for _, c := range v.chunks {
		first, end := v.nodes(c)
		for i := first; i < end; i++ {
			if t.nodes.at(i).seq.Load()&1 == 0 {
				continue
			}
			if ok, did := t.moveOut(i); !ok {
				v.stuck[c] = true
			} else if did {
				moved++
			}
		}
		if !v.stuck[c] {
			released++
		}
	}
	lockAll()
	t.nodes.endCompaction(v,
		func(e *entry[T]) bool { return e.seq.Load()&1 == 0 },
		markReleased[T])
	unlockAll()
	return moved, released
}

// moveOut moves the entry in node i, found live, to another node under its
// stripe's lock. It reports whether node i is free now, and whether it
// moved the entry (else the entry was deleted meanwhile, and put dropped
// its node); i stays live for a node that is no entry of the table's
// chains (a TCP listener), or when no node was left to move to.
func (t *Table[T]) moveOut(i uint32) (free, moved bool) {
	e := t.nodes.at(i)
	k := e.key.load()
	a, st, s, b := t.lockStripe(uint32(k.meta>>32), lockOnly)
	defer st.mu.Unlock()
	if e.seq.Load()&1 == 0 {
		return true, false
	}
	prev, l := t.findLocked(a, &k)
	if l.isNulls() || l.index() != i {
		return false, false
	}
	to, ok := t.spare(a, st, s, b)
	if !ok {
		return false, false
	}
	t.move(a, prev, b, i, to)
	t.free(a, st, i)
	return true, true
}
