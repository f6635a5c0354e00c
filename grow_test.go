package hash4

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// growCheck checks that tab holds exactly want, through Lookup,
// AppendLookups, All, Len and Stats, and that its buckets and nodes are in
// order.
func growCheck(t *testing.T, tab *Table[int], want map[Tuple]*int, msg string) {
	t.Helper()
	keys := make([]Tuple, 0, len(want))
	for k, v := range want {
		got, ok := tab.Lookup(k)
		require.True(t, ok, "%s: %v not found", msg, k)
		require.Same(t, v, got, "%s: %v", msg, k)
		keys = append(keys, k)
	}
	for i, v := range tab.AppendLookups(nil, keys) {
		require.Same(t, want[keys[i]], v, "%s: AppendLookups %v", msg, keys[i])
	}
	require.Equal(t, len(want), tab.Len(), msg)
	got := tblCollect(t, tab)
	require.Len(t, got, len(want), msg)
	for k, v := range want {
		require.Same(t, v, got[tblCanon(k)], "%s: All %v", msg, k)
	}
	st := tab.Stats()
	require.Equal(t, len(want), st.Entries, msg)
	tblCheckBuckets(t, tab, msg)
	compactCheckNodes(t, tab, msg)
}

// TestTableGrow grows tables step by step, and by several doublings at
// once, with writes between the steps, and checks after each that the table
// holds what it held, that its new array ends its chains on nulls values of
// the other flip, and that lookups still allocate nothing.
func TestTableGrow(t *testing.T) {
	for _, h := range hashers {
		t.Run(h.String(), func(t *testing.T) {
			tab := New[int](WithFixedBuckets(), WithCapacity(16), WithSecret(tblSecret), WithHasher(h))
			want := map[Tuple]*int{}
			next := 0
			add := func(n int) {
				for range n {
					k := tblKey(next, next%3 == 0)
					v := valPtr(next)
					require.NoError(t, tab.Insert(k, v))
					want[k] = v
					next++
				}
			}
			add(48) // three per bucket
			for _, n := range []int{17, 64, 100, 1024, 4096} {
				before := tab.cur()
				require.NoError(t, tab.Grow(n))
				a := tab.cur()
				require.NotSame(t, before, a)
				require.Equal(t, bucketCount(n), len(a.lines))
				require.Equal(t, before.nullsBase^arrayNullsFlip, a.nullsBase)
				require.Nil(t, a.old.Load())
				for i := range before.lines {
					require.True(t, before.lines[i].moved(), "old bucket %d not marked moved", i)
				}
				growCheck(t, tab, want, fmt.Sprintf("grown to %d", n))
				// Writes go on in the new array: delete a third, add as many.
				i := 0
				for k, v := range want {
					if i++; i%3 == 0 {
						got, ok := tab.Delete(k)
						require.True(t, ok)
						require.Same(t, v, got)
						delete(want, k)
					}
				}
				add(len(a.lines) - len(want)) // one per bucket
				growCheck(t, tab, want, fmt.Sprintf("grown to %d, after writes", n))
			}
			var k Tuple
			for k = range want {
				break
			}
			require.Zero(t, testing.AllocsPerRun(100, func() { tab.Lookup(k) }))
		})
	}
}

// TestTableGrowTakesNoNode grows a table whose chains hold most of its
// entries: each entry goes to its new bucket's line or, that taken, moves
// in its own node; no node is carved, and those whose entries went to a
// line are free for reuse.
func TestTableGrowTakesNoNode(t *testing.T) {
	tab := New[int](WithFixedBuckets(), WithCapacity(16), WithSecret(tblSecret), WithHasher(LinuxHasher))
	want := map[Tuple]*int{}
	for i := range 400 {
		k := tblKey(i, i%2 == 0)
		want[k] = valPtr(i)
		require.NoError(t, tab.Insert(k, want[k]))
	}
	carved, _ := tab.nodes.stats()
	relinked := 0
	hooksOf(tab).relinked = func(uint32) { relinked++ }
	require.NoError(t, tab.Grow(128))
	after, _ := tab.nodes.stats()
	require.Equal(t, carved, after, "growth carved nodes")
	require.Positive(t, relinked)
	growCheck(t, tab, want, "grown")
}

// TestTableGrowNoOp checks that Grow to no more buckets than a table has
// changes nothing, and that a negative size panics and changes nothing.
func TestTableGrowNoOp(t *testing.T) {
	tab := New[int](WithFixedBuckets(), WithCapacity(64))
	want := map[Tuple]*int{}
	for i := range 100 {
		k := tblKey(i, false)
		want[k] = valPtr(i)
		require.NoError(t, tab.Insert(k, want[k]))
	}
	a := tab.cur()
	nodes := tab.Stats().Nodes
	for _, n := range []int{0, 1, 16, 63, 64} {
		require.NoError(t, tab.Grow(n), n)
		require.Same(t, a, tab.cur(), "Grow(%d) replaced the array", n)
	}
	require.PanicsWithValue(t, "hash4: Grow(-1): negative size", func() { _ = tab.Grow(-1) })
	require.PanicsWithValue(t, fmt.Sprintf("hash4: Grow(%d): negative size", math.MinInt), func() { _ = tab.Grow(math.MinInt) })
	require.Same(t, a, tab.cur())
	require.Equal(t, nodes, tab.Stats().Nodes)
	growCheck(t, tab, want, "after Grows to no more buckets")
}

