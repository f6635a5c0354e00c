package hash4

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

// The tests of home groups (home.go) run on the fixture of the nulls tests
// with groups forced on: 16 buckets, one stripe, every home slot holding
// its bucket's filler. Bucket A (3) is in the group {3, 11, 7, 15}.

// tblGroupFind reports whether lookupGroup finds tup: in a home slot of its
// group, without the chain.
func tblGroupFind(f *tblNulls, tup Tuple) (*string, bool) {
	var k key
	f.tab.tupleKey(&k, tup)
	return f.tab.lookupGroup(&k, f.tab.b.bucket(uint32(k.meta>>32)))
}

// freeHome deletes bucket b's filler and empties the free cache, so that
// b's home slot is the only free node at hand.
func (f *tblNulls) freeHome(t *testing.T, b uint32) {
	t.Helper()
	_, ok := f.tab.Delete(f.filler(b))
	require.True(t, ok)
	f.tab.b.stripes[0].cache.free = nil
}

// TestTableHomeGroupsDefault checks which tables get home groups: those of
// at least homeGroupMinBuckets buckets whose groups fit in one stripe.
func TestTableHomeGroupsDefault(t *testing.T) {
	for _, c := range []struct {
		capacity, stripes int
		want              bool
	}{
		{homeGroupMinBuckets / 2, 0, false},
		{homeGroupMinBuckets, 0, true},
		{homeGroupMinBuckets, homeGroupMinBuckets / 4, true},
		{homeGroupMinBuckets, homeGroupMinBuckets / 2, false},
	} {
		opts := []Option{WithCapacity(c.capacity)}
		if c.stripes > 0 {
			opts = append(opts, WithLockStripes(c.stripes))
		}
		tab := New[int](opts...)
		require.Equal(t, c.want, tab.home.grouped(), "%+v", c)
	}
	require.False(t, New[int](WithCapacity(16), withHomeGroups(true), WithLockStripes(8)).home.grouped(),
		"a group of four buckets of 16 spans two of 8 stripes")
}

// TestTableHomeGroupPlacement checks that an entry whose home slot is taken
// goes to a free home slot of its group, where lookups find it without the
// chain, and that a table of random flows at one entry per bucket holds
// more than 74% of them in a home slot of their group (77% here), against
// 63% at most without groups.
func TestTableHomeGroupPlacement(t *testing.T) {
	f := newTblNulls(t, withHomeGroups(true))
	y := f.byBkt[f.a][0]
	vy := new("Y")
	f.freeHome(t, 11) // in A's group
	require.NoError(t, f.tab.Insert(y, vy))
	require.Equal(t, homeSlot(11), f.headIndex(t, f.a), "Y not in the free slot of its group")
	got, ok := tblGroupFind(f, y)
	require.True(t, ok, "Y not found in its group's home slots")
	require.Same(t, vy, got)
	st := f.tab.Stats()
	require.Equal(t, 1, st.GroupEntries)
	require.Equal(t, 15, st.HomeEntries)
	tblCheckHome(t, f.tab, "after the insert")

	const n = 1 << 14
	r := rand.New(rand.NewPCG(8, 9))
	for _, grouped := range []bool{false, true} {
		tab := New[int](WithCapacity(n), withHomeGroups(grouped))
		v := new(0)
		for i := range n {
			tup := Tuple{
				Local:  netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, 1}), 443),
				Remote: netip.AddrPortFrom(netip.AddrFrom4([4]byte{100, 64, byte(i >> 8), byte(i)}), uint16(1024+r.IntN(60000))),
			}
			require.NoError(t, tab.Insert(tup, v))
		}
		st := tab.Stats()
		share := float64(st.HomeEntries+st.GroupEntries) / n
		t.Logf("groups %v: %.3f of entries in a home slot of their group (%d own, %d group)", grouped, share, st.HomeEntries, st.GroupEntries)
		if grouped {
			require.Greater(t, share, 0.74)
		} else {
			require.Zero(t, st.GroupEntries)
			require.Less(t, share, 0.64)
		}
		tblCheckHome(t, tab, fmt.Sprint("groups ", grouped))
	}
}

