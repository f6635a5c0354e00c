package hash4

import "fmt"

// findLocked returns the field that links the entry holding k, or k's
// reservation (see entry), in its chain (the head or the predecessor's
// next) and the entry's link, or a nulls link if k is absent. The caller
// holds the chain's stripe lock, so the chain and its entries are stable; a
// is the table's array, loaded under the lock (see lockStripe).
func (t *Table[T]) findLocked(a *tableArray[T], k *key) (*linkField, link) {
	prev := a.b.head(uint32(k.meta >> 32))
	l := prev.load()
	for !l.isNulls() {
		e := t.nodes.at(l.index())
		if e.key.matchesHeld(k) {
			return prev, l
		}
		prev = &e.next
		l = prev.load()
	}
	return prev, l
}

// Insert adds the flow tup with value v. It returns an error matching
// ErrExists if tup is already present, ErrInvalidTuple or ErrNilValue for
// bad input; on error the table is unchanged.
func (t *Table[T]) Insert(tup Tuple, v *T) error {
	if err := validateInsert(tup, v); err != nil {
		return err
	}
	var k key
	t.tupleKey(&k, &tup)
	switch _, res := t.insert(&k, v); res {
	case insertExists:
		return fmt.Errorf("%w: %v", ErrExists, tup)
	case insertReserved:
		return errReserved(tup)
	case insertFull:
		return ErrTableFull
	}
	return nil
}

// LookupOrInsert returns the value stored for tup and found = true if tup
// is present; otherwise it inserts v and returns v and found = false. Like
// sync.Map's LoadOrStore, it is one atomic step: of concurrent calls for an
// absent tuple, one inserts and the others find its value. A tuple that is
// present costs a lookup, without a lock. Bad input returns an error that
// matches ErrInvalidTuple or ErrNilValue, whether or not tup is present,
// and changes nothing; so do ErrTableFull, and ErrExists while a
// [Table.ConnectFunc] holds tup.
func (t *Table[T]) LookupOrInsert(tup Tuple, v *T) (actual *T, found bool, err error) {
	if err := validateInsert(tup, v); err != nil {
		return nil, false, err
	}
	var k key
	t.tupleKey(&k, &tup)
	if old, ok := t.lookup(&k, false); ok {
		return old, true, nil
	}
	switch old, res := t.insert(&k, v); res {
	case insertExists: // inserted since the lookup
		return old, true, nil
	case insertReserved:
		return nil, false, errReserved(tup)
	case insertFull:
		return nil, false, ErrTableFull
	}
	return v, false, nil
}

type insertResult uint8

const (
	inserted insertResult = iota
	insertExists
	insertReserved  // a ConnectFunc holds the tuple (see entry)
	insertFull      // the node store is out of indexes
	insertTakenOver // a Connect took over a flow in TIME_WAIT (timewait.go)
)

// insert adds k with value v under the stripe lock, unless k is present;
// then it returns the value k has (insertExists), or insertReserved. An
// insert that leaves its stripe holding more entries than the array's
// growAt has the table's growth check the table (see grown).
func (t *Table[T]) insert(k *key, v *T) (*T, insertResult) {
	a, st, s, b := t.lockStripe(uint32(k.meta>>32), lockToInsert)
	if _, l := t.findLocked(a, k); !l.isNulls() {
		e := t.nodes.at(l.index())
		res := insertExists
		if e.reserved() {
			res = insertReserved
		}
		old := e.val.Load()
		st.mu.Unlock()
		return old, res
	}
	n, res := t.add(a, st, s, b, k, v)
	st.mu.Unlock()
	t.grown(a, s, n)
	return nil, res
}

// add inserts k, absent, with value v into bucket b of stripe s (st),
// whose lock the caller holds, and returns the stripe's entry count after
// it, to pass to grown once the lock is released.
func (t *Table[T]) add(a *tableArray[T], st *stripe, s, b uint32, k *key, v *T) (uint64, insertResult) {
	i, ok := t.place(a, st, s, b)
	if !ok {
		return 0, insertFull
	}
	t.fill(i, k, v, &a.b.heads[b])
	if t.alloc != nil {
		t.alloc.use(&k.local, uint16(k.meta>>16))
	}
	if t.indexes.Load() != nil { // N.B. without indexes, a load and a branch
		t.noteIndex(k, uint16(k.meta>>16), true)
	}
	n := st.count.Load() + 1
	st.count.Store(n)
	return n, inserted
}

// grown has the table's growth check the table (see overLimit) if an insert
// of hash h left its stripe of a holding n entries, more than a's growAt.
// The caller has released the stripe's lock.
func (t *Table[T]) grown(a *tableArray[T], h uint32, n uint64) {
	if n > a.growAt {
		t.overLimit(a, h&a.b.stripeMask, n) // N.B. after the unlock (see overLimit)
	}
}

// lockIntent says what a writer locking a stripe is about to do, and so
// which lines lockStripe asks for before it takes the lock (Table.touch).
type lockIntent uint8