// TestTableGrowMarkers checks that consecutive arrays end their chains in
// nulls values that no chain of the other has: a reader led from a chain
// of one into a chain of the next, through a node that moved, must end on a
// value not its own and restart.
func TestTableGrowMarkers(t *testing.T) {
	tab := New[int](WithFixedBuckets(), WithCapacity(16))
	a := tab.cur()
	for _, n := range []int{32, 256, 1024} {
		require.NoError(t, tab.Grow(n))
		b := tab.cur()
		values := map[uint32]bool{}
		for i := range a.lines {
			values[a.lines[i].next.load().nullsValue()] = true
		}
		for i := range b.lines {
			v := b.lines[i].next.load().nullsValue()
			require.False(t, values[v], "nulls value %d in arrays of %d and %d buckets", v, len(a.lines), len(b.lines))
			require.Less(t, v, uint32(maxNullsValue))
			require.False(t, v >= listenerNullsBase && v < listenerNullsBase+maxBuckets, "nulls value %d of a listener chain", v)
		}
		a = b
	}
}

// TestTableGrowReaderOnMovedNode stops a reader on node X of chain A of the
// old array, looking for Y behind it, grows the table, and lets the reader
// go on. X moved to its new bucket's line (its node freed, and reused in
// one case) or, that taken, in its own node to the new bucket's chain: the
// reader walks on into a chain of the new array, or along X's old next
// link, ends on a marker that is not its own or finds A emptied with its
// line's seq changed, and restarts; it finds Y.
func TestTableGrowReaderOnMovedNode(t *testing.T) {
	for _, reuse := range []bool{false, true} {
		t.Run(fmt.Sprint("reuse=", reuse), func(t *testing.T) {
			f := newTblNulls(t)
			tab := f.tab
			ka := f.byBkt[f.a]
			x, y := ka[0], ka[1]
			vx, vy := valPtr("X"), valPtr("Y")
			require.NoError(t, tab.Insert(y, vy))
			require.NoError(t, tab.Insert(x, vx))
			xIdx := f.headIndex(t, f.a)
			r, restarts := f.lookupAcross(t, y, xIdx, func() {
				require.NoError(t, tab.Grow(32))
				if !reuse || tab.nodes.at(xIdx).live() {
					return
				}
				// Fill the new array until X's old node holds an entry.
				for i := 0; !tab.nodes.at(xIdx).live(); i++ {
					require.Less(t, i, 4096, "X's node never reused")
					require.NoError(t, tab.Insert(tblKey(10000+i, false), valPtr("fill")))
				}
			})
			// (Y found in its node, moved into the new array, takes no
			// restart.)
			require.True(t, r.ok, "Lookup(Y) missed Y")
			require.Same(t, vy, r.v)
			t.Logf("%d restarts", restarts)
			got, ok := tab.Lookup(x)
			require.True(t, ok)
			require.Same(t, vx, got)
		})
	}
}

// TestTableGrowAllExactlyOnce grows the table from inside All's loop body,
// once by 16 times, and then by doublings at every step up to 2^14
// buckets: every entry present for the whole iteration is yielded exactly
// once.
func TestTableGrowAllExactlyOnce(t *testing.T) {
	for _, every := range []bool{false, true} {
		t.Run(fmt.Sprint("every=", every), func(t *testing.T) {
			tab := New[int](WithFixedBuckets(), WithCapacity(16))
			want := map[Tuple]*int{}
			for i := range 500 {
				k := tblCanon(tblKey(i, i%3 == 0))
				want[k] = valPtr(i)
				require.NoError(t, tab.Insert(k, want[k]))
			}
			seen := map[Tuple]int{}
			n, buckets := 0, 16
			for k, v := range tab.All() {
				require.Same(t, want[k], v, k)
				seen[k]++
				if every && buckets < 1<<14 {
					buckets *= 2
					require.NoError(t, tab.Grow(buckets))
				} else if !every && n == 100 {
					buckets *= 16
					require.NoError(t, tab.Grow(buckets))
				}
				n++
			}
			require.Len(t, seen, len(want))
			for k, c := range seen {
				require.Equal(t, 1, c, "%v yielded %d times", k, c)
			}
			require.Equal(t, buckets, tab.Stats().Buckets)
		})
	}
}

