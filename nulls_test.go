package hash4

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// tblNulls is the fixture of the deterministic nulls tests: a 16-bucket,
// one-stripe table with a fixed secret, and keys grouped by bucket. Every
// home slot holds a filler entry (the last key of its bucket), so that the
// entries a test inserts are linked in chains only, lookups walk those
// chains, and a freed entry is the next one inserted.
type tblNulls struct {
	tab     *Table[string]
	byBkt   map[uint32][]Tuple
	a, b    uint32 // two buckets
	restart func() uint64
}

// filler returns the filler key of bucket b.
func (f *tblNulls) filler(b uint32) Tuple { return f.byBkt[b][len(f.byBkt[b])-1] }

// insertStealing inserts x, a key of bucket A, into B's home slot: it frees
// that slot and nothing else (B's filler deleted, the free cache emptied),
// so that x's insert, whose own home slot is taken, steals it.
func (f *tblNulls) insertStealing(t *testing.T, x Tuple, v *string) {
	t.Helper()
	_, ok := f.tab.Delete(f.filler(f.b))
	require.True(t, ok)
	f.tab.cur().b.stripes[0].cache.free = nil
	require.NoError(t, f.tab.Insert(x, v))
	require.Equal(t, homeSlot(f.b), f.headIndex(t, f.a))
}

func newTblNulls(t *testing.T, opts ...Option) *tblNulls {
	tab := New[string](append([]Option{WithFixedBuckets(), WithCapacity(16), WithLockStripes(1), WithSecret(tblSecret), WithHasher(LinuxHasher)}, opts...)...)
	hooksOf(tab) // made before tab is shared: tests set hooks while lookups run
	f := &tblNulls{tab: tab, byBkt: map[uint32][]Tuple{}}
	f.restart = func() uint64 { return tab.Stats().LookupRestarts }
	for i := 0; i < 4096; i++ {
		k := tblKey(i, i%2 == 1)
		b := HashTuple(k, LinuxHasher, tblSecret) & 15
		f.byBkt[b] = append(f.byBkt[b], k)
	}
	f.a, f.b = 3, 11
	require.GreaterOrEqual(t, len(f.byBkt[f.a]), 8)
	require.GreaterOrEqual(t, len(f.byBkt[f.b]), 8)
	for _, tup := range f.byBkt[f.a] {
		var k key
		tab.tupleKey(&k, &tup)
		require.Equal(t, f.a, tab.cur().b.bucket(uint32(k.meta>>32)))
	}
	for b := range uint32(16) {
		require.NoError(t, tab.Insert(f.filler(b), valPtr("filler")))
		require.Equal(t, homeSlot(b), f.headIndex(t, b))
	}
	return f
}

// headIndex returns the entry index at the head of bucket b.
func (f *tblNulls) headIndex(t *testing.T, b uint32) uint32 {
	l := f.tab.cur().b.heads[b].load()
	require.False(t, l.isNulls(), "bucket %d empty", b)
	return l.index()
}

// blockAt installs a visit hook that blocks the first visit of entry idx
// until release is closed, and closes arrived when it gets there.
func (f *tblNulls) blockAt(idx uint32) (arrived, release chan struct{}) {
	arrived, release = make(chan struct{}), make(chan struct{})
	blocked := false // only the reader goroutine touches it
	hooksOf(f.tab).visit = func(i uint32) {
		if i == idx && !blocked {
			blocked = true
			close(arrived)
			<-release
		}
	}
	return arrived, release
}

type tblResult struct {
	v  *string
	ok bool
}

// lookupAsync starts Lookup(k) in a goroutine.
func (f *tblNulls) lookupAsync(k Tuple) chan tblResult {
	res := make(chan tblResult, 1)
	go func() {
		v, ok := f.tab.Lookup(k)
		res <- tblResult{v, ok}
	}()
	return res
}

