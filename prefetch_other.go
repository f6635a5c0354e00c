//go:build !amd64

package hash4

import "unsafe"

// touchForWrite loads a chain head and an entry's seq, to bring their
// lines into the cache before the caller writes them under a lock (see
// Table.touch). Without a prefetch for writing here (prefetch_amd64.go),
// val's line is left to the write.
func touchForWrite(head *linkField, seq *relUint32, _ *unsafe.Pointer) {
	head.load()
	seq.Load()
}

// canPrefetchW reports whether the package issues prefetches for writing:
// only on amd64 (prefetch_amd64.go).
const canPrefetchW = false

// prefetchW does nothing: without canPrefetchW it is never called.
func (h *lineHints) prefetchW() {}

// canPrefetch reports whether the package issues prefetches for reading:
// only on amd64. Elsewhere Table.AppendLookups loads instead.
const canPrefetch = false

// prefetchRead does nothing: without canPrefetch it is never called.
func (h *lineHints) prefetchRead() {}

// prefetch4 does nothing: without canPrefetch it is never called.
func prefetch4(_, _, _, _ unsafe.Pointer) {}
