package hash4

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestStoreSwap(t *testing.T) {
	tab := New[int](WithSecret(tblSecret))
	k := tblTuple("10.0.0.1:1000", "10.0.0.2:80")
	v1, v2, v3 := valPtr(1), valPtr(2), valPtr(3)
	require.NoError(t, tab.Store(k, v1))
	got, ok := tab.Lookup(tblMapped(k))
	require.True(t, ok)
	require.Same(t, v1, got)
	require.NoError(t, tab.Store(tblMapped(k), v2))
	got, _ = tab.Lookup(k)
	require.Same(t, v2, got)
	old, loaded, err := tab.Swap(k, v3)
	require.NoError(t, err)
	require.True(t, loaded)
	require.Same(t, v2, old)
	old, loaded, err = tab.Swap(tblTuple("10.0.0.1:1001", "10.0.0.2:80"), v1)
	require.NoError(t, err)
	require.False(t, loaded)
	require.Nil(t, old)
	require.Equal(t, 2, tab.Len())

	require.ErrorIs(t, tab.Store(k, nil), ErrNilValue)
	require.ErrorIs(t, tab.Store(tblTuple("10.0.0.1:0", "10.0.0.2:80"), v1), ErrInvalidTuple)
	_, loaded, err = tab.Swap(Tuple{}, v1)
	require.ErrorIs(t, err, ErrInvalidAddr)
	require.False(t, loaded)
	got, _ = tab.Lookup(k)
	require.Same(t, v3, got, "bad input changes nothing")
	require.Equal(t, 2, tab.Len())
}

func TestCompute(t *testing.T) {
	tab := New[int](WithSecret(tblSecret))
	k := tblTuple("10.0.0.1:1000", "10.0.0.2:80")
	incr := func(old *int, loaded bool) (*int, ComputeOp) {
		if !loaded {
			return valPtr(1), UpdateOp
		}
		return valPtr(*old + 1), UpdateOp
	}
	for want := 1; want <= 3; want++ {
		v, ok, err := tab.Compute(k, incr)
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, want, *v)
	}
	cur, _ := tab.Lookup(k)
	v, ok, err := tab.Compute(k, func(old *int, loaded bool) (*int, ComputeOp) {
		require.True(t, loaded)
		return valPtr(99), CancelOp
	})
	require.NoError(t, err)
	require.True(t, ok)
	require.Same(t, cur, v, "CancelOp keeps the value")

	_, _, err = tab.Compute(k, func(*int, bool) (*int, ComputeOp) { return nil, UpdateOp })
	require.ErrorIs(t, err, ErrNilValue)
	_, _, err = tab.Compute(k, func(*int, bool) (*int, ComputeOp) { return valPtr(1), 7 })
	require.ErrorContains(t, err, "unknown ComputeOp 7")
	got, _ := tab.Lookup(k)
	require.Same(t, cur, got, "errors change nothing")

	v, ok, err = tab.Compute(k, func(*int, bool) (*int, ComputeOp) { return nil, DeleteOp })
	require.NoError(t, err)
	require.False(t, ok)
	require.Nil(t, v)
	require.Zero(t, tab.Len())
	v, ok, err = tab.Compute(k, func(old *int, loaded bool) (*int, ComputeOp) {
		require.False(t, loaded)
		require.Nil(t, old)
		return nil, CancelOp
	})
	require.NoError(t, err)
	require.False(t, ok)
	require.Nil(t, v)
	require.Zero(t, tab.Len())

	// A panic in f leaves the stripe unlocked.
	require.Panics(t, func() {
		_, _, _ = tab.Compute(k, func(*int, bool) (*int, ComputeOp) { panic("f") })
	})
	require.NoError(t, tab.Insert(k, valPtr(5)))

	_, _, err = tab.Compute(Tuple{}, incr)
	require.ErrorIs(t, err, ErrInvalidTuple)
}

