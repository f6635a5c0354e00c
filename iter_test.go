package hash4

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestTableAllExactlyOnce(t *testing.T) {
	tab := New[int](WithFixedBuckets(), WithCapacity(16))
	want := map[Tuple]*int{}
	for i := range 300 {
		k := tblKey(i, i%3 == 0)
		v := valPtr(i)
		if i%5 == 0 {
			require.NoError(t, tab.Insert(tblMapped(k), v)) // v4 as mapped, v6 unchanged
		} else {
			require.NoError(t, tab.Insert(k, v))
		}
		want[k] = v
	}
	got := tblCollect(t, tab)
	require.Len(t, got, len(want))
	for k, v := range want {
		require.Same(t, v, got[k], k)
	}
}

func TestTableAllEarlyBreak(t *testing.T) {
	tab := New[int](WithFixedBuckets(), WithCapacity(16))
	for i := range 50 {
		require.NoError(t, tab.Insert(tblKey(i, false), valPtr(i)))
	}
	for _, stop := range []int{1, 2, 3, 17, 49, 50} {
		n := 0
		for range tab.All() {
			n++
			if n == stop {
				break
			}
		}
		require.Equal(t, stop, n)
		// No lock is left held: the single stripe still takes writes.
		k := tblKey(1000, false)
		require.NoError(t, tab.Insert(k, valPtr(0)))
		_, ok := tab.Delete(k)
		require.True(t, ok)
	}
	n := 0
	tab.All()(func(Tuple, *int) bool { n++; return false })
	require.Equal(t, 1, n, "the iterator stops when yield returns false")
}

// tblNoDeadlock runs f and fails if it does not return within a generous
// time.
func tblNoDeadlock(t *testing.T, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("deadlock: the call did not return within 30 s")
	}
}

func TestTableAllBodyMayWrite(t *testing.T) {
	tab := New[int](WithFixedBuckets(), WithCapacity(16))
	orig := map[Tuple]*int{}
	for i := range 64 {
		k := tblKey(i, i%2 == 0)
		orig[k] = valPtr(i)
		require.NoError(t, tab.Insert(k, orig[k]))
	}
	added := map[Tuple]*int{}
	seen := map[Tuple]int{}
	var errs []error
	tblNoDeadlock(t, func() {
		i := 0
		for tup, v := range tab.All() {
			seen[tup]++
			if o, ok := orig[tup]; ok {
				if v != o {
					errs = append(errs, fmt.Errorf("%v: value %p, want %p", tup, v, o))
				}
				if d, ok := tab.Delete(tup); !ok || d != o {
					errs = append(errs, fmt.Errorf("delete %v in body: %p %v", tup, d, ok))
				}
			} else if a, ok := added[tup]; !ok || a != v {
				errs = append(errs, fmt.Errorf("yielded unknown %v", tup))
			}
			// Insert, look up, count and iterate from inside the body.
			k := tblKey(10000+i, i%2 == 1)
			i++
			added[k] = valPtr(-i)
			if err := tab.Insert(k, added[k]); err != nil {
				errs = append(errs, err)
			}
			if _, ok := tab.Lookup(k); !ok {
				errs = append(errs, fmt.Errorf("lookup %v in body", k))
			}
			_ = tab.Len()
			_ = tab.Stats()
			for range tab.All() {
				break
			}
		}
	})
	require.Empty(t, errs)
	for k := range orig {
		require.Equal(t, 1, seen[k], "original %v yielded %d times", k, seen[k])
		_, ok := tab.Lookup(k)
		require.False(t, ok)
	}
	for k, n := range seen {
		require.Equal(t, 1, n, k)
	}
	require.Equal(t, len(added), tab.Len())
	require.Equal(t, added, tblCollect(t, tab))
}

// TestTableAllWeaklyConsistent iterates while other goroutines insert and
// delete other keys: keys present for the whole iteration are yielded
// exactly once, and nothing is yielded twice or with a foreign value.
func TestTableAllWeaklyConsistent(t *testing.T) {
	type val struct{ tup Tuple }
	tab := New[val](WithFixedBuckets(), WithCapacity(32), WithSecret(tblSecret), WithHasher(LinuxHasher))
	const nPerm, nChurn = 200, 200
	perm := map[Tuple]*val{}
	for i := range nPerm {
		k := tblKey(i, i%2 == 0)
		perm[k] = &val{k}
		require.NoError(t, tab.Insert(k, perm[k]))
	}
	var stop atomic.Bool
	var churnOps atomic.Int64
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 42))
			present := make([]bool, nChurn)
			for !stop.Load() {
				j := r.IntN(nChurn/2)*2 + w // writer w owns keys j%2 == w
				k := tblKey(100000+j, j%3 == 0)
				if present[j] {
					if v, ok := tab.Delete(k); !ok || v.tup != k {
						t.Errorf("delete %v: %v %v", k, v, ok)
						return
					}
				} else if err := tab.Insert(k, &val{k}); err != nil {
					t.Errorf("insert %v: %v", k, err)
					return
				}
				present[j] = !present[j]
				churnOps.Add(1)
			}
		}()
	}
	iters := 100
	if testing.Short() {
		iters = 30
	}
	// N.B. the iterations go on past iters (bounded) until the writers
	// have churned: on a loaded machine they may not have run at all by
	// then.
	for i := 0; i < iters || churnOps.Load() == 0 && i < 100*iters; i++ {
		seen := map[Tuple]bool{}
		for tup, v := range tab.All() {
			require.False(t, seen[tup], "%v yielded twice", tup)
			seen[tup] = true
			require.Equal(t, tup, v.tup, "foreign value")
			if p, ok := perm[tup]; ok {
				require.Same(t, p, v)
			}
		}
		for k := range perm {
			require.True(t, seen[k], "permanent %v not yielded", k)
		}
	}
	stop.Store(true)
	wg.Wait()
	require.Positive(t, churnOps.Load())
}
