package hash4

import "fmt"

// This file holds the read-modify-write operations that sync.Map and xsync
// users expect: Store, Swap, Compute and LookupOrCompute. Each takes the
// bucket lock of its tuple once, as Insert does.

// Store sets the value of tup to v, inserting tup if it is absent. A
// present entry keeps its place and only its value changes, as in
// [Table.CompareAndSwap]: a concurrent Lookup finds the old value or v,
// never neither, and one that began before may still return the old value
// after Store returns (see [Table]). It returns an error matching
// ErrInvalidTuple or ErrNilValue for bad input, ErrExists while a
// [Table.ConnectFunc] holds tup, and ErrTableFull; then nothing changes.
func (t *Table[T]) Store(tup Tuple, v *T) error {
	_, _, err := t.Swap(tup, v)
	return err
}

// Swap is [Table.Store] that also returns the value tup had, and
// loaded = true if it had one, as sync.Map's Swap. It costs what Store
// does: one lock of tup's bucket.
func (t *Table[T]) Swap(tup Tuple, v *T) (old *T, loaded bool, err error) {
	var k key
	t.tupleKey(&k, &tup)
	if !k.valid() || v == nil {
		return nil, false, validateInsert(tup, v)
	}
	_, b := t.lockBucket(k.hash())
	if e, _, _ := t.findLocked(b, &k); e != nil {
		if e.reserved() {
			b.unlock()
			return nil, false, errReserved(tup)
		}
		old = e.val.Load()
		e.val.Store(v) // N.B. seq stays live, as in CompareAndSwap
		b.unlock()
		return old, true, nil
	}
	res := t.add(b, &k, v)
	b.unlock()
	if res == insertFull {
		return nil, false, ErrTableFull
	}
	t.counted(1)
	return nil, false, nil
}

// ComputeOp tells [Table.Compute] what to do with the value its function
// returns.
type ComputeOp uint8

const (
	// CancelOp, the zero ComputeOp, leaves the table as it was.
	CancelOp ComputeOp = iota
	// UpdateOp stores the value returned, inserting the tuple if absent.
	UpdateOp
	// DeleteOp deletes the tuple if present.
	DeleteOp
)

// Compute calls f once with the value of tup (nil and loaded = false if
// absent) and stores, deletes or keeps it as f's op says, as xsync's
// Compute; it returns the value tup has afterwards and whether it has one.
// f runs under the lock of tup's bucket, atomically with every other write
// of tup: it must be short and must not call the table. Bad input, nil
// with UpdateOp, an unknown op, a tuple a [Table.ConnectFunc] holds or a
// full table give an error (as [Table.Store]) and change nothing. A nil f
// panics, named.
func (t *Table[T]) Compute(tup Tuple, f func(old *T, loaded bool) (v *T, op ComputeOp)) (actual *T, ok bool, err error) {
	if t == nil {
		panic(nilTable)
	}
	if f == nil {
		panic(fmt.Sprintf("hash4: Compute(%v, nil): nil function", tup))
	}
	var k key
	t.tupleKey(&k, &tup)
	if !k.valid() {
		return nil, false, validate(tup)
	}
	actual, ok, n, err := t.compute(&k, tup, f)
	if n != 0 {
		t.counted(n)
	}
	return actual, ok, err
}

// compute is Compute under the bucket lock; n is the change in the table's
// entries, for counted.
func (t *Table[T]) compute(k *key, tup Tuple, f func(*T, bool) (*T, ComputeOp)) (actual *T, ok bool, n int64, err error) {
	_, b := t.lockBucket(k.hash())
	// N.B. deferred, so that a panic in f leaves the bucket unlocked.
	defer b.unlock()
	e, prev, i := t.findLocked(b, k)
	var old *T
	if e != nil {
		if e.reserved() {
			return nil, false, 0, errReserved(tup)
		}
		old = e.val.Load()
	}
	v, op := f(old, e != nil)
	switch {
	case op == CancelOp:
		return old, e != nil, 0, nil
	case op == DeleteOp:
		if e != nil {
			t.remove(b, e, prev, i, k)
			return nil, false, -1, nil
		}
		return nil, false, 0, nil
	case op != UpdateOp:
		return old, e != nil, 0, fmt.Errorf("hash4: Compute of %v: unknown ComputeOp %d", tup, op)
	case v == nil:
		return old, e != nil, 0, fmt.Errorf("%w from Compute of %v", ErrNilValue, tup)
	case e != nil:
		e.val.Store(v) // N.B. seq stays live, as in CompareAndSwap
		return v, true, 0, nil
	}
	if t.add(b, k, v) == insertFull {
		return nil, false, 0, ErrTableFull
	}
	return v, true, 1, nil
}

// LookupOrCompute returns the value of tup and loaded = true if tup is
// present, at the cost of a Lookup; otherwise it calls f once and inserts
// the value f returns, as xsync's LoadOrCompute. Of concurrent calls for an
// absent tuple, one calls f and inserts, the others return its value. f
// runs under the lock of tup's bucket: it must be short and must not call
// the table (build a slow value, such as one that needs a socket, in
// [Table.ConnectFunc]). f's error, or a nil value, inserts nothing and is
// returned; other errors are those of [Table.Store]. It panics for a nil
// f, naming it.
func (t *Table[T]) LookupOrCompute(tup Tuple, f func() (*T, error)) (actual *T, loaded bool, err error) {
	if t == nil {
		panic(nilTable)
	}
	if f == nil {
		panic(fmt.Sprintf("hash4: LookupOrCompute(%v, nil): nil function", tup))
	}
	var k key
	t.tupleKey(&k, &tup)
	if !k.valid() {
		return nil, false, validate(tup)
	}
	if v, ok := t.lookup(&k); ok {
		return v, true, nil
	}
	called := false
	actual, _, n, cerr := t.compute(&k, tup, func(old *T, ok bool) (*T, ComputeOp) {
		if ok { // inserted since the lookup
			return old, CancelOp
		}
		called = true
		v, ferr := f()
		switch {
		case ferr != nil:
			err = ferr
		case v == nil:
			err = fmt.Errorf("%w from LookupOrCompute of %v", ErrNilValue, tup)
		default:
			return v, UpdateOp
		}
		return nil, CancelOp
	})
	if n != 0 {
		t.counted(n)
	}
	if err == nil {
		err = cerr
	}
	if err != nil {
		return nil, false, err
	}
	return actual, !called, nil
}
