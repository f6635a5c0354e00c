package hash4

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestConnectFuncHeld: while f runs, its tuple is held: invisible to
// readers, refused to every other writer, not counted; it stays held
// through a Grow and a Compact; once f returns, it is live with f's value.
func TestConnectFuncHeld(t *testing.T) {
	tab := New[int](WithCapacity(16), WithSecret(connSecret))
	a := newTestAllocator(t)
	for i := range 40 { // entries to move about
		require.NoError(t, tab.Insert(tblKey(i, i%2 == 0), valPtr(i)))
	}
	v := valPtr(7)
	calls := 0
	tup, got, err := tab.ConnectFunc(a, connLocal, connDsts[0], func(tup Tuple) (*int, error) {
		calls++
		held := func(when string) {
			_, ok := tab.Lookup(tup)
			require.False(t, ok, when)
			require.Equal(t, []*int{nil}, tab.AppendLookups(nil, []Tuple{tup}), when)
			for k := range tab.All() {
				require.NotEqual(t, tup, k, when)
			}
			require.Equal(t, 40, tab.Len(), when)
			require.Equal(t, 41, tab.Stats().Entries, when)
			require.ErrorIs(t, tab.Insert(tup, valPtr(1)), ErrExists, when)
			require.ErrorIs(t, tab.Store(tup, valPtr(1)), ErrExists, when)
			_, _, err := tab.Swap(tup, valPtr(1))
			require.ErrorIs(t, err, ErrExists, when)
			_, _, err = tab.LookupOrInsert(tup, valPtr(1))
			require.ErrorIs(t, err, ErrExists, when)
			_, _, err = tab.Compute(tup, func(*int, bool) (*int, ComputeOp) { t.Fatal("f called"); return nil, CancelOp })
			require.ErrorIs(t, err, ErrExists, when)
			_, _, err = tab.LookupOrCompute(tup, func() (*int, error) { t.Fatal("f called"); return nil, nil })
			require.ErrorIs(t, err, ErrExists, when)
			_, ok = tab.Delete(tup)
			require.False(t, ok, when)
			require.False(t, tab.CompareAndDelete(tup, v), when)
			require.False(t, tab.CompareAndSwap(tup, v, v), when)
			require.Zero(t, tab.DeleteFunc(func(k Tuple, _ *int) bool { return k == tup }), when)
		}
		held("at first")
		require.NoError(t, tab.Grow(1024))
		held("after Grow")
		for i := range 40 { // free nodes, for Compact to gather
			tab.Delete(tblKey(i, i%2 == 0))
		}
		tab.Compact()
		tab.Clear()
		require.Zero(t, tab.Len())
		require.Equal(t, 1, tab.Stats().Entries, "Clear keeps the held tuple")
		_, ok := tab.Lookup(tup)
		require.False(t, ok)
		return v, nil
	})
	require.NoError(t, err)
	require.Equal(t, 1, calls)
	require.Same(t, v, got)
	found, ok := tab.Lookup(tup)
	require.True(t, ok)
	require.Same(t, v, found)
	require.Equal(t, 1, tab.Len())
	require.Equal(t, tcollect(tab), map[Tuple]*int{tup: v})
	require.Same(t, v, tab.AppendLookups(nil, []Tuple{tup})[0])
	old, ok := tab.Delete(tup)
	require.True(t, ok)
	require.Same(t, v, old)
	require.Zero(t, tab.Stats().Entries)
}

func tcollect(tab *Table[int]) map[Tuple]*int {
	m := map[Tuple]*int{}
	for k, v := range tab.All() {
		m[k] = v
	}
	return m
}

// TestConnectFuncRefused: ErrPortRefused moves ConnectFunc to the port
// Connect would pick were the refused one taken, exactly one port on;
// another error, a nil value or a panic ends it with nothing held.
func TestConnectFuncRefused(t *testing.T) {
	tab, twin := connTable(64), connTable(64)
	a, twinA := newTestAllocator(t), newTestAllocator(t)
	for round := range 5 {
		var offered []Tuple
		tup, _, err := tab.ConnectFunc(a, connLocal, connDsts[0], func(tup Tuple) (*int, error) {
			offered = append(offered, tup)
			if len(offered) == 1 {
				return nil, fmt.Errorf("bind %v: %w", tup.Local, ErrPortRefused)
			}
			return valPtr(round), nil
		})
		require.NoError(t, err)
		require.Len(t, offered, 2)
		require.Equal(t, offered[1], tup)
		_, ok := tab.Lookup(offered[0])
		require.False(t, ok, "a refused port is not kept")
		// The twin sees the refused port taken: its Connect picks the
		// port ConnectFunc was offered next.
		require.NoError(t, twin.Insert(offered[0], valPtr(-1)))
		got, err := twin.Connect(twinA, connLocal, connDsts[0], valPtr(round))
		require.NoError(t, err)
		require.Equal(t, tup, got, "round %d", round)
		twin.Delete(offered[0])
	}
	require.Equal(t, 5, tab.Len())

	fail := errors.New("socket failed")
	n := tab.Len()
	var first Tuple
	_, _, err := tab.ConnectFunc(a, connLocal, connDsts[1], func(tup Tuple) (*int, error) {
		first = tup
		return nil, fail
	})
	require.ErrorIs(t, err, fail)
	require.NotErrorIs(t, err, ErrNoPorts)
	_, _, err = tab.ConnectFunc(a, connLocal, connDsts[1], func(tup Tuple) (*int, error) {
		require.Equal(t, first, tup, "a failed ConnectFunc leaves its port free, the scan where it was")
		return nil, nil
	})
	require.ErrorIs(t, err, ErrNilValue)
	require.Panics(t, func() {
		_, _, _ = tab.ConnectFunc(a, connLocal, connDsts[1], func(Tuple) (*int, error) { panic("f") })
	})
	require.Equal(t, n, tab.Len())
	require.Equal(t, n, tab.Stats().Entries, "no reservation left")
	_, ok := tab.Lookup(first)
	require.False(t, ok)

	// Every port refused: ErrNoPorts, after one try of each.
	small := connTable(16)
	tries := 0
	_, _, err = small.ConnectFunc(a, connLocal, connDsts[0], func(Tuple) (*int, error) {
		tries++
		return nil, ErrPortRefused
	}, WithConnectRange(PortRange{40000, 40009}))
	require.ErrorIs(t, err, ErrNoPorts)
	require.ErrorContains(t, err, "(ports refused: 10)")
	require.Equal(t, 10, tries)
	require.Zero(t, small.Stats().Entries)

	_, _, err = tab.ConnectFunc(a, connLocal, connDsts[0], nil)
	require.ErrorIs(t, err, ErrNilValue)
	_, _, err = tab.ConnectFunc(nil, connLocal, connDsts[0], func(Tuple) (*int, error) { return valPtr(1), nil })
	require.ErrorIs(t, err, ErrNilAllocator)
}

