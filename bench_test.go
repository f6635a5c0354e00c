package hash4

// Benchmarks of Table on its own (growth, lock stripes, the hash, chained
// lookups, the machine's memory reads), and against sync.Map side by side
// (BenchmarkSyncMap). The comparisons with other Go concurrent maps (xsync,
// concurrent-map, a map behind a sync.RWMutex, and sync.Map), e.g.
// BenchmarkLookup/n=1M/impl=hash4, are in the module in bench/, whose
// requirements the library does not have; see bench/README.md. Run these
// with
//
//	go test -run '^$' -bench '^Benchmark(SyncMap|HashTuple)$' -count 6 . > bench.txt
//	benchstat -filter '.name:SyncMap' -col /impl bench.txt
//	benchstat -filter '.name:HashTuple' -col /hasher bench.txt
//
// (anchored: a bare 'Lookup' also matches other files' benchmarks).
//
// Every implementation gets the same keys: n distinct Tuples, half IPv4 and
// half IPv6, generated deterministically (see benchKeySet). Key sets are
// built once per size, and a prefilled map is kept for the run of one
// sub-benchmark (all its -count repetitions run back to back), so the cost of
// filling a 1M-entry map is paid once per sub-benchmark and outside the
// timer. The 1M key set holds 4 orders of 1M Tuples, about 256 MB.

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"
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
	m    benchMap
}

// benchPrefilled returns a map of impl holding all n keys, inserted into an
// empty map in ks.fill order, and the keys. It stops the timer while it
// builds one; the caller resets it.
func benchPrefilled(b *testing.B, impl benchImpl, n int) (benchMap, *benchKeySet) {
	b.StopTimer()
	defer b.StartTimer()
	ks := benchKeys(n)
	if benchFilled.m != nil && benchFilled.impl == impl.name && benchFilled.n == n {
		return benchFilled.m, ks
	}
	benchFilled.m = nil
	m := impl.new(n)
	for _, i := range ks.fill {
		m.Insert(ks.keys[i], &ks.vals[i])
	}
	benchFilled.impl, benchFilled.n, benchFilled.m = impl.name, n, m
	runtime.GC() // the fill's garbage is not the benchmark's
	return m, ks
}

// benchEach runs body for every size and implementation, on a prefilled
// map, reporting allocations if allocs is set.
func benchEach(b *testing.B, allocs bool, body func(b *testing.B, m benchMap, ks *benchKeySet)) {
	for _, sz := range benchSizes {
		for _, impl := range benchImpls {
			b.Run(fmt.Sprintf("n=%s/impl=%s", sz.name, impl.name), func(b *testing.B) {
				if allocs {
					b.ReportAllocs()
				}
				m, ks := benchPrefilled(b, impl, sz.n)
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

// BenchmarkSyncMap measures hash4 and sync.Map side by side, the one
// concurrent map of the standard library: lookup hits (op=lookup), 90%
// lookups and 10% delete+insert of the same key (op=mixed), and
// delete+insert pairs only (op=churn), as BenchmarkLookup, BenchmarkMixed
// and BenchmarkChurn in bench/ measure them against every other map, e.g.
// BenchmarkSyncMap/op=mixed/n=1M/impl=hash4.
func BenchmarkSyncMap(b *testing.B) {
	for _, op := range []struct {
		name   string
		allocs bool
		body   func(*testing.B, benchMap, *benchKeySet)
	}{{"lookup", false, benchLookups}, {"mixed", true, benchMixed}, {"churn", true, benchChurn}} {
		b.Run("op="+op.name, func(b *testing.B) { benchEach(b, op.allocs, op.body) })
	}
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
	benchEach(b, false, func(b *testing.B, m benchMap, ks *benchKeySet) {
		for _, chained := range []bool{false, true} {
			name := "deps=none"
			if chained {
				name = "deps=chained"
			}
			b.Run(name, func(b *testing.B) {
				keys := ks.views[1]
				i := 0
				for range b.N {
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
			for range b.N {
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
				for i := 0; i < b.N; i++ {
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

// benchMixed runs 90% lookups and 10% delete+insert of the same key (one
// op each), so that occupancy stays constant, on m, which holds the keys of
// ks.
func benchMixed(b *testing.B, m benchMap, ks *benchKeySet) {
	var gid atomic.Uint64
	b.RunParallel(func(pb *testing.PB) {
		w, c := newBenchWalk(&gid, ks), 10
		for pb.Next() {
			k := w.next()
			if c--; c == 0 {
				c = 10
				// Another goroutine may hold this key deleted for a
				// moment: reinsert only what this one removed.
				if v, ok := m.Delete(*k); ok {
					m.Insert(*k, v)
				}
			} else {
				m.Lookup(*k)
			}
		}
	})
}

// benchChurn runs delete+insert pairs (one op each) on m, which holds the
// keys of ks.
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
				for i := 0; i < b.N; i++ {
					sum += HashTuple(keys[i&(nkeys-1)], h, benchSecret)
				}
				benchSink = sum
			})
		}
	}
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