const (
	lockOnly     lockIntent = iota // no request: CompareAndSwap, iteration, statistics, compaction
	lockToInsert                   // an insert (Table.insert)
	lockToDelete                   // a delete (Table.delete), which may refill a home slot (Table.free)
)

// lockStripe locks the stripe of hash h, after asking for the lines that
// an insert or a delete writes (touch) unless intent is lockOnly, and
// returns the array that holds the stripe's entries, the stripe and its
// index, and h's bucket in the array. If Grow has published a new array
// and the stripe's entries are still in the old one, it moves them first
// (see migrate).
//
// N.B. the array is loaded again under the lock, and the stripe of a hash
// is the same in every array. An array loaded under the lock is the
// table's, or was until a Grow published a newer one since; then the
// stripe's entries stay in it until the lock is released, when the next
// holder (or Grow) moves them.
func (t *Table[T]) lockStripe(h uint32, intent lockIntent) (a *tableArray[T], st *stripe, s, b uint32) {
	a = t.array()
	s = h & a.b.stripeMask
	st = &a.b.stripes[s]
	if intent != lockOnly {
		t.touch(a, a.b.bucket(h), intent)
	}
	st.mu.Lock()
	a = t.arr.Load()
	if st.flipped != a.flipped() {
		t.migrate(a, st, s)
	}
	return a, st, s, a.b.bucket(h)
}

// fill writes key k and value v into free node i and links it at field at
// of k's chain (its head, or a node's next field). The caller holds the
// chain's stripe lock.
func (t *Table[T]) fill(i uint32, k *key, v *T, at *linkField) {
	e := t.nodes.at(i)
	// N.B. the entry is free (seq even): readers that still stand on it
	// ignore its key, so it can be written field by field.
	e.key.store(k)
	e.val.Store(v)
	linkAt(at, nodeLink(i), &e.next)
	e.seq.Store(e.seq.Load() + 1) // live: N.B. after linking (see entry)
}

// touch asks for the lines that insert and delete write under the stripe
// lock of bucket b, before the caller takes the lock: the chain head and
// the home slot; and in tables with home groups, whose lines are beyond the
// caches (home.go), the stripe's word of the home bitmap and its move
// count, and the other home slots of b's group, where the walk under the
// lock finds most of the chain; for a delete, also the chain heads of the
// group's other buckets. N.B. the requests do not wait, so their
// misses overlap with each other and with the lock's, rather than come one
// after the other under it.
//
// With PREFETCHW (prefetch_amd64.go) a line comes in the state a store
// needs: a line another core wrote last comes over once, rather than once
// to read and again to write. With two goroutines on cores that do not
// share a cache, the head and home slot made churn of a 1K table 9.5%
// faster than plain loads (8 interleaved rounds); the bitmap, the move
// count and the group made churn of a 1M table 13% faster (6 rounds),
// and cost a Connect in a 32K-bucket table, whose lines are all cached,
// 4%, hence only with groups. Without PREFETCHW, touch loads the head and
// the home slot's seq only.
//
// A delete of an entry held in the home slot of another bucket of its
// group frees that slot, and free reads that bucket's head to learn
// whether an entry must refill it: a miss under the lock, for 11% of the
// keys churned in the benchmark's 1M table (28.5% of them sit in such a
// slot when it is filled once). Asking for the three heads with the rest
// made churn at 1M 4.7% faster with one goroutine (p = 0.04, 28
// interleaved rounds) and 5.0% with two (p = 0.02, 38). Inserts do not
// ask: the only other head they read is a stealer's, whose bucket is
// known only under the lock.
//
// N.B. the head and home slot go through touchForWrite, three pointers in
// registers, and only the group's lines through a list: with every line in
// one list, building it made churn of a 1K table 2.3% slower, and 5.6% with
// a table per goroutine (6 interleaved rounds).
func (t *Table[T]) touch(a *tableArray[T], b uint32, intent lockIntent) {
	e := a.homeAt(b)
	touchForWrite(&a.b.heads[b], &e.seq, &e.val.v)
	if canPrefetchW && a.home.grouped() {
		var h lineHints
		s := b & a.b.stripeMask
		w, _ := a.home.bit(&a.b.stripes[s], b)
		addLineHint(&h, w)
		addLineHint(&h, &t.moves[s])
		for _, x := range a.home.group {
			// Both halves, as touchForWrite's seq and val.
			g := a.homeAt(b ^ x)
			addLineHint(&h, &g.seq)
			addLineHint(&h, &g.val)
			if intent == lockToDelete {
				addLineHint(&h, &a.b.heads[b^x])
			}
		}
		h.prefetchW()
	}
}

// unlinkLocked deletes the entry of link l, linked by prev, and returns its
// value; the caller frees its node. The caller holds the chain's stripe
// lock.
func (t *Table[T]) unlinkLocked(prev *linkField, l link) *T {
	e := t.nodes.at(l.index())
	e.seq.Store(e.seq.Load() + 1) // free: N.B. before unlinking, and before the value is cleared (see entry)
	unlink(prev, &e.next)
	v := e.val.Load()
	e.val.Store(nil)
	return v
}

