package bench

// The maps compared. Every implementation gets the same keys: n distinct
// Tuples, half IPv4 and half IPv6, generated deterministically (see
// benchkit.Keys). Key sets are built once per size, and a prefilled map is
// kept for the run of one sub-benchmark (all its -count repetitions run
// back to back), so the cost of filling a 1M-entry map is paid once per
// sub-benchmark and outside the timer. The 1M key set holds 4 orders of 1M
// Tuples, about 256 MB.

import (
	"hash/maphash"
	"sync"

	"github.com/hash4/hash4"
	"github.com/hash4/hash4/internal/benchkit"
	cmap "github.com/orcaman/concurrent-map/v2"
	"github.com/puzpuzpuz/xsync/v4"
)

// Tuple is the key of every map.
type Tuple = hash4.Tuple

// benchSecret fixes bucket placement so that runs are comparable.
var benchSecret = hash4.Secret{Ehash: 0x9e3779b9, Ehash6Addr: 0x7f4a7c15, Seed: 0x243f6a8885a308d3}

// benchVal, benchMap, benchImpl and benchKeySet are the harness's value,
// map adapter, implementation and key set (see package benchkit), keyed by
// Tuple.
type (
	benchVal    = benchkit.Val
	benchMap    = benchkit.Map[Tuple]
	benchImpl   = benchkit.Impl[Tuple]
	benchKeySet = benchkit.KeySet[Tuple]
)

var benchImpls = []benchImpl{
	{Name: "hash4", New: func(n int) benchMap {
		return benchHash4{hash4.New[benchVal](hash4.WithCapacity(n), hash4.WithSecret(benchSecret))}
	}},
	{Name: "syncmap", New: func(int) benchMap { return new(benchkit.SyncMap[Tuple]) }},
	{Name: "xsync", New: func(n int) benchMap {
		return benchXsync{xsync.NewMap[Tuple, *benchVal](xsync.WithPresize(n))}
	}},
	{Name: "rwmutex", New: func(n int) benchMap {
		return &benchRWMap{m: make(map[Tuple]*benchVal, n)}
	}},
	{Name: "cmap", New: func(int) benchMap { return newBenchCmap() }},
}

// benchHash4 is the adapter over Table.
type benchHash4 struct{ t *hash4.Table[benchVal] }

func (m benchHash4) Lookup(k Tuple) (*benchVal, bool) { return m.t.Lookup(k) }
func (m benchHash4) Delete(k Tuple) (*benchVal, bool) { return m.t.Delete(k) }
func (m benchHash4) Insert(k Tuple, v *benchVal) {
	if err := m.t.Insert(k, v); err != nil {
		panic(err)
	}
}

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
