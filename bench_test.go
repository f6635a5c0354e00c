package hash4

// Benchmarks of Table against the usual Go concurrent maps, in the style of
// xsync and the sync package: every implementation side by side in one
// benchmark function, e.g. BenchmarkLookup/n=1M/impl=hash4. Compare them with
//
//	for i in 1 2 3 4 5 6; do
//		go test -run '^$' -bench '^Benchmark(Lookup|Mixed|Churn|HashTuple)$' -count 1 .
//	done > bench.txt
//	benchstat -filter '-.name:HashTuple' -col /impl bench.txt
//	benchstat -filter '.name:HashTuple' -col /hasher bench.txt
//
// (anchored: a bare 'Lookup' also matches other files' benchmarks). Each
// run is a process of its own, so that every implementation's samples
// span the machine's changes of speed rather than fall in one of them.
//
// Every implementation gets the same keys: n distinct Tuples, half IPv4 and
// half IPv6, generated deterministically (see benchKeySet). Key sets are
// built once per size, and a prefilled map is kept for the run of one
// sub-benchmark (all its -count repetitions run back to back), so the cost of
// filling a 1M-entry map is paid once per sub-benchmark and outside the
// timer. The 1M key set holds 4 orders of 1M Tuples, about 256 MB.

import (
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	cmap "github.com/orcaman/concurrent-map/v2"
	"github.com/puzpuzpuz/xsync/v4"
)

// benchSecret fixes bucket placement so that runs are comparable.
var benchSecret = Secret{Ehash: 0x9e3779b9, Ehash6Addr: 0x7f4a7c15, Seed: 0x243f6a8885a308d3}

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
		return benchHash4{New[benchVal](WithCapacity(n), WithSecret(benchSecret))}
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

type benchHash4 struct{ t *Table[benchVal] }

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
		return Tuple{netip.AddrPortFrom(local, lport), netip.AddrPortFrom(remote, rport)}
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
		netip.AddrPortFrom(netip.AddrFrom16(l), lport),
		netip.AddrPortFrom(netip.AddrFrom16(rem), rport),
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

// BenchmarkLookup measures lookup hits in a map filled once.
func BenchmarkLookup(b *testing.B) {
	benchEach(b, false, filledOnce, benchLookups)
}

// BenchmarkLookupChurned measures lookup hits in a map whose keys all came
// in through churn (filledByChurn).
func BenchmarkLookupChurned(b *testing.B) {
	benchEach(b, false, filledByChurn, benchLookups)
}

// benchLookups looks up the keys of ks in m, which holds them all.
func benchLookups(b *testing.B, m benchMap, ks *benchKeySet) {
	var gid atomic.Uint64
	b.RunParallel(func(pb *testing.PB) {
		w, misses := newBenchWalk(&gid, ks), 0
		for pb.Next() {
			if _, ok := m.Lookup(*w.next()); !ok {
				misses++
			}
		}
		if misses > 0 {
			b.Errorf("%d lookups of present keys missed", misses)
		}
	})
}

// BenchmarkLookupChained measures lookup hits on one goroutine, in two
// loops over the same keys: deps=none, where every key is known in advance,
// and deps=chained, where the index of the next key takes in the value the
// last lookup returned (it adds zero, which the processor cannot know), so a
// lookup cannot begin before the one before it has answered. The loops take
// equal time when the processor overlaps no memory reads of consecutive
// lookups by itself; then each lookup waits out its own.
func BenchmarkLookupChained(b *testing.B) {
	benchEach(b, false, filledOnce, func(b *testing.B, m benchMap, ks *benchKeySet) {
		for _, chained := range []bool{false, true} {
			name := "deps=none"
			if chained {
				name = "deps=chained"
			}
			b.Run(name, func(b *testing.B) {
				keys := ks.views[1]
				i := 0
				for b.Loop() {
					v, ok := m.Lookup(keys[i])
					if !ok {
						b.Fatalf("lookup of present key %v missed", keys[i])
					}
					if i++; i == len(keys) {
						i = 0
					}
					if chained {
						// A data dependence on v, not a branch the
						// processor could predict and run past.
						i += int(uintptr(unsafe.Pointer(v)) & benchZero)
					}
				}
			})
		}
	})
}

// benchZero is zero, in a variable so that the compiler cannot fold what it
// masks.
var benchZero uintptr