// TestTableGrowConcurrent grows tables from 16 buckets to 4096, one
// doubling after another, while readers look up keys that stay in the
// table (they must always be found, with their value) and keys that a
// writer inserts and deletes (any value returned must be of the key asked
// for), and an iterator checks that All yields each staying key once and
// that Stats counts them. Run it with -race.
func TestTableGrowConcurrent(t *testing.T) {
	dur := time.Second
	if testing.Short() {
		dur = 300 * time.Millisecond
	}
	type val struct{ tup Tuple }
	stay := make([]Tuple, 256)
	for i := range stay {
		stay[i] = tblCanon(stressKey(i))
	}
	churn := make([]Tuple, 512)
	for i := range churn {
		churn[i] = tblCanon(stressKey(len(stay) + i))
	}
	end := time.Now().Add(dur)
	rounds, lookups := 0, int64(0)
	for rounds < 3 || time.Now().Before(end) {
		rounds++
		tab := New[val](WithFixedBuckets(), WithCapacity(16), WithSecret(NewSecret()))
		hooksOf(tab) // before the table is shared: lookups read its hooks
		vals := make([]*val, len(stay))
		for i, k := range stay {
			vals[i] = &val{k}
			require.NoError(t, tab.Insert(k, vals[i]))
		}
		var (
			stop     atomic.Bool
			wg       sync.WaitGroup
			failures atomic.Int64
			n        atomic.Int64
		)
		fail := func(format string, args ...any) {
			if failures.Add(1) <= 10 {
				t.Errorf(format, args...)
			}
		}
		for rd := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(uint64(rd), uint64(rounds)))
				batch := make([]Tuple, 8)
				var got []*val
				for !stop.Load() {
					i := r.IntN(len(stay))
					if v, ok := tab.Lookup(stay[i]); !ok || v != vals[i] {
						fail("round %d: %v: got %v, %v", rounds, stay[i], v, ok)
					}
					c := churn[r.IntN(len(churn))]
					if v, ok := tab.Lookup(c); ok && v.tup != c {
						fail("round %d: %v returned the value of %v", rounds, c, v.tup)
					}
					for j := range batch {
						batch[j] = stay[(i+j)%len(stay)]
					}
					got = tab.AppendLookups(got[:0], batch)
					for j, v := range got {
						if v != vals[(i+j)%len(stay)] {
							fail("round %d: batch: %v: got %v", rounds, batch[j], v)
						}
					}
					n.Add(10)
				}
			}()
		}
		wg.Add(1)
		go func() { // the writer
			defer wg.Done()
			r := rand.New(rand.NewPCG(99, uint64(rounds)))
			for !stop.Load() {
				c := churn[r.IntN(len(churn))]
				if _, ok := tab.Delete(c); !ok {
					if err := tab.Insert(c, &val{c}); err != nil {
						fail("round %d: insert %v: %v", rounds, c, err)
					}
				}
			}
		}()
		wg.Add(1)
		go func() { // the iterator
			defer wg.Done()
			for !stop.Load() {
				seen := map[Tuple]int{}
				for k, v := range tab.All() {
					if v.tup != k {
						fail("round %d: All: %v with the value of %v", rounds, k, v.tup)
					}
					seen[k]++
				}
				for i, k := range stay {
					if seen[k] != 1 {
						fail("round %d: All yielded staying key %d %d times", rounds, i, seen[k])
					}
				}
				st := tab.Stats()
				buckets, entries := 0, 0
				for n, c := range st.ChainLengths {
					buckets += c
					entries += n * c
				}
				if buckets != st.Buckets || entries != st.Entries || st.Entries < len(stay) || st.Entries > len(stay)+len(churn) {
					fail("round %d: Stats: %d buckets counted of %d, %d entries counted of %d", rounds, buckets, st.Buckets, entries, st.Entries)
				}
			}
		}()
		for b := 32; b <= 4096; b *= 2 {
			if err := tab.Grow(b); err != nil {
				fail("round %d: Grow(%d): %v", rounds, b, err)
			}
			time.Sleep(time.Millisecond)
		}
		stop.Store(true)
		wg.Wait()
		require.Zero(t, failures.Load())
		lookups += n.Load()
		require.Equal(t, 4096, tab.Stats().Buckets)
		for i, k := range stay {
			v, ok := tab.Lookup(k)
			require.True(t, ok)
			require.Same(t, vals[i], v)
		}
		tblCheckBuckets(t, tab, fmt.Sprintf("round %d", rounds))
		compactCheckNodes(t, tab, fmt.Sprintf("round %d", rounds))
	}
	t.Logf("%d rounds, %d lookups", rounds, lookups)
}

// TestTCPTableEstablishedGrow grows a TCPTable's established table: its
// flows and its listeners are still found.
func TestTCPTableEstablishedGrow(t *testing.T) {
	tbl := NewTCPTable[string](WithCapacity(16), WithFixedBuckets())
	lis := netip.MustParseAddrPort("10.0.0.1:80")
	vl := valPtr("listener")
	release, err := tbl.Listen(lis, vl)
	require.NoError(t, err)
	flows := map[Tuple]*string{}
	for i := range 200 {
		k := Tuple{Local: lis, Remote: netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), uint16(1000+i))}
		flows[k] = valPtr(fmt.Sprint(i))
		require.NoError(t, tbl.Established().Insert(k, flows[k]))
	}
	require.NoError(t, tbl.Established().Grow(256))
	for k, v := range flows {
		got, ok := tbl.Lookup(k)
		require.True(t, ok)
		require.Same(t, v, got)
	}
	syn := Tuple{Local: lis, Remote: netip.MustParseAddrPort("198.51.100.7:5555")}
	got, ok := tbl.Lookup(syn)
	require.True(t, ok)
	require.Same(t, vl, got)
	release()
	_, ok = tbl.Lookup(syn)
	require.False(t, ok)
}

// growPaused starts tab.Grow(n) in a goroutine that stops before it moves
// each old bucket: next lets it go on to the next bucket and returns the
// bucket it stopped before, and wait lets it finish and returns Grow's
// error.
func growPaused[T any](t *testing.T, tab *Table[T], n int) (next func() uint32, wait func() error) {
	t.Helper()
	paused, resume, done := make(chan uint32), make(chan struct{}), make(chan error, 1)
	hooksOf(tab).growStep = func(b uint32) {
		select {
		case paused <- b:
			<-resume
		case <-resume: // closed by wait
		}
	}
	go func() { done <- tab.Grow(n) }()
	first := true
	next = func() uint32 {
		if !first {
			resume <- struct{}{}
		}
		first = false
		select {
		case b := <-paused:
			return b
		case <-time.After(30 * time.Second):
			t.Fatal("Grow never moved a bucket")
			return 0
		}
	}
	wait = func() error {
		close(resume)
		select {
		case err := <-done:
			hooksOf(tab).growStep = nil
			return err
		case <-time.After(30 * time.Second):
			t.Fatal("Grow did not return")
			return nil
		}
	}
	return next, wait
}

