package bench

// Benchmarks of Table against the usual Go concurrent maps, in the style of
// xsync and the sync package: every implementation side by side in one
// benchmark function, e.g. BenchmarkLookup/n=1M/impl=hash4. Compare them,
// from the repository's root, with
//
//	for i in 1 2 3 4 5 6; do
//		go test -run '^$' -bench '^Benchmark(Lookup|Mixed|Churn)$' -count 1 ./bench
//	done > bench.txt
//	benchstat -col /impl bench.txt
//
// Each run is a process of its own, so that every implementation's samples
// span the machine's changes of speed rather than fall in one of them.

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hash4/hash4"
	"github.com/hash4/hash4/internal/benchkit"
	"github.com/puzpuzpuz/xsync/v4"
)

// BenchmarkLookup measures lookup hits in a map filled once.
func BenchmarkLookup(b *testing.B) {
	benchkit.Each(b, benchImpls, false, benchkit.FilledOnce, benchkit.Lookups[Tuple])
}

// BenchmarkLookupChurned measures lookup hits in a map whose keys all came
// in through churn (benchkit.FilledByChurn).
func BenchmarkLookupChurned(b *testing.B) {
	benchkit.Each(b, benchImpls, false, benchkit.FilledByChurn, benchkit.Lookups[Tuple])
}

// BenchmarkMixed measures 90% lookups and 10% delete+insert of the same key
// (one op each), so that occupancy stays constant.
func BenchmarkMixed(b *testing.B) {
	benchkit.Each(b, benchImpls, true, benchkit.FilledOnce, benchkit.Mixed[Tuple])
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
			if impl.Name != "hash4" && impl.Name != "xsync" {
				continue
			}
			b.Run(fmt.Sprintf("n=1M/ops=%s/impl=%s", part.name, impl.Name), func(b *testing.B) {
				m, ks := benchkit.Prefilled(b, impl, 1<<20, benchkit.FilledOnce)
				b.ResetTimer()
				benchkit.MixedParts(b, m, ks, part.lookups, part.churn)
			})
		}
	}
}

// BenchmarkChurn measures delete+insert pairs (one op each) only.
func BenchmarkChurn(b *testing.B) {
	benchkit.Each(b, benchImpls, true, benchkit.FilledOnce, benchkit.Churn[Tuple])
}

