//go:build !amd64

package hash4

import (
	"sync/atomic"
	"unsafe"
)

// prefetchw3 loads the 32-bit words at a and b, to bring their lines into
// the cache; c, which the amd64 version also asks for, is not loaded, as
// it may point at a word of another size. a and b must be 4-byte aligned
// fields that lock-free readers load atomically.
func prefetchw3(a, b, _ unsafe.Pointer) {
	atomic.LoadUint32((*uint32)(a))
	atomic.LoadUint32((*uint32)(b))
}