// lookupAcross runs Lookup(k) in a reader stopped on node stop, runs write
// meanwhile, then lets the reader go, and returns what it found and how many
// restarts it counted.
func (f *tblNulls) lookupAcross(t *testing.T, k Tuple, stop uint32, write func()) (tblResult, uint64) {
	t.Helper()
	arrived, release := f.blockAt(stop)
	res := f.lookupAsync(k)
	tblWait(t, arrived)
	before := f.restart()
	write()
	close(release)
	r := tblWaitResult(t, res)
	return r, f.restart() - before
}

func tblWait(t *testing.T, c chan struct{}) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(30 * time.Second):
		t.Fatal("reader never reached the hooked entry")
	}
}

func tblWaitResult(t *testing.T, c chan tblResult) tblResult {
	t.Helper()
	select {
	case r := <-c:
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("reader did not return")
		return tblResult{}
	}
}

// TestTableNullsRecycledEntry stops a reader on entry X of chain A (looking
// for Y behind it), deletes X and recycles its entry for Z, then lets the
// reader go on.
func TestTableNullsRecycledEntry(t *testing.T) {
	cases := []struct {
		name         string
		zBucketB     bool // Z in bucket B, else in A
		preB         int  // entries already in B, besides its filler
		steal        bool // X is in B's home slot, and B empty
		wantRestarts uint64
	}{
		{"into bucket B", true, 0, false, 1},
		{"into bucket B with entries", true, 2, false, 1},
		{"into the same bucket A", false, 0, false, 0},
		{"into empty bucket B, whose home slot X held", true, 0, true, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newTblNulls(t)
			tab := f.tab
			ka, kb := f.byBkt[f.a], f.byBkt[f.b]
			x, y := ka[0], ka[1]
			z := ka[2]
			if c.zBucketB {
				z = kb[0]
			}
			for i := range c.preB {
				require.NoError(t, tab.Insert(kb[1+i], valPtr("pre")))
			}
			vy, vx, vz := valPtr("Y"), valPtr("X"), valPtr("Z")
			require.NoError(t, tab.Insert(y, vy))
			if c.steal {
				f.insertStealing(t, x, vx)
			} else {
				require.NoError(t, tab.Insert(x, vx))
			}
			xIdx := f.headIndex(t, f.a) // X is at the head of A

			arrived, release := f.blockAt(xIdx)
			res := f.lookupAsync(y)
			tblWait(t, arrived)
			before := f.restart()

			got, ok := tab.Delete(x)
			require.True(t, ok)
			require.Same(t, vx, got)
			require.NoError(t, tab.Insert(z, vz))
			zb := f.a
			if c.zBucketB {
				zb = f.b
			}
			require.Equal(t, xIdx, f.headIndex(t, zb), "Z did not recycle X's entry")

			close(release)
			r := tblWaitResult(t, res)
			require.True(t, r.ok, "Lookup(Y) missed Y")
			require.Same(t, vy, r.v)
			require.Equal(t, c.wantRestarts, f.restart()-before)

			// The table is intact.
			for k, v := range map[Tuple]*string{y: vy, z: vz} {
				got, ok := tab.Lookup(k)
				require.True(t, ok)
				require.Same(t, v, got)
			}
			_, ok = tab.Lookup(x)
			require.False(t, ok)
			fillers := 16
			if c.steal {
				fillers--
			}
			require.Equal(t, 2+c.preB+fillers, tab.Len())
		})
	}
}

