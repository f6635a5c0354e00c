package hash4

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCPUID checks cpuid against what every x86-64 processor reports: a
// vendor string of printable characters, extended leaves up to 0x80000001
// at least (the long-mode flag is there), and, from AMD, PREFETCHW, which
// all of its x86-64 processors have.
func TestCPUID(t *testing.T) {
	_, ebx, ecx, edx := cpuid(0, 0)
	var v [12]byte
	binary.LittleEndian.PutUint32(v[0:], ebx)
	binary.LittleEndian.PutUint32(v[4:], edx)
	binary.LittleEndian.PutUint32(v[8:], ecx)
	vendor := string(v[:])
	for _, c := range vendor {
		require.True(t, c >= ' ' && c <= '~', "vendor %q", vendor)
	}
	maxExt, _, _, _ := cpuid(0x80000000, 0)
	require.GreaterOrEqual(t, maxExt, uint32(0x80000001))
	_, _, _, edx = cpuid(0x80000001, 0)
	require.NotZero(t, edx&(1<<29), "long mode not reported")
	require.Equal(t, hasPrefetchW(), canPrefetchW)
	if vendor == "AuthenticAMD" {
		require.True(t, canPrefetchW)
	}
	t.Logf("%s: PREFETCHW %v", vendor, canPrefetchW)
}

// TestTableWithoutPrefetchW runs the table's writers through both paths of
// touch, that of processors without PREFETCHW, where it loads instead, and
// the other, on a small table, one whose home bitmap lies beyond its
// stripes' lines and one with home groups, where touch names more lines: a
// churn checked against a model, with the stripes' home bookkeeping
// checked after.
func TestTableWithoutPrefetchW(t *testing.T) {
	saved := canPrefetchW
	t.Cleanup(func() { canPrefetchW = saved })
	for _, opts := range [][]Option{
		{WithCapacity(64), WithLockStripes(4)},
		{WithCapacity(512), WithLockStripes(2)},
		{WithCapacity(512), WithLockStripes(2), withHomeGroups(true)},
	} {
		for _, can := range []bool{false, true} {
			canPrefetchW = can
			tab := New[int](append(opts, WithSecret(tblSecret), WithHasher(LinuxHasher), WithFixedBuckets())...)
			model := map[int]*int{}
			for i := range 5000 {
				ki := (i * 7919) % (len(tab.cur().b.heads) * 3)
				k := tblKey(ki, ki%2 == 1)
				if v, ok := model[ki]; ok {
					got, gok := tab.Delete(k)
					require.True(t, gok, "PREFETCHW %v, step %d", can, i)
					require.Same(t, v, got)
					delete(model, ki)
					continue
				}
				v := valPtr(i)
				require.NoError(t, tab.Insert(k, v))
				model[ki] = v
			}
			require.Equal(t, len(model), tab.Len())
			for ki, v := range model {
				got, ok := tab.Lookup(tblKey(ki, ki%2 == 1))
				require.True(t, ok)
				require.Same(t, v, got)
			}
			tblCheckHome(t, tab, fmt.Sprintf("after churn, %d buckets, PREFETCHW %v", len(tab.cur().b.heads), can))
		}
	}
}

// TestTableAppendLookupsWithoutPrefetch checks AppendLookups on the path of
// architectures without a prefetch, where it loads the lines instead.
func TestTableAppendLookupsWithoutPrefetch(t *testing.T) {
	saved := canPrefetch
	t.Cleanup(func() { canPrefetch = saved })
	canPrefetch = false
	for _, grouped := range []bool{false, true} {
		tab := New[int](WithFixedBuckets(), WithCapacity(64), WithLockStripes(4), withHomeGroups(grouped), WithSecret(tblSecret), WithHasher(LinuxHasher))
		var keys []Tuple
		for i := range 100 {
			k := tblKey(i, i%2 == 1)
			keys = append(keys, k)
			if i%3 != 0 {
				require.NoError(t, tab.Insert(k, valPtr(i)))
			}
		}
		require.Greater(t, tblCheckAppendLookups(t, tab, keys, rand.New(rand.NewPCG(3, 4))), 500)
	}
}
