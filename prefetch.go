package hash4

import "unsafe"

// lineHints is a list of cache lines about to be read or written, for a
// prefetch: those a writer writes under a stripe lock, before it takes the
// lock (Table.touch), or those lookups read, of a batch
// (Table.AppendLookups) or of one key's home group (requestGroupLines). It
// holds addresses as unsafe.Pointers so that the fields named may be of
// any type; nothing dereferences them, only the prefetch instructions take
// them (prefetch_amd64.s).
//
// N.B. the room is an array in the list, so that a list on the stack stays
// there: a slice of an array the caller declares made the array escape to
// the heap.
type lineHints struct {
	n    int
	addr [maxLineHints]unsafe.Pointer
}

// maxLineHints is the most lines a list names: for Table.touch, a home
// bitmap word, a move count and, for each of the other three buckets of a
// group, two lines of its home slot and, for a delete, its chain head; for
// a lookup, fewer (Table.requestLines, requestGroupLines).
const maxLineHints = 2 + 3*(homeGroupSize-1)

// addLineHint adds the line of *p to h.
func addLineHint[P any](h *lineHints, p *P) {
	h.addr[h.n] = unsafe.Pointer(p)
	h.n++
}

// requestGroupLines asks for the lines that a lookup in a table with home
// groups reads after its own home slot's: its chain head's and those of
// the other three home slots' seqs (Table.lookupGroup). With a prefetch
// instruction (prefetch_amd64.go) the requests do not wait; elsewhere they
// are loads, which overlap too but hold the lookup up until all four lines
// have come.
//
// N.B. the four requests go through prefetch4, four pointers in
// registers: built as a list for prefetch's loop, they cost a lookup of
// a hot flow in a 1M table 71 instructions of its 464 (callgrind, Zipf
// lookups), for four prefetch instructions.
func requestGroupLines(head *linkField, s1, s2, s3 *relUint32) {
	if canPrefetch {
		prefetch4(unsafe.Pointer(head), unsafe.Pointer(s1), unsafe.Pointer(s2), unsafe.Pointer(s3))
		return
	}
	// N.B. atomic loads are not removed for want of a use.
	head.load()
	s1.Load()
	s2.Load()
	s3.Load()
}
