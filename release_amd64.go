//go:build amd64 && !race && !hash4_atomicstores

package hash4

import "unsafe"

// Release stores on amd64, outside race builds: plain stores, each in a
// function the compiler may not inline, so that it neither reorders them
// with the stores around the call nor drops one as overwritten (see
// release.go). x86-TSO does the rest.

//go:noinline
func storeRel32(p *uint32, v uint32) { *p = v }

//go:noinline
func storeRel64(p *uint64, v uint64) { *p = v }

// storeRelPointer stores v into *p: a plain store, with the write barrier
// the garbage collector needs.
//
//go:noinline
func storeRelPointer(p *unsafe.Pointer, v unsafe.Pointer) { *p = v }

// store sets the words of x to those of k, with release stores in any
// order, in one call.
//
//go:noinline
func (x *entryKey) store(k *key) {
	x.meta.v = k.meta
	x.remote[0].v, x.remote[1].v = k.remote[0], k.remote[1]
	x.local[0].v, x.local[1].v = k.local[0], k.local[1]
}
