package hash4

import "unsafe"

// This file and prefetch_amd64.s hold the package's only assembly: Go has
// no intrinsic for a prefetch with intent to write.

// prefetchw3 asks for the cache lines of a, b and c in the state a store
// needs (PREFETCHW), and returns without waiting for them. It is a hint:
// it neither reads nor writes memory as far as the program is concerned,
// and it cannot fault (processors without PREFETCHW execute it as a NOP).
//
//go:noescape
func prefetchw3(a, b, c unsafe.Pointer)