// connFlow is a flow whose value records its tuple, written in
// ConnectFunc's f: readers that find the flow check that they see it.
type connFlow struct {
	tup   Tuple
	ready bool
}

// TestConnectFuncReaders runs ConnectFunc and Delete against Lookup,
// AppendLookups and All, while the table grows, compacts and clears: no
// reader ever finds a tuple before its f returned, nor a value without the
// fields f wrote, and f never finds its own tuple.
func TestConnectFuncReaders(t *testing.T) {
	tab := New[connFlow](WithCapacity(16), WithSecret(connSecret))
	a := newTestAllocator(t, WithPortRange(PortRange{20000, 29999}))
	const writers, readers, flows = 2, 2, 1500
	var offered [64]atomic.Pointer[Tuple] // tuples being set up
	var stop atomic.Bool
	var bad atomic.Int64
	var seen atomic.Int64
	check := func(v *connFlow, ok bool, tup Tuple, how string) {
		if !ok {
			return
		}
		seen.Add(1)
		if v == nil || !v.ready || tblCanon(tup) != v.tup {
			bad.Add(1)
			t.Errorf("%s: flow %v seen before its f returned: %+v", how, tup, v)
		}
	}
	var wg, ww, readersUp sync.WaitGroup
	readersUp.Add(readers)
	for w := range writers {
		ww.Add(1)
		go func() {
			defer ww.Done()
			// N.B. the readers run before the writers begin: on a
			// loaded machine the writers could otherwise be done first.
			readersUp.Wait()
			var mine []Tuple
			// N.B. a writer goes on past flows until a reader has
			// seen one: on a loaded machine the readers may not have
			// run at all by then, and a Clear after the writers are
			// done leaves them nothing to find.
			for i := 0; i < flows || seen.Load() == 0 && i < 100*flows; i++ {
				slot := &offered[(w*32+i)%len(offered)]
				tup, _, err := tab.ConnectFunc(a, connLocal, connDsts[w], func(tup Tuple) (*connFlow, error) {
					slot.Store(&tup)
					if _, ok := tab.Lookup(tup); ok {
						t.Errorf("f found its own tuple %v", tup)
					}
					runtime.Gosched() // let readers look meanwhile
					v := &connFlow{tup: tup}
					v.ready = true
					return v, nil
				})
				if err != nil {
					t.Error(err)
					return
				}
				if mine = append(mine, tup); len(mine) > 200 {
					tab.Delete(mine[0])
					mine = mine[1:]
				}
			}
		}()
	}
	for r := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var dst []*connFlow
			var tups []Tuple
			readersUp.Done()
			for i := 0; !stop.Load(); i++ {
				tups = tups[:0]
				for j := range offered {
					if p := offered[j].Load(); p != nil {
						v, ok := tab.Lookup(*p)
						check(v, ok, *p, "Lookup")
						tups = append(tups, *p)
					}
				}
				dst = tab.AppendLookups(dst[:0], tups)
				for j, v := range dst {
					check(v, v != nil, tups[j], "AppendLookups")
				}
				if i%8 == r {
					for tup, v := range tab.All() {
						check(v, true, tup, "All")
					}
				}
			}
		}()
	}
	wg.Add(1)
	go func() { // compaction and clearing while flows are set up
		defer wg.Done()
		for i := 0; !stop.Load(); i++ {
			runtime.Gosched()
			if i%50 == 0 {
				tab.Compact()
			}
			if i%400 == 399 {
				tab.Clear()
			}
		}
	}()
	ww.Wait()
	stop.Store(true)
	wg.Wait()
	tab.growers.Wait()
	require.Zero(t, bad.Load())
	require.Positive(t, seen.Load(), "the readers found no flow")
	require.Equal(t, tab.Len(), tab.Stats().Entries, "no reservation left")
}

// TestConnectFuncAllocs: a steady-state ConnectFunc and Delete allocate
// nothing, as Connect and Delete do.
func TestConnectFuncAllocs(t *testing.T) {
	tab := connTable(256)
	a := newTestAllocator(t)
	vals := []*int{valPtr(1), valPtr(2)}
	i := 0
	f := func(Tuple) (*int, error) { return vals[i%2], nil }
	op := func() {
		tup, _, err := tab.ConnectFunc(a, connLocal, connDsts[0], f)
		if err != nil {
			t.Fatal(err)
		}
		tab.Delete(tup)
		i++
	}
	for range 100 {
		op()
	}
	require.Zero(t, testing.AllocsPerRun(1000, op))
	require.Zero(t, tab.Len())
}
