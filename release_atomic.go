//go:build !amd64 || race || hash4_atomicstores

package hash4

import (
	"sync/atomic"
	"unsafe"
)

// Release stores as sync/atomic stores: on architectures other than amd64,
// and under the race detector (see release.go).

func storeRel32(p *uint32, v uint32)                      { atomic.StoreUint32(p, v) }
func storeRel64(p *uint64, v uint64)                      { atomic.StoreUint64(p, v) }
func storeRelPointer(p *unsafe.Pointer, v unsafe.Pointer) { atomic.StorePointer(p, v) }

// store sets the words of x to those of k, in any order.
func (x *entryKey) store(k *key) {
	x.meta.Store(k.meta)
	x.remote[0].Store(k.remote[0])
	x.remote[1].Store(k.remote[1])
	x.local[0].Store(k.local[0])
	x.local[1].Store(k.local[1])
}
