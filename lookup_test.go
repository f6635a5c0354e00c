package hash4

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// tblCheckAppendLookups checks AppendLookups against Lookup on tab, over
// batches of every length up to 3*lookupBatch+1 drawn from keys (present
// and absent ones, in several spellings) and the invalid tuples: every
// answer is Lookup's, in order, after dst's own values, which stay. It
// returns the number of answers that found a value.
func tblCheckAppendLookups(t *testing.T, tab *Table[int], keys []Tuple, r *rand.Rand) (found int) {
	t.Helper()
	pool := append(slices.Clone(keys), tblFuzzInvalid...)
	for _, k := range keys {
		if k.Local.Addr().Is4() {
			mapped := k
			mapped.Local = netip.AddrPortFrom(netip.AddrFrom16(k.Local.Addr().As16()), k.Local.Port())
			pool = append(pool, mapped)
		}
	}
	prefix := []*int{valPtr(-1), nil, valPtr(-2)}
	for n := range 3*lookupBatch + 2 {
		for range 20 {
			tups := make([]Tuple, n)
			for i := range tups {
				tups[i] = pool[r.IntN(len(pool))]
			}
			got := tab.AppendLookups(slices.Clone(prefix), tups)
			require.Len(t, got, len(prefix)+n)
			for i, p := range prefix {
				require.Same(t, p, got[i], "dst's own value %d", i)
			}
			for i, tup := range tups {
				want, ok := tab.Lookup(tup)
				if !ok {
					require.Nil(t, got[len(prefix)+i], "%v, %d of %d", tup, i, n)
					continue
				}
				require.Same(t, want, got[len(prefix)+i], "%v, %d of %d", tup, i, n)
				found++
			}
		}
	}
	return found
}

// TestTableAppendLookups checks AppendLookups against Lookup, on a table
// whose keys are in its lines and one whose keys are mostly in chains, each
// holding some of the keys asked for; and that it allocates nothing when
// dst has room.
func TestTableAppendLookups(t *testing.T) {
	for _, capacity := range []int{64, 1024} {
		t.Run(fmt.Sprintf("capacity=%v", capacity), func(t *testing.T) {
			tab := New[int](WithFixedBuckets(), WithCapacity(capacity), WithSecret(tblSecret), WithHasher(LinuxHasher))
			var keys []Tuple
			for i := range 200 {
				k := tblKey(i, i%2 == 1)
				keys = append(keys, k)
				if i%3 != 0 { // a third absent
					require.NoError(t, tab.Insert(k, valPtr(i)))
				}
			}
			found := tblCheckAppendLookups(t, tab, keys, rand.New(rand.NewPCG(1, 2)))
			require.Greater(t, found, 1000)

			require.Empty(t, tab.AppendLookups(nil, nil))
			dst := make([]*int, 0, len(keys))
			allocs := testing.AllocsPerRun(100, func() {
				dst = tab.AppendLookups(dst[:0], keys)
			})
			require.Zero(t, allocs)
		})
	}
}

// TestTablePrefetch checks that Prefetch changes nothing and allocates
// nothing, on the path with a prefetch instruction and the one without,
// for present, absent and port-0 tuples, on a table growing meanwhile.
func TestTablePrefetch(t *testing.T) {
	saved := canPrefetch
	t.Cleanup(func() { canPrefetch = saved })
	for _, can := range []bool{saved, false} {
		canPrefetch = can
		tab := New[int](WithCapacity(64), WithSecret(tblSecret))
		var keys []Tuple
		for i := range 300 {
			k := tblKey(i, i%2 == 1)
			keys = append(keys, k)
			if i%3 != 0 {
				require.NoError(t, tab.Insert(k, valPtr(i)))
			}
			tab.Prefetch(k)
		}
		keys = append(keys, Tuple{Local: keys[0].Local}) // port 0: never found
		before := tab.Len()
		for _, k := range keys {
			tab.Prefetch(k)
		}
		require.Equal(t, before, tab.Len())
		for i, k := range keys {
			v, ok := tab.Lookup(k)
			if i%3 == 0 || i == len(keys)-1 {
				require.False(t, ok, "key %d", i)
				continue
			}
			require.True(t, ok, "key %d", i)
			require.Equal(t, i, *v)
		}
		require.Zero(t, testing.AllocsPerRun(100, func() { tab.Prefetch(keys[7]) }))
		require.PanicsWithValue(t, nilTable, func() { (*Table[int])(nil).Prefetch(keys[0]) })
		require.PanicsWithValue(t, zeroTable, func() { new(Table[int]).Prefetch(keys[0]) })
	}
}
