package hash4

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// tblNulls is the fixture of the deterministic interleavings: a 16-bucket
// table with a fixed secret, one shard (so that a freed node is the next one
// taken), and keys grouped by bucket. Every bucket's line holds a filler
// entry (its bucket's last key), so that the entries a test inserts go to
// chains, until a test deletes a filler.
type tblNulls struct {
	tab     *Table[string]
	byBkt   map[uint32][]Tuple
	a, b    uint32 // two buckets
	restart func() uint64
}

// filler returns the filler key of bucket b.
func (f *tblNulls) filler(b uint32) Tuple { return f.byBkt[b][len(f.byBkt[b])-1] }

func newTblNulls(t *testing.T) *tblNulls {
	tab := New[string](WithFixedBuckets(), WithCapacity(16), WithSecret(tblSecret), WithHasher(LinuxHasher))
	tab.shards = tab.shards[:1]
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
	for b := range uint32(16) {
		require.NoError(t, tab.Insert(f.filler(b), valPtr("filler")))
		require.True(t, tab.cur().lines[b].live())
	}
	return f
}

// headIndex returns the node index at the head of bucket b's chain.
func (f *tblNulls) headIndex(t *testing.T, b uint32) uint32 {
	l := f.tab.cur().lines[b].next.load()
	require.False(t, l.isNulls(), "bucket %d's chain empty", b)
	return l.index()
}

// blockAt installs a visit hook that blocks the first visit of idx (a node
// index, or visitLine, visitLineHit) until release is closed, and closes
// arrived when it gets there.
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

// lookupAcross runs Lookup(k) in a reader stopped at stop (see blockAt),
// runs write meanwhile, then lets the reader go, and returns what it found
// and how many restarts it counted.
func (f *tblNulls) lookupAcross(t *testing.T, k Tuple, stop uint32, write func()) (tblResult, uint64) {
	t.Helper()
	arrived, release := f.blockAt(stop)
	res := f.lookupAsync(k)
	tblWait(t, arrived)
	before := f.restart()
	write()
	close(release)
	r := tblWaitResult(t, res)
	hooksOf(f.tab).visit = nil
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

// TestTableNullsRecycledEntry stops a reader on node X of chain A, looking
// for Y behind it, deletes X and recycles its node for Z, then lets the
// reader go on. Into bucket B, X's next link leads the reader into B's
// chain, which ends on B's marker: it restarts, once, and finds Y. Into A
// again, Z's node goes to the head of A's chain and leads the reader back
// to the chain's start: it finds Y without a restart.
func TestTableNullsRecycledEntry(t *testing.T) {
	for _, c := range []struct {
		name         string
		zBucketB     bool // Z in bucket B, else in A
		preB         int  // entries in B's chain already
		wantRestarts uint64
	}{
		{"into bucket B", true, 0, 1},
		{"into bucket B with entries", true, 2, 1},
		{"into the same bucket A", false, 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newTblNulls(t)
			tab := f.tab
			ka, kb := f.byBkt[f.a], f.byBkt[f.b]
			x, y, z := ka[0], ka[1], ka[2]
			if c.zBucketB {
				z = kb[0]
			}
			for i := range c.preB {
				require.NoError(t, tab.Insert(kb[1+i], valPtr("pre")))
			}
			vy, vx, vz := valPtr("Y"), valPtr("X"), valPtr("Z")
			require.NoError(t, tab.Insert(y, vy))
			require.NoError(t, tab.Insert(x, vx))
			xIdx := f.headIndex(t, f.a) // X is at the head of A's chain
			r, restarts := f.lookupAcross(t, y, xIdx, func() {
				got, ok := tab.Delete(x)
				require.True(t, ok)
				require.Same(t, vx, got)
				require.NoError(t, tab.Insert(z, vz))
				zb := f.a
				if c.zBucketB {
					zb = f.b
				}
				require.Equal(t, xIdx, f.headIndex(t, zb), "Z did not recycle X's node")
			})
			require.True(t, r.ok, "Lookup(Y) missed Y")
			require.Same(t, vy, r.v)
			require.Equal(t, c.wantRestarts, restarts)
			for k, v := range map[Tuple]*string{y: vy, z: vz} {
				got, ok := tab.Lookup(k)
				require.True(t, ok)
				require.Same(t, v, got)
			}
			_, ok := tab.Lookup(x)
			require.False(t, ok)
			require.Equal(t, 16+2+c.preB, tab.Len())
			tblCheckBuckets(t, tab, c.name)
		})
	}
}