// TestTableNullsStolenHomeReclaimed stops a reader on entry X of the chain
// of bucket 0, held in B's home slot (stolen; 0 is outside B's group),
// looking for Y behind it. Z goes into B, to the free home slot of bucket 7
// of B's group, rather than evicting X; deleting X frees B's home slot
// while B has an entry, so Z moves into it: the reader, still on the node,
// walks into B's chain, restarts on its marker and finds Y.
func TestTableNullsStolenHomeReclaimed(t *testing.T) {
	f := newTblNulls(t, withHomeGroups(true))
	tab := f.tab
	x, y, z, w := f.byBkt[0][0], f.byBkt[0][1], f.byBkt[f.b][0], f.byBkt[0][2]
	vx, vy, vz := valPtr("X"), valPtr("Y"), valPtr("Z")
	require.NoError(t, tab.Insert(y, vy))
	f.freeHome(t, f.b)
	require.NoError(t, tab.Insert(x, vx))
	require.Equal(t, homeSlot(f.b), f.headIndex(t, 0), "X did not steal B's home slot")
	require.NoError(t, tab.Insert(w, valPtr("W"))) // 0: W -> X -> Y -> filler
	f.freeHome(t, 7)
	require.NoError(t, tab.Insert(z, vz))
	require.Equal(t, homeSlot(7), f.headIndex(t, f.b), "Z not in the free slot of its group")
	before := tab.Stats()

	r, restarts := f.lookupAcross(t, y, homeSlot(f.b), func() {
		got, ok := tab.Delete(x)
		require.True(t, ok)
		require.Same(t, vx, got)
		require.Equal(t, homeSlot(f.b), f.headIndex(t, f.b), "Z did not move into B's home slot")
	})
	require.True(t, r.ok, "Lookup(Y) missed Y")
	require.Same(t, vy, r.v)
	require.EqualValues(t, 1, restarts)

	got, ok := tab.Lookup(z)
	require.True(t, ok, "Z lost in the move")
	require.Same(t, vz, got)
	after := tab.Stats()
	require.Equal(t, before.Entries-1, after.Entries)
	require.Equal(t, before.HomeEntries+1, after.HomeEntries, "Z is home now")
	require.Equal(t, before.GroupEntries-1, after.GroupEntries, "Z left 7's slot")
	tblCheckHome(t, tab, "after the move")
}

// TestTableNullsStealerDeepEvicted stops a reader on entry X, second in the
// chain of bucket A behind W, held in bucket B's home slot (stolen),
// looking for Y behind it; an insert into B takes the slot back, moving X
// right behind itself to a spare node though it is not the head: the
// reader, still on the node, walks into B's chain, restarts on its marker
// and finds Y, and every key of A is found.
func TestTableNullsStealerDeepEvicted(t *testing.T) {
	f := newTblNulls(t)
	tab := f.tab
	ka, kb := f.byBkt[f.a], f.byBkt[f.b]
	x, y, z, w := ka[0], ka[1], kb[0], ka[2]
	vx, vy, vz, vw := valPtr("X"), valPtr("Y"), valPtr("Z"), valPtr("W")
	require.NoError(t, tab.Insert(y, vy))
	f.insertStealing(t, x, vx)
	require.NoError(t, tab.Insert(w, vw)) // A: W -> X -> Y -> filler
	require.NotEqual(t, homeSlot(f.b), f.headIndex(t, f.a), "X is the head")
	before := tab.Stats()

	r, restarts := f.lookupAcross(t, y, homeSlot(f.b), func() {
		require.NoError(t, tab.Insert(z, vz))
		require.Equal(t, homeSlot(f.b), f.headIndex(t, f.b), "Z did not take B's home slot back")
	})
	require.True(t, r.ok, "Lookup(Y) missed Y")
	require.Same(t, vy, r.v)
	require.EqualValues(t, 1, restarts)

	for k, v := range map[Tuple]*string{x: vx, y: vy, w: vw, z: vz} {
		got, ok := tab.Lookup(k)
		require.True(t, ok, "%s lost", *v)
		require.Same(t, v, got)
	}
	after := tab.Stats()
	require.Equal(t, before.Entries+1, after.Entries)
	require.Equal(t, before.HomeEntries+1, after.HomeEntries, "Z is home, X was not")
	tblCheckHome(t, tab, "after the move")
}