// bucketOf returns the bucket of tup in tab's array a.
func bucketOf[T any](tab *Table[T], a *bucketArray[T], tup Tuple) uint32 {
	return tblKeyOf(tab, tup).hash() & a.mask
}

// unmoved returns the buckets of the array tab's growth moves entries out
// of that it has not moved yet.
func unmoved[T any](tab *Table[T]) []uint32 {
	us := []uint32{}
	if o := tab.cur().old.Load(); o != nil {
		for b := range o.lines {
			if !o.lines[b].moved() {
				us = append(us, uint32(b))
			}
		}
	}
	return us
}

// TestTableGrowBucketByBucket stops Grow before each old bucket it moves
// and, while it waits, uses the table: lookups, one at a time and in
// batches, find every entry, whether its bucket has moved or not; an
// insert, a delete and a swap in a bucket that has not moved move its
// entries first, and none of them waits for Grow, which then skips that
// bucket. In the All and Stats variants, that method, at the first stop,
// moves every bucket left and counts each entry once.
func TestTableGrowBucketByBucket(t *testing.T) {
	for _, iterate := range []string{"", "All", "Stats"} {
		t.Run("iterate="+iterate, func(t *testing.T) {
			const buckets = 16
			tab := New[int](WithFixedBuckets(), WithCapacity(buckets), WithSecret(tblSecret), WithHasher(LinuxHasher))
			old := tab.cur()
			want := map[Tuple]*int{}
			next := 0
			fresh := func(b uint32) Tuple { // a key of old bucket b not in the table
				for {
					k := tblCanon(tblKey(next, next%3 == 0))
					next++
					if bucketOf(tab, old, k) == b {
						return k
					}
				}
			}
			for b := range uint32(buckets) {
				for range 3 { // a line and two nodes
					k := fresh(b)
					want[k] = valPtr(next)
					require.NoError(t, tab.Insert(k, want[k]))
				}
			}
			check := func(msg string) {
				t.Helper()
				keys := make([]Tuple, 0, len(want))
				for k, v := range want {
					got, ok := tab.Lookup(k)
					require.True(t, ok, "%s: %v not found", msg, k)
					require.Same(t, v, got, msg)
					keys = append(keys, k)
				}
				for i, v := range tab.AppendLookups(nil, keys) {
					require.Same(t, want[keys[i]], v, "%s: AppendLookups", msg)
				}
				for range 8 {
					_, ok := tab.Lookup(fresh(uint32(next % buckets)))
					require.False(t, ok, msg)
				}
				require.Equal(t, len(want), tab.Len(), msg)
			}
			// writes runs an insert, a delete and a swap in old bucket b in
			// a goroutine that must not wait for Grow.
			writes := func(b uint32) {
				t.Helper()
				var in []Tuple // two keys of the table in old bucket b
				for k := range want {
					if bucketOf(tab, old, k) == b && len(in) < 2 {
						in = append(in, k)
					}
				}
				require.Len(t, in, 2)
				done := make(chan struct{})
				ins, del, swap := fresh(b), in[0], in[1]
				vIns, vSwap, was := valPtr(next), valPtr(next+1), want[swap]
				go func() {
					defer close(done)
					assert.NoError(t, tab.Insert(ins, vIns))
					_, ok := tab.Delete(del)
					assert.True(t, ok)
					assert.True(t, tab.CompareAndSwap(swap, was, vSwap))
				}()
				select {
				case <-done:
				case <-time.After(30 * time.Second):
					t.Fatalf("writes in bucket %d waited for Grow", b)
				}
				want[ins] = vIns
				delete(want, del)
				want[swap] = vSwap
			}

			step, wait := growPaused(t, tab, 2*buckets)
			for i := range buckets {
				b := step()
				if i > 0 && iterate != "" {
					continue // moved by the iteration below
				}
				require.Equal(t, uint32(i), b, "Grow moves the buckets in order")
				require.NotNil(t, tab.cur().old.Load(), "old array dropped before Grow ended")
				left := unmoved(tab)
				check(fmt.Sprintf("before bucket %d", b))
				require.Equal(t, left, unmoved(tab), "lookups moved entries")
				if len(left) > 1 {
					writes(left[len(left)-1]) // moves it
					require.Equal(t, left[:len(left)-1], unmoved(tab))
				}
				if i > 0 {
					writes(b - 1) // moved by Grow
				}
				check(fmt.Sprintf("before bucket %d, after writes", b))
				if iterate != "" && i == 0 {
					if iterate == "Stats" {
						require.Equal(t, len(want), tab.Stats().Entries)
					} else {
						got := tblCollect(t, tab)
						require.Len(t, got, len(want))
						for k, v := range want {
							require.Same(t, v, got[k], "All %v", k)
						}
					}
					require.Empty(t, unmoved(tab), "%s left entries in the old array", iterate)
				}
			}
			require.NoError(t, wait())
			require.Nil(t, tab.cur().old.Load(), "old array kept after Grow")
			growCheck(t, tab, want, "grown bucket by bucket")
		})
	}
}

