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
	return t.lookup(&k)
}

// AppendLookups appends to dst the value stored for each tuple of tups, in
// order, nil for a tuple that is absent, and returns the extended slice. It
// allocates only if dst has too little room. Each answer is a Lookup's,
// made during the call: under concurrent writes they are not a snapshot,
// and a batch's lookups may answer in any order. In a table larger than the
// caches it is about twice as fast as a loop of Lookup: it hashes up to 8
// tuples, asks for their buckets' lines before reading any, and then for
// the first nodes of the chains whose lines do not hold their keys, so
// that the misses of a batch overlap, as packet processors look up a burst
// (DPDK's rte_hash_lookup_bulk).
func (t *Table[T]) AppendLookups(dst []*T, tups []Tuple) []*T {
	dst = slices.Grow(dst, len(tups))
	var keys [lookupBatch]key
	var lines, heads [lookupBatch]*entry[T]
	var found [lookupBatch]*T
	a := t.array() // for the requests only: each lookup loads its own
	for len(tups) > 0 {
		batch := tups[:min(len(tups), lookupBatch)]
		tups = tups[len(batch):]
		for i := range batch {
			tup := &batch[i]
			lines[i] = nil
			// As Lookup: no entry has port 0.
			if tup.Remote.Port() != 0 && tup.Local.Port() != 0 {
				t.tupleKey(&keys[i], tup)
				lines[i] = &a.line(keys[i].hash()).entry
			}
		}
		// N.B. the requests come after all the hashing: loads issued
		// between hashes would wait behind them.
		requestEntries(&lines, len(batch))
		// The keys held in their lines are answered; for the others, the
		// first nodes of their chains are asked for.
		for i := range batch {
			found[i], heads[i] = nil, nil
			if e := lines[i]; e != nil {
				if v, ok, _ := e.read(&keys[i]); ok {
					found[i], lines[i] = v, nil
				} else if l := e.next.load(); !l.isNulls() {
					heads[i] = &t.nodes.at(l.index()).entry
				}
			}
		}
		requestEntries(&heads, len(batch))
		for i := range batch {
			v := found[i]
			if lines[i] != nil {
				v, _ = t.lookup(&keys[i])
			}
			dst = append(dst, v)
		}
	}
	return dst
}

// lookupBatch is how many lookups AppendLookups overlaps.
const lookupBatch = 8

// lookup is __inet_lookup_established over k's bucket: the line's own entry,
// then its chain, walked without locks. It trusts a match only if the entry
// stayed live and unchanged across the read (see entry), and a miss only if
// the walk ended on this chain's own nulls marker (an entry recycled into
// another chain while we stood on it leads into that chain), if the line's
// seq did not change meanwhile (see bucket), and if no growth moves entries
// into the array or replaced it: then lookupGrowing walks the arrays.
func (t *Table[T]) lookup(k *key) (*T, bool) {
	h := k.hash()
	a := t.arr.Load()
	if a == nil {
		// N.B. array's test, in line, and a panic the compiler sees end
		// the path: no register is saved for it.
		panic(zeroTable)
	}
	b := a.line(h)
	for {
		seq := b.seq.Load() &^ seqLock
		if seq&seqLive != 0 && b.key.matches(k) {
			t.hooks.onVisit(visitLineHit)
			v := b.val.Load()
			if b.seq.Load()&^seqLock == seq {
				return v, true
			}
			t.restarts.Add(1)
			continue
		}
		t.hooks.onVisit(visitLine)
		l := b.next.load()
		if !l.isNulls() {
			v, ok, done := t.walk(k, l, a, h, seq)
			if done {
				return v, ok
			}
			t.restarts.Add(1)
			continue
		}
		// An empty chain: the common miss, checked in line. N.B. old and
		// the table's array are loaded before seq is checked again: a
		// growth clears old only once every bucket moved, and a bucket's
		// move changes its new line's seq, so if old was nil either the
		// walk came after the move or seq changed.
		if l == nullsLink(a.nullsBase+h&a.mask) {
			settled := a.old.Load() == nil && t.arr.Load() == a
			if b.seq.Load()&^seqLock == seq {
				if settled {
					return nil, false
				}
				return t.lookupGrowing(k)
			}
		}
		t.restarts.Add(1)
	}
}