// TestTableNullsPromotedBehindReader stops a reader after it read bucket
// A's line, which does not hold the key X it looks for, before it loads
// the chain's head; then deletes the line's entry, so that X, first in the
// chain, moves into the line and its node is freed (and, in one case,
// recycled into bucket B). The reader's walk no longer meets X anywhere in
// the chain, but the line's seq changed (bucket's rule 2): it restarts and
// finds X in the line. Without the check it returned a miss.
func TestTableNullsPromotedBehindReader(t *testing.T) {
	for _, recycle := range []bool{false, true} {
		t.Run(map[bool]string{false: "freed", true: "recycled"}[recycle], func(t *testing.T) {
			f := newTblNulls(t)
			tab := f.tab
			x, y := f.byBkt[f.a][0], f.byBkt[f.a][1]
			vx, vy := valPtr("X"), valPtr("Y")
			require.NoError(t, tab.Insert(y, vy))
			require.NoError(t, tab.Insert(x, vx))
			xIdx := f.headIndex(t, f.a)
			r, restarts := f.lookupAcross(t, x, visitLine, func() {
				_, ok := tab.Delete(f.filler(f.a))
				require.True(t, ok)
				require.False(t, tab.nodes.at(xIdx).live(), "X's node not freed")
				if recycle {
					require.NoError(t, tab.Insert(f.byBkt[f.b][0], valPtr("Z")))
					require.Equal(t, xIdx, f.headIndex(t, f.b))
				}
			})
			require.True(t, r.ok, "Lookup(X) missed X, moved into the line")
			require.Same(t, vx, r.v)
			require.EqualValues(t, 1, restarts)
			tblCheckBuckets(t, tab, "after the promotion")
		})
	}
}

// TestTableNullsPromotedUnderReader stops a reader on node N, first in A's
// chain, looking for Y behind it; the line's entry is deleted and N's key
// moves into the line. N's next link is left as it was (nulls.go's
// invariant 4): the reader walks on to Y and finds it without a restart.
func TestTableNullsPromotedUnderReader(t *testing.T) {
	f := newTblNulls(t)
	tab := f.tab
	n, y := f.byBkt[f.a][0], f.byBkt[f.a][1]
	vy := valPtr("Y")
	require.NoError(t, tab.Insert(y, vy))
	require.NoError(t, tab.Insert(n, valPtr("N")))
	r, restarts := f.lookupAcross(t, y, f.headIndex(t, f.a), func() {
		_, ok := tab.Delete(f.filler(f.a))
		require.True(t, ok)
	})
	require.True(t, r.ok)
	require.Same(t, vy, r.v)
	require.Zero(t, restarts)
}

// TestTableNullsLineChangedUnderReader stops a reader that matched the key
// X held in A's line, before it loads the value, and changes the line under
// it: X deleted and the line reused for Z (the reader must not return Z's
// value as X's: it restarts and misses X), X deleted and inserted again
// with a new value (it restarts and finds the new one), X's value swapped
// in place (no restart: either value is X's), and X moved to the table's
// next array by growth (it restarts and finds X there).
func TestTableNullsLineChangedUnderReader(t *testing.T) {
	for _, c := range []struct {
		name         string
		change       func(t *testing.T, tab *Table[string], x, z Tuple)
		want         string // the value found, or "" for a miss
		wantRestarts uint64
	}{
		{"deleted and reused", func(t *testing.T, tab *Table[string], x, z Tuple) {
			_, ok := tab.Delete(x)
			require.True(t, ok)
			require.NoError(t, tab.Insert(z, valPtr("Z")))
		}, "", 1},
		{"deleted and inserted again", func(t *testing.T, tab *Table[string], x, _ Tuple) {
			_, ok := tab.Delete(x)
			require.True(t, ok)
			require.NoError(t, tab.Insert(x, valPtr("X again")))
		}, "X again", 1},
		{"swapped", func(t *testing.T, tab *Table[string], x, _ Tuple) {
			_, _, err := tab.Swap(x, valPtr("X swapped"))
			require.NoError(t, err)
		}, "X swapped", 0},
		{"moved by growth", func(t *testing.T, tab *Table[string], _, _ Tuple) {
			require.NoError(t, tab.Grow(32))
		}, "X", 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newTblNulls(t)
			tab := f.tab
			x, z := f.filler(f.a), f.byBkt[f.a][0]
			_, ok := tab.Delete(x)
			require.True(t, ok)
			require.NoError(t, tab.Insert(x, valPtr("X")))
			require.True(t, tab.cur().lines[f.a].key.matchesHeld(tblKeyOf(tab, x)))
			r, restarts := f.lookupAcross(t, x, visitLineHit, func() { c.change(t, tab, x, z) })
			if c.want == "" {
				require.False(t, r.ok, "found %v", r.v)
			} else {
				require.True(t, r.ok)
				require.Equal(t, c.want, *r.v)
			}
			require.Equal(t, c.wantRestarts, restarts)
		})
	}
}

