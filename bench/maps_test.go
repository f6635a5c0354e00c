package bench

// The maps compared, the keys they hold, and the walks benchmarks make
// over them. Every implementation gets the same keys: n distinct Tuples,
// half IPv4 and half IPv6, generated deterministically (see benchKeySet).
// Key sets are built once per size, and a prefilled map is kept for the run
// of one sub-benchmark (all its -count repetitions run back to back), so the
// cost of filling a 1M-entry map is paid once per sub-benchmark and outside
// the timer. The 1M key set holds 4 orders of 1M Tuples, about 256 MB.

import (
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/hash4/hash4"
	cmap "github.com/orcaman/concurrent-map/v2"
	"github.com/puzpuzpuz/xsync/v4"
)

// Tuple is the key of every map.
type Tuple = hash4.Tuple

// benchSecret fixes bucket placement so that runs are comparable.
var benchSecret = hash4.Secret{Ehash: 0x9e3779b9, Ehash6Addr: 0x7f4a7c15, Seed: 0x243f6a8885a308d3}

// benchVal is the value type stored by every implementation.
type benchVal struct{ n int }

// benchMap is the adapter over the implementations compared. Insert is only
// called for absent keys.
type benchMap interface {
	Lookup(Tuple) (*benchVal, bool)
	Insert(Tuple, *benchVal)
	Delete(Tuple) (*benchVal, bool)
}

type benchImpl struct {
	name string
	new  func(n int) benchMap
}

var benchImpls = []benchImpl{
	{"hash4", func(n int) benchMap {
		return benchHash4{hash4.New[benchVal](hash4.WithCapacity(n), hash4.WithSecret(benchSecret))}
	}},
	{"syncmap", func(int) benchMap { return new(benchSyncMap) }},
	{"xsync", func(n int) benchMap {
		return benchXsync{xsync.NewMap[Tuple, *benchVal](xsync.WithPresize(n))}
	}},
	{"rwmutex", func(n int) benchMap {
		return &benchRWMap{m: make(map[Tuple]*benchVal, n)}
	}},
	{"cmap", func(int) benchMap { return newBenchCmap() }},
}

type benchHash4 struct{ t *hash4.Table[benchVal] }

func (m benchHash4) Lookup(k Tuple) (*benchVal, bool) { return m.t.Lookup(k) }
func (m benchHash4) Delete(k Tuple) (*benchVal, bool) { return m.t.Delete(k) }
func (m benchHash4) Insert(k Tuple, v *benchVal) {
	if err := m.t.Insert(k, v); err != nil {
		panic(err)
	}
}

type benchSyncMap struct{ m sync.Map }

func (m *benchSyncMap) Lookup(k Tuple) (*benchVal, bool) {
	v, ok := m.m.Load(k)
	if !ok {
		return nil, false
	}
	return v.(*benchVal), true
}

func (m *benchSyncMap) Delete(k Tuple) (*benchVal, bool) {
	v, ok := m.m.LoadAndDelete(k)
	if !ok {
		return nil, false
	}
	return v.(*benchVal), true
}

func (m *benchSyncMap) Insert(k Tuple, v *benchVal) { m.m.Store(k, v) }

type benchXsync struct{ m *xsync.Map[Tuple, *benchVal] }

func (m benchXsync) Lookup(k Tuple) (*benchVal, bool) { return m.m.Load(k) }
func (m benchXsync) Delete(k Tuple) (*benchVal, bool) { return m.m.LoadAndDelete(k) }
func (m benchXsync) Insert(k Tuple, v *benchVal)      { m.m.Store(k, v) }

// benchCmap is github.com/orcaman/concurrent-map/v2, the common sharded
// map: 32 maps, each behind a sync.RWMutex, chosen by a hash of the key
// (maphash here, as the package leaves the hash of a struct key to its
// user). The maps start empty: the package has no presizing.
type benchCmap struct {
	m cmap.ConcurrentMap[Tuple, *benchVal]
}

func newBenchCmap() benchCmap {
	seed := maphash.MakeSeed()
	return benchCmap{cmap.NewWithCustomShardingFunction[Tuple, *benchVal](func(k Tuple) uint32 {
		return uint32(maphash.Comparable(seed, k))
	})}
}

func (m benchCmap) Lookup(k Tuple) (*benchVal, bool) { return m.m.Get(k) }
func (m benchCmap) Delete(k Tuple) (*benchVal, bool) { return m.m.Pop(k) }
func (m benchCmap) Insert(k Tuple, v *benchVal)      { m.m.Set(k, v) }

