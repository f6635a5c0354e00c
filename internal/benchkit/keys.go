package benchkit

import (
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"sync"
)

// Tuple is the constraint satisfied by hash4.Tuple: a flow's local and
// remote address and port.
type Tuple interface {
	~struct{ Local, Remote netip.AddrPort }
}

// Val is the value type stored by every implementation.
type Val struct{ N int }

// Size is a table size benchmarked, and its name in benchmark names.
type Size struct {
	Name string
	N    int
}

// Sizes are the table sizes benchmarked.
var Sizes = []Size{
	{"1K", 1 << 10},
	{"1M", 1 << 20},
}

// NumViews is the number of differently shuffled copies of the keys that
// benchmarks walk in turn (see Walk).
const NumViews = 4

// KeySet is the keys of one size, one value per key, the order in which
// maps are filled, and the orders in which benchmarks visit keys.
//
// N.B. an implementation that allocates a node per insert places nodes in
// insertion order, and nodes visited in that order again are found side by
// side in memory, a locality real traffic does not have. So maps are filled
// in an order of their own (Fill), and benchmarks walk the keys through
// views, each shuffled independently: a pass over one view visits keys in an
// order unrelated to that of the pass before, during which delete+insert
// reallocated nodes. Walking a view is sequential in memory, so fetching the
// next key costs what reading a packet header in cache would, the same for
// every implementation.
type KeySet[K Tuple] struct {
	Keys  []K           // in a random order, unrelated to Fill
	Vals  []Val         // Vals[i] is the value of Keys[i]
	Fill  []int         // a permutation of the indexes of Keys
	Views [NumViews][]K // Keys itself, then shuffled copies of it
}

var keyCache struct {
	sync.Mutex
	m map[keyCacheKey]any
}

type keyCacheKey struct {
	n int
	k reflect.Type
}

// Keys returns n distinct valid tuples, half IPv4 and half IPv6, in a
// random but fixed order, built once per n and key type.
func Keys[K Tuple](n int) *KeySet[K] {
	keyCache.Lock()
	defer keyCache.Unlock()
	ck := keyCacheKey{n, reflect.TypeFor[K]()}
	if ks, ok := keyCache.m[ck].(*KeySet[K]); ok {
		return ks
	}
	ks := &KeySet[K]{Keys: make([]K, n), Vals: make([]Val, n)}
	r := rand.New(rand.NewPCG(1, uint64(n)))
	for i := range ks.Keys {
		ks.Keys[i] = Key[K](r, i, i%2 == 0)
		ks.Vals[i].N = i
	}
	r.Shuffle(n, func(i, j int) {
		ks.Keys[i], ks.Keys[j] = ks.Keys[j], ks.Keys[i]
	})
	ks.Fill = r.Perm(n)
	ks.Views[0] = ks.Keys // already in an order unrelated to Fill
	for v := 1; v < NumViews; v++ {
		view := slices.Clone(ks.Keys)
		r.Shuffle(n, func(i, j int) { view[i], view[j] = view[j], view[i] })
		ks.Views[v] = view
	}
	if keyCache.m == nil {
		keyCache.m = make(map[keyCacheKey]any)
	}
	keyCache.m[ck] = ks
	return ks
}

// fmix32 is MurmurHash3's finalizer: a bijection of uint32 with
// fmix32(x) == 0 only for x == 0.
func fmix32(x uint32) uint32 {
	x ^= x >> 16
	x *= 0x85ebca6b
	x ^= x >> 13
	x *= 0xc2b2ae35
	x ^= x >> 16
	return x
}

// Key returns the i'th key of a family, drawing from r: a server address
// and port from a small set, and a peer whose address is unique per i (so
// keys are distinct without a dedup pass) with a random ephemeral port.
func Key[K Tuple](r *rand.Rand, i int, v4 bool) K {
	lport := [...]uint16{443, 80, 8443, 22}[r.IntN(4)]
	rport := uint16(1024 + r.IntN(65536-1024))
	u := fmix32(uint32(i) + 1) // nonzero, distinct per i
	if v4 {
		local := netip.AddrFrom4([4]byte{192, 0, 2, byte(1 + r.IntN(4))})
		remote := netip.AddrFrom4([4]byte{byte(u >> 24), byte(u >> 16), byte(u >> 8), byte(u)})
		return K{Local: netip.AddrPortFrom(local, lport), Remote: netip.AddrPortFrom(remote, rport)}
	}
	var l, rem [16]byte
	copy(l[:], []byte{0x20, 0x01, 0x0d, 0xb8})
	l[15] = byte(1 + r.IntN(4))
	rem[0] = 0x20
	rem[1] = 0x01
	for j := 2; j < 12; j++ {
		rem[j] = byte(r.Uint32())
	}
	rem[12], rem[13], rem[14], rem[15] = byte(u>>24), byte(u>>16), byte(u>>8), byte(u)
	return K{
		Local:  netip.AddrPortFrom(netip.AddrFrom16(l), lport),
		Remote: netip.AddrPortFrom(netip.AddrFrom16(rem), rport),
	}
}
