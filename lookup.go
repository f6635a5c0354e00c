package hash4

import "slices"

// Lookup returns the value stored for tup. It takes no lock and does not
// allocate. A tuple that Insert would reject is never found.
func (t *Table[T]) Lookup(tup Tuple) (*T, bool) {
	// No entry has port 0; checking it here also keeps a stray walk (into
	// a TCPTable listener chain, whose nodes leave the remote zero) from
	// ever matching.
	if tup.Remote.Port() == 0 || tup.Local.Port() == 0 {
		return nil, false
	}
	var k key
	t.tupleKey(&k, &tup)
	return t.lookup(&k, false)
}

// AppendLookups appends to dst the value stored for each tuple of tups, in
// order, nil for a tuple that is absent, and returns the extended slice. It
// allocates only if dst has too little room. Each lookup is a Lookup, run
// in order: under concurrent writes the answers are those of as many
// Lookups in a row, not a snapshot. In a table larger than the caches it is
// about twice as fast as a loop of Lookup: it hashes up to 8 tuples and
// asks for the memory of all before reading any, so that their misses
// overlap, as packet processors look up a burst (DPDK's rte_hash_lookup_bulk).
func (t *Table[T]) AppendLookups(dst []*T, tups []Tuple) []*T {
	dst = slices.Grow(dst, len(tups))
	var keys [lookupBatch]key
	var buckets [lookupBatch]uint32
	var valid [lookupBatch]bool
	a := t.array() // for the requests only: each lookup loads its own
	for len(tups) > 0 {
		batch := tups[:min(len(tups), lookupBatch)]
		tups = tups[len(batch):]
		for i := range batch {
			tup := &batch[i]
			// As Lookup: no entry has port 0.
			if valid[i] = tup.Remote.Port() != 0 && tup.Local.Port() != 0; valid[i] {
				t.tupleKey(&keys[i], tup)
				buckets[i] = a.b.bucket(uint32(keys[i].meta >> 32))
			}
		}
		// N.B. the requests for all lines come after all the hashing:
		// loads issued between hashes would wait behind them.
		t.requestLines(a, &buckets, &valid, len(batch))
		for i := range batch {
			var v *T
			if valid[i] {
				v, _ = t.lookup(&keys[i], true)
			}
			dst = append(dst, v)
		}
	}
	return dst
}

// lookupBatch is how many lookups AppendLookups overlaps.
const lookupBatch = 8

// requestLines asks for the lines that lookups in the first n buckets of bs
// (those marked valid) will read: each chain head, home slot and the other
// home slots of its group. With a prefetch instruction (prefetch_amd64.go)
// the requests do not wait; elsewhere they are loads, which overlap too but
// hold up what comes after them while they wait.
func (t *Table[T]) requestLines(a *tableArray[T], bs *[lookupBatch]uint32, valid *[lookupBatch]bool, n int) {
	if !canPrefetch {
		// N.B. atomic loads are not removed for want of a use.
		for i, b := range bs[:n] {
			if !valid[i] {
				continue
			}
			a.b.heads[b].load()
			a.homeAt(b).seq.Load()
			for _, x := range a.home.group[:a.home.groupOthers()] {
				a.homeAt(b ^ x).seq.Load()
			}
		}
		return
	}
	for i, b := range bs[:n] {
		if !valid[i] {
			continue
		}
		var h lineHints
		e := a.homeAt(b)
		addLineHint(&h, &a.b.heads[b])
		addLineHint(&h, &e.seq)
		addLineHint(&h, &e.val) // on the next line when the entry straddles two
		for _, x := range a.home.group[:a.home.groupOthers()] {
			addLineHint(&h, &a.homeAt(b^x).seq)
		}
		h.prefetchRead()
	}
}