// TestTableNullsStealerEvicted stops a reader on entry X, the head of
// chain A, held in bucket B's home slot (stolen), looking for Y behind it;
// an insert into B takes the slot back, moving X right behind itself to a
// spare node: the reader, still on the node, walks into B's chain, restarts
// on its marker and finds Y, and X is found at its new node.
func TestTableNullsStealerEvicted(t *testing.T) {
	f := newTblNulls(t)
	tab := f.tab
	ka, kb := f.byBkt[f.a], f.byBkt[f.b]
	x, y, z := ka[0], ka[1], kb[0]
	vx, vy, vz := valPtr("X"), valPtr("Y"), valPtr("Z")
	require.NoError(t, tab.Insert(y, vy))
	f.insertStealing(t, x, vx) // A: X -> Y -> filler
	xIdx := f.headIndex(t, f.a)
	before := tab.Stats()

	r, restarts := f.lookupAcross(t, y, xIdx, func() {
		require.NoError(t, tab.Insert(z, vz))
		require.Equal(t, xIdx, f.headIndex(t, f.b), "Z did not take B's home slot back")
	})
	require.True(t, r.ok, "Lookup(Y) missed Y")
	require.Same(t, vy, r.v)
	require.EqualValues(t, 1, restarts)

	got, ok := tab.Lookup(x)
	require.True(t, ok, "X lost in the move")
	require.Same(t, vx, got)
	require.NotEqual(t, xIdx, f.headIndex(t, f.a), "X not moved")
	after := tab.Stats()
	require.Equal(t, before.Entries+1, after.Entries)
	require.Equal(t, before.HomeEntries+1, after.HomeEntries, "Z is home, X was not")
	tblCheckHome(t, tab, "after the move")
}

