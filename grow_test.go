package hash4

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// growCheck checks that tab holds exactly want, through Lookup,
// AppendLookups, All, Len and Stats, and that its home slot bookkeeping
// holds.
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
	tblCheckHome(t, tab, msg)
	growCheckNodes(t, tab, msg)
}

// growCheckNodes checks that every node tab has carved, in every array it
// has had but the released ones, is accounted for once: linked in a chain
// of the current array, a free home slot of it, or free in a stripe's cache
// or the depot. The table must be quiescent.
func growCheckNodes[T any](t *testing.T, tab *Table[T], msg string) {
	t.Helper()
	a := tab.cur()
	seen := map[uint32]string{}
	see := func(i uint32, as string) {
		prev, dup := seen[i]
		require.False(t, dup, "%s: node %d %s and %s", msg, i, prev, as)
		seen[i] = as
	}
	for b := range a.b.heads {
		for l := a.b.heads[b].load(); !l.isNulls(); l = tab.nodes.at(l.index()).next.load() {
			see(l.index(), "linked")
		}
	}
	for b := range uint32(len(a.b.heads)) {
		if w, m := a.home.bit(&a.b.stripes[b&a.b.stripeMask], b); *w&m != 0 {
			see(a.home.slot(b), "a free home slot")
		}
	}
	for s := range a.b.stripes {
		for _, i := range a.b.stripes[s].cache.free {
			see(i, "cached")
		}
	}
	for _, i := range tab.nodes.depot {
		see(i, "in the depot")
	}
	for i, as := range seen {
		require.Equal(t, as == "linked", tab.nodes.at(i).seq.Load()&1 == 1, "%s: node %d %s, seq %d", msg, i, as, tab.nodes.at(i).seq.Load())
	}
	nodes, _ := tab.nodes.stats()
	require.Len(t, seen, nodes, "%s: nodes accounted for, of those carved", msg)
}