// lookup is __inet_lookup_established over one chain, preceded by a look
// at the bucket's home slot, or its group's (home.go): trust a match only
// if the entry stayed live and unchanged across the read (see entry); walk
// the chain without locks, and trust a miss only if the walk ended on this
// chain's own nulls marker, since an entry recycled into another chain
// while we stood on it leads into that chain, if no move in the stripe
// overlapped the walk (see move), if the table's array is still the one
// walked, and if no Grow is moving entries out of the array before it (see
// Grow): then the lookup goes on in lookupGrowing, as it does when it
// finds the array replaced. asked is whether the caller has asked for the
// lines of k's bucket already (AppendLookups, requestLines), so that the
// lookup does not ask again.
func (t *Table[T]) lookup(k *key, asked bool) (*T, bool) {
	h := uint32(k.meta >> 32)
	a := t.arr.Load()
	if a == nil {
		// N.B. array's test, in line, and a panic the compiler sees
		// end the path: no register is saved for it.
		panic(zeroTable)
	}
	b := a.b.bucket(h)
	head := &a.b.heads[b]
	nodes := t.nodes.view()
	// N.B. moves is loaded before the head, for correctness: a move that
	// counts itself after this load is seen by the check at a miss, and
	// one counted before it finished its writes before the walk began
	// (see move). A stripe's moves are the same in every array.
	moves := &t.moves[h&a.b.stripeMask].n
	m := moves.Load()
	var l link
	// A home slot that changed under us leaves the answer to the walk.
	if a.home.grouped() {
		// N.B. the head is loaded only once the group's slots have
		// missed: lookupGroup has asked for its line already.
		if v, ok := t.lookupGroup(a, k, b, asked); ok {
			return v, true
		}
		l = head.load()
	} else {
		// The head is loaded before the home slot is read so that the
		// two loads, which do not depend on each other, overlap their
		// misses.
		l = head.load()
		if v, ok, _ := a.homeAt(b).read(k); ok {
			return v, true
		}
	}
	for {
	walk:
		for !l.isNulls() {
			e := nodes.at(l.index())
			v, ok, changed := e.read(k)
			if ok {
				return v, true
			}
			if changed {
				break walk // restart
			}
			t.hooks.onVisit(l.index())
			l = e.next.load()
		}
		if l.isNulls() && l.nullsValue() == a.b.nullsBase+b {
			t.hooks.onVisit(visitWalkEnd)
			// A miss is trusted only if no move in the stripe
			// overlapped the walk (see move), the array is the
			// table's, and the stripe's entries are all in it.
			// N.B. old is loaded before the count: Grow counts a
			// move in each stripe once all its entries are in the
			// new array, and clears old once every stripe's are. So
			// if old is nil, either the walk began after the
			// stripe's count went up and saw all its entries, or the
			// count loaded now differs from m. (Loaded after the
			// walk, rather than before it, old sends to
			// lookupGrowing only the misses of lookups that overlap
			// a Grow's moves.)
			old := a.old.Load()
			now := moves.Load()
			if now == m && t.arr.Load() == a {
				if old == nil {
					return nil, false
				}
				return t.lookupGrowing(k)
			}
			m = now
		}
		t.restarts.Add(1) // the slow path's only write
		if t.arr.Load() != a {
			return t.lookupGrowing(k)
		}
		l = head.load()
	}
}

// lookupGrowing is lookup in a table whose array Grow replaced since the
// lookup began, or is moving entries into (see Grow): it walks the chain
// of k in the old array, while there is one, then in the new one, and
// restarts both until it can trust a miss. A miss in the old array is
// trusted, and the walk goes on in the new one, if it ended on the old
// chain's own marker: an entry leaves the old array only once it is live in
// the new one, so a walk that no longer meets it in the old array meets it
// in the new. A miss in the new array is trusted as lookup trusts one. It
// reads no home slot: every entry is in its chain.
func (t *Table[T]) lookupGrowing(k *key) (*T, bool) {
	h := uint32(k.meta >> 32)
	nodes := t.nodes.view()
	for {
		a := t.arr.Load()
		t.hooks.onVisit(visitGrowing)
		// N.B. moves is loaded before the walks, as in lookup.
		moves := &t.moves[h&a.b.stripeMask].n
		m := moves.Load()
		ok := true
		if old := a.old.Load(); old != nil {
			var v *T
			var found bool
			if v, found, ok = t.walk(old, &nodes, k, h); found {
				return v, true
			}
		}
		if ok {
			v, found, own := t.walk(a, &nodes, k, h)
			if found {
				return v, true
			}
			// N.B. the array check is needed even when a has no
			// old: a newer Grow may have emptied a's chain after
			// this lookup loaded a, and counted its move before m
			// was loaded, or not yet.
			if own && moves.Load() == m && t.arr.Load() == a {
				return nil, false
			}
		}
		t.restarts.Add(1)
	}
}

