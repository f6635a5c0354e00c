package hash4

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTouchIsAHint checks that Table.touch changes no memory, on a small
// table, one whose home bitmap lies beyond its stripes' lines, where touch
// names the head and the home slot, and one with home groups, where it also
// names the bitmap word, the move count and the group's home slots, and
// for a delete their chain heads; and that it allocates nothing. (It
// cannot tell a prefetch for writing from any other hint: what that buys
// is measured, in BenchmarkChurn.)
func TestTouchIsAHint(t *testing.T) {
	for _, c := range []struct {
		name            string
		opts            []Option
		bitmap, grouped bool
	}{
		{"small", []Option{WithCapacity(16), WithLockStripes(2)}, false, false},
		{"bitmap", []Option{WithCapacity(1024), WithLockStripes(4)}, true, false},
		{"groups", []Option{WithCapacity(1024), WithLockStripes(4), withHomeGroups(true)}, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			tab := New[int](append(c.opts, WithSecret(tblSecret), WithHasher(LinuxHasher), WithFixedBuckets())...)
			require.Equal(t, c.bitmap, tab.cur().home.free != nil)
			require.Equal(t, c.grouped, tab.cur().home.grouped())
			for i := range 2 * len(tab.cur().b.heads) {
				require.NoError(t, tab.Insert(tblKey(i, i%2 == 1), valPtr(i)))
			}
			for i := 0; i < 2*len(tab.cur().b.heads); i += 3 {
				_, ok := tab.Delete(tblKey(i, i%2 == 1))
				require.True(t, ok)
			}
			snapshot := func() string {
				var s []any
				for b := range uint32(len(tab.cur().b.heads)) {
					s = append(s, tab.cur().b.heads[b].load(), tab.cur().homeAt(b).key.load(), tab.cur().homeAt(b).seq.Load())
				}
				for i := range tab.moves {
					s = append(s, tab.moves[i].n.Load())
				}
				return fmt.Sprint(s, slices.Clone(tab.cur().home.free), tab.Stats())
			}
			before, entries := snapshot(), tblCollect(t, tab)
			allocs := testing.AllocsPerRun(100, func() {
				for b := range uint32(len(tab.cur().b.heads)) {
					for _, intent := range []lockIntent{lockToInsert, lockToDelete} {
						tab.touch(tab.cur(), b, intent)
					}
				}
			})
			require.Zero(t, allocs)
			require.Equal(t, before, snapshot())
			require.Equal(t, entries, tblCollect(t, tab))
		})
	}
}