// TestTableGrowWriterAcrossPublish holds bucket A's lock in the old array
// from before Grow publishes its new array to after, as a writer that
// locked it just before may, and under it, and under the lock of bucket B
// of the old array, deletes X from chain A and reuses its node for Z in
// chain B, while a lookup of Y, behind X in A, stands on X in its walk of
// the old array. The lookup goes on into chain B of the old array, ends on
// B's marker, walks again and finds Y, which has not moved yet.
func TestTableGrowWriterAcrossPublish(t *testing.T) {
	f := newTblNulls(t)
	tab := f.tab
	ka := f.byBkt[f.a]
	x, y, z := ka[0], ka[1], f.byBkt[f.b][0]
	vx, vy, vz := valPtr("X"), valPtr("Y"), valPtr("Z")
	require.NoError(t, tab.Insert(y, vy))
	require.NoError(t, tab.Insert(x, vx))
	xIdx := f.headIndex(t, f.a)
	kx, kz := tblKeyOf(tab, x), tblKeyOf(tab, z)
	old, la := tab.lockBucket(kx.hash())
	grown := make(chan error, 1)
	go func() { grown <- tab.Grow(32) }()
	for start := time.Now(); tab.cur() == old; time.Sleep(time.Millisecond) {
		require.Less(t, time.Since(start), 30*time.Second, "Grow never published its array")
	}
	arrived, release := f.blockAt(xIdx)
	res := f.lookupAsync(y)
	tblWait(t, arrived)
	before := tab.restarts.Load()
	// The writer, in the old array: delete X, insert Z in X's node.
	e, prev, i := tab.findLocked(la, kx)
	require.Equal(t, xIdx, i)
	require.Same(t, vx, tab.remove(la, e, prev, i, kx))
	lb := old.line(kz.hash())
	require.Same(t, &old.lines[f.b], lb)
	lb.lock()
	require.True(t, tab.place(lb, kz, vz))
	require.Equal(t, xIdx, f.headIndexIn(t, old, f.b), "X's node not reused")
	lb.unlock()
	close(release)
	r := tblWaitResult(t, res)
	require.True(t, r.ok, "Lookup(Y) missed Y")
	require.Same(t, vy, r.v)
	require.Greater(t, tab.restarts.Load(), before)
	la.unlock()
	require.NoError(t, <-grown)
	for k, v := range map[Tuple]*string{y: vy, z: vz} {
		got, ok := tab.Lookup(k)
		require.True(t, ok, "%v not found", k)
		require.Same(t, v, got)
	}
	_, ok := tab.Lookup(x)
	require.False(t, ok, "X found after its delete")
	tblCheckBuckets(t, tab, "after Grow")
}

// headIndexIn returns the node index at the head of bucket b's chain in a.
func (f *tblNulls) headIndexIn(t *testing.T, a *bucketArray[string], b uint32) uint32 {
	l := a.lines[b].next.load()
	require.False(t, l.isNulls(), "bucket %d's chain empty", b)
	return l.index()
}

// TestTableGrowReaderBeforeMove stops a lookup of Y after it read Y's
// bucket's line in the new array, still empty, before Grow moved Y's old
// bucket, and lets Grow finish: the lookup then finds no old array, but the
// line's seq changed when Y moved into it, so it walks again and finds Y.
// (Had it loaded old after its check of seq, it would have missed Y.)
func TestTableGrowReaderBeforeMove(t *testing.T) {
	tab := New[int](WithFixedBuckets(), WithCapacity(16), WithSecret(tblSecret), WithHasher(LinuxHasher))
	var y Tuple
	for i := 0; ; i++ {
		if y = tblKey(i, false); bucketOf(tab, tab.cur(), y) == 1 {
			break
		}
	}
	vy := valPtr(1)
	require.NoError(t, tab.Insert(y, vy))
	step, wait := growPaused(t, tab, 32)
	require.Equal(t, uint32(0), step())
	require.Equal(t, uint32(1), step())
	require.Contains(t, unmoved(tab), uint32(1))
	lookedUp := lookupStopped(t, tab, y, visitLine, "the lookup never read a line")
	before := tab.restarts.Load()
	require.NoError(t, wait())
	require.Nil(t, tab.cur().old.Load())
	require.Same(t, vy, lookedUp(), "Lookup(Y) missed Y")
	require.Greater(t, tab.restarts.Load(), before)
}

// TestTableGrowReaderBeforeRelink stops a lookup of C in the new array while
// Grow moves C's old bucket into it: the line holds A, moved first, and the
// lookup stands on B, relinked into the chain next, when Grow relinks C at
// the chain's head, behind the lookup, and finishes. The lookup then ends on
// its own marker, with no old array: only the line's seq, changed by C's
// relink, tells it to walk again, and it finds C.
func TestTableGrowReaderBeforeRelink(t *testing.T) {
	tab := New[int](WithFixedBuckets(), WithCapacity(16), WithSecret(tblSecret), WithHasher(LinuxHasher))
	var abc []Tuple // three keys of bucket 1 in 16 buckets and in 32
	for i := 0; len(abc) < 3; i++ {
		if k := tblKey(i, false); tblKeyOf(tab, k).hash()&31 == 1 {
			abc = append(abc, k)
		}
	}
	a, b, c := abc[0], abc[1], abc[2]
	vc := valPtr(3)
	// A in the line, then the chain B -> C: growth moves A, B, C in turn.
	require.NoError(t, tab.Insert(a, valPtr(1)))
	require.NoError(t, tab.Insert(c, vc))
	require.NoError(t, tab.Insert(b, valPtr(2)))
	bIdx := tab.cur().line(1).next.load().index()
	var lookedUp func() *int
	hooksOf(tab).relinked = func(i uint32) {
		if i == bIdx {
			lookedUp = lookupStopped(t, tab, c, bIdx, "the lookup never reached B")
		}
	}
	require.NoError(t, tab.Grow(32))
	require.NotNil(t, lookedUp, "Grow never relinked B")
	require.Nil(t, tab.cur().old.Load())
	before := tab.restarts.Load()
	require.Same(t, vc, lookedUp(), "Lookup(C) missed C")
	require.Greater(t, tab.restarts.Load(), before)
}

