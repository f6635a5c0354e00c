package nat

import (
	"sync/atomic"

	"github.com/hash4/hash4"
)

// addrPorts records which ports of one external address, in one protocol,
// mappings hold: the ports of endpoint-independent and address-dependent
// mappings, each one mapping's alone, as a port bind() holds. It is a
// bitmap, one bit a port, made when the address's first port is taken
// (8 KiB; the zero value, 8 bytes, has no port taken). A mapping takes a
// port with a CompareAndSwap of its word, found from a random start as RFC
// 6056's Algorithm 1 does, 64 ports a load where the address is busy; VPP's
// NAT holds its ports so. Which mapping holds a port is in the table extm
// (protoState), so that a mapping costs the same memory however sparse
// its address's ports are.
//
// A bit goes from 0 to 1 only by CompareAndSwap, so one mapping holds a
// port, and back to 0 only when that mapping lets it go.
type addrPorts struct {
	words atomic.Pointer[[65536 / 64]atomic.Uint64]
}

// bitmap returns the address's bitmap, making it if there is none.
func (a *addrPorts) bitmap() *[65536 / 64]atomic.Uint64 {
	if w := a.words.Load(); w != nil {
		return w
	}
	a.words.CompareAndSwap(nil, new([65536 / 64]atomic.Uint64)) // a loser's is dropped
	return a.words.Load()
}

// taken reports whether port is held.
func (a *addrPorts) taken(port uint16) bool {
	w := a.words.Load()
	return w != nil && w[port>>6].Load()&(1<<(port&63)) != 0
}

// take holds port if it is free, and reports whether it did.
func (a *addrPorts) take(port uint16) bool {
	w, bit := &a.bitmap()[port>>6], uint64(1)<<(port&63)
	for {
		old := w.Load()
		if old&bit != 0 {
			return false
		}
		if w.CompareAndSwap(old, old|bit) {
			return true
		}
	}
}

// release lets port go; its holder calls it once.
func (a *addrPorts) release(port uint16) {
	a.words.Load()[port>>6].And(^(uint64(1) << (port & 63)))
}

// Parities takeAny may be asked for.
const (
	anyParity  = -1
	evenParity = 0
	oddParity  = 1
)

// takeAny holds a free port of lo-hi, of the given parity unless it is
// anyParity, that alloc does not reserve, and returns it; ok is false if
// none of the first tries ports looked at was. It looks at the ports in
// order from start (a random number, reduced here), as RFC 6056's
// Algorithm 1 does, passing over words with no port free.
func (a *addrPorts) takeAny(lo, hi uint16, start uint32, parity int, tries uint32, alloc *hash4.PortAllocator) (port uint16, ok bool) {
	bm := a.bitmap()
	size := uint32(hi-lo) + 1
	n := min(size, tries)
	start %= size
	for i := uint32(0); i < n; {
		p := lo + uint16((start+i)%size)
		w := &bm[p>>6]
		old := w.Load()
		if old == ^uint64(0) {
			// On to the word's end, or hi: the ports up to it come next.
			i += uint32(min(p|63, hi)-p) + 1
			continue
		}
		i++
		bit := uint64(1) << (p & 63)
		if old&bit != 0 || parity != anyParity && int(p&1) != parity || alloc.Reserved(p) {
			continue
		}
		for old&bit == 0 { // another port of the word may change meanwhile
			if w.CompareAndSwap(old, old|bit) {
				return p, true
			}
			old = w.Load()
		}
	}
	return 0, false
}
