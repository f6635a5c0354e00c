package hash4

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTableAppendLookupsWithoutPrefetch checks AppendLookups on the path of
// architectures without a prefetch, where it loads the lines instead.
func TestTableAppendLookupsWithoutPrefetch(t *testing.T) {
	saved := canPrefetch
	t.Cleanup(func() { canPrefetch = saved })
	canPrefetch = false
	for _, capacity := range []int{64, 1024} {
		tab := New[int](WithFixedBuckets(), WithCapacity(capacity), WithSecret(tblSecret), WithHasher(LinuxHasher))
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