// TestTableNullsMoveIntoVisitedNode makes a move put an entry into the node
// a reader stands on, whose old key it has read: the reader would go on past
// the key it looks for, the moved one or one between the node's old place
// and the moved entry's, and must restart because a move overlapped its
// walk. The node comes from the free cache (a, c, e), from a stolen home
// slot released (b), or is the home slot the move refills (d); in (e) the
// table has home groups, and the stealer is evicted from a slot of another
// group than its own.
func TestTableNullsMoveIntoVisitedNode(t *testing.T) {
	cases := []struct {
		name    string
		grouped bool
		// setup fills the table and returns the key sought, the node
		// the reader stops on, and the write that moves the key.
		setup func(t *testing.T, f *tblNulls) (sought Tuple, stop uint32, write func())
	}{
		{"stealer X evicted into W's freed node", false, func(t *testing.T, f *tblNulls) (Tuple, uint32, func()) {
			ka, kb := f.byBkt[f.a], f.byBkt[f.b]
			x, w, z := ka[0], ka[1], kb[0]
			f.insertStealing(t, x, valPtr("X"))
			require.NoError(t, f.tab.Insert(w, valPtr("W"))) // A: W -> X -> filler
			wIdx := f.headIndex(t, f.a)
			return x, wIdx, func() {
				_, ok := f.tab.Delete(w) // W's node tops the free cache, X heads A
				require.True(t, ok)
				require.NoError(t, f.tab.Insert(z, valPtr("Z"))) // moves X into W's node
				require.Equal(t, wIdx, f.headIndex(t, f.a))
			}
		}},
		{"stealer X evicted into the home slot W released", false, func(t *testing.T, f *tblNulls) (Tuple, uint32, func()) {
			ka, kb := f.byBkt[f.a], f.byBkt[f.b]
			const c = 7
			x, w, z := ka[0], ka[1], kb[0]
			f.insertStealing(t, x, valPtr("X"))
			_, ok := f.tab.Delete(f.filler(c))
			require.True(t, ok)
			f.tab.cur().b.stripes[0].cache.free = nil
			require.NoError(t, f.tab.Insert(w, valPtr("W"))) // steals C's home slot
			wIdx := f.headIndex(t, f.a)
			require.Equal(t, homeSlot(c), wIdx)
			return x, wIdx, func() {
				_, ok := f.tab.Delete(w)
				require.True(t, ok)
				require.NoError(t, f.tab.Insert(z, valPtr("Z"))) // moves X into C's home slot
				require.Equal(t, wIdx, f.headIndex(t, f.a))
			}
		}},
		{"stealer X, deep in its chain, evicted into N's freed node past K", false, func(t *testing.T, f *tblNulls) (Tuple, uint32, func()) {
			// Z takes B's home slot back.
			return tblStealerPastK(t, f, func(x Tuple) { f.insertStealing(t, x, valPtr("X")) }, f.byBkt[f.b][0], f.b, f.b)
		}},
		{"Y moved into the home slot of J, deleted", false, func(t *testing.T, f *tblNulls) (Tuple, uint32, func()) {
			ka := f.byBkt[f.a]
			y, j := ka[0], ka[1]
			require.NoError(t, f.tab.Insert(y, valPtr("Y")))
			require.NoError(t, f.tab.Insert(j, valPtr("J"))) // A: J -> Y -> filler
			_, ok := f.tab.Delete(f.filler(f.a))             // J moves home: A: J -> Y
			require.True(t, ok)
			home := homeSlot(f.a)
			require.Equal(t, home, f.headIndex(t, f.a))
			return y, home, func() {
				_, ok := f.tab.Delete(j) // Y moves into J's node, the home slot
				require.True(t, ok)
				require.Equal(t, home, f.headIndex(t, f.a))
			}
		}},
		{"stealer X in a slot of another group, evicted into N's freed node past K", true, func(t *testing.T, f *tblNulls) (Tuple, uint32, func()) {
			require.True(t, f.tab.cur().home.grouped())
			// Bucket 4 is of group {0, 4, 8, 12}, A of {3, 7, 11, 15}:
			// Z, of bucket 0, finds no free slot in its group and evicts
			// X, an outsider, from slot 4.
			return tblStealerPastK(t, f, func(x Tuple) {
				f.freeHome(t, 4)
				require.NoError(t, f.tab.Insert(x, valPtr("X")))
				require.Equal(t, homeSlot(4), f.headIndex(t, f.a))
			}, f.byBkt[0][0], 0, 4)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var opts []Option
			if c.grouped {
				opts = append(opts, withHomeGroups(true))
			}
			f := newTblNulls(t, opts...)
			sought, stop, write := c.setup(t, f)
			want, ok := f.tab.Lookup(sought)
			require.True(t, ok)
			r, restarts := f.lookupAcross(t, sought, stop, write)
			require.True(t, r.ok, "Lookup missed a key present throughout")
			require.Same(t, want, r.v)
			require.EqualValues(t, 1, restarts)
			tblCheckHome(t, f.tab, c.name)
		})
	}
}

// tblStealerPastK sets up a move past the key sought: steal makes X, a key
// of bucket A, a stealer of another home slot, then A's chain becomes
// N -> K -> X -> filler. The write deletes N, whose node tops the free
// cache, and inserts Z, of bucket zb, which takes home slot slot (its own,
// or one of its group's) and so moves X into N's node, behind K: a reader
// standing on N's node goes on behind X, past K.
func tblStealerPastK(t *testing.T, f *tblNulls, steal func(x Tuple), z Tuple, zb, slot uint32) (Tuple, uint32, func()) {
	ka := f.byBkt[f.a]
	x, k, n := ka[0], ka[1], ka[2]
	steal(x)
	require.NoError(t, f.tab.Insert(k, valPtr("K")))
	require.NoError(t, f.tab.Insert(n, valPtr("N")))
	nIdx := f.headIndex(t, f.a)
	return k, nIdx, func() {
		_, ok := f.tab.Delete(n)
		require.True(t, ok)
		require.NoError(t, f.tab.Insert(z, valPtr("Z")))
		require.Equal(t, homeSlot(slot), f.headIndex(t, zb), "Z did not take home slot %d", slot)
		l := f.tab.nodes.at(f.headIndex(t, f.a)).next.load()
		require.Equal(t, nodeLink(nIdx), l, "X not moved into N's node behind K")
	}
}