// TestTableNullsGroupStealerStays checks that an insert whose home slot
// holds an entry of another bucket of its group leaves that entry in
// place, and that the entry's home slot is taken in turn without a move.
func TestTableNullsGroupStealerStays(t *testing.T) {
	f := newTblNulls(t, withHomeGroups(true))
	y, z := f.byBkt[f.a][0], f.byBkt[11][0]
	f.freeHome(t, 11)
	require.NoError(t, f.tab.Insert(y, new("Y"))) // A: Y in 11's home slot
	moves := f.tab.moves[0].n.Load()
	require.NoError(t, f.tab.Insert(z, new("Z"))) // 11: its slot is Y's
	require.Equal(t, homeSlot(11), f.headIndex(t, f.a), "Y moved")
	require.NotEqual(t, homeSlot(11), f.headIndex(t, 11))
	require.Equal(t, moves, f.tab.moves[0].n.Load(), "a move was made")
	for _, k := range []Tuple{y, z} {
		_, ok := f.tab.Lookup(k)
		require.True(t, ok)
	}
	tblCheckHome(t, f.tab, "after the inserts")
}

// TestStealTakesReleasedSlot checks the order in which steal hands out free
// home slots: the slot Table.free released last first, if it is recorded
// (in tables with home groups) and still free, then the search order.
func TestStealTakesReleasedSlot(t *testing.T) {
	for _, record := range []bool{true, false} {
		var ss [1]stripe
		var h homeSlots
		h.init(256, 1, ss[:], true)
		st := &ss[0]
		for range 256 {
			_, ok := h.steal(st, 0)
			require.True(t, ok)
		}
		_, ok := h.steal(st, 0)
		require.False(t, ok, "all taken")
		release := func(b uint32) {
			h.release(st, b)
			if record {
				st.homeLast = b + 1 // as Table.free does
			}
		}

		release(200)
		release(100)
		first, ok := h.steal(st, 0)
		require.True(t, ok)
		second, ok := h.steal(st, 0)
		require.True(t, ok)
		if record {
			require.Equal(t, []uint32{100, 200}, []uint32{first, second}, "the slot freed last first")
		} else {
			// The search resumes in the last word it took from: 200's.
			require.Equal(t, []uint32{200, 100}, []uint32{first, second}, "the search order")
		}

		// A slot freed last but taken back by its own bucket is not
		// handed out again.
		release(50)
		release(100)
		require.True(t, h.take(st, 100))
		b, ok := h.steal(st, 0)
		require.True(t, ok)
		require.EqualValues(t, 50, b)
		_, ok = h.steal(st, 0)
		require.False(t, ok)
		require.Zero(t, st.homeFree)
	}
}

// TestTableRecordsReleasedSlot checks what Table.free records for steal: in
// a table with home groups, after a delete that releases a home slot, that
// slot, free, of a bucket whose chain is empty; in a table without groups,
// nothing.
func TestTableRecordsReleasedSlot(t *testing.T) {
	for _, grouped := range []bool{true, false} {
		tab := New[int](WithCapacity(64), WithLockStripes(1), withHomeGroups(grouped), WithSecret(tblSecret))
		require.Equal(t, grouped, tab.home.grouped())
		st := &tab.b.stripes[0]
		r := rand.New(rand.NewPCG(8, 9))
		live, releases := map[int]bool{}, 0
		for range 20000 {
			ki := r.IntN(128)
			k := tblKey(ki, ki%2 == 1)
			if !live[ki] {
				require.NoError(t, tab.Insert(k, new(ki)))
				live[ki] = true
				continue
			}
			free := st.homeFree
			st.homeLast = 0
			_, ok := tab.Delete(k)
			require.True(t, ok)
			delete(live, ki)
			if !grouped || st.homeFree == free {
				require.Zero(t, st.homeLast)
				continue
			}
			releases++
			require.NotZero(t, st.homeLast, "a delete released a slot")
			b := st.homeLast - 1
			w, m := tab.home.bit(st, b)
			require.NotZero(t, *w&m, "bucket %d's home slot recorded, not free", b)
			require.True(t, tab.b.heads[b].load().isNulls(), "bucket %d's home slot recorded, its chain not empty", b)
		}
		if grouped {
			require.Greater(t, releases, 1000)
		}
		tblCheckHome(t, tab, "after churn")
	}
}
