//go:build !amd64

package hash4

import "unsafe"

// canPrefetch is false where the package has no prefetch instruction:
// requestLines loads the lines instead.
var canPrefetch = false

// prefetch is never called where canPrefetch is false.
func prefetch([]unsafe.Pointer) { panic("hash4: no prefetch instruction on this architecture") }