// TestTableGrow grows tables of every layout step by step, and by several
// doublings at once, with writes between the steps, and checks after each
// that the table holds what it held, that its new array lays out as a new
// table of its size would, and that lookups still allocate nothing.
func TestTableGrow(t *testing.T) {
	cases := []struct {
		name string
		opts []Option
	}{
		{"default", nil},
		{"one stripe", []Option{WithLockStripes(1)}},
		{"groups", []Option{withHomeGroups(true), WithLockStripes(2)}},
		{"XXH3", []Option{WithHasher(XXH3Hasher)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tab := New[int](append([]Option{WithFixedBuckets(), WithCapacity(16), WithSecret(tblSecret), WithHasher(LinuxHasher)}, c.opts...)...)
			stripes := tab.Stats().LockStripes
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
				require.Equal(t, bucketCount(n), len(a.b.heads))
				require.Equal(t, stripes, len(a.b.stripes), "Grow keeps the stripes")
				require.Equal(t, before.b.nullsBase^arrayNullsFlip, a.b.nullsBase)
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
				add(len(a.b.heads) - len(want)) // one per bucket
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

// TestTableGrowHomeGroups grows a table past homeGroupMinBuckets: the new
// array has home groups, as a new table of its size has, and its entries
// fill them.
func TestTableGrowHomeGroups(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a table of 2^16 entries")
	}
	tab := New[int](WithFixedBuckets(), WithCapacity(homeGroupMinBuckets/2), WithSecret(tblSecret), WithHasher(LinuxHasher))
	require.False(t, tab.cur().home.grouped())
	want := map[Tuple]*int{}
	for i := range homeGroupMinBuckets {
		k := tblKey(i, i%2 == 0)
		want[k] = valPtr(i)
		require.NoError(t, tab.Insert(k, want[k]))
	}
	require.NoError(t, tab.Grow(homeGroupMinBuckets))
	require.True(t, tab.cur().home.grouped())
	growCheck(t, tab, want, "grown into groups")
	st := tab.Stats()
	require.Positive(t, st.GroupEntries, "no entry in a home slot of its group")
	// As a table of the new size, filled once: the share of entries in a
	// home slot of their group is near 80.5% (see home.go).
	require.Greater(t, float64(st.HomeEntries+st.GroupEntries)/float64(st.Entries), 0.78)
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

// TestTableGrowNodeBatch checks that a grown table moves free nodes
// between its stripes' caches and the depot in the batches of a table made
// at its size (see Table.New): a table grown from 1024 buckets under 64
// stripes, which moved them one at a time, filled a million entries 24%
// slower with the batch it was made with.
func TestTableGrowNodeBatch(t *testing.T) {
	tab := New[int](WithSecret(tblSecret), WithHasher(LinuxHasher))
	require.Equal(t, 1, tab.nodes.batchSize())
	stripes := len(tab.cur().b.stripes)
	for _, n := range []int{1 << 13, 1 << 15, 1 << 16, 1 << 18} {
		require.NoError(t, tab.Grow(n))
		require.Equal(t, min(max(n/stripes/64, 1), slabBatch), tab.nodes.batchSize(), "grown to %d", n)
	}
	require.Equal(t, slabBatch, tab.nodes.batchSize())
	require.Equal(t, stripes, len(tab.cur().b.stripes))
}

// TestTableGrowMarkers checks that consecutive arrays end their chains in
// nulls values that no chain of the other has: a reader led from a chain
// of one into a chain of the next, through a node that Grow filled while
// the old array was still the table's, must end on a value not its own and
// restart, since it cannot yet see the array replaced.
func TestTableGrowMarkers(t *testing.T) {
	tab := New[int](WithFixedBuckets(), WithCapacity(16))
	a := tab.cur()
	for _, n := range []int{32, 256, 1024} {
		require.NoError(t, tab.Grow(n))
		b := tab.cur()
		values := map[uint32]bool{}
		for i := range a.b.heads {
			values[a.b.heads[i].load().nullsValue()] = true
		}
		for i := range b.b.heads {
			v := b.b.heads[i].load().nullsValue()
			require.False(t, values[v], "nulls value %d in arrays of %d and %d buckets", v, len(a.b.heads), len(b.b.heads))
			require.Less(t, v, uint32(maxNullsValue))
			require.False(t, v >= listenerNullsBase && v < listenerNullsBase+maxBuckets, "nulls value %d of a listener chain", v)
		}
		a = b
	}
}

// TestTableGrowReaderOnRetiredEntry stops a reader on entry X of chain A,
// looking for Y behind it, grows the table, and lets the reader go on. The
// entries of the old array are free by then: without a reuse of X's node,
// the reader walks the old chain to its own marker, misses, finds the array
// replaced (or its stripe's move count changed) and walks the new one;
// with X's node reused in the new array, it follows X into a chain of the
// new array and restarts on its marker. Either way it finds Y, after a
// restart.
func TestTableGrowReaderOnRetiredEntry(t *testing.T) {
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
				require.Zero(t, tab.nodes.at(xIdx).seq.Load()&1, "X's old node not freed")
				if !reuse {
					return
				}
				// Fill the new array until X's old node holds an entry.
				for i := 0; tab.nodes.at(xIdx).seq.Load()&1 == 0; i++ {
					require.Less(t, i, 4096, "X's node never reused")
					k := tblKey(10000+i, false)
					require.NoError(t, tab.Insert(k, valPtr("fill")))
				}
			})
			require.True(t, r.ok, "Lookup(Y) missed Y")
			require.Same(t, vy, r.v)
			require.Positive(t, restarts)
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
			tab := New[int](WithFixedBuckets(), WithCapacity(16), WithLockStripes(4))
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
// that Stats counts them. Every other round, each Grow finds the index
// space ending at its new home slots, so that it moves entries in their
// own nodes, and the writer's inserts may find the table full. Run it with
// -race.
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
		spent := rounds%2 == 0
		tab := New[val](WithFixedBuckets(), WithCapacity(16), WithLockStripes(4), WithSecret(NewSecret()))
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
					if err := tab.Insert(c, &val{c}); err != nil && !(spent && errors.Is(err, ErrTableFull)) {
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
		if spent {
			spendIndexSpace(tab)
		}
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
		tblCheckHome(t, tab, fmt.Sprintf("round %d", rounds))
		growCheckNodes(t, tab, fmt.Sprintf("round %d", rounds))
	}
	t.Logf("%d rounds, %d lookups", rounds, lookups)
}

// TestTCPTableEstablishedGrow grows a TCPTable's established table: its
// flows and its listeners are still found, and the listeners' chains, which
// do not grow, share the node store with the new array.
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
	// Listeners come and go in nodes freed by the Grow.
	for i := range 50 {
		release, err := tbl.Listen(netip.AddrPortFrom(lis.Addr(), uint16(2000+i)), valPtr("l"))
		require.NoError(t, err)
		defer release()
	}
	for k, v := range flows {
		got, ok := tbl.Lookup(k)
		require.True(t, ok)
		require.Same(t, v, got)
	}
}

// growPaused starts tab.Grow(n) in a goroutine that stops before it moves
// the entries of each stripe: next lets it go on to the next stripe and
// returns the stripe it stopped before, and wait lets it finish and
// returns Grow's error.
func growPaused[T any](t *testing.T, tab *Table[T], n int) (next func() uint32, wait func() error) {
	t.Helper()
	paused, resume, done := make(chan uint32), make(chan struct{}), make(chan error, 1)
	hooksOf(tab).growStep = func(s uint32) {
		select {
		case paused <- s:
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
		case s := <-paused:
			return s
		case <-time.After(30 * time.Second):
			t.Fatal("Grow never moved a stripe")
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

// stripeOf returns the stripe of tup in tab.
func stripeOf[T any](tab *Table[T], tup Tuple) uint32 {
	var k key
	tab.tupleKey(&k, &tup)
	return uint32(k.meta>>32) & tab.cur().b.stripeMask
}

// unmoved returns the stripes of tab whose entries are still in the old
// array.
func unmoved[T any](tab *Table[T]) []uint32 {
	a := tab.cur()
	us := []uint32{}
	for s := range a.b.stripes {
		if a.b.stripes[s].flipped != a.flipped() {
			us = append(us, uint32(s))
		}
	}
	return us
}

// TestTableGrowStripeByStripe stops Grow before each stripe it moves and,
// while it waits, uses the table: lookups, one at a time and in batches,
// find every entry, whether its stripe has moved or not; an insert, a
// delete and a swap in a stripe that has not moved move its entries first,
// and none of them waits for Grow, which then skips that stripe. In the
// All and Stats variants, that method, at the first stop, moves every
// stripe left and counts each entry once.
func TestTableGrowStripeByStripe(t *testing.T) {
	for _, c := range []struct {
		name    string
		opts    []Option
		iterate string // "All" or "Stats" at the first stop
	}{
		{"plain", nil, ""},
		{"groups", []Option{withHomeGroups(true)}, ""},
		{"All", nil, "All"},
		{"Stats", nil, "Stats"},
	} {
		t.Run(c.name, func(t *testing.T) {
			const stripes = 4
			tab := New[int](append([]Option{WithFixedBuckets(), WithCapacity(64), WithLockStripes(stripes), WithSecret(tblSecret), WithHasher(LinuxHasher)}, c.opts...)...)
			want := map[Tuple]*int{}
			next := 0
			fresh := func(s uint32) Tuple { // a key of stripe s not in the table
				for {
					k := tblCanon(tblKey(next, next%3 == 0))
					next++
					if stripeOf(tab, k) == s {
						return k
					}
				}
			}
			for s := range uint32(stripes) {
				for range 32 { // two entries per bucket
					k := fresh(s)
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
					_, ok := tab.Lookup(fresh(uint32(next % stripes)))
					require.False(t, ok, msg)
				}
				require.Equal(t, len(want), tab.Len(), msg)
			}
			// writes runs an insert, a delete and a swap in stripe s in a
			// goroutine that must not wait for Grow.
			writes := func(s uint32) {
				t.Helper()
				var in []Tuple // two keys of the table in stripe s
				for k := range want {
					if stripeOf(tab, k) == s && len(in) < 2 {
						in = append(in, k)
					}
				}
				require.Len(t, in, 2)
				done := make(chan struct{})
				ins, del, swap := fresh(s), in[0], in[1]
				vIns, vSwap, old := valPtr(next), valPtr(next+1), want[swap]
				go func() {
					defer close(done)
					assert.NoError(t, tab.Insert(ins, vIns))
					_, ok := tab.Delete(del)
					assert.True(t, ok)
					assert.True(t, tab.CompareAndSwap(swap, old, vSwap))
				}()
				select {
				case <-done:
				case <-time.After(30 * time.Second):
					t.Fatalf("writes in stripe %d waited for Grow", s)
				}
				want[ins] = vIns
				delete(want, del)
				want[swap] = vSwap
			}

			step, wait := growPaused(t, tab, 256)
			for i := range stripes {
				s := step()
				require.Equal(t, uint32(i), s, "Grow moves the stripes in order")
				require.NotNil(t, tab.cur().old.Load(), "old array dropped before Grow ended")
				left := unmoved(tab)
				check(fmt.Sprintf("before stripe %d", s))
				require.Equal(t, left, unmoved(tab), "lookups moved entries")
				if len(left) > 0 {
					writes(left[len(left)-1]) // moves it
					require.Equal(t, left[:len(left)-1], unmoved(tab))
				}
				if i > 0 {
					writes(s - 1) // moved by Grow
				}
				check(fmt.Sprintf("before stripe %d, after writes", s))
				if c.iterate != "" && i == 0 {
					if c.iterate == "Stats" {
						require.Equal(t, len(want), tab.Stats().Entries)
					} else {
						got := tblCollect(t, tab)
						require.Len(t, got, len(want))
						for k, v := range want {
							require.Same(t, v, got[k], "All %v", k)
						}
					}
					require.Empty(t, unmoved(tab), "%s left entries in the old array", c.iterate)
				}
			}
			require.NoError(t, wait())
			require.Nil(t, tab.cur().old.Load(), "old array kept after Grow")
			growCheck(t, tab, want, "grown stripe by stripe")
		})
	}
}

// spendIndexSpace makes each Grow of tab find the index space ending
// where its new home slots end: no node can be carved after them. A
// table shared already must have its hooks (hooksOf) from before.
func spendIndexSpace[T any](tab *Table[T]) {
	tab.nodes.mu.Lock()
	defer tab.nodes.mu.Unlock()
	hooksOf(tab).nodesSpent = true
}

// TestTableGrowIndexSpaceSpent grows a table whose index space ends at the
// new array's home slots, so that entries beyond them find no node to be
// copied into and move in their own nodes instead. A reader stopped on X
// of chain A, looking for Y behind it, goes on after X has moved into a
// chain of the new array, and finds Y; every entry is then in the new
// array, in its own chain, and writes go on.
func TestTableGrowIndexSpaceSpent(t *testing.T) {
	f := newTblNulls(t)
	tab := f.tab
	want := map[Tuple]*string{}
	for b := range uint32(16) {
		want[f.filler(b)] = nil // their values are checked below by key only
	}
	ka := f.byBkt[f.a]
	x, y := ka[0], ka[1]
	want[x], want[y] = valPtr("X"), valPtr("Y")
	require.NoError(t, tab.Insert(y, want[y]))
	require.NoError(t, tab.Insert(x, want[x]))
	xIdx := f.headIndex(t, f.a)
	// Enough entries ahead of X in its chain to take every home slot of
	// the new array and every node left: a bucket's move frees the nodes
	// of its old chain only once all its entries are copied, so X finds
	// none.
	require.GreaterOrEqual(t, len(ka), 202)
	for _, k := range ka[2:202] {
		want[k] = valPtr(fmt.Sprint(k))
		require.NoError(t, tab.Insert(k, want[k]))
	}
	spendIndexSpace(tab)

	arrived, release := f.blockAt(xIdx)
	res := f.lookupAsync(y)
	tblWait(t, arrived)
	before := tab.restarts.Load()
	// Each entry moved in its own node is found by a lookup that runs
	// while it is in both chains.
	relinks := 0
	hooksOf(tab).relinked = func(i uint32) {
		relinks++
		e := tab.nodes.at(i)
		k := e.key.load()
		got, ok := tab.lookup(&k, false)
		assert.True(t, ok, "node %d, moved, not found", i)
		assert.Same(t, e.val.Load(), got)
	}
	old := tab.cur()
	require.NoError(t, tab.Grow(32))
	hooksOf(tab).relinked = nil
	require.Positive(t, relinks)
	// Some moved in their own nodes were old home slots: the old array
	// stays, its other home slots out of use (accounted for below).
	require.Positive(t, tab.cur().relinkedHomes.Load())
	require.NotEqual(t, nullsLink(releasedNullsValue), tab.nodes.at(old.home.slot(0)).next.load(), "old home slots released")
	e := tab.nodes.at(xIdx)
	require.EqualValues(t, 1, e.seq.Load()&1, "X was copied, not moved in its node")
	require.Same(t, want[x], e.val.Load())
	close(release)
	r := tblWaitResult(t, res)
	require.True(t, r.ok, "Lookup(Y) missed Y")
	require.Same(t, want[y], r.v)
	require.Greater(t, tab.restarts.Load(), before)

	for k, v := range want {
		got, ok := tab.Lookup(k)
		require.True(t, ok, "%v not found", k)
		if v != nil {
			require.Same(t, v, got)
		}
	}
	require.Equal(t, len(want), tab.Len())
	tblCheckHome(t, tab, "index space spent")
	growCheckNodes(t, tab, "index space spent")
	// The nodes of the entries copied were freed: inserts go on in them,
	// up to the end of the index space, and then fail.
	var err error
	for i := 0; err == nil; i++ {
		require.Less(t, i, 1000, "inserts never ran out of nodes")
		err = tab.Insert(f.byBkt[f.b][i], valPtr("more"))
	}
	require.ErrorIs(t, err, ErrTableFull)
	tblCheckHome(t, tab, "index space spent, table full")
}

// TestTableGrowReaderBeforeStripeMoves stops a lookup of Y at the end of
// its walk of the new array, which it began before Grow moved Y's stripe
// (its chain there was empty), and lets Grow finish: the lookup then finds
// no old array, but sees the move count of Y's stripe changed, and walks
// again, finding Y.
func TestTableGrowReaderBeforeStripeMoves(t *testing.T) {
	tab := New[int](WithFixedBuckets(), WithCapacity(16), WithLockStripes(2), WithSecret(tblSecret), WithHasher(LinuxHasher))
	var y Tuple
	for i := 0; ; i++ {
		if y = tblKey(i, false); stripeOf(tab, y) == 1 {
			break
		}
	}
	vy := valPtr(1)
	require.NoError(t, tab.Insert(y, vy))
	step, wait := growPaused(t, tab, 32)
	require.Equal(t, uint32(0), step())
	require.Equal(t, uint32(1), step())
	require.Equal(t, []uint32{1}, unmoved(tab))
	lookedUp := lookupStopped(t, tab, y, visitWalkEnd, "the lookup never ended a walk")
	before := tab.restarts.Load()
	require.NoError(t, wait())
	require.Nil(t, tab.cur().old.Load())
	require.Same(t, vy, lookedUp(), "Lookup(Y) missed Y")
	require.Greater(t, tab.restarts.Load(), before)
}

// TestTableGrowWriterAcrossPublish holds a stripe lock from before Grow
// publishes its new array to after, as a writer that locked the stripe
// just before may, and under it deletes X from chain A of the old array
// and reuses its node for Z in chain B, while a lookup of Y, behind X in
// A, stands on X in its walk of the old array. The lookup goes on into
// chain B of the old array, ends on B's marker, walks again and finds Y,
// which has not moved yet.
func TestTableGrowWriterAcrossPublish(t *testing.T) {
	f := newTblNulls(t)
	tab := f.tab
	ka := f.byBkt[f.a]
	x, y, z := ka[0], ka[1], f.byBkt[f.b][0]
	vx, vy, vz := valPtr("X"), valPtr("Y"), valPtr("Z")
	require.NoError(t, tab.Insert(y, vy))
	require.NoError(t, tab.Insert(x, vx))
	xIdx := f.headIndex(t, f.a)
	var kx, kz key
	tab.tupleKey(&kx, &x)
	tab.tupleKey(&kz, &z)

	old, st, s, _ := tab.lockStripe(uint32(kx.meta>>32), lockOnly)
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
	prev, l := tab.findLocked(old, &kx)
	require.Equal(t, xIdx, l.index())
	require.Same(t, vx, tab.unlinkLocked(prev, l))
	tab.free(old, st, xIdx)
	bz := old.b.bucket(uint32(kz.meta >> 32))
	require.Equal(t, f.b, bz)
	i, ok := tab.place(old, st, s, bz)
	require.True(t, ok)
	require.Equal(t, xIdx, i, "X's node not reused")
	tab.fill(i, &kz, vz, &old.b.heads[bz])
	close(release)
	r := tblWaitResult(t, res)
	require.True(t, r.ok, "Lookup(Y) missed Y")
	require.Same(t, vy, r.v)
	require.Greater(t, tab.restarts.Load(), before)
	st.mu.Unlock()
	require.NoError(t, <-grown)

	for k, v := range map[Tuple]*string{y: vy, z: vz} {
		got, ok := tab.Lookup(k)
		require.True(t, ok, "%v not found", k)
		require.Same(t, v, got)
	}
	_, ok = tab.Lookup(x)
	require.False(t, ok, "X found after its delete")
	tblCheckHome(t, tab, "after Grow")
}

// TestTableGrowWriterAcrossPublishTakesNode holds a writer on stripe 1 across
// Grow's publish, lets Grow move stripe 0, and has the writer insert Z into
// the old array: every home slot of its stripe is taken and its cache is
// empty, so Z's node comes from the store, and it is no old home slot of
// stripe 0, freed by that stripe's move, since home slots are never handed
// on. Every node is accounted for after the Grow, and the old array's home
// slots read as released: free, their next links ending on
// releasedNullsValue.
func TestTableGrowWriterAcrossPublishTakesNode(t *testing.T) {
	tab := New[int](WithFixedBuckets(), WithCapacity(16), WithLockStripes(2), WithSecret(tblSecret), WithHasher(LinuxHasher))
	want := map[Tuple]*int{}
	byBkt := map[uint32][]Tuple{}
	for i := 0; i < 1024; i++ {
		k := tblKey(i, i%2 == 1)
		b := HashTuple(k, LinuxHasher, tblSecret) & 15
		byBkt[b] = append(byBkt[b], k)
	}
	for b := range uint32(16) {
		k := byBkt[b][0]
		want[k] = valPtr(int(b))
		require.NoError(t, tab.Insert(k, want[k]))
	}
	z := byBkt[1][1] // bucket 1, of stripe 1
	var kz key
	tab.tupleKey(&kz, &z)
	old, st, s, bz := tab.lockStripe(uint32(kz.meta>>32), lockOnly)
	require.Equal(t, uint32(1), s)
	require.Empty(t, st.cache.free)

	step, wait := growPaused(t, tab, 32)
	require.Equal(t, uint32(0), step())
	require.Equal(t, uint32(1), step(), "stripe 0 moved, stripe 1 next")
	i, ok := tab.place(old, st, s, bz)
	require.True(t, ok)
	_, home := old.home.isHome(i)
	require.False(t, home, "Z's node %d is an old home slot", i)
	want[z] = valPtr(-1)
	tab.fill(i, &kz, want[z], &old.b.heads[bz])
	st.count.Store(st.count.Load() + 1)
	st.mu.Unlock()
	require.NoError(t, wait())
	growCheck(t, tab, want, "after Grow")
	for b := range uint32(16) {
		e := tab.nodes.at(old.home.slot(b))
		require.Zero(t, e.seq.Load()&1, "old home slot of bucket %d live", b)
		require.Equal(t, nullsLink(releasedNullsValue), e.next.load(), "old home slot of bucket %d", b)
		require.NotZero(t, old.homes[b].seq.Load(), "the old array itself, which a reader may hold, is left as it was")
	}
}

// TestTableGrowReaderDuringStripeMove stops a lookup of Y at the end of its
// walk of the new array, which it began while Grow moved Y's stripe, after
// the move began and before it copied Y (Grow is held up on the node
// store's mutex, which it takes to give the nodes it freed to the depot),
// and lets Grow finish: the move counted itself at its end, so the lookup
// sees the count changed, and walks again, finding Y.
func TestTableGrowReaderDuringStripeMove(t *testing.T) {
	tab := New[int](WithFixedBuckets(), WithCapacity(16), WithLockStripes(1), WithSecret(tblSecret), WithHasher(LinuxHasher))
	var y Tuple
	var ky key
	n, found := 0, false
	for i := 0; !found || n < 16+8; i++ {
		k := tblKey(i, false)
		var kk key
		tab.tupleKey(&kk, &k)
		if b := uint32(kk.meta>>32) & 15; b == 15 && !found {
			y, ky, found = k, kk, true // a key of the last bucket, moved last
		} else if b < 14 && n < 16+8 {
			// The home slots, then 8 nodes beyond them, in chains
			// that the move empties before Y's.
			require.NoError(t, tab.Insert(k, valPtr(i)))
			n++
		}
	}
	require.Equal(t, 16+8, n)
	vy := valPtr(1)
	require.NoError(t, tab.Insert(y, vy))
	step, wait := growPaused(t, tab, 32)
	require.Equal(t, uint32(0), step())
	// The stripe's cache keeps 4 nodes (a batch of 1): freeing the 8
	// nodes of the old chains takes the mutex.
	tab.nodes.mu.Lock()
	grown := make(chan error, 1)
	go func() { grown <- wait() }()
	time.Sleep(50 * time.Millisecond) // for Grow to reach the mutex; the test holds if it has not
	a := tab.cur()
	require.True(t, a.b.heads[a.b.bucket(uint32(ky.meta>>32))].load().isNulls(), "Y copied already")
	lookedUp := lookupStopped(t, tab, y, visitWalkEnd, "the lookup never ended a walk")
	tab.nodes.mu.Unlock()
	require.NoError(t, <-grown)
	require.Nil(t, tab.cur().old.Load())
	require.Same(t, vy, lookedUp(), "Lookup(Y) missed Y")
}

// TestTableGrowReaderOnOlderArray stops a lookup of Y in lookupGrowing
// right after it loaded the table's array B, while a Grow moves entries
// into B, and lets that Grow finish and another move every entry into a
// newer array C, emptying B's chains. The lookup then finds no old array
// in B, a move count that no longer changes, and Y's chain in B empty and
// ending on its own marker: only the array check tells it that B is no
// longer the table's, and it walks C and finds Y.
func TestTableGrowReaderOnOlderArray(t *testing.T) {
	tab := New[int](WithFixedBuckets(), WithCapacity(16), WithLockStripes(1), WithSecret(tblSecret), WithHasher(LinuxHasher))
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

// growItselfBuckets returns the bucket count a table that grows itself
// must reach from n buckets under its stripes: the least power of two,
// from n up, at which no stripe holds more than its limit.
func growItselfBuckets[T any](tab *Table[T], n int) int {
	ss := tab.cur().b.stripes
	var most uint64
	for i := range ss {
		most = max(most, ss[i].count.Load())
	}
	for tab.growLimit(n, len(ss)) < most {
		n *= 2
	}
	return n
}

// TestTableGrowsItself fills tables through Insert and LookupOrInsert
// until they hold 20 to 300 entries per starting bucket: each grows itself
// to the least bucket count at which no stripe holds more than its limit,
// and then holds exactly what was inserted; a table made WithFixedBuckets
// does not grow. A TCPTable's established table grows itself under its
// listeners.
func TestTableGrowsItself(t *testing.T) {
	cases := []struct {
		name string
		opts []Option
		n    int
	}{
		{"small", []Option{WithCapacity(16), WithLockStripes(4)}, 5000},
		{"one stripe", []Option{WithCapacity(16), WithLockStripes(1)}, 600},
		{"stripe per bucket", []Option{WithCapacity(16), WithLockStripes(16)}, 600},
		{"groups", []Option{WithCapacity(64), WithLockStripes(4), withHomeGroups(true)}, 3000},
		{"default", nil, 20000},
	}
	for _, c := range cases {
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
			require.False(t, tab.cur().overfull())
			require.Equal(t, growItselfBuckets(tab, start), tab.Stats().Buckets)
			require.Greater(t, tab.Stats().Buckets, start)
			growCheck(t, tab, want, "grown by itself")
			require.Equal(t, start, fixed.Stats().Buckets, "WithFixedBuckets")
			growCheck(t, fixed, want, "fixed")
			// Deletes do not shrink it, and reinserts take it no further.
			for k := range want {
				_, ok := tab.Delete(k)
				require.True(t, ok)
			}
			grown := tab.cur()
			for k, v := range want {
				require.NoError(t, tab.Insert(k, v))
			}
			tab.growers.Wait()
			require.Same(t, grown, tab.cur())
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
		require.Equal(t, growItselfBuckets(est, 16), est.Stats().Buckets)
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

// TestTableGrowsItselfUntilRefused fills a table whose index space has
// room for its nodes but not for a larger array: its growth fails, the
// table stops growing itself for good (no insert starts another growth),
// and inserts and lookups go on in the array it has.
func TestTableGrowsItselfUntilRefused(t *testing.T) {
	tab := New[int](WithCapacity(16), WithLockStripes(4), WithSecret(tblSecret), WithHasher(LinuxHasher))
	// The 16 home slots take the first chunk of 64 indexes, the nodes
	// beyond them the second; a new array would need a third.
	tab.nodes.mu.Lock()
	hooksOf(tab).nodeLimit = 129
	tab.nodes.mu.Unlock()
	want := map[Tuple]*int{}
	for i := range 48 {
		k := tblKey(i, i%2 == 0)
		want[k] = valPtr(i)
		require.NoError(t, tab.Insert(k, want[k]))
	}
	tab.growers.Wait()
	require.True(t, tab.growing.Load(), "growing cleared after a failed growth")
	require.True(t, tab.cur().overfull())
	require.Equal(t, 16, tab.Stats().Buckets)
	require.ErrorIs(t, tab.Grow(32), ErrTableFull)
	for i := 48; i < 56; i++ {
		k := tblKey(i, i%2 == 0)
		want[k] = valPtr(i)
		require.NoError(t, tab.Insert(k, want[k]))
	}
	tab.growers.Wait()
	require.Equal(t, 16, tab.Stats().Buckets)
	growCheck(t, tab, want, "refused")
}

// TestReleasedNullsValue checks that the marker of released nodes ends no
// chain of a Table's store: bucket indexes of either flip of the array,
// and of listener chains, which never flip, stay below it.
func TestReleasedNullsValue(t *testing.T) {
	require.Less(t, uint64(arrayNullsFlip+maxBuckets-1), uint64(releasedNullsValue), "array chains")
	require.Less(t, uint64(listenerNullsBase+maxBuckets-1), uint64(releasedNullsValue), "listener chains")
	require.Less(t, uint64(listenerNullsBase+maxBuckets-1), uint64(arrayNullsFlip), "listener chains below the flip")
	require.True(t, nullsLink(releasedNullsValue).isNulls())
	require.EqualValues(t, releasedNullsValue, nullsLink(releasedNullsValue).nullsValue())
}

// stripeKeys returns n distinct IPv4 tuples whose hashes, with h and
// tblSecret, agree on the bits of mask (all 0 there), as one who knows the
// secret can choose them: they fall into one lock stripe, or one chain, of
// a table whose stripe or bucket mask is within mask.
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

// TestTableGrowthBoundedByEntries fills default tables, with either
// hasher, with keys chosen (the secret known) to share the stripe bits of
// their hashes, so that one stripe holds them all in every array: the
// table grows on its total load, to at most twice as many buckets as
// entries, so that it holds at most 200 bytes per entry, where growing for
// the one stripe took it to 2^21 buckets and 2.5 KB per entry. The entry
// count is one past a power of two, the worst case: the table has just
// doubled. Inserts into the full stripe check the table a few times per
// growth, not once per insert.
func TestTableGrowthBoundedByEntries(t *testing.T) {
	const n = 1<<15 + 1
	for _, h := range hashers {
		t.Run(h.String(), func(t *testing.T) {
			probe := New[int](WithSecret(tblSecret), WithHasher(LinuxHasher), WithHasher(h))
			mask := probe.cur().b.stripeMask
			keys := stripeKeys(t, h, mask, n)
			v := valPtr(0)
			before := heapAfterGC()
			tab := New[int](WithSecret(tblSecret), WithHasher(LinuxHasher), WithHasher(h))
			var checks, grew atomic.Int32
			hooksOf(tab).checked = func(g bool) {
				checks.Add(1)
				if g {
					grew.Add(1)
				}
			}
			for _, k := range keys {
				require.NoError(t, tab.Insert(k, v))
			}
			tab.growers.Wait()
			perEntry := float64(heapAfterGC()-before) / n
			runtime.KeepAlive(keys) // made before the table: not counted, but not freed either
			st := tab.Stats()
			runtime.KeepAlive(tab)
			t.Logf("%.1f bytes per entry; %d buckets and %d nodes for %d entries, longest chain %d; %d checks, %d growths", perEntry, st.Buckets, st.Nodes, st.Entries, st.LongestChain, checks.Load(), grew.Load())
			require.Equal(t, n, st.Entries)
			require.EqualValues(t, n, tab.cur().b.stripes[0].count.Load(), "the keys share a stripe")
			// Grown to the least power of two past the entries, however
			// the checks raced the inserts (see postpone).
			require.Equal(t, 1<<16, st.Buckets, "grown to about the entries")
			require.LessOrEqual(t, perEntry, 200.0)
			// At most 6 growths, from 2^10 to 2^16 buckets (fewer
			// where one lagged behind the inserts and skipped a size);
			// at each size a check that postpones and one that grows.
			require.LessOrEqual(t, grew.Load(), int32(6))
			require.LessOrEqual(t, checks.Load(), int32(2*7))
		})
	}
}

// TestTableGrowthInsertDuringCheck has an insert pass its stripe's
// trigger while a check of the table runs, after the check counted the
// stripes and decided not to grow: the insert returns without a check of
// its own (growing is set), and the trigger the check sets must still be
// passed by the insert that takes the table past one entry per bucket.
// (The check raised it from the stripe's count as it read it again after
// the decision, the racing insert's entry in it and not in the total it
// decided on: one entry too high, so the table stayed at 1024 buckets
// with 1025 entries.)
func TestTableGrowthInsertDuringCheck(t *testing.T) {
	for _, h := range hashers {
		t.Run(h.String(), func(t *testing.T) {
			tab := New[int](WithSecret(tblSecret), WithHasher(LinuxHasher), WithHasher(h))
			a := tab.cur()
			buckets := len(a.b.heads)
			keys := stripeKeys(t, h, a.b.stripeMask, buckets+1)
			due := int(a.growAt) + 1 // the insert of keys[due-1] starts a check
			counted, inserted := make(chan struct{}), make(chan struct{})
			var checks, grew atomic.Int32
			hooksOf(tab).checked = func(g bool) {
				if checks.Add(1) == 1 {
					close(counted) // counted due entries, decided g
					<-inserted
				}
				if g {
					grew.Add(1)
				}
			}
			v := valPtr(0)
			for _, k := range keys[:due] {
				require.NoError(t, tab.Insert(k, v))
			}
			<-counted
			require.NoError(t, tab.Insert(keys[due], v)) // past the trigger, growing set
			close(inserted)
			tab.growers.Wait()
			require.Same(t, a, tab.cur(), "grown below one entry per bucket")
			for _, k := range keys[due+1 : buckets] {
				require.NoError(t, tab.Insert(k, v))
			}
			tab.growers.Wait()
			require.Same(t, a, tab.cur(), "grown at one entry per bucket")
			require.EqualValues(t, 1, checks.Load(), "the stripe checked before the table could grow")
			require.NoError(t, tab.Insert(keys[buckets], v))
			tab.growers.Wait()
			require.Equal(t, 2*buckets, tab.Stats().Buckets, "%d entries", buckets+1)
			require.EqualValues(t, 1, grew.Load())
			require.Equal(t, buckets+1, tab.Len())
		})
	}
}

// TestTableNoGrowthForOneStripe fills a table made for 2^20 entries with
// 4096 keys that share the low 10 bits of their hashes, its stripe bits:
// the stripe passes its limit, but the table holds far fewer entries than
// buckets, so it does not grow (it grew to 2^29 buckets, 480 MiB more,
// when it grew for the stripe), and it checks the table only once.
func TestTableNoGrowthForOneStripe(t *testing.T) {
	const n = 4096
	for _, h := range hashers {
		t.Run(h.String(), func(t *testing.T) {
			tab := New[int](WithCapacity(1<<20), WithSecret(tblSecret), WithHasher(LinuxHasher), WithHasher(h))
			a := tab.cur()
			require.EqualValues(t, 1<<10-1, a.b.stripeMask)
			var checks atomic.Int32
			hooksOf(tab).checked = func(grew bool) {
				checks.Add(1)
				assert.False(t, grew)
			}
			v := valPtr(0)
			for _, k := range stripeKeys(t, h, a.b.stripeMask, n) {
				require.NoError(t, tab.Insert(k, v))
			}
			tab.growers.Wait()
			require.Greater(t, uint64(n), a.growAt, "the stripe is past its limit")
			require.Same(t, a, tab.cur(), "grown")
			require.EqualValues(t, 1, checks.Load())
			require.False(t, a.overfull())
			require.False(t, tab.growing.Load())
			require.Equal(t, n, tab.Len())
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
	tab := New[int](WithCapacity(16), WithMaxBuckets(100), WithLockStripes(4), WithSecret(tblSecret), WithHasher(LinuxHasher))
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

// TestTableSizesFailCleanly checks that sizes no table can have fail
// before allocating: New panics (and so do NewUDPTable and NewTCPTable), Grow returns ErrTooLarge, and Grow to a
// size whose nodes the index space has no room for returns ErrTableFull;
// both without an allocation, where the array they asked for would be
// 28 GiB or more.
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
	// Within the bound but past the index space left (here made small):
	// refused before the nodes are allocated.
	hooksOf(tab).nodeLimit = 1 << 16
	require.ErrorIs(t, tab.Grow(1<<17), ErrTableFull)
	require.Zero(t, allocated(func() { _ = tab.Grow(1 << 17) }))
	require.Same(t, a, tab.cur())
	require.NoError(t, tab.Grow(1<<10))
	require.Equal(t, 1<<10, tab.Stats().Buckets)
}

// valPtr returns a pointer to a new variable holding v, as new(v) does from
// Go 1.26 on; the tests build with Go 1.23.
func valPtr[T any](v T) *T { return &v }