// TestTableGrowReaderOnOlderArray stops a lookup of Y in lookupGrowing
// right after it loaded the table's array B, while a Grow moves entries
// into B, and lets that Grow finish and another move every entry into a
// newer array C, emptying B. The lookup then finds no old array in B, and
// Y's bucket in B empty and unchanged since it looked: only the array check
// tells it that B is no longer the table's, and it walks C and finds Y.
func TestTableGrowReaderOnOlderArray(t *testing.T) {
	tab := New[int](WithFixedBuckets(), WithCapacity(16), WithSecret(tblSecret), WithHasher(LinuxHasher))
	y := tblKey(1, false)
	vy := valPtr(1)
	require.NoError(t, tab.Insert(y, vy))
	step, wait := growPaused(t, tab, 32)
	require.Equal(t, uint32(0), step())
	b := tab.cur()
	lookedUp := lookupStopped(t, tab, y, visitGrowing, "the lookup never reached lookupGrowing")
	require.NoError(t, wait())
	require.NoError(t, tab.Grow(64))
	require.NotSame(t, b, tab.cur())
	require.Nil(t, b.old.Load())
	require.Same(t, vy, lookedUp(), "Lookup(Y) missed Y")
}

// lookupStopped starts Lookup(y) in a goroutine and returns once the lookup
// has called tab.visit with at (its first such call, where it stays): what
// names the place for the failure message. result lets the lookup go on
// and returns its value.
func lookupStopped(t *testing.T, tab *Table[int], y Tuple, at uint32, what string) (result func() *int) {
	t.Helper()
	arrived, release := make(chan struct{}), make(chan struct{})
	blocked := false // only the reader touches it
	hooksOf(tab).visit = func(i uint32) {
		if i == at && !blocked {
			blocked = true
			close(arrived)
			<-release
		}
	}
	res := make(chan *int, 1)
	go func() {
		v, _ := tab.Lookup(y)
		res <- v
	}()
	select {
	case <-arrived:
	case <-time.After(30 * time.Second):
		t.Fatal(what)
	}
	return func() *int {
		close(release)
		select {
		case v := <-res:
			return v
		case <-time.After(30 * time.Second):
			t.Fatal("Lookup did not return")
			return nil
		}
	}
}

// TestTableGrowsItself fills tables through Insert and LookupOrInsert: each
// grows itself, doubling, once it holds more than two entries per bucket,
// and no further, and then holds exactly what was inserted; a table made
// WithFixedBuckets does not grow. A TCPTable's established table grows
// itself under its listeners.
func TestTableGrowsItself(t *testing.T) {
	for _, c := range []struct {
		name string
		opts []Option
		n    int
	}{
		{"small", []Option{WithCapacity(16)}, 5000},
		{"default", nil, 20000},
		{"at a power of two", []Option{WithCapacity(16)}, 4097},
	} {
		t.Run(c.name, func(t *testing.T) {
			tab := New[int](append(c.opts, WithSecret(tblSecret), WithHasher(LinuxHasher))...)
			fixed := New[int](append(c.opts, WithSecret(tblSecret), WithHasher(LinuxHasher), WithFixedBuckets())...)
			start := tab.Stats().Buckets
			want := map[Tuple]*int{}
			for i := range c.n {
				k := tblKey(i, i%3 == 0)
				want[k] = valPtr(i)
				if i%2 == 0 {
					require.NoError(t, tab.Insert(k, want[k]))
				} else {
					_, found, err := tab.LookupOrInsert(k, want[k])
					require.NoError(t, err)
					require.False(t, found)
				}
				require.NoError(t, fixed.Insert(k, want[k]))
			}
			tab.growers.Wait()
			require.False(t, tab.growing.Load())
			buckets := tab.Stats().Buckets
			require.Greater(t, buckets, start)
			// Past its limit by at most a 64th (see overLimit), and
			// grown only past the limit before.
			require.LessOrEqual(t, c.n, maxLoad*buckets+maxLoad*buckets/64)
			require.Greater(t, c.n, buckets)
			growCheck(t, tab, want, "grown by itself")
			require.Equal(t, start, fixed.Stats().Buckets, "WithFixedBuckets")
			growCheck(t, fixed, want, "fixed")
			// Deletes do not shrink it, and reinserts take it no further,
			// unless the fill left it past its limit within the slack:
			// then the refill's triggers, armed elsewhere, may fire.
			for k := range want {
				_, ok := tab.Delete(k)
				require.True(t, ok)
			}
			require.Equal(t, buckets, tab.Stats().Buckets, "after deletes")
			for k, v := range want {
				require.NoError(t, tab.Insert(k, v))
			}
			tab.growers.Wait()
			if refilled := tab.Stats().Buckets; c.n <= maxLoad*buckets || refilled != 2*buckets {
				require.Equal(t, buckets, refilled, "refilled")
			}
			growCheck(t, tab, want, "refilled")
		})
	}
	t.Run("TCPTable", func(t *testing.T) {
		tbl := NewTCPTable[string](WithCapacity(16), WithLockStripes(2))
		lis := netip.MustParseAddrPort("10.0.0.1:80")
		vl := valPtr("listener")
		release, err := tbl.Listen(lis, vl)
		require.NoError(t, err)
		defer release()
		flows := map[Tuple]*string{}
		for i := range 1000 {
			k := Tuple{Local: lis, Remote: netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2 + byte(i>>8), byte(i)}), uint16(1000+i))}
			flows[k] = valPtr(fmt.Sprint(i))
			require.NoError(t, tbl.Established().Insert(k, flows[k]))
		}
		est := tbl.Established()
		est.growers.Wait()
		require.Equal(t, 512, est.Stats().Buckets)
		for k, v := range flows {
			got, ok := tbl.Lookup(k)
			require.True(t, ok)
			require.Same(t, v, got)
		}
		got, ok := tbl.Lookup(Tuple{Local: lis, Remote: netip.MustParseAddrPort("198.51.100.7:5555")})
		require.True(t, ok)
		require.Same(t, vl, got)
	})
}