// BenchmarkFill measures filling an empty map with n keys from GOMAXPROCS
// goroutines, each inserting a share of them, where every map is made
// without a size and grows as it fills: hash4 by itself (from New's 1024
// buckets), the others as they do; impl=hash4-sized is hash4 made for n
// entries, for scale. It reports the time per insert (ns/insert), which
// for hash4 includes the wait for its growth to end (see fillSettle).
func BenchmarkFill(b *testing.B) {
	newUnsized := func(int) benchMap {
		return benchHash4{hash4.New[benchVal](hash4.WithSecret(benchSecret))}
	}
	impls := []benchImpl{
		{Name: "hash4", New: newUnsized},
		{Name: "hash4-sized", New: benchImpls[0].New},
		{Name: "syncmap", New: func(int) benchMap { return new(benchkit.SyncMap[Tuple]) }},
		{Name: "xsync", New: func(int) benchMap { return benchXsync{xsync.NewMap[Tuple, *benchVal]()} }},
		{Name: "rwmutex", New: func(int) benchMap { return &benchRWMap{m: map[Tuple]*benchVal{}} }},
		{Name: "cmap", New: func(int) benchMap { return newBenchCmap() }},
	}
	for _, sz := range benchkit.Sizes {
		ks := benchkit.Keys[Tuple](sz.N)
		for _, impl := range impls {
			b.Run(fmt.Sprintf("n=%s/impl=%s", sz.Name, impl.Name), func(b *testing.B) {
				procs := runtime.GOMAXPROCS(0)
				settled := 0
				if impl.Name == "hash4" {
					b.StopTimer()
					m := newUnsized(sz.N).(benchHash4)
					fillFrom(m, ks, 1)
					settled = fillSettled(m.t)
					b.StartTimer()
				}
				for b.Loop() {
					m := impl.New(sz.N)
					fillFrom(m, ks, procs)
					if h, ok := m.(benchHash4); ok && settled > 0 {
						fillSettle(h.t, settled)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(sz.N), "ns/insert")
			})
		}
	}
}

// fillFrom inserts the keys of ks into m from procs goroutines, each a share.
func fillFrom(m benchMap, ks *benchKeySet, procs int) {
	var wg sync.WaitGroup
	wg.Add(procs)
	for g := range procs {
		go func() {
			defer wg.Done()
			for i := g; i < len(ks.Fill); i += procs {
				j := ks.Fill[i]
				m.Insert(ks.Keys[j], &ks.Vals[j])
			}
		}()
	}
	wg.Wait()
}

// fillSettled returns the bucket count of t, filled and growing by itself,
// once its growth has ended, waiting for that untimed. The count is the
// same in every fill of the same keys: the least at which no stripe is
// over its limit with every key in, as the counts only rise during a fill
// and a growth goes to the least count at which no stripe is over with
// the keys in so far.
func fillSettled(t *hash4.Table[benchVal]) int {
	for prev := 0; ; {
		time.Sleep(20 * time.Millisecond) // for a growth an insert started
		_ = t.Grow(0)                     // waits for a growth under way
		n := t.Stats().Buckets
		if n == prev {
			return n
		}
		prev = n
	}
}

// fillSettle waits for the growth of t, just filled, to end: until the
// table has its settled bucket count (fillSettled), published when the
// last growth began, and then, through Grow, which runs after the table's
// own growth, until that growth has moved every entry.
func fillSettle(t *hash4.Table[benchVal], settled int) {
	for t.Stats().Buckets < settled {
		runtime.Gosched()
	}
	_ = t.Grow(0)
}

// BenchmarkAppendLookups measures lookup hits in bursts of 16 tuples, as a
// gateway that reads packets in bursts does: Table.AppendLookups
// (impl=hash4-batch) against a loop of Lookup (impl=hash4) and of xsync's
// Load (impl=xsync). Time per op is per tuple.
func BenchmarkAppendLookups(b *testing.B) {
	const burst = 16
	for _, sz := range benchkit.Sizes {
		for _, impl := range []string{"hash4-batch", "hash4", "xsync"} {
			b.Run(fmt.Sprintf("n=%s/impl=%s", sz.Name, impl), func(b *testing.B) {
				bi := benchImpls[slices.IndexFunc(benchImpls, func(bi benchImpl) bool {
					return bi.Name == strings.TrimSuffix(impl, "-batch")
				})]
				m, ks := benchkit.Prefilled(b, bi, sz.N, benchkit.FilledOnce)
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
					w, misses := benchkit.NewWalk(&gid, ks), 0
					var tups [burst]Tuple
					vals := make([]*benchVal, 0, burst)
					for more := true; more; {
						n := 0
						for ; n < burst; n++ {
							if more = pb.Next(); !more {
								break
							}
							tups[n] = *w.Next()
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

// BenchmarkChurnSharing measures what sharing a table between goroutines
// costs in churn: every goroutine churns either one table (tables=shared)
// or a table of its own that holds the same keys (tables=own). Both do the
// same work per op; the difference is cache lines that move between the
// cores writing them. At 1M, tables=own is also churn with no line to pass.
func BenchmarkChurnSharing(b *testing.B) {
	for _, sz := range benchkit.Sizes {
		ks := benchkit.Keys[Tuple](sz.N)
		for _, impl := range benchImpls {
			if impl.Name != "hash4" && impl.Name != "xsync" {
				continue
			}
			for _, shared := range []bool{true, false} {
				name := map[bool]string{true: "shared", false: "own"}[shared]
				b.Run(fmt.Sprintf("n=%s/impl=%s/tables=%s", sz.Name, impl.Name, name), func(b *testing.B) {
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
		maps[g] = impl.New(len(ks.Keys))
		for _, i := range ks.Fill {
			maps[g].Insert(ks.Keys[i], &ks.Vals[i])
		}
	}
	runtime.GC()
	b.ResetTimer()
	var gid atomic.Uint64
	b.RunParallel(func(pb *testing.PB) {
		w := benchkit.NewWalk(&gid, ks)
		// N.B. the walk's own number, not gid.Load(): both goroutines
		// may load gid after both have added to it, and then churn one
		// table of the own ones.
		m := maps[(w.G-1)%uint64(len(maps))]
		for pb.Next() {
			k := w.Next()
			if v, ok := m.Delete(*k); ok {
				m.Insert(*k, v)
			}
		}
	})
}