type benchRWMap struct {
	mu sync.RWMutex
	m  map[Tuple]*benchVal
}

func (m *benchRWMap) Lookup(k Tuple) (*benchVal, bool) {
	m.mu.RLock()
	v, ok := m.m[k]
	m.mu.RUnlock()
	return v, ok
}

func (m *benchRWMap) Delete(k Tuple) (*benchVal, bool) {
	m.mu.Lock()
	v, ok := m.m[k]
	delete(m.m, k)
	m.mu.Unlock()
	return v, ok
}

func (m *benchRWMap) Insert(k Tuple, v *benchVal) {
	m.mu.Lock()
	m.m[k] = v
	m.mu.Unlock()
}

// benchSizes are the table sizes benchmarked.
var benchSizes = []struct {
	name string
	n    int
}{
	{"1K", 1 << 10},
	{"1M", 1 << 20},
}

// benchViews is the number of differently shuffled copies of the keys that
// benchmarks walk in turn (see benchWalk).
const benchViews = 4

// benchKeySet is the keys of one size, one value per key, the order in which
// maps are filled, and the orders in which benchmarks visit keys.
//
// N.B. an implementation that allocates a node per insert places nodes in
// insertion order, and nodes visited in that order again are found side by
// side in memory, a locality real traffic does not have. So maps are filled
// in an order of their own (fill), and benchmarks walk the keys through
// views, each shuffled independently: a pass over one view visits keys in an
// order unrelated to that of the pass before, during which delete+insert
// reallocated nodes. Walking a view is sequential in memory, so fetching the
// next key costs what reading a packet header in cache would, the same for
// every implementation.
type benchKeySet struct {
	keys  []Tuple
	vals  []benchVal // vals[i] is the value of keys[i]
	fill  []int      // a permutation of the indexes of keys
	views [benchViews][]Tuple
}

var benchKeyCache struct {
	sync.Mutex
	m map[int]*benchKeySet
}

// benchKeys returns n distinct valid tuples, half IPv4 and half IPv6, in a
// random but fixed order, built once per n.
func benchKeys(n int) *benchKeySet {
	benchKeyCache.Lock()
	defer benchKeyCache.Unlock()
	if ks := benchKeyCache.m[n]; ks != nil {
		return ks
	}
	ks := &benchKeySet{keys: make([]Tuple, n), vals: make([]benchVal, n)}
	r := rand.New(rand.NewPCG(1, uint64(n)))
	for i := range ks.keys {
		ks.keys[i] = benchTuple(r, i, i%2 == 0)
		ks.vals[i].n = i
	}
	r.Shuffle(n, func(i, j int) {
		ks.keys[i], ks.keys[j] = ks.keys[j], ks.keys[i]
	})
	ks.fill = r.Perm(n)
	ks.views[0] = ks.keys // already in an order unrelated to fill
	for v := 1; v < benchViews; v++ {
		view := slices.Clone(ks.keys)
		r.Shuffle(n, func(i, j int) { view[i], view[j] = view[j], view[i] })
		ks.views[v] = view
	}
	if benchKeyCache.m == nil {
		benchKeyCache.m = make(map[int]*benchKeySet)
	}
	benchKeyCache.m[n] = ks
	return ks
}

// benchFmix32 is MurmurHash3's finalizer: a bijection of uint32 with
// fmix32(x) == 0 only for x == 0.
func benchFmix32(x uint32) uint32 {
	x ^= x >> 16
	x *= 0x85ebca6b
	x ^= x >> 13
	x *= 0xc2b2ae35
	x ^= x >> 16
	return x
}