// tblKeyOf returns tab's key of tup.
func tblKeyOf[T any](tab *Table[T], tup Tuple) *key {
	var k key
	tab.tupleKey(&k, &tup)
	return &k
}

// TestTableNullsReadersKeyRecycled has readers look up a key whose entry
// is deleted and recycled, in line and in chains, over and over, by a
// writer that inserts other keys: no reader ever returns another key's
// value, and a key that stays is always found.
func TestTableNullsReadersKeyRecycled(t *testing.T) {
	f := newTblNulls(t)
	tab := f.tab
	ka, kb := f.byBkt[f.a], f.byBkt[f.b]
	stay := ka[5]
	vs := valPtr("stay")
	require.NoError(t, tab.Insert(stay, vs))
	vals := map[Tuple]*string{}
	for _, k := range append(ka[:4:4], kb[:4]...) {
		vals[k] = valPtr(k.String())
	}
	var stop atomic.Bool
	var bad atomic.Int64
	done := make(chan struct{})
	for range 2 {
		go func() {
			defer func() { done <- struct{}{} }()
			for !stop.Load() {
				for k := range vals {
					if v, ok := tab.Lookup(k); ok && *v != k.String() {
						bad.Add(1)
					}
				}
				if v, ok := tab.Lookup(stay); !ok || v != vs {
					bad.Add(1)
				}
				runtime.Gosched()
			}
		}()
	}
	deadline := time.Now().Add(200 * time.Millisecond)
	for i := 0; i < 2000 || time.Now().Before(deadline); i++ {
		for k, v := range vals {
			if i%2 == 0 {
				require.NoError(t, tab.Insert(k, v))
			} else {
				_, ok := tab.Delete(k)
				require.True(t, ok)
			}
		}
		if i%7 == 0 { // and the line's own entry, so that chains move into it
			k := f.filler(f.a)
			if _, ok := tab.Delete(k); !ok {
				require.NoError(t, tab.Insert(k, valPtr("filler")))
			}
		}
	}
	stop.Store(true)
	<-done
	<-done
	require.Zero(t, bad.Load())
}

// TestBucketLock checks the bit lock of a bucket line: a writer of a locked
// bucket waits for it while writers of other buckets and every reader go
// on; the lock bit is invisible to readers, who compare seq without it; and
// a waiter yields the processor, so that at GOMAXPROCS=1 the holder runs
// and releases it.
func TestBucketLock(t *testing.T) {
	f := newTblNulls(t)
	tab := f.tab
	la := &tab.cur().lines[f.a]
	la.lock()
	require.NotZero(t, la.seq.Load()&seqLock)
	// A reader of A's line, which the lock does not stop.
	got, ok := tab.Lookup(f.filler(f.a))
	require.True(t, ok)
	require.Equal(t, "filler", *got)
	// A writer of another bucket goes on.
	require.NoError(t, tab.Insert(f.byBkt[f.b][0], valPtr("B")))
	// A writer of A waits.
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, ok := tab.Delete(f.filler(f.a))
		require.True(t, ok)
	}()
	select {
	case <-done:
		t.Fatal("a writer of a locked bucket went on")
	case <-time.After(50 * time.Millisecond):
	}
	_, ok = tab.Lookup(f.filler(f.a))
	require.True(t, ok, "the waiting writer deleted under the lock")
	la.unlock()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the writer never took the lock")
	}
	_, ok = tab.Lookup(f.filler(f.a))
	require.False(t, ok)
	require.Zero(t, la.seq.Load()&seqLock)

	// At one processor, a waiter yields to the holder.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	la.lock()
	go func() {
		runtime.Gosched()
		la.unlock()
	}()
	waited := make(chan struct{})
	go func() {
		defer close(waited)
		require.NoError(t, tab.Insert(f.byBkt[f.a][0], valPtr("A")))
	}()
	select {
	case <-waited:
	case <-time.After(30 * time.Second):
		t.Fatal("a waiter kept the holder from running")
	}
	tblCheckBuckets(t, tab, "after the locks")
}