// TestComputeConcurrent: increments by Compute from several goroutines on
// a few tuples lose none.
func TestComputeConcurrent(t *testing.T) {
	tab := New[int](WithCapacity(16))
	keys := []Tuple{tblTuple("10.0.0.1:1000", "10.0.0.2:80"), tblTuple("10.0.0.1:1001", "10.0.0.2:80")}
	const workers, rounds = 4, 500
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				_, _, err := tab.Compute(keys[(w+i)%2], func(old *int, loaded bool) (*int, ComputeOp) {
					if !loaded {
						return valPtr(1), UpdateOp
					}
					return valPtr(*old + 1), UpdateOp
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	sum := 0
	for _, v := range tab.All() {
		sum += *v
	}
	require.Equal(t, workers*rounds, sum)
}

func TestLookupOrCompute(t *testing.T) {
	tab := New[int](WithSecret(tblSecret))
	k := tblTuple("10.0.0.1:1000", "10.0.0.2:80")
	fail := errors.New("no")
	v, loaded, err := tab.LookupOrCompute(k, func() (*int, error) { return nil, fail })
	require.ErrorIs(t, err, fail)
	require.False(t, loaded)
	require.Nil(t, v)
	_, loaded, err = tab.LookupOrCompute(k, func() (*int, error) { return nil, nil })
	require.ErrorIs(t, err, ErrNilValue)
	require.False(t, loaded)
	require.Zero(t, tab.Len())

	// Concurrent callers for one absent tuple: f runs once, all get its
	// value, exactly one of them with loaded = false.
	var calls, built atomic.Int32
	const n = 8
	got := make([]*int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, loaded, err := tab.LookupOrCompute(k, func() (*int, error) {
				calls.Add(1)
				return valPtr(42), nil
			})
			if err != nil {
				t.Error(err)
			}
			if !loaded {
				built.Add(1)
			}
			got[i] = v
		}()
	}
	wg.Wait()
	require.Equal(t, int32(1), calls.Load())
	require.Equal(t, int32(1), built.Load())
	for _, v := range got {
		require.Same(t, got[0], v)
	}
	require.Equal(t, 1, tab.Len())
	_, _, err = tab.LookupOrCompute(Tuple{}, func() (*int, error) { t.Fatal("f called for bad input"); return nil, nil })
	require.ErrorIs(t, err, ErrInvalidTuple)
}

func TestDeleteFuncClear(t *testing.T) {
	tab := New[int](WithCapacity(16), WithSecret(tblSecret))
	const n = 300 // the table grows meanwhile
	for i := range n {
		require.NoError(t, tab.Insert(tblKey(i, i%3 == 0), valPtr(i)))
	}
	seen := 0
	deleted := tab.DeleteFunc(func(tup Tuple, v *int) bool {
		seen++
		require.Equal(t, tblCanon(tblKey(*v, *v%3 == 0)), tup)
		return *v%2 == 0
	})
	require.Equal(t, n, seen)
	require.Equal(t, n/2, deleted)
	require.Equal(t, n/2, tab.Len())
	for i := range n {
		_, ok := tab.Lookup(tblKey(i, i%3 == 0))
		require.Equal(t, i%2 == 1, ok, i)
	}
	// A value replaced after f saw it stays.
	k := tblKey(1, false)
	newer := valPtr(1)
	require.Zero(t, tab.DeleteFunc(func(tup Tuple, v *int) bool {
		if *v == 1 {
			require.True(t, tab.CompareAndSwap(k, v, newer))
			return true
		}
		return false
	}))
	got, _ := tab.Lookup(k)
	require.Same(t, newer, got)

	tab.Clear()
	require.Zero(t, tab.Len())
	require.Zero(t, tab.Stats().Entries)
	for range tab.All() {
		t.Fatal("an entry after Clear")
	}
	require.NoError(t, tab.Insert(k, valPtr(1)), "a cleared table takes entries")
	require.Equal(t, 1, tab.Len())
}

// TestReaperRace runs reapers, over All with CompareAndDelete and over
// DeleteFunc, while flows are created (by LookupOrCompute and ConnectFunc),
// touched and cleared, for the race detector; every flow a reaper deletes
// was expired when it was deleted.
func TestReaperRace(t *testing.T) {
	type flow struct{ expired atomic.Bool }
	tab := New[flow](WithCapacity(16))
	var wg sync.WaitGroup
	var stop atomic.Bool
	var created, reaped atomic.Int64
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				k := tblKey(w<<20|i%1000, i%2 == 0)
				if _, loaded, err := tab.LookupOrCompute(k, func() (*flow, error) { return new(flow), nil }); err == nil && !loaded {
					created.Add(1)
				}
				if f, ok := tab.Lookup(tblKey(w<<20|(i/2)%1000, i%2 == 0)); ok {
					f.expired.Store(true)
				}
			}
		}()
	}
	// Flows set up by ConnectFunc, expired at once.
	a := newTestAllocator(t)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			_, _, err := tab.ConnectFunc(a, connLocal, connDsts[0], func(Tuple) (*flow, error) {
				f := new(flow)
				f.expired.Store(true)
				return f, nil
			}, WithConnectRange(PortRange{40000, 40999}))
			if err == nil {
				created.Add(1)
			} else if !errors.Is(err, ErrNoPorts) {
				t.Error(err)
				return
			}
		}
	}()
	reap := func(tup Tuple, f *flow) bool {
		if !f.expired.Load() {
			return false
		}
		reaped.Add(1)
		return true
	}
	// Rounds until both reapers have deleted flows (or a bound), since
	// the writers may start late.
	// N.B. while none has, the rounds go on past that bound, to a
	// generous one: on a loaded or emulated machine the writers may not
	// have run within the first.
	deadline, last := time.Now().Add(5*time.Second), time.Now().Add(30*time.Second)
	for round := 0; round < 5 || reaped.Load() < 100 && time.Now().Before(deadline) ||
		reaped.Load() == 0 && time.Now().Before(last); round++ {
		runtime.Gosched()
		tab.DeleteFunc(reap)
		for tup, f := range tab.All() {
			if f.expired.Load() && tab.CompareAndDelete(tup, f) {
				reaped.Add(1)
			}
		}
	}
	stop.Store(true)
	wg.Wait()
	require.Positive(t, created.Load())
	require.Positive(t, reaped.Load())
	tab.Clear()
	require.Zero(t, tab.Len())
	tab.growers.Wait()
}

