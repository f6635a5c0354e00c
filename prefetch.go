package hash4

import "unsafe"

// lineHints is a list of cache lines a writer is about to write under a
// stripe lock, for a prefetch for writing before it takes the lock (see
// Table.touch). It holds addresses as unsafe.Pointers so that the fields
// named may be of any type; nothing dereferences them, only the prefetch
// instruction takes them (prefetch_amd64.s).
type lineHints struct {
	n    int
	addr [maxLineHints]unsafe.Pointer
}

// maxLineHints is the most lines Table.touch names in a list: a home bitmap
// word, a move count, and two lines of each of the other three home slots
// of a group.
const maxLineHints = 2 + 2*(homeGroupSize-1)

// addLineHint adds the line of *p to h.
func addLineHint[P any](h *lineHints, p *P) {
	h.addr[h.n] = unsafe.Pointer(p)
	h.n++
}