// walk walks the chain of hash h in array a for k and returns its value if
// it found k live and unchanged across the read, and whether the walk
// ended on the chain's own marker. N.B. lookup's walk is this one written
// in line, with its restarts in the loop: the fast path keeps its own.
func (t *Table[T]) walk(a *tableArray[T], nodes *slabView[entry[T]], k *key, h uint32) (v *T, found, own bool) {
	b := a.b.bucket(h)
	l := a.b.heads[b].load()
	for !l.isNulls() {
		e := nodes.at(l.index())
		v, ok, changed := e.read(k)
		if ok || changed {
			return v, ok, ok
		}
		t.hooks.onVisit(l.index())
		l = e.next.load()
	}
	return nil, false, l.nullsValue() == a.b.nullsBase+b
}

// lookupGroup looks for k in the home slots of bucket b's group (home.go),
// its own first, as lookup does in its own home slot. N.B. unless asked
// says the caller has, it asks for the lines of the other three slots and
// of b's chain head at once, without waiting for them
// (requestGroupLines), so that their misses overlap with
// each other and with its own slot's; and it loads each slot's seq only
// when it comes to test the slot. A lookup waits for every line it has
// loaded, needed or not, before it is done: with the four seqs loaded up
// front, a key found in its own slot waited for the slowest of five
// misses. The four are written out: as a loop over arrays, the loaded
// seqs went through the stack.
func (t *Table[T]) lookupGroup(a *tableArray[T], k *key, b uint32, asked bool) (*T, bool) {
	g := &a.home.group
	e0, e1, e2, e3 := a.homeAt(b), a.homeAt(b^g[0]), a.homeAt(b^g[1]), a.homeAt(b^g[2])
	if !asked {
		requestGroupLines(&a.b.heads[b], &e1.seq, &e2.seq, &e3.seq)
	}
	if v, ok, _ := e0.read(k); ok {
		return v, true
	}
	if v, ok, _ := e1.read(k); ok {
		return v, true
	}
	if v, ok, _ := e2.read(k); ok {
		return v, true
	}
	if v, ok, _ := e3.read(k); ok {
		return v, true
	}
	return nil, false
}

// present reports whether k is in the table, without a lock: the
// lock-free pre-check of each Connect candidate, whose insert under the
// stripe lock decides every candidate it lets through. N.B. only a true
// answer must be exact, and is: a live entry held k unchanged across the
// read. A false one may be wrong when the walk met an entry recycled or
// moved under it, and the insert's own check corrects that, so present
// neither counts moves nor restarts, and saves lookup's loads for them.
func (t *Table[T]) present(k *key) bool {
	a := t.arr.Load()
	b := a.b.bucket(uint32(k.meta >> 32))
	l := a.b.heads[b].load()
	if _, ok, _ := a.homeAt(b).read(k); ok {
		return true
	}
	return !l.isNulls() && t.presentInChain(k, l)
}

// presentInChain is present past the home slot: a walk of the chain from
// its first link l. N.B. it is a function of its own so that the checks
// where a Connect scan ends most candidates, the home slot and an empty
// chain, have a small frame.
func (t *Table[T]) presentInChain(k *key, l link) bool {
	nodes := t.nodes.view()
	for !l.isNulls() {
		e := nodes.at(l.index())
		if _, ok, _ := e.read(k); ok {
			return true
		}
		t.hooks.onVisit(l.index())
		l = e.next.load()
	}
	return false
}