// free returns node i, deleted under stripe st, for reuse. The caller holds
// st's lock. A home slot whose bucket still has entries is not freed but
// refilled at once with the entry at the head of that bucket's chain, and
// the node that entry leaves is freed in turn: so a home slot is free only
// while its bucket is empty.
func (t *Table[T]) free(a *tableArray[T], st *stripe, i uint32) {
	for {
		c, ok := a.home.isHome(i)
		if !ok {
			// A stripe that has free home slots takes them before
			// its cached nodes (spareNode): it keeps few, and the
			// depot passes the rest to stripes that need nodes.
			limit := t.nodes.cacheMax()
			if st.homeFree > 0 {
				limit = t.nodes.batchSize()
			}
			t.nodes.put(&st.cache, i, limit)
			return
		}
		head := a.b.heads[c].load()
		if head.isNulls() {
			a.home.release(st, c)
			if a.home.grouped() { // see steal
				st.homeLast = c + 1
			}
			return
		}
		j := head.index()
		t.move(a, &a.b.heads[c], c, j, i)
		i = j
	}
}

// Delete removes tup and returns its value. A Lookup that began before may
// still return that value after Delete returns: a caller that reuses
// values must wait until no such Lookup can hold it (see [Table]).
func (t *Table[T]) Delete(tup Tuple) (*T, bool) {
	var k key
	t.tupleKey(&k, &tup)
	return t.delete(&k, nil)
}

// CompareAndDelete removes tup if its value is old (the same pointer), and
// reports whether it did, as sync.Map's CompareAndDelete: a flow reaper that read old can
// remove the flow without removing a newer one that took the same 4-tuple
// since. A nil old deletes nothing.
func (t *Table[T]) CompareAndDelete(tup Tuple, old *T) (deleted bool) {
	if old == nil {
		return false
	}
	var k key
	t.tupleKey(&k, &tup)
	_, deleted = t.delete(&k, old)
	return deleted
}

// CompareAndSwap sets the value of tup to new if it is old (the same
// pointer), and reports whether it did, as sync.Map's CompareAndSwap. The
// entry stays in its chain and only its value changes, so a lookup running
// meanwhile finds old or new, never neither: a connection can take over the
// 4-tuple of a TIME_WAIT socket with no moment at which its segments find
// no socket, as they would between a Delete and an Insert. (Linux's
// inet_ehash_insert makes this takeover, from the old socket osk to the
// new, under the bucket lock.) A nil old or new swaps nothing.
func (t *Table[T]) CompareAndSwap(tup Tuple, old, new *T) (swapped bool) {
	if old == nil || new == nil {
		return false
	}
	var k key
	t.tupleKey(&k, &tup)
	a, st, _, _ := t.lockStripe(uint32(k.meta>>32), lockOnly)
	defer st.mu.Unlock()
	_, l := t.findLocked(a, &k)
	if l.isNulls() {
		return false
	}
	e := t.nodes.at(l.index())
	if e.val.Load() != old {
		return false
	}
	// N.B. seq stays odd: a reader that loaded the value before this store
	// returns old, one after it new, and both were the entry's value while
	// it read.
	e.val.Store(new)
	return true
}

// delete removes k if its value is old, or whatever its value if old is
// nil, and returns the value removed.
func (t *Table[T]) delete(k *key, old *T) (*T, bool) {
	a, st, _, _ := t.lockStripe(uint32(k.meta>>32), lockToDelete)
	defer st.mu.Unlock()
	prev, l := t.findLocked(a, k)
	if l.isNulls() {
		return nil, false
	}
	// N.B. a reservation's value is nil: a compare never matches it.
	if e := t.nodes.at(l.index()); e.reserved() || (old != nil && e.val.Load() != old) {
		return nil, false
	}
	return t.remove(a, st, prev, l), true
}

// remove deletes the entry of link l, linked by prev, from stripe st,
// whose lock the caller holds, frees its node and returns its value.
func (t *Table[T]) remove(a *tableArray[T], st *stripe, prev *linkField, l link) *T {
	// The stripe of the entry's mark, if it has one, and the entry's key.
	var marked *timeWaitStripe
	var k key
	if tw := t.timeWaits.Load(); tw != nil { // N.B. without marks, a load and a branch
		e := t.nodes.at(l.index())
		ms, v, held := t.forgetTimeWait(tw, st, uint32(e.key.meta.Load()>>32)&a.b.stripeMask, e, &k)
		if held {
			return v
		}
		marked = ms
	}
	if t.alloc != nil {
		t.unuseEntry(t.nodes.at(l.index()))
	}
	if t.indexes.Load() != nil { // N.B. without indexes, a load and a branch
		t.noteEntry(t.nodes.at(l.index()))
	}
	v := t.unlinkLocked(prev, l)
	t.free(a, st, l.index())
	st.count.Store(st.count.Load() - 1)
	if marked != nil {
		t.dropRemoved(marked, &k) // N.B. once unlinked (timewait.go)
	}
	return v
}
