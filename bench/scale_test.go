package bench

// BenchmarkScale fills each implementation, made without a size, with n
// flows (half IPv4, half IPv6) from GOMAXPROCS goroutines, as a gateway
// fills its table in the first minutes after a restart, and then, right
// after the last insert (whatever growth is still running), looks up
// uniformly random flows from as many goroutines; last, it removes every
// flow in one sweep (hash4's DeleteFunc, the others' Range and Delete). It
// reports each phase's cost: ns/insert, ns/lookup, and the sweep's ns per
// flow. Run it once per implementation, each in a process of its own:
//
//	for impl in hash4 xsync rwmutex syncmap; do
//		go test -run '^$' -bench "^BenchmarkScale$/n=10M/impl=$impl$" -benchtime 1x ./bench
//	done

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hash4/hash4"
	"github.com/hash4/hash4/internal/benchkit"
	"github.com/puzpuzpuz/xsync/v4"
)

// scaleMap is an implementation of BenchmarkScale, keyed by K.
type scaleMap[K comparable] interface {
	insert(k *K, v *benchVal)
	lookup(k *K) *benchVal
	sweep() int // removes every flow, returns how many
}

type scaleHash4 struct{ t *hash4.Table[benchVal] }

func (m scaleHash4) insert(k *Tuple, v *benchVal) {
	if err := m.t.Insert(*k, v); err != nil {
		panic(err)
	}
}
func (m scaleHash4) lookup(k *Tuple) *benchVal { v, _ := m.t.Lookup(*k); return v }
func (m scaleHash4) sweep() int {
	return m.t.DeleteFunc(func(Tuple, *benchVal) bool { return true })
}

type scaleXsync struct {
	m *xsync.Map[flowKey, *benchVal]
}

func (m scaleXsync) insert(k *flowKey, v *benchVal) { m.m.Store(*k, v) }
func (m scaleXsync) lookup(k *flowKey) *benchVal    { v, _ := m.m.Load(*k); return v }
func (m scaleXsync) sweep() int {
	n := 0
	m.m.Range(func(k flowKey, _ *benchVal) bool {
		m.m.Delete(k)
		n++
		return true
	})
	return n
}

type scaleRWMap struct{ flowRWMap }

func (m *scaleRWMap) sweep() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := len(m.m)
	for k := range m.m {
		delete(m.m, k)
	}
	return n
}

type scaleSyncMap struct{ flowSyncMap }

func (m *scaleSyncMap) sweep() int {
	n := 0
	m.m.Range(func(k, _ any) bool {
		m.m.Delete(k)
		n++
		return true
	})
	return n
}

// BenchmarkScale measures a fill from empty, the lookups right after it
// and a sweep, at 10M flows (see the top of the file).
func BenchmarkScale(b *testing.B) {
	n := scaleN
	run := func(name string, f func(b *testing.B)) {
		b.Run(fmt.Sprintf("n=10M/impl=%s", name), f)
	}
	run("hash4", func(b *testing.B) {
		scaleRun(b, n, func(t Tuple) Tuple { return t }, func() scaleMap[Tuple] {
			return scaleHash4{hash4.New[benchVal]()}
		})
	})
	// For scale: hash4 made for n flows, and grown by itself with its
	// arrays advised for huge pages.
	run("hash4-sized", func(b *testing.B) {
		scaleRun(b, n, func(t Tuple) Tuple { return t }, func() scaleMap[Tuple] {
			return scaleHash4{hash4.New[benchVal](hash4.WithCapacity(n))}
		})
	})
	run("hash4-hugepages", func(b *testing.B) {
		scaleRun(b, n, func(t Tuple) Tuple { return t }, func() scaleMap[Tuple] {
			return scaleHash4{hash4.New[benchVal](hash4.WithHugePages())}
		})
	})
	run("xsync", func(b *testing.B) {
		scaleRun(b, n, flowKeyOf, func() scaleMap[flowKey] {
			return scaleXsync{xsync.NewMap[flowKey, *benchVal]()}
		})
	})
	run("rwmutex", func(b *testing.B) {
		scaleRun(b, n, flowKeyOf, func() scaleMap[flowKey] {
			return &scaleRWMap{flowRWMap{m: map[flowKey]*benchVal{}}}
		})
	})
	run("syncmap", func(b *testing.B) {
		scaleRun(b, n, flowKeyOf, func() scaleMap[flowKey] { return new(scaleSyncMap) })
	})
}

// scaleRun runs BenchmarkScale's phases on an implementation made by mk,
// keyed by K (conv converts a Tuple). Every b.N runs them all once.
func scaleRun[K comparable](b *testing.B, n int, conv func(Tuple) K, mk func() scaleMap[K]) {
	procs := runtime.GOMAXPROCS(0)
	r := rand.New(rand.NewPCG(53, uint64(n)))
	keys := make([]K, n)
	for i := range keys {
		keys[i] = conv(benchkit.Key[Tuple](r, i, i%2 == 0))
	}
	order := r.Perm(n) // the fill's order, unrelated to the lookups'
	lookups := 2 * n
	var v benchVal
	var insert, lookup, sweep time.Duration
	for range b.N {
		b.StopTimer()
		runtime.GC()
		m := mk()
		b.StartTimer()
		start := time.Now()
		var wg sync.WaitGroup
		for g := range procs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := g; i < n; i += procs {
					m.insert(&keys[order[i]], &v)
				}
			}()
		}
		wg.Wait()
		insert += time.Since(start)
		start = time.Now()
		var missed atomic.Int64
		for g := range procs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := benchkit.Rand(uint64(g)*0x9e3779b97f4a7c15 + 7)
				for range lookups / procs {
					if m.lookup(&keys[(rng.Next()>>32)*uint64(n)>>32]) == nil {
						missed.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		lookup += time.Since(start)
		if missed.Load() > 0 {
			b.Fatalf("%d lookups of present flows missed", missed.Load())
		}
		start = time.Now()
		if got := m.sweep(); got != n {
			b.Fatalf("the sweep removed %d flows of %d", got, n)
		}
		sweep += time.Since(start)
	}
	b.ReportMetric(float64(insert.Nanoseconds())/float64(b.N*n), "ns/insert")
	b.ReportMetric(float64(lookup.Nanoseconds())/float64(b.N*lookups), "ns/lookup")
	b.ReportMetric(float64(sweep.Nanoseconds())/float64(b.N*n), "ns/flow-swept")
	b.ReportMetric(0, "ns/op")
}

// scaleN is BenchmarkScale's flow count: 10M, or what -scale.n says (the
// benchmarks' names say 10M whatever it is).
var scaleN = 10_000_000

func init() { flag.IntVar(&scaleN, "scale.n", scaleN, "flows of BenchmarkScale") }