// TestTableGrowthChecksFew holds a table at its limit under turnover, with
// its inserts and deletes on one processor and on the other: an insert
// past its shard's trigger sums the shards, and finding the table within
// its limit raises the trigger by at least a 64th of the limit, so the
// sums are few.
func TestTableGrowthChecksFew(t *testing.T) {
	tab := New[int](WithCapacity(1<<12), WithSecret(tblSecret), WithHasher(LinuxHasher))
	var checks, over atomic.Int32
	hooksOf(tab).checked = func(g bool) {
		checks.Add(1)
		if g {
			over.Add(1)
		}
	}
	v := valPtr(0)
	limit := int(tab.growLimit(tab.cur()))
	for i := range limit {
		require.NoError(t, tab.Insert(tblKey(i, false), v))
	}
	base := checks.Load()
	const turns = 20000
	for i := range turns {
		_, ok := tab.Delete(tblKey(i, false))
		require.True(t, ok)
		require.NoError(t, tab.Insert(tblKey(limit+i, false), v))
	}
	tab.growers.Wait()
	require.Zero(t, over.Load(), "past its limit at its limit")
	require.Equal(t, 1<<12, tab.Stats().Buckets)
	require.LessOrEqual(t, checks.Load()-base, int32(turns/(limit/64)+len(tab.shards)+1))
}

// stripeKeys returns n distinct IPv4 tuples whose hashes, with h and
// tblSecret, agree on the bits of mask (all 0 there), as one who knows the
// secret can choose them: they fall into one chain of a table whose bucket
// mask is within mask.
func stripeKeys(t *testing.T, h Hasher, mask uint32, n int) []Tuple {
	t.Helper()
	keys := make([]Tuple, 0, n)
	local := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, 1}), 443)
	for i := 0; len(keys) < n; i++ {
		if i == 1<<30 {
			t.Fatalf("%d of %d keys found", len(keys), n)
		}
		k := Tuple{Local: local, Remote: netip.AddrPortFrom(netip.AddrFrom4([4]byte{100, byte(i >> 16), byte(i >> 8), byte(i)}), uint16(1024+i>>24))}
		if HashTuple(k, h, tblSecret)&mask == 0 {
			keys = append(keys, k)
		}
	}
	return keys
}

// heapAfterGC returns the heap in use once the garbage collector has run.
func heapAfterGC() int64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC() // and what the first cycle's cleanups freed
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// TestTableGrowthBoundedByEntries fills default tables, with either hasher,
// with keys chosen (the secret known) to share the low bits of their
// hashes, so that one chain holds many of them in every array: the table
// grows on its total count, to at most one bucket per entry, so that it
// holds a bounded number of bytes per entry however long its chains.
func TestTableGrowthBoundedByEntries(t *testing.T) {
	const n = 1<<13 + 1<<8 // past 8192, the limit of 4096 buckets, by more than its 64th
	for _, h := range hashers {
		t.Run(h.String(), func(t *testing.T) {
			keys := stripeKeys(t, h, 1<<6-1, n)
			v := valPtr(0)
			before := heapAfterGC()
			tab := New[int](WithSecret(tblSecret), WithHasher(h))
			for _, k := range keys {
				require.NoError(t, tab.Insert(k, v))
			}
			tab.growers.Wait()
			perEntry := float64(heapAfterGC()-before) / n
			runtime.KeepAlive(keys) // made before the table: not counted, but not freed either
			st := tab.Stats()
			runtime.KeepAlive(tab)
			t.Logf("%.1f bytes per entry; %d buckets and %d nodes for %d entries, longest chain %d", perEntry, st.Buckets, st.Nodes, st.Entries, st.LongestChain)
			require.Equal(t, n, st.Entries)
			require.Equal(t, 1<<13, st.Buckets, "grown to about the entries")
			require.LessOrEqual(t, perEntry, 200.0)
		})
	}
}

// huge is a size no table can have: 2^40 where an int holds it, the
// largest int on 32-bit targets.
var huge = int(min(uint64(1)<<40, uint64(math.MaxInt)))

