package benchkit

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"testing"
)

// Map is the adapter over the implementations compared. Insert is only
// called for absent keys.
type Map[K any] interface {
	Lookup(K) (*Val, bool)
	Insert(K, *Val)
	Delete(K) (*Val, bool)
}

// Impl is an implementation compared: its name in benchmark names, and
// how to make one sized for n keys.
type Impl[K any] struct {
	Name string
	New  func(n int) Map[K]
}

// Fill is how a benchmark's map came to hold its keys.
type Fill int

const (
	// FilledOnce is a map whose keys were inserted into it empty, in
	// KeySet.Fill order.
	FilledOnce Fill = iota
	// FilledByChurn is a map filled with n other keys, each of which was
	// then deleted, in random order, and replaced by one of the keys, as
	// flows come and go. Where an implementation places an entry by what
	// its bucket and neighbours hold when it is inserted (hash4's home
	// slots), this is the placement that churn leaves, rather than the one
	// a single fill makes.
	FilledByChurn
)

// filled is the one prefilled map kept between runs of a sub-benchmark;
// benchmarks leave it holding every key.
var filled struct {
	impl string
	n    int
	how  Fill
	m    any // a Map[K]
}

// Prefilled returns a map of impl holding all n keys of Keys(n), filled as
// how says, and the keys. The map is kept for the next call with the same
// arguments. It stops the timer while it builds one; the caller resets it.
func Prefilled[K Tuple](b *testing.B, impl Impl[K], n int, how Fill) (Map[K], *KeySet[K]) {
	b.StopTimer()
	defer b.StartTimer()
	ks := Keys[K](n)
	if m, ok := filled.m.(Map[K]); ok && filled.impl == impl.Name && filled.n == n && filled.how == how {
		return m, ks
	}
	filled.m = nil
	m := impl.New(n)
	if how == FilledByChurn {
		// Other keys: Key's peer address is unique per i, and ks.Keys has
		// i < n.
		r := rand.New(rand.NewPCG(2, uint64(n)))
		others := make([]K, n)
		for i := range others {
			others[i] = Key[K](r, n+i, i%2 == 0)
			m.Insert(others[i], &ks.Vals[i])
		}
		gone := r.Perm(n)
		for j, i := range ks.Fill {
			if _, ok := m.Delete(others[gone[j]]); !ok {
				b.Fatalf("%s lost key %v", impl.Name, others[gone[j]])
			}
			m.Insert(ks.Keys[i], &ks.Vals[i])
		}
	} else {
		for _, i := range ks.Fill {
			m.Insert(ks.Keys[i], &ks.Vals[i])
		}
	}
	filled.impl, filled.n, filled.how, filled.m = impl.Name, n, how, m
	runtime.GC() // the fill's garbage is not the benchmark's
	return m, ks
}

// Body is a benchmark's work on m, which holds the keys of ks.
type Body[K Tuple] func(b *testing.B, m Map[K], ks *KeySet[K])

// Each runs body as a sub-benchmark n=<size>/impl=<name> for every size of
// Sizes and implementation of impls, on a map filled as how says, reporting
// allocations if allocs is set.
func Each[K Tuple](b *testing.B, impls []Impl[K], allocs bool, how Fill, body Body[K]) {
	for _, sz := range Sizes {
		for _, impl := range impls {
			b.Run(fmt.Sprintf("n=%s/impl=%s", sz.Name, impl.Name), func(b *testing.B) {
				if allocs {
					b.ReportAllocs()
				}
				m, ks := Prefilled(b, impl, sz.N, how)
				b.ResetTimer()
				body(b, m, ks)
			})
		}
	}
}

// Walk is the order in which one RunParallel goroutine visits keys: each
// view in turn from start to end (see KeySet), starting in a view and at an
// offset of its own. No counter is shared between goroutines.
type Walk[K Tuple] struct {
	G    uint64 // the goroutine's number, from 1
	ks   *KeySet[K]
	view int
	cur  []K
	i    int
}

// NewWalk returns the walk of the next goroutine to call it; gid numbers
// them.
func NewWalk[K Tuple](gid *atomic.Uint64, ks *KeySet[K]) *Walk[K] {
	g := gid.Add(1)
	w := &Walk[K]{G: g, ks: ks, view: int(g % NumViews)}
	w.cur = ks.Views[w.view]
	w.i = rand.New(rand.NewPCG(g, 0x5eed)).IntN(len(w.cur))
	return w
}

// Next returns the next key to visit.
func (w *Walk[K]) Next() *K {
	k := &w.cur[w.i]
	if w.i++; w.i == len(w.cur) {
		w.i, w.view = 0, (w.view+1)%NumViews
		w.cur = w.ks.Views[w.view]
	}
	return k
}

// Lookups looks up the keys of ks in m, which holds them all, and fails b
// if any is missing.
func Lookups[K Tuple](b *testing.B, m Map[K], ks *KeySet[K]) {
	var gid atomic.Uint64
	b.RunParallel(func(pb *testing.PB) {
		w, misses := NewWalk(&gid, ks), 0
		for pb.Next() {
			if _, ok := m.Lookup(*w.Next()); !ok {
				misses++
			}
		}
		if misses > 0 {
			b.Errorf("%d lookups of present keys missed", misses)
		}
	})
}

// Mixed runs 90% lookups and 10% delete+insert of the same key (one op
// each), so that occupancy stays constant, on m, which holds the keys of
// ks.
func Mixed[K Tuple](b *testing.B, m Map[K], ks *KeySet[K]) {
	MixedParts(b, m, ks, true, true)
}

// MixedParts runs Mixed's walk on m, doing its lookups only if lookups is
// set and its delete+insert pairs only if churn is. A skipped op still
// counts as one, and costs its step of the walk: so the two parts' times,
// less once the time of the walk alone, add up to the whole's if the two
// kinds of op do not slow each other down.
func MixedParts[K Tuple](b *testing.B, m Map[K], ks *KeySet[K], lookups, churn bool) {
	var gid atomic.Uint64
	b.RunParallel(func(pb *testing.PB) {
		w, c := NewWalk(&gid, ks), 10
		for pb.Next() {
			k := w.Next()
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

// Churn runs delete+insert pairs (one op each) on m, which holds the keys
// of ks.
func Churn[K Tuple](b *testing.B, m Map[K], ks *KeySet[K]) {
	var gid atomic.Uint64
	b.RunParallel(func(pb *testing.PB) {
		w := NewWalk(&gid, ks)
		for pb.Next() {
			k := w.Next()
			if v, ok := m.Delete(*k); ok {
				m.Insert(*k, v)
			}
		}
	})
}
