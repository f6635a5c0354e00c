package hash4

import "unsafe"

// requestLines asks for the lines of the first n buckets of lines, but the
// nil ones, for AppendLookups. With a prefetch instruction
// (prefetch_amd64.go) the requests do not wait; elsewhere they are loads,
// which overlap too but hold up what comes after them while they wait.
func requestLines[T any](lines *[lookupBatch]*bucket[T], n int) {
	if !canPrefetch {
		// N.B. atomic loads are not removed for want of a use.
		for _, b := range lines[:n] {
			if b != nil {
				b.seq.Load()
			}
		}
		return
	}
	var addrs [lookupBatch]unsafe.Pointer
	m := 0
	for _, b := range lines[:n] {
		if b != nil {
			addrs[m] = unsafe.Pointer(b)
			m++
		}
	}
	prefetch(addrs[:m])
}
