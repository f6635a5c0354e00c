package hash4

import "unsafe"

// requestEntries asks for the lines of the first n entries of es (bucket
// lines or chain nodes), but the nil ones, for AppendLookups. With a
// prefetch instruction (prefetch_amd64.go) the requests do not wait;
// elsewhere they are loads, which overlap too but hold up what comes after
// them while they wait.
func requestEntries[T any](es *[lookupBatch]*entry[T], n int) {
	if !canPrefetch {
		// N.B. atomic loads are not removed for want of a use.
		for _, e := range es[:n] {
			if e != nil {
				e.seq.Load()
			}
		}
		return
	}
	var addrs [lookupBatch]unsafe.Pointer
	m := 0
	for _, e := range es[:n] {
		if e != nil {
			addrs[m] = unsafe.Pointer(e)
			m++
		}
	}
	prefetch(addrs[:m])
}

// Prefetch asks for the cache line of tup's bucket and returns without
// waiting for it, so that a Lookup, Insert or Delete of tup soon after
// finds it in the cache: for a caller that knows a key it will need while
// it has other work to do first. It changes nothing the program can see.
// Where the package has no prefetch instruction it does nothing. Like
// Lookup, it panics on a nil Table or one not made by New.
func (t *Table[T]) Prefetch(tup Tuple) {
	a := t.array()
	if !canPrefetch {
		return
	}
	var k key
	t.tupleKey(&k, &tup)
	p := [1]unsafe.Pointer{unsafe.Pointer(&a.line(k.hash()).entry)}
	prefetch(p[:])
}