// walk is lookup's walk of the chain of hash h in array a from its first
// node l, the line's seq having been seq before: it returns the value of k
// and ok if it found k, and done = false if the walk must restart (see
// lookup).
func (t *Table[T]) walk(k *key, l link, a *bucketArray[T], h, seq uint32) (v *T, ok, done bool) {
	nodes := t.nodes.view()
	for !l.isNulls() {
		e := &nodes.at(l.index()).entry
		v, ok, changed := e.read(k)
		if ok {
			return v, true, true
		}
		if changed {
			return nil, false, false
		}
		t.hooks.onVisit(l.index())
		l = e.next.load()
	}
	if !a.ends(l, h) {
		return nil, false, false
	}
	t.hooks.onVisit(visitWalkEnd)
	settled := a.old.Load() == nil && t.arr.Load() == a // N.B. before seq (see lookup)
	if a.line(h).seq.Load()&^seqLock != seq {
		return nil, false, false
	}
	if settled {
		return nil, false, true
	}
	v, ok = t.lookupGrowing(k)
	return v, ok, true
}

// find looks k up in array a alone, restarting until it can trust its
// answer for a (see lookup).
func (t *Table[T]) find(a *bucketArray[T], k *key) (*T, bool) {
	h := k.hash()
	b := a.line(h)
	nodes := t.nodes.view()
	for ; ; t.restarts.Add(1) {
		seq := b.seq.Load() &^ seqLock
		if seq&seqLive != 0 && b.key.matches(k) {
			t.hooks.onVisit(visitLineHit)
			v := b.val.Load()
			if b.seq.Load()&^seqLock == seq {
				return v, true
			}
			continue
		}
		t.hooks.onVisit(visitLine)
		l := b.next.load()
		for !l.isNulls() {
			e := &nodes.at(l.index()).entry
			v, ok, changed := e.read(k)
			if ok {
				return v, true
			}
			if changed {
				break
			}
			t.hooks.onVisit(l.index())
			l = e.next.load()
		}
		if a.ends(l, h) && b.seq.Load()&^seqLock == seq {
			return nil, false
		}
	}
}

// lookupGrowing is lookup in a table whose array growth replaced since the
// lookup began, or is moving entries into (see grow): it looks in the old
// array, while there is one, then in the new, and again until the table's
// array stayed the same. An entry leaves the old array only once it is
// live in the new one, so a key missed in the old array by a look that
// came after it left is found by the look in the new one that follows.
func (t *Table[T]) lookupGrowing(k *key) (*T, bool) {
	for {
		a := t.arr.Load()
		t.hooks.onVisit(visitGrowing)
		if o := a.old.Load(); o != nil {
			if v, ok := t.find(o, k); ok {
				return v, true
			}
		}
		if v, ok := t.find(a, k); ok {
			return v, true
		}
		if t.arr.Load() == a {
			return nil, false
		}
		t.restarts.Add(1)
	}
}

// present reports whether k is in the table, without a lock: the lock-free
// pre-check of each Connect candidate, whose insert under the bucket lock
// decides every candidate it lets through. N.B. only a true answer must be
// exact, and is: a live entry held k unchanged across the read. A false one
// may be wrong when the walk met an entry recycled or moved under it, and
// the insert's own check corrects that, so present neither restarts nor
// checks the marker.
func (t *Table[T]) present(k *key) bool {
	b := t.arr.Load().line(k.hash())
	if _, ok, _ := b.read(k); ok {
		return true
	}
	l := b.next.load()
	return !l.isNulls() && t.presentInChain(k, l)
}

// presentInChain is present past the line: a walk of the chain from its
// first link l. N.B. a function of its own, so that present, where a
// Connect scan ends most candidates, has a small frame.
func (t *Table[T]) presentInChain(k *key, l link) bool {
	nodes := t.nodes.view()
	for !l.isNulls() {
		e := &nodes.at(l.index()).entry
		if _, ok, _ := e.read(k); ok {
			return true
		}
		t.hooks.onVisit(l.index())
		l = e.next.load()
	}
	return false
}
