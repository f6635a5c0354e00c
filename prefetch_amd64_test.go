package hash4

import (
	"encoding/binary"
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

// TestTableWithoutPrefetchW runs the table's writers through the path of
// processors without PREFETCHW, where touch loads instead: a churn checked
// against a model, with the stripes' home bookkeeping checked after.
func TestTableWithoutPrefetchW(t *testing.T) {
	saved := canPrefetchW
	t.Cleanup(func() { canPrefetchW = saved })
	for _, can := range []bool{false, true} {
		canPrefetchW = can
		tab := New[int](WithCapacity(64), WithLockStripes(4), WithSecret(tblSecret))
		model := map[int]*int{}
		for i := range 5000 {
			ki := (i * 7919) % 200
			k := tblKey(ki, ki%2 == 1)
			if v, ok := model[ki]; ok {
				got, gok := tab.Delete(k)
				require.True(t, gok, "PREFETCHW %v, step %d", can, i)
				require.Same(t, v, got)
				delete(model, ki)
				continue
			}
			v := new(i)
			require.NoError(t, tab.Insert(k, v))
			model[ki] = v
		}
		require.Equal(t, len(model), tab.Len())
		for ki, v := range model {
			got, ok := tab.Lookup(tblKey(ki, ki%2 == 1))
			require.True(t, ok)
			require.Same(t, v, got)
		}
		tblCheckHome(t, tab, "after churn")
	}
}
