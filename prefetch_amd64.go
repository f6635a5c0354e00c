package hash4

import "unsafe"

// This file and prefetch_amd64.s hold the package's only assembly: Go has
// no intrinsic for a prefetch.

// canPrefetch reports whether the package issues prefetches: PREFETCHT0 is
// part of SSE, which every amd64 processor has. A variable, so that tests
// can take the path of other architectures (AppendLookups).
var canPrefetch = true

// prefetch asks for the cache line of each address with PREFETCHT0, into
// every level of the cache, and returns without waiting for them. It is a
// hint: it neither reads nor writes memory as far as the program is
// concerned.
//
//go:noescape
func prefetch(addrs []unsafe.Pointer)