// BenchmarkMemoryReads measures the machine rather than a table: what a
// read of a random line costs, and how far apart in the instruction stream
// two independent reads may be and still overlap. It gives the figures in
// docs/performance.md, "What bounds the table".
//
// reads=chained follows a random cycle through mem bytes, each read's
// address in the last read's line: the full latency of one read. In
// reads=independent, each read's address is known in advance, and work=w
// runs w rounds of four arithmetic instructions, unrelated to the reads,
// after each: while the instructions from one read to the next fit in the
// processor's reorder window, the reads overlap and an op costs a fraction
// of a latency; beyond it each op waits out its own read.
func BenchmarkMemoryReads(b *testing.B) {
	const lineWords = 8 // uint64s in a 64-byte line
	r := rand.New(rand.NewPCG(12, 34))
	for _, mb := range []int{4, 64} {
		mem := make([]uint64, mb<<20/8)
		lines := len(mem) / lineWords
		// The cycle: each line holds the word index of the next.
		order := r.Perm(lines)
		for i, l := range order {
			mem[l*lineWords] = uint64(order[(i+1)%lines] * lineWords)
		}
		b.Run(fmt.Sprintf("reads=chained/mem=%dMB", mb), func(b *testing.B) {
			p := uint64(0)
			for b.Loop() {
				p = mem[p]
			}
			benchSink += uint32(p)
		})
		if mb != 64 {
			continue
		}
		addrs := make([]uint32, 1<<20)
		for i := range addrs {
			addrs[i] = uint32(r.IntN(lines) * lineWords)
		}
		for _, work := range []int{0, 8, 16, 24, 32, 48} {
			b.Run(fmt.Sprintf("reads=independent/work=%d/mem=%dMB", work, mb), func(b *testing.B) {
				var sum, out uint64
				for i := 0; b.Loop(); i++ {
					sum += mem[addrs[i&(len(addrs)-1)]]
					x0, x1, x2, x3 := uint64(i), uint64(i)+1, uint64(i)+2, uint64(i)+3
					for range work {
						x0 += x1
						x1 ^= x2
						x2 += x3
						x3 ^= x0
					}
					out ^= x0 ^ x3
				}
				benchSink += uint32(sum + out)
			})
		}
	}
}

// BenchmarkMixed measures 90% lookups and 10% delete+insert of the same key
// (one op each), so that occupancy stays constant.
func BenchmarkMixed(b *testing.B) {
	benchEach(b, true, filledOnce, benchMixed)
}

// benchMixed runs BenchmarkMixed's ops on m, which holds the keys of ks.
func benchMixed(b *testing.B, m benchMap, ks *benchKeySet) {
	benchMixedParts(b, m, ks, true, true)
}

// benchMixedParts runs BenchmarkMixed's walk on m, doing its lookups only if
// lookups is set and its delete+insert pairs only if churn is. A skipped op
// still counts as one, and costs its step of the walk: so the two parts'
// times, less once the time of the walk alone, add up to the whole's if
// the two kinds of op do not slow each other down.
func benchMixedParts(b *testing.B, m benchMap, ks *benchKeySet, lookups, churn bool) {
	var gid atomic.Uint64
	b.RunParallel(func(pb *testing.PB) {
		w, c := newBenchWalk(&gid, ks), 10
		for pb.Next() {
			k := w.next()
			if c--; c == 0 {
				c = 10
				// Another goroutine may hold this key deleted for a
				// moment: reinsert only what this one removed.
				if !churn {
					continue
				}
				if v, ok := m.Delete(*k); ok {
					m.Insert(*k, v)
				}
			} else if lookups {
				m.Lookup(*k)
			}
		}
	})
}

// BenchmarkMixedParts runs BenchmarkMixed at 1M entries, on hash4 and on
// xsync, whole (ops=all), in its two parts, the lookups alone (ops=lookups,
// 90% of ops; the rest only walk) and the delete+insert pairs alone
// (ops=churn, 10%), and as the walk alone (ops=none), to tell whether the
// two kinds of op slow each other down.
func BenchmarkMixedParts(b *testing.B) {
	for _, part := range []struct {
		name           string
		lookups, churn bool
	}{{"all", true, true}, {"lookups", true, false}, {"churn", false, true}, {"none", false, false}} {
		for _, impl := range benchImpls {
			if impl.name != "hash4" && impl.name != "xsync" {
				continue
			}
			b.Run(fmt.Sprintf("n=1M/ops=%s/impl=%s", part.name, impl.name), func(b *testing.B) {
				m, ks := benchPrefilled(b, impl, 1<<20, filledOnce)
				b.ResetTimer()
				benchMixedParts(b, m, ks, part.lookups, part.churn)
			})
		}
	}
}

