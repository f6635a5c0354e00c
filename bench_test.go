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
// half IPv6, generated deterministically (see benchkit.Keys). Key sets are
// built once per size, and a prefilled map is kept for the run of one
// sub-benchmark (all its -count repetitions run back to back), so the cost of
// filling a 1M-entry map is paid once per sub-benchmark and outside the
// timer. The 1M key set holds 4 orders of 1M Tuples, about 256 MB.

import (
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/hash4/hash4/internal/benchkit"
)

// benchSecret fixes bucket placement so that runs are comparable.
var benchSecret = Secret{Ehash: 0x9e3779b9, Ehash6Addr: 0x7f4a7c15, Seed: 0x243f6a8885a308d3}

// benchVal, benchMap and benchKeySet are the harness's value, map adapter
// and key set (see package benchkit), keyed by Tuple.
type (
	benchVal    = benchkit.Val
	benchMap    = benchkit.Map[Tuple]
	benchKeySet = benchkit.KeySet[Tuple]
)

var benchImpls = []benchkit.Impl[Tuple]{
	{Name: "hash4", New: func(n int) benchMap {
		return benchHash4{New[benchVal](WithCapacity(n), WithSecret(benchSecret))}
	}},
	{Name: "syncmap", New: func(int) benchMap { return new(benchkit.SyncMap[Tuple]) }},
}

// benchHash4 is the adapter over Table.
type benchHash4 struct{ t *Table[benchVal] }

func (m benchHash4) Lookup(k Tuple) (*benchVal, bool) { return m.t.Lookup(k) }
func (m benchHash4) Delete(k Tuple) (*benchVal, bool) { return m.t.Delete(k) }
func (m benchHash4) Insert(k Tuple, v *benchVal) {
	if err := m.t.Insert(k, v); err != nil {
		panic(err)
	}
}

// benchEach runs body for every size of benchkit.Sizes and implementation
// of benchImpls, on a prefilled map, reporting allocations if allocs is
// set.
func benchEach(b *testing.B, allocs bool, body benchkit.Body[Tuple]) {
	benchkit.Each(b, benchImpls, allocs, benchkit.FilledOnce, body)
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
		body   benchkit.Body[Tuple]
	}{{"lookup", false, benchkit.Lookups[Tuple]}, {"mixed", true, benchkit.Mixed[Tuple]}, {"churn", true, benchkit.Churn[Tuple]}} {
		b.Run("op="+op.name, func(b *testing.B) { benchEach(b, op.allocs, op.body) })
	}
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
				keys := ks.Views[1]
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
			keys[i] = benchkit.Key[Tuple](r, i, fam.v4)
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
	for _, sz := range benchkit.Sizes {
		b.Run("n="+sz.Name, func(b *testing.B) {
			ks := benchkit.Keys[Tuple](sz.N)
			batch := max(1, min(64, (1<<16)/sz.N))
			var tabs []*Table[benchVal]
			for i := 0; i < b.N; i++ {
				if len(tabs) == 0 {
					b.StopTimer()
					for range min(batch, b.N-i) {
						tab := New[benchVal](WithCapacity(sz.N), WithSecret(benchSecret))
						for _, j := range ks.Fill {
							if err := tab.Insert(ks.Keys[j], &ks.Vals[j]); err != nil {
								b.Fatal(err)
							}
						}
						tabs = append(tabs, tab)
					}
					b.StartTimer()
				}
				if err := tabs[len(tabs)-1].Grow(2 * sz.N); err != nil {
					b.Fatal(err)
				}
				tabs[len(tabs)-1] = nil
				tabs = tabs[:len(tabs)-1]
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(sz.N), "ns/entry")
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
	for _, sz := range benchkit.Sizes {
		b.Run("n="+sz.Name, func(b *testing.B) {
			ks := benchkit.Keys[Tuple](sz.N)
			var worstSum time.Duration
			var writes int
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				tab := New[benchVal](WithCapacity(sz.N), WithSecret(benchSecret))
				for _, j := range ks.Fill {
					if err := tab.Insert(ks.Keys[j], &ks.Vals[j]); err != nil {
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
						k := &ks.Keys[ks.Fill[r.IntN(len(ks.Fill))]]
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
				if err := tab.Grow(2 * sz.N); err != nil {
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
