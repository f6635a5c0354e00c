package hash4

import "fmt"

// This file holds the writers' side of a Table: every insert and delete
// locks the bucket of its tuple (bucket.lock), finds the tuple under the
// lock (findLocked), and changes the line or its chain. Lock order: a
// bucket of an old array before one of the new (grow.go); a bucket before
// a shard (percpu.go), the node store's mutex, and what the table's
// watcher takes (tupleWatcher).

// tupleWatcher is told of every tuple a Table's writers add or remove, under
// the tuple's bucket lock, so that what depends on the tuples present (the
// bind table of a PortAllocator, Connect's occupancy indexes, TIME_WAIT
// marks) stays exact without the table knowing of it. Moves of entries
// (promotion, growth, compaction) keep their tuples and are not told.
//
// N.B. keys go by value: a pointer passed to a method the compiler cannot
// see into escapes, and every write would allocate its key.
type tupleWatcher interface {
	// added: k went into the table, live or reserved.
	added(k key)
	// removing: k's entry is about to be removed. hold keeps it as a
	// reservation instead (a ConnectFunc that took the tuple over holds
	// it); the table counts it removed.
	removing(k key) (hold bool)
	// removed: k's entry is out of its chain.
	removed(k key)
}

// watchSlot holds a table's watcher, published once.
type watchSlot struct{ tupleWatcher }

// watcher returns the table's watcher, or nil. N.B. without one, a load
// and a branch per write.
func (t *Table[T]) watcher() tupleWatcher {
	if w := t.watch.Load(); w != nil {
		return w.tupleWatcher
	}
	return nil
}

// lockBucket locks the bucket of hash h in the table's array, after moving
// the entries of h's bucket of the array before, if a growth is moving them
// (see grow), and returns the array and the locked bucket.
//
// N.B. the array is checked again under the lock: a growth published since
// moves the bucket's entries only under its lock, so once the check passes
// the bucket is the table's until it is unlocked.
func (t *Table[T]) lockBucket(h uint32) (*bucketArray[T], *bucket[T]) {
	for {
		a := t.array()
		if o := a.old.Load(); o != nil {
			t.moveBucket(a, o, h)
		}
		b := a.line(h)
		b.lock()
		if t.arr.Load() == a {
			return a, b
		}
		b.unlock()
	}
}

// findLocked returns the entry holding k, or k's reservation (see entry),
// in bucket b, with the field that links it in b's chain and its node
// index (nil and 0 for the line's own entry); nil if k is absent. The
// caller holds b's lock.
func (t *Table[T]) findLocked(b *bucket[T], k *key) (e *entry[T], prev *linkField, i uint32) {
	if !b.live() {
		return nil, nil, 0 // the chain is empty (bucket's rule 1)
	}
	if b.key.matchesHeld(k) {
		return &b.entry, nil, 0
	}
	prev = &b.next
	for l := prev.load(); !l.isNulls(); l = prev.load() {
		e := &t.nodes.at(l.index()).entry
		if e.key.matchesHeld(k) {
			return e, prev, l.index()
		}
		prev = &e.next
	}
	return nil, nil, 0
}