// BenchmarkChurn measures delete+insert pairs (one op each) only.
func BenchmarkChurn(b *testing.B) {
	benchEach(b, true, filledOnce, benchChurn)
}

// benchChurn runs BenchmarkChurn's ops on m, which holds the keys of ks.
func benchChurn(b *testing.B, m benchMap, ks *benchKeySet) {
	var gid atomic.Uint64
	b.RunParallel(func(pb *testing.PB) {
		w := newBenchWalk(&gid, ks)
		for pb.Next() {
			k := w.next()
			if v, ok := m.Delete(*k); ok {
				m.Insert(*k, v)
			}
		}
	})
}

// BenchmarkFill measures filling an empty map with n keys from GOMAXPROCS
// goroutines, each inserting a share of them, where every map is made
// without a size and grows as it fills: hash4 by itself (from New's 1024
// buckets), the others as they do; impl=hash4-sized is hash4 made for n
// entries, for scale. It reports the time per insert (ns/insert), which
// for hash4 includes the wait for its growth to end.
func BenchmarkFill(b *testing.B) {
	impls := []benchImpl{
		{"hash4", func(int) benchMap { return benchHash4{New[benchVal](WithSecret(benchSecret))} }},
		{"hash4-sized", benchImpls[0].new},
		{"syncmap", func(int) benchMap { return new(benchSyncMap) }},
		{"xsync", func(int) benchMap { return benchXsync{xsync.NewMap[Tuple, *benchVal]()} }},
		{"rwmutex", func(int) benchMap { return &benchRWMap{m: map[Tuple]*benchVal{}} }},
		{"cmap", func(int) benchMap { return newBenchCmap() }},
	}
	for _, sz := range benchSizes {
		ks := benchKeys(sz.n)
		for _, impl := range impls {
			b.Run(fmt.Sprintf("n=%s/impl=%s", sz.name, impl.name), func(b *testing.B) {
				procs := runtime.GOMAXPROCS(0)
				for b.Loop() {
					m := impl.new(sz.n)
					var wg sync.WaitGroup
					for g := range procs {
						wg.Go(func() {
							for i := g; i < len(ks.fill); i += procs {
								j := ks.fill[i]
								m.Insert(ks.keys[j], &ks.vals[j])
							}
						})
					}
					wg.Wait()
					if h, ok := m.(benchHash4); ok {
						h.t.growers.Wait()
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(sz.n), "ns/insert")
			})
		}
	}
}

// BenchmarkLockStripes measures Mixed 90/10 and Churn in small tables of
// hash4 with the stripe counts from one to the default, to choose
// WithLockStripes by: fewer stripes hold fewer bytes per entry in a small
// table (see TestTableMemoryPerEntry), and change how often writers meet.
func BenchmarkLockStripes(b *testing.B) {
	ops := []struct {
		name string
		body func(*testing.B, benchMap, *benchKeySet)
	}{{"mixed", benchMixed}, {"churn", benchChurn}}
	for _, sz := range []struct {
		name string
		n    int
	}{{"1K", 1 << 10}, {"4K", 1 << 12}} {
		ks := benchKeys(sz.n)
		for _, stripes := range []int{1, 2, 4, 16, 64} {
			tab := New[benchVal](WithCapacity(sz.n), WithSecret(benchSecret), WithLockStripes(stripes))
			for _, i := range ks.fill {
				if err := tab.Insert(ks.keys[i], &ks.vals[i]); err != nil {
					b.Fatal(err)
				}
			}
			for _, op := range ops {
				b.Run(fmt.Sprintf("op=%s/n=%s/stripes=%d", op.name, sz.name, stripes), func(b *testing.B) {
					b.ReportAllocs()
					op.body(b, benchHash4{tab}, ks)
				})
			}
		}
	}
}

// BenchmarkAppendLookups measures lookup hits in bursts of 16 tuples, as a
// gateway that reads packets in bursts does: Table.AppendLookups
// (impl=hash4-batch) against a loop of Lookup (impl=hash4) and of xsync's
// Load (impl=xsync). Time per op is per tuple.
func BenchmarkAppendLookups(b *testing.B) {
	const burst = 16
	for _, sz := range benchSizes {
		for _, impl := range []string{"hash4-batch", "hash4", "xsync"} {
			b.Run(fmt.Sprintf("n=%s/impl=%s", sz.name, impl), func(b *testing.B) {
				bi := benchImpls[slices.IndexFunc(benchImpls, func(bi benchImpl) bool {
					return bi.name == strings.TrimSuffix(impl, "-batch")
				})]
				m, ks := benchPrefilled(b, bi, sz.n, filledOnce)
				// One indirect call per burst; direct calls within it.
				var lookupBurst func(vals []*benchVal, tups []Tuple) []*benchVal
				switch m := m.(type) {
				case benchHash4:
					lookupBurst = func(vals []*benchVal, tups []Tuple) []*benchVal {
						if impl == "hash4-batch" {
							return m.t.AppendLookups(vals, tups)
						}
						for _, tup := range tups {
							v, _ := m.t.Lookup(tup)
							vals = append(vals, v)
						}
						return vals
					}
				case benchXsync:
					lookupBurst = func(vals []*benchVal, tups []Tuple) []*benchVal {
						for _, tup := range tups {
							v, _ := m.m.Load(tup)
							vals = append(vals, v)
						}
						return vals
					}
				}
				b.ResetTimer()
				var gid atomic.Uint64
				b.RunParallel(func(pb *testing.PB) {
					w, misses := newBenchWalk(&gid, ks), 0
					var tups [burst]Tuple
					vals := make([]*benchVal, 0, burst)
					for more := true; more; {
						n := 0
						for ; n < burst; n++ {
							if more = pb.Next(); !more {
								break
							}
							tups[n] = *w.next()
						}
						vals = lookupBurst(vals[:0], tups[:n])
						for _, v := range vals {
							if v == nil {
								misses++
							}
						}
					}
					if misses > 0 {
						b.Errorf("%d lookups of present keys missed", misses)
					}
				})
			})
		}
	}
}

// benchSink takes benchmark results that must not be optimized away.
var benchSink uint32

// BenchmarkHashTuple measures HashTuple per address family and hasher.
func BenchmarkHashTuple(b *testing.B) {
	for _, fam := range []struct {
		name string
		v4   bool
	}{{"ipv4", true}, {"ipv6", false}} {
		const nkeys = 1024
		r := rand.New(rand.NewPCG(2, 0))
		keys := make([]Tuple, nkeys)
		for i := range keys {
			keys[i] = benchTuple(r, i, fam.v4)
		}
		for _, h := range []Hasher{LinuxHasher, XXH3Hasher} {
			b.Run(fmt.Sprintf("family=%s/hasher=%s", fam.name, h), func(b *testing.B) {
				b.ReportAllocs()
				var sum uint32
				for i := 0; b.Loop(); i++ {
					sum += HashTuple(keys[i&(nkeys-1)], h, benchSecret)
				}
				benchSink = sum
			})
		}
	}
}

// BenchmarkChurnSharing measures what sharing a table between goroutines
// costs in churn: every goroutine churns either one table (tables=shared)
// or a table of its own that holds the same keys (tables=own). Both do the
// same work per op; the difference is cache lines that move between the
// cores writing them. At 1M, tables=own is also churn with no line to pass.
func BenchmarkChurnSharing(b *testing.B) {
	for _, sz := range benchSizes {
		ks := benchKeys(sz.n)
		for _, impl := range benchImpls {
			if impl.name != "hash4" && impl.name != "xsync" {
				continue
			}
			for _, shared := range []bool{true, false} {
				name := map[bool]string{true: "shared", false: "own"}[shared]
				b.Run(fmt.Sprintf("n=%s/impl=%s/tables=%s", sz.name, impl.name, name), func(b *testing.B) {
					benchChurnTables(b, impl, ks, shared)
				})
			}
		}
	}
}

// benchChurnTables runs BenchmarkChurnSharing's churn of the keys of ks in
// one table shared by every goroutine or in a table per goroutine.
func benchChurnTables(b *testing.B, impl benchImpl, ks *benchKeySet, shared bool) {
	maps := make([]benchMap, runtime.GOMAXPROCS(0))
	for g := range maps {
		if g > 0 && shared {
			maps[g] = maps[0]
			continue
		}
		maps[g] = impl.new(len(ks.keys))
		for _, i := range ks.fill {
			maps[g].Insert(ks.keys[i], &ks.vals[i])
		}
	}
	runtime.GC()
	b.ResetTimer()
	var gid atomic.Uint64
	b.RunParallel(func(pb *testing.PB) {
		w := newBenchWalk(&gid, ks)
		// N.B. the walk's own number, not gid.Load(): both goroutines
		// may load gid after both have added to it, and then churn one
		// table of the own ones.
		m := maps[(w.g-1)%uint64(len(maps))]
		for pb.Next() {
			k := w.next()
			if v, ok := m.Delete(*k); ok {
				m.Insert(*k, v)
			}
		}
	})
}

// BenchmarkGrow measures Table.Grow of a table of n buckets holding n
// entries to 2n buckets, with nothing else running: time per Grow, and per
// entry moved (see BenchmarkGrowWriterWait for what writers wait). The tables are filled with the timer
// stopped, up to 64 at a time, as stopping the timer reads the memory
// statistics, which costs more than a Grow of a small table.
func BenchmarkGrow(b *testing.B) {
	for _, sz := range benchSizes {
		b.Run("n="+sz.name, func(b *testing.B) {
			ks := benchKeys(sz.n)
			batch := max(1, min(64, (1<<16)/sz.n))
			var tabs []*Table[benchVal]
			for i := 0; i < b.N; i++ {
				if len(tabs) == 0 {
					b.StopTimer()
					for range min(batch, b.N-i) {
						tab := New[benchVal](WithCapacity(sz.n), WithSecret(benchSecret))
						for _, j := range ks.fill {
							if err := tab.Insert(ks.keys[j], &ks.vals[j]); err != nil {
								b.Fatal(err)
							}
						}
						tabs = append(tabs, tab)
					}
					b.StartTimer()
				}
				if err := tabs[len(tabs)-1].Grow(2 * sz.n); err != nil {
					b.Fatal(err)
				}
				tabs[len(tabs)-1] = nil
				tabs = tabs[:len(tabs)-1]
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(sz.n), "ns/entry")
		})
	}
}

// BenchmarkGrowWriterWait measures what writers wait for while Grow
// doubles a table of n buckets holding n entries: a goroutine deletes and
// reinserts entries throughout, and the benchmark reports the longest write
// that overlapped each Grow (max-write-µs, the mean over Grows) and the
// writes that overlapped it (writes/grow). The time per op is that of the
// Grow alone; the tables are filled with the timer stopped.
func BenchmarkGrowWriterWait(b *testing.B) {
	for _, sz := range benchSizes {
		b.Run("n="+sz.name, func(b *testing.B) {
			ks := benchKeys(sz.n)
			var worstSum time.Duration
			var writes int
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				tab := New[benchVal](WithCapacity(sz.n), WithSecret(benchSecret))
				for _, j := range ks.fill {
					if err := tab.Insert(ks.keys[j], &ks.vals[j]); err != nil {
						b.Fatal(err)
					}
				}
				var growing, stop atomic.Bool
				var worst time.Duration
				var n int
				started, done := make(chan struct{}), make(chan struct{})
				go func() {
					defer close(done)
					r := rand.New(rand.NewPCG(uint64(i), 7))
					for first := true; !stop.Load(); first = false {
						if first {
							close(started)
						}
						k := &ks.keys[ks.fill[r.IntN(len(ks.fill))]]
						during := growing.Load()
						t0 := time.Now()
						if v, ok := tab.Delete(*k); ok {
							if err := tab.Insert(*k, v); err != nil {
								panic(err)
							}
						}
						d := time.Since(t0)
						if during || growing.Load() {
							worst = max(worst, d)
							n++
						}
					}
				}()
				<-started
				growing.Store(true)
				b.StartTimer()
				if err := tab.Grow(2 * sz.n); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				growing.Store(false)
				stop.Store(true)
				<-done
				worstSum += worst
				writes += n
			}
			b.ReportMetric(float64(worstSum.Microseconds())/float64(b.N), "max-write-µs")
			b.ReportMetric(float64(writes)/float64(b.N), "writes/grow")
		})
	}
}