// TestTableNullsMovedHead stops a reader looking for Y on J, the head of
// chain A; deleting A's entry at home moves J into the home slot, right
// behind J: the reader goes on from J to the copy and on to Y, with no
// restart, and the table holds J once, at home.
func TestTableNullsMovedHead(t *testing.T) {
	f := newTblNulls(t)
	tab := f.tab
	ka := f.byBkt[f.a]
	y, j := ka[0], ka[1]
	vy, vj := valPtr("Y"), valPtr("J")
	require.NoError(t, tab.Insert(y, vy))
	require.NoError(t, tab.Insert(j, vj))
	jIdx := f.headIndex(t, f.a) // A: J -> Y -> A's filler, at home

	r, restarts := f.lookupAcross(t, y, jIdx, func() {
		_, ok := tab.Delete(f.filler(f.a))
		require.True(t, ok)
		require.Equal(t, homeSlot(f.a), f.headIndex(t, f.a), "J did not move into A's home slot")
	})
	require.True(t, r.ok, "Lookup(Y) missed Y")
	require.Same(t, vy, r.v)
	require.Zero(t, restarts)

	got, ok := tab.Lookup(j)
	require.True(t, ok)
	require.Same(t, vj, got)
	n := 0
	for tup := range tab.All() {
		if tup == j {
			n++
		}
	}
	require.Equal(t, 1, n, "J yielded %d times", n)
	tblCheckHome(t, tab, "after the move")
}

// TestTableNullsReadersKeyRecycled stops a reader looking for X on the
// entry W before X, deletes W and X, and recycles X's entry: the reader
// must answer not-found or a value of X, never the recycled entry's value.
func TestTableNullsReadersKeyRecycled(t *testing.T) {
	cases := []struct {
		name string
		// after W and X are deleted (X's entry on top of the free cache):
		reinsert func(f *tblNulls, x Tuple) (zb uint32, z Tuple)
		wantOK   bool // the deterministic outcome
		wantX2   bool
	}{
		{"Z into bucket B", func(f *tblNulls, x Tuple) (uint32, Tuple) { return f.b, f.byBkt[f.b][0] }, false, false},
		{"Z into bucket A", func(f *tblNulls, x Tuple) (uint32, Tuple) { return f.a, f.byBkt[f.a][2] }, false, false},
		{"X itself again", func(f *tblNulls, x Tuple) (uint32, Tuple) { return f.a, x }, true, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newTblNulls(t)
			tab := f.tab
			ka := f.byBkt[f.a]
			w, x := ka[0], ka[1]
			vx, vw := valPtr("X"), valPtr("W")
			require.NoError(t, tab.Insert(x, vx))
			xIdx := f.headIndex(t, f.a)
			require.NoError(t, tab.Insert(w, vw))
			wIdx := f.headIndex(t, f.a) // A: W -> X

			arrived, release := f.blockAt(wIdx)
			res := f.lookupAsync(x)
			tblWait(t, arrived)

			_, ok := tab.Delete(w) // W's next still leads to X's entry
			require.True(t, ok)
			_, ok = tab.Delete(x)
			require.True(t, ok)
			zb, z := c.reinsert(f, x)
			vz := valPtr("new")
			require.NoError(t, tab.Insert(z, vz))
			require.Equal(t, xIdx, f.headIndex(t, zb), "X's entry was not recycled")

			close(release)
			r := tblWaitResult(t, res)
			if r.ok {
				require.True(t, r.v == vx || (z == x && r.v == vz), "Lookup(X) returned %q, not a value of X", *r.v)
			}
			if z != x {
				require.NotSame(t, vz, r.v, "Lookup(X) returned the value of %v", z)
			}
			require.Equal(t, c.wantOK, r.ok)
			if c.wantX2 {
				require.Same(t, vz, r.v)
			}
		})
	}
}