// benchTuple returns the i'th key of a family: a server address and port
// from a small set, and a peer whose address is unique per i (so keys are
// distinct without a dedup pass) with a random ephemeral port.
func benchTuple(r *rand.Rand, i int, v4 bool) Tuple {
	lport := [...]uint16{443, 80, 8443, 22}[r.IntN(4)]
	rport := uint16(1024 + r.IntN(65536-1024))
	u := benchFmix32(uint32(i) + 1) // nonzero, distinct per i
	if v4 {
		local := netip.AddrFrom4([4]byte{192, 0, 2, byte(1 + r.IntN(4))})
		remote := netip.AddrFrom4([4]byte{byte(u >> 24), byte(u >> 16), byte(u >> 8), byte(u)})
		return Tuple{Local: netip.AddrPortFrom(local, lport), Remote: netip.AddrPortFrom(remote, rport)}
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
	return Tuple{
		Local:  netip.AddrPortFrom(netip.AddrFrom16(l), lport),
		Remote: netip.AddrPortFrom(netip.AddrFrom16(rem), rport),
	}
}

// benchFilled is the one prefilled map kept between runs of a
// sub-benchmark; benchmarks leave it holding every key.
var benchFilled struct {
	impl string
	n    int
	how  benchFill
	m    benchMap
}

// benchFill is how a benchmark's map came to hold its keys.
type benchFill int

const (
	// filledOnce: the keys were inserted into an empty map, in ks.fill
	// order.
	filledOnce benchFill = iota
	// filledByChurn: the map was filled with n other keys, and each was
	// then deleted, in random order, and replaced by one of the keys, as
	// flows come and go. Where an implementation places an entry by what
	// its bucket and neighbours hold when it is inserted (hash4's home
	// slots), this is the placement that churn leaves, rather than the one
	// a single fill makes.
	filledByChurn
)

// benchPrefilled returns a map of impl holding all n keys, filled as how
// says, and the keys. It stops the timer while it builds one; the caller
// resets it.
func benchPrefilled(b *testing.B, impl benchImpl, n int, how benchFill) (benchMap, *benchKeySet) {
	b.StopTimer()
	defer b.StartTimer()
	ks := benchKeys(n)
	if benchFilled.m != nil && benchFilled.impl == impl.name && benchFilled.n == n && benchFilled.how == how {
		return benchFilled.m, ks
	}
	benchFilled.m = nil
	m := impl.new(n)
	if how == filledByChurn {
		// Other keys: benchTuple's peer address is unique per i, and
		// ks.keys has i < n.
		r := rand.New(rand.NewPCG(2, uint64(n)))
		others := make([]Tuple, n)
		for i := range others {
			others[i] = benchTuple(r, n+i, i%2 == 0)
			m.Insert(others[i], &ks.vals[i])
		}
		gone := r.Perm(n)
		for j, i := range ks.fill {
			if _, ok := m.Delete(others[gone[j]]); !ok {
				b.Fatalf("%s lost key %v", impl.name, others[gone[j]])
			}
			m.Insert(ks.keys[i], &ks.vals[i])
		}
	} else {
		for _, i := range ks.fill {
			m.Insert(ks.keys[i], &ks.vals[i])
		}
	}
	benchFilled.impl, benchFilled.n, benchFilled.how, benchFilled.m = impl.name, n, how, m
	runtime.GC() // the fill's garbage is not the benchmark's
	return m, ks
}

// benchEach runs body for every size and implementation, on a map filled as
// how says, reporting allocations if allocs is set.
func benchEach(b *testing.B, allocs bool, how benchFill, body func(b *testing.B, m benchMap, ks *benchKeySet)) {
	for _, sz := range benchSizes {
		for _, impl := range benchImpls {
			b.Run(fmt.Sprintf("n=%s/impl=%s", sz.name, impl.name), func(b *testing.B) {
				if allocs {
					b.ReportAllocs()
				}
				m, ks := benchPrefilled(b, impl, sz.n, how)
				b.ResetTimer()
				body(b, m, ks)
			})
		}
	}
}

// benchWalk is the order in which one RunParallel goroutine visits keys:
// each view in turn from start to end (see benchKeySet), starting in a view
// and at an offset of its own. No counter is shared between goroutines.
type benchWalk struct {
	g    uint64 // the goroutine's number, from 1
	ks   *benchKeySet
	view int
	cur  []Tuple
	i    int
}

// newBenchWalk returns the walk of the next goroutine to call it; gid
// numbers them.
func newBenchWalk(gid *atomic.Uint64, ks *benchKeySet) *benchWalk {
	g := gid.Add(1)
	w := &benchWalk{g: g, ks: ks, view: int(g % benchViews)}
	w.cur = ks.views[w.view]
	w.i = rand.New(rand.NewPCG(g, 0x5eed)).IntN(len(w.cur))
	return w
}

// next returns the next key to visit.
func (w *benchWalk) next() *Tuple {
	k := &w.cur[w.i]
	if w.i++; w.i == len(w.cur) {
		w.i, w.view = 0, (w.view+1)%benchViews
		w.cur = w.ks.views[w.view]
	}
	return k
}
