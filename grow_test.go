package hash4

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
			tab := New[int](append([]Option{WithCapacity(16), WithSecret(tblSecret)}, c.opts...)...)
			stripes := tab.Stats().LockStripes
			want := map[Tuple]*int{}
			next := 0
			add := func(n int) {
				for range n {
					k := tblKey(next, next%3 == 0)
					v := new(next)
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
	tab := New[int](WithCapacity(homeGroupMinBuckets/2), WithSecret(tblSecret))
	require.False(t, tab.cur().home.grouped())
	want := map[Tuple]*int{}
	for i := range homeGroupMinBuckets {
		k := tblKey(i, i%2 == 0)
		want[k] = new(i)
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

// TestTableGrowNoOp checks that Grow to no more buckets than a table has,
// for any n, changes nothing.
func TestTableGrowNoOp(t *testing.T) {
	tab := New[int](WithCapacity(64))
	want := map[Tuple]*int{}
	for i := range 100 {
		k := tblKey(i, false)
		want[k] = new(i)
		require.NoError(t, tab.Insert(k, want[k]))
	}
	a := tab.cur()
	nodes := tab.Stats().Nodes
	for _, n := range []int{math.MinInt, -1, 0, 1, 16, 63, 64} {
		require.NoError(t, tab.Grow(n), n)
		require.Same(t, a, tab.cur(), "Grow(%d) replaced the array", n)
	}
	require.Equal(t, nodes, tab.Stats().Nodes)
	growCheck(t, tab, want, "after Grows to no more buckets")
}

// TestTableGrowMarkers checks that consecutive arrays end their chains in
// nulls values that no chain of the other has: a reader led from a chain
// of one into a chain of the next, through a node that Grow filled while
// the old array was still the table's, must end on a value not its own and
// restart, since it cannot yet see the array replaced.
func TestTableGrowMarkers(t *testing.T) {
	tab := New[int](WithCapacity(16))
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
// replaced and walks the new one; with X's node reused in the new array,
// it follows X into a chain of the new array and restarts on its marker.
// Either way it finds Y, after a restart.
func TestTableGrowReaderOnRetiredEntry(t *testing.T) {
	for _, reuse := range []bool{false, true} {
		t.Run(fmt.Sprint("reuse=", reuse), func(t *testing.T) {
			f := newTblNulls(t)
			tab := f.tab
			ka := f.byBkt[f.a]
			x, y := ka[0], ka[1]
			vx, vy := new("X"), new("Y")
			require.NoError(t, tab.Insert(y, vy))
			require.NoError(t, tab.Insert(x, vx))
			xIdx := f.headIndex(t, f.a)
			moves := tab.moves[0].n.Load()
			r, restarts := f.lookupAcross(t, y, xIdx, func() {
				require.NoError(t, tab.Grow(32))
				require.Zero(t, tab.nodes.at(xIdx).seq.Load()&1, "X's old node not freed")
				if !reuse {
					// N.B. no move either: the restart must come from the
					// array check.
					require.Equal(t, moves, tab.moves[0].n.Load(), "Grow moved an entry")
					return
				}
				// Fill the new array until X's old node holds an entry.
				for i := 0; tab.nodes.at(xIdx).seq.Load()&1 == 0; i++ {
					require.Less(t, i, 4096, "X's node never reused")
					k := tblKey(10000+i, false)
					require.NoError(t, tab.Insert(k, new("fill")))
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
			tab := New[int](WithCapacity(16), WithLockStripes(4))
			want := map[Tuple]*int{}
			for i := range 500 {
				k := tblCanon(tblKey(i, i%3 == 0))
				want[k] = new(i)
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
		tab := New[val](WithCapacity(16), WithLockStripes(4), WithSecret(NewSecret()))
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
			wg.Go(func() {
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
			})
		}
		wg.Go(func() { // the writer
			r := rand.New(rand.NewPCG(99, uint64(rounds)))
			for !stop.Load() {
				c := churn[r.IntN(len(churn))]
				if _, ok := tab.Delete(c); !ok {
					if err := tab.Insert(c, &val{c}); err != nil {
						fail("round %d: insert %v: %v", rounds, c, err)
					}
				}
			}
		})
		wg.Go(func() { // the iterator
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
		})
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
	}
	t.Logf("%d rounds, %d lookups", rounds, lookups)
}

// TestTCPTableEstablishedGrow grows a TCPTable's established table: its
// flows and its listeners are still found, and the listeners' chains, which
// do not grow, share the node store with the new array.
func TestTCPTableEstablishedGrow(t *testing.T) {
	tbl := NewTCPTable[string](WithCapacity(16))
	lis := netip.MustParseAddrPort("10.0.0.1:80")
	vl := new("listener")
	release, err := tbl.Listen(lis, vl)
	require.NoError(t, err)
	flows := map[Tuple]*string{}
	for i := range 200 {
		k := Tuple{Local: lis, Remote: netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), uint16(1000+i))}
		flows[k] = new(fmt.Sprint(i))
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
		release, err := tbl.Listen(netip.AddrPortFrom(lis.Addr(), uint16(2000+i)), new("l"))
		require.NoError(t, err)
		defer release()
	}
	for k, v := range flows {
		got, ok := tbl.Lookup(k)
		require.True(t, ok)
		require.Same(t, v, got)
	}
}