// TestUpdateAllocs: steady-state Store, Swap and Compute allocate nothing.
func TestUpdateAllocs(t *testing.T) {
	tab := New[int](WithFixedBuckets(), WithCapacity(256))
	keys := make([]Tuple, 64)
	vals := make([]*int, len(keys))
	for i := range keys {
		keys[i] = tblKey(i, i%2 == 1)
		vals[i] = valPtr(i)
	}
	i := 0
	update := func(old *int, loaded bool) (*int, ComputeOp) { return vals[i%len(vals)], UpdateOp }
	for name, op := range map[string]func(){
		"Store": func() { _ = tab.Store(keys[i%len(keys)], vals[(i+1)%len(vals)]) },
		"Swap":  func() { _, _, _ = tab.Swap(keys[i%len(keys)], vals[(i+2)%len(vals)]) },
		"Compute": func() {
			_, _, _ = tab.Compute(keys[i%len(keys)], update)
		},
		"Store after Delete": func() {
			tab.Delete(keys[i%len(keys)])
			_ = tab.Store(keys[i%len(keys)], vals[i%len(vals)])
		},
	} {
		for range 2 * len(keys) { // warm
			op()
			i++
		}
		allocs := testing.AllocsPerRun(1000, func() { op(); i++ })
		require.Zero(t, allocs, name)
		require.Equal(t, len(keys), tab.Len(), name)
	}
}
