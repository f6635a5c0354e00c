package hash4

import (
	"sync/atomic"
	"unsafe"
)

// This file holds the fields that lock-free readers load while writers, one
// at a time under the lock that covers them, store them. Readers load them
// with sync/atomic loads; writers store them with release stores, which no
// processor sees before the stores that precede them: all that the sequence
// protocol (see entry) and chain publication (nulls.go) ask of a store.
//
// On amd64 (x86-TSO) a release store is a plain store behind a call the
// compiler does not see into (release_amd64.go), as the kernel's
// smp_store_release on x86; sync/atomic's Store is an XCHG there, a full
// fence. Elsewhere, under the race detector, and with the build tag
// hash4_atomicstores, it is a sync/atomic store (release_atomic.go).
//
// N.B. a release store is not a full fence. Nothing relies on one: readers
// never store to these fields, and writers order themselves with their
// locks, whose atomic instructions are full fences.

// relUint32 is a uint32 loaded atomically and stored with release stores,
// by one writer at a time. The zero value is 0.
type relUint32 struct{ v uint32 }

// Load atomically loads x.
func (x *relUint32) Load() uint32 { return atomic.LoadUint32(&x.v) }

// CompareAndSwap is atomic.CompareAndSwapUint32 on x: a full fence, for the
// bit lock of a bucket line (bucket.lock), which is x's writer's claim.
func (x *relUint32) CompareAndSwap(old, new uint32) bool {
	return atomic.CompareAndSwapUint32(&x.v, old, new)
}

// Store stores v into x with a release store. The caller is x's only
// writer for the moment (it holds the lock that covers x).
func (x *relUint32) Store(v uint32) { storeRel32(&x.v, v) }

// relUint64 is relUint32 for uint64. Like atomic.Uint64, it is 8-byte
// aligned on every platform, as 64-bit atomic loads need on 32-bit ones.
type relUint64 struct {
	_ [0]atomic.Uint64 // its alignment
	v uint64
}

// Load atomically loads x.
func (x *relUint64) Load() uint64 { return atomic.LoadUint64(&x.v) }

// Store stores v into x with a release store, as relUint32.Store.
func (x *relUint64) Store(v uint64) { storeRel64(&x.v, v) }

// relPointer is relUint32 for *T.
type relPointer[T any] struct {
	_ [0]*T // keeps relPointer[A] and relPointer[B] apart
	v unsafe.Pointer
}

// Load atomically loads x.
func (x *relPointer[T]) Load() *T { return (*T)(atomic.LoadPointer(&x.v)) }

// Store stores v into x with a release store, as relUint32.Store.
func (x *relPointer[T]) Store(v *T) { storeRelPointer(&x.v, unsafe.Pointer(v)) }

// relUint64 is 8-byte aligned wherever it is built: this does not compile
// otherwise. CI builds and tests it for 386, where a uint64 alone is 4-byte
// aligned.
var _ [unsafe.Alignof(relUint64{}) - 8]struct{}