// TestTableMaxBuckets checks WithMaxBuckets: the bound is n rounded down
// to a power of two, at least 16; a table does not grow itself past it,
// Grow past it fails with ErrTooLarge and changes nothing, and the default
// capacity is lowered to it.
func TestTableMaxBuckets(t *testing.T) {
	for _, c := range []struct{ max, limit, buckets int }{
		{0, maxBuckets, 1024},
		{1, 16, 16},
		{16, 16, 16},
		{100, 64, 64},
		{1000, 512, 512},
		{1024, 1024, 1024},
		{5000, 4096, 1024},
		{huge, maxBuckets, 1024},
	} {
		tab := New[int](WithMaxBuckets(c.max), WithSecret(tblSecret), WithHasher(LinuxHasher))
		require.Equal(t, c.limit, tab.bucketLimit, "WithMaxBuckets(%d)", c.max)
		require.Equal(t, c.buckets, tab.Stats().Buckets, "WithMaxBuckets(%d)", c.max)
	}
	// Grown by itself, up to the bound and no further.
	tab := New[int](WithCapacity(16), WithMaxBuckets(100), WithSecret(tblSecret), WithHasher(LinuxHasher))
	want := map[Tuple]*int{}
	for i := range 1000 {
		k := tblKey(i, i%2 == 0)
		want[k] = valPtr(i)
		require.NoError(t, tab.Insert(k, want[k]))
	}
	tab.growers.Wait()
	require.Equal(t, 64, tab.Stats().Buckets)
	require.False(t, tab.growing.Load(), "a table at its bound is not growing")
	growCheck(t, tab, want, "at its bound")
	a := tab.cur()
	require.ErrorIs(t, tab.Grow(65), ErrTooLarge)
	require.ErrorIs(t, tab.Grow(huge), ErrTooLarge)
	require.NoError(t, tab.Grow(64))
	require.Same(t, a, tab.cur())
	growCheck(t, tab, want, "after Grows past its bound")
}

// allocated returns the bytes of heap that f allocates.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestTableSizesFailCleanly checks that sizes no table can have fail before
// allocating: New panics (and so do NewUDPTable and NewTCPTable), and Grow
// returns ErrTooLarge, for sizes beyond the most buckets a table can have
// and for arrays beyond the process's memory limit.
func TestTableSizesFailCleanly(t *testing.T) {
	for _, c := range []struct {
		opts []Option
		msg  string
	}{
		{[]Option{WithCapacity(huge)}, fmt.Sprintf("hash4: WithCapacity(%d) beyond 536870912 buckets, the most a table can have", huge)},
		{[]Option{WithCapacity(maxBuckets + 1)}, "hash4: WithCapacity(536870913) beyond 536870912 buckets, the most a table can have"},
		{[]Option{WithMaxBuckets(1000), WithCapacity(513)}, "hash4: WithCapacity(513) beyond WithMaxBuckets(1000), 512 buckets"},
		{[]Option{WithCapacity(4096), WithMaxBuckets(4095)}, "hash4: WithCapacity(4096) beyond WithMaxBuckets(4095), 2048 buckets"},
		{[]Option{WithMaxBuckets(-1)}, "hash4: WithMaxBuckets(-1): negative"},
	} {
		require.PanicsWithValue(t, c.msg, func() { New[int](c.opts...) })
	}
	require.Equal(t, 512, New[int](WithMaxBuckets(1000), WithCapacity(512)).Stats().Buckets)
	require.PanicsWithValue(t, fmt.Sprintf("hash4: WithCapacity(%d) beyond 536870912 buckets, the most a table can have", huge), func() { NewUDPTable[int](WithCapacity(huge)) })
	require.PanicsWithValue(t, fmt.Sprintf("hash4: WithCapacity(%d) beyond 536870912 buckets, the most a table can have", huge), func() { NewTCPTable[int](WithCapacity(huge)) })

	tab := New[int](WithCapacity(64), WithSecret(tblSecret), WithHasher(LinuxHasher))
	a := tab.cur()
	for _, n := range []int{maxBuckets + 1, huge, math.MaxInt} {
		err := tab.Grow(n)
		require.ErrorIs(t, err, ErrTooLarge)
		require.Equal(t, fmt.Sprintf("hash4: size beyond the table's bucket limit: Grow(%d) beyond 536870912 buckets", n), err.Error())
	}
	require.Less(t, allocated(func() { _ = tab.Grow(huge) }), uint64(1024), "Grow past the limit allocates only its error")

	// Past the process's memory limit: refused before the array is made.
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(1 << 30))
	require.PanicsWithValue(t, "hash4: WithCapacity(33554432): 33554432 buckets take 2147483648 bytes, beyond the memory limit of 1073741824", func() { New[int](WithCapacity(1 << 25)) })
	err := tab.Grow(1 << 25)
	require.ErrorIs(t, err, ErrTooLarge)
	require.Equal(t, "hash4: size beyond the table's bucket limit: Grow(33554432): 33554432 buckets take 2147483648 bytes, beyond the memory limit of 1073741824", err.Error())
	require.Less(t, allocated(func() { _ = tab.Grow(1 << 25) }), uint64(1024))
	require.Same(t, a, tab.cur())
	require.NoError(t, tab.Grow(1<<10))
	require.Equal(t, 1<<10, tab.Stats().Buckets)
}

// TestReleasedNullsValue checks that the marker of released nodes ends no
// chain: bucket indexes of either flip of the array, and of listener
// chains, which never flip, stay below it.
func TestReleasedNullsValue(t *testing.T) {
	require.Less(t, uint64(arrayNullsFlip+maxBuckets-1), uint64(releasedNullsValue), "array chains")
	require.Less(t, uint64(listenerNullsBase+maxBuckets-1), uint64(releasedNullsValue), "listener chains")
	require.Less(t, uint64(listenerNullsBase+maxBuckets-1), uint64(arrayNullsFlip), "listener chains below the flip")
	require.True(t, nullsLink(releasedNullsValue).isNulls())
	require.EqualValues(t, releasedNullsValue, nullsLink(releasedNullsValue).nullsValue())
}

// valPtr returns a pointer to a new variable holding v, as new(v) does from
// Go 1.26 on; the tests build with Go 1.23.
func valPtr[T any](v T) *T { return &v }