// Insert adds the flow tup with value v. It returns an error matching
// ErrExists if tup is already present, ErrInvalidTuple or ErrNilValue for
// bad input; on error the table is unchanged.
func (t *Table[T]) Insert(tup Tuple, v *T) error {
	var k key
	t.tupleKey(&k, &tup)
	if !k.valid() || v == nil {
		return validateInsert(tup, v)
	}
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
	var k key
	t.tupleKey(&k, &tup)
	if !k.valid() || v == nil {
		return nil, false, validateInsert(tup, v)
	}
	if old, ok := t.lookup(&k); ok {
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

// insert adds k with value v, unless k is present; then it returns the
// value k has (insertExists), or insertReserved.
func (t *Table[T]) insert(k *key, v *T) (*T, insertResult) {
	_, b := t.lockBucket(k.hash())
	if e, _, _ := t.findLocked(b, k); e != nil {
		res := insertExists
		if e.reserved() {
			res = insertReserved
		}
		old := e.val.Load()
		b.unlock()
		return old, res
	}
	res := t.add(b, k, v)
	b.unlock()
	if res == inserted {
		t.counted(1)
	}
	return nil, res
}

// add inserts k, absent, with value v into bucket b, whose lock the caller
// holds, and tells the watcher; a nil v inserts k's reservation (see
// entry). The caller counts a live entry (counted) once it has unlocked b.
func (t *Table[T]) add(b *bucket[T], k *key, v *T) insertResult {
	stored := k
	if v == nil {
		r := *k
		r.meta &^= lportMask
		stored = &r
	}
	if !t.place(b, stored, v) {
		return insertFull
	}
	if w := t.watcher(); w != nil {
		w.added(*k)
	}
	return inserted
}

// place writes k with value v into bucket b, whose lock the caller holds:
// into the line's own entry if it is free, else into a node at the head of
// the chain. It reports false if the node store is out of indexes.
func (t *Table[T]) place(b *bucket[T], k *key, v *T) bool {
	if !b.live() {
		b.fill(k, v, 0, nil)
		return true
	}
	i, n, sh := t.takeNode()
	if n == nil {
		return false
	}
	n.fill(k, v, nodeLink(i), &b.next)
	sh.release()
	return true
}

// takeNode returns a free node and its index, with the caller's shard,
// locked: the caller fills and links the node, then releases the shard
// (percpu.go's rule 2). A nil node means the node store is out of indexes,
// and the shard is released.
func (t *Table[T]) takeNode() (uint32, *node[T], *shard) {
	sh := t.shard()
	i, ok := t.nodes.get(&sh.cache)
	if !ok {
		sh.release()
		return 0, nil, nil
	}
	return i, t.nodes.at(i), sh
}

// freeEntry makes node i's entry e free, unlinks it from prev and returns
// the node for reuse, under one hold of a shard lock (percpu.go's rule 2),
// and returns e's value; the caller holds the bucket lock. N.B. a
// compaction that saw e free between the two would release its chunk, and
// the put would bring a released index back into use.
func (t *Table[T]) freeEntry(e *entry[T], prev *linkField, i uint32) *T {
	sh := t.shard()
	v := e.empty(prev)
	t.nodes.put(&sh.cache, i, shardCacheMax)
	sh.release()
	return v
}

// freeNode returns node i, free and unlinked, for reuse: under growMu
// (growth, compaction), which keeps compaction out.
func (t *Table[T]) freeNode(i uint32) {
	sh := t.shard()
	t.nodes.put(&sh.cache, i, shardCacheMax)
	sh.release()
}

// counted adds n to the entries counted in the caller's shard and, for an
// insert, checks whether the table should grow (grow.go).
func (t *Table[T]) counted(n int64) {
	sh := &t.shards[procID()&uint32(len(t.shards)-1)]
	if c := sh.count.Add(n); n > 0 && c > sh.checkAt.Load() {
		t.overLimit()
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
// reports whether it did, as sync.Map's CompareAndDelete: a flow reaper that
// read old can remove the flow without removing a newer one that took the
// same 4-tuple since. A nil old deletes nothing.
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
// entry stays where it is and only its value changes, so a lookup running
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
	_, b := t.lockBucket(k.hash())
	defer b.unlock()
	e, _, _ := t.findLocked(b, &k)
	if e == nil || e.val.Load() != old {
		return false
	}
	// N.B. seq stays live: a reader that loaded the value before this
	// store returns old, one after it new, and both were the entry's value
	// while it read (entry's rule 4).
	e.val.Store(new)
	return true
}

// delete removes k if its value is old, or whatever its value if old is
// nil, and returns the value removed.
func (t *Table[T]) delete(k *key, old *T) (*T, bool) {
	_, b := t.lockBucket(k.hash())
	e, prev, i := t.findLocked(b, k)
	// N.B. a reservation's value is nil: a compare never matches it.
	if e == nil || e.reserved() || (old != nil && e.val.Load() != old) {
		b.unlock()
		return nil, false
	}
	v := t.remove(b, e, prev, i, k)
	b.unlock()
	t.counted(-1)
	return v, true
}

// remove deletes the entry e of tuple k, found by findLocked with prev and
// i, from bucket b, whose lock the caller holds, tells the watcher and
// returns e's value; the caller counts the removal (counted) once it has
// unlocked b. A watcher that holds the tuple has e turned into a
// reservation in place instead.
func (t *Table[T]) remove(b *bucket[T], e *entry[T], prev *linkField, i uint32, k *key) *T {
	w := t.watcher()
	if w != nil && w.removing(*k) {
		return t.toReservation(e, k)
	}
	v := t.unlinkEntry(b, e, prev, i)
	if w != nil {
		w.removed(*k)
	}
	return v
}

// unlinkEntry takes entry e, found by findLocked with prev and i, out of
// bucket b, whose lock the caller holds, and returns its value. The line's
// own entry is refilled with the chain's first, whose node is freed
// (bucket's rule 1).
func (t *Table[T]) unlinkEntry(b *bucket[T], e *entry[T], prev *linkField, i uint32) *T {
	if prev != nil {
		return t.freeEntry(e, prev, i)
	}
	v := b.empty(nil)
	if l := b.next.load(); !l.isNulls() {
		n := &t.nodes.at(l.index()).entry
		// N.B. the key is in two live entries for a moment, with one
		// value, so that a reader finds it in one or the other; the
		// line's seq changed twice, so a lookup that missed meanwhile
		// walks again (bucket's rule 2).
		k := n.key.load()
		b.fill(&k, n.val.Load(), 0, nil)
		t.freeEntry(n, &b.next, l.index())
	}
	return v
}

// toReservation makes live entry e, of key k, a reservation in place: as a
// recycling (seq free, the reservation's key and no value, then live
// again), in the same chain. It returns e's value.
func (t *Table[T]) toReservation(e *entry[T], k *key) *T {
	e.flip()
	e.key.meta.Store(k.meta &^ lportMask)
	v := e.val.Load()
	e.val.Store(nil)
	e.flip()
	return v
}

// errReserved is the error of a write to a tuple that a ConnectFunc holds.
func errReserved(tup Tuple) error {
	return fmt.Errorf("%w: %v, held by a ConnectFunc in progress", ErrExists, tup)
}
