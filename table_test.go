package hash4

import (
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// tblSecret is the fixed secret of the tests that need reproducible buckets.
var tblSecret = Secret{Ehash: 0x01234567, Ehash6Addr: 0x89abcdef, Seed: 0x0f1e2d3c4b5a6978}

// tblTuple parses "local" and "remote" address:port strings.
func tblTuple(local, remote string) Tuple {
	return Tuple{Local: netip.MustParseAddrPort(local), Remote: netip.MustParseAddrPort(remote)}
}

// tblKey returns distinct valid tuples: i < 2^24 selects the tuple, v6 the
// family.
func tblKey(i int, v6 bool) Tuple {
	if v6 {
		var a [16]byte
		a[0], a[1], a[2], a[3] = 0x20, 0x01, 0x0d, 0xb8
		a[13], a[14], a[15] = byte(i>>16), byte(i>>8), byte(i)
		a[12] = 1
		return Tuple{
			Local:  netip.AddrPortFrom(netip.AddrFrom16(a), 443),
			Remote: netip.MustParseAddrPort("[2001:db8:ffff::7]:50000"),
		}
	}
	return Tuple{
		Local:  netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 443),
		Remote: netip.MustParseAddrPort("192.0.2.7:50000"),
	}
}

// tblCanon returns the form of tup that All yields: IPv4-mapped addresses
// unmapped, zones dropped.
func tblCanon(tup Tuple) Tuple {
	c := func(ap netip.AddrPort) netip.AddrPort {
		return netip.AddrPortFrom(ap.Addr().Unmap().WithZone(""), ap.Port())
	}
	return Tuple{Local: c(tup.Local), Remote: c(tup.Remote)}
}

// tblMapped returns tup with both addresses in IPv4-mapped form.
func tblMapped(tup Tuple) Tuple {
	m := func(ap netip.AddrPort) netip.AddrPort {
		return netip.AddrPortFrom(netip.AddrFrom16(ap.Addr().As16()), ap.Port())
	}
	return Tuple{Local: m(tup.Local), Remote: m(tup.Remote)}
}

// tblCollect returns what All yields, failing on a tuple yielded twice.
func tblCollect[T any](t testing.TB, tab *Table[T]) map[Tuple]*T {
	t.Helper()
	got := map[Tuple]*T{}
	for tup, v := range tab.All() {
		// N.B. checked before asserting: testify's assertions walk the
		// stack (Helper) even when they pass, and FuzzTable collects often.
		if _, dup := got[tup]; dup || v == nil {
			require.False(t, dup, "All yielded %v twice", tup)
			require.NotNil(t, v, "All yielded nil for %v", tup)
		}
		got[tup] = v
	}
	return got
}

func TestTableBasic(t *testing.T) {
	tab := New[string](WithFixedBuckets(), WithSecret(tblSecret))
	require.Zero(t, tab.Len())
	require.Empty(t, tblCollect(t, tab))

	keys := []Tuple{
		tblTuple("10.0.0.1:40000", "93.184.216.34:443"),
		tblTuple("10.0.0.1:40001", "93.184.216.34:443"),
		tblTuple("10.0.0.1:40000", "93.184.216.34:80"),
		tblTuple("10.0.0.2:40000", "93.184.216.34:443"),
		tblTuple("[2001:db8::1]:40000", "[2001:db8::2]:443"),
		tblTuple("[2001:db8::1]:40000", "[2001:db8::3]:443"),
		tblTuple("[::1.2.3.4]:1", "[::5.6.7.8]:2"), // IPv4-compatible: IPv6
		tblTuple("127.0.0.1:65535", "127.0.0.1:1"),
	}
	vals := make([]*string, len(keys))
	for i, k := range keys {
		_, ok := tab.Lookup(k)
		require.False(t, ok, k)
		vals[i] = new(fmt.Sprint("v", i))
		require.NoError(t, tab.Insert(k, vals[i]))
		require.Equal(t, i+1, tab.Len())
		for j := 0; j <= i; j++ {
			v, ok := tab.Lookup(keys[j])
			require.True(t, ok, keys[j])
			require.Same(t, vals[j], v)
		}
	}
	st := tab.Stats()
	require.Equal(t, len(keys), st.Entries)
	sum, weighted := 0, 0
	for n, c := range st.ChainLengths {
		sum += c
		weighted += n * c
	}
	require.Equal(t, st.Buckets, sum)
	require.Equal(t, len(keys), weighted)
	require.Equal(t, len(st.ChainLengths)-1, st.LongestChain)

	all := tblCollect(t, tab)
	require.Len(t, all, len(keys))
	for i, k := range keys {
		require.Same(t, vals[i], all[k], k)
	}

	// ErrExists, the stored value untouched.
	err := tab.Insert(keys[0], new("other"))
	require.ErrorIs(t, err, ErrExists)
	require.NotErrorIs(t, err, ErrInvalidTuple)
	v, ok := tab.Lookup(keys[0])
	require.True(t, ok)
	require.Same(t, vals[0], v)
	require.Equal(t, len(keys), tab.Len())

	// Delete returns the stored value, once.
	for i, k := range keys {
		v, ok := tab.Delete(k)
		require.True(t, ok, k)
		require.Same(t, vals[i], v)
		v, ok = tab.Delete(k)
		require.False(t, ok)
		require.Nil(t, v)
		_, ok = tab.Lookup(k)
		require.False(t, ok)
		require.Equal(t, len(keys)-i-1, tab.Len())
		for j := i + 1; j < len(keys); j++ {
			v, ok := tab.Lookup(keys[j])
			require.True(t, ok)
			require.Same(t, vals[j], v)
		}
	}
	require.Empty(t, tblCollect(t, tab))
	require.Zero(t, tab.Stats().Entries)

	// Reinsert after delete, with a new value.
	nv := new("again")
	require.NoError(t, tab.Insert(keys[0], nv))
	v, ok = tab.Lookup(keys[0])
	require.True(t, ok)
	require.Same(t, nv, v)
}

func TestTableBadInput(t *testing.T) {
	good := tblTuple("10.0.0.1:1000", "10.0.0.2:2000")
	cases := []struct {
		name string
		tup  Tuple
		nilV bool
		want error
	}{
		{"zero tuple", Tuple{}, false, ErrInvalidTuple},
		{"invalid local", Tuple{Remote: good.Remote}, false, ErrInvalidTuple},
		{"invalid remote", Tuple{Local: good.Local}, false, ErrInvalidTuple},
		{"invalid local addr with port", Tuple{Local: netip.AddrPortFrom(netip.Addr{}, 5), Remote: good.Remote}, false, ErrInvalidTuple},
		{"local 0.0.0.0", tblTuple("0.0.0.0:1000", "10.0.0.2:2000"), false, ErrInvalidTuple},
		{"remote 0.0.0.0", tblTuple("10.0.0.1:1000", "0.0.0.0:2000"), false, ErrInvalidTuple},
		{"local ::", tblTuple("[::]:1000", "[2001:db8::2]:2000"), false, ErrInvalidTuple},
		{"remote ::", tblTuple("[2001:db8::1]:1000", "[::]:2000"), false, ErrInvalidTuple},
		{"local ::ffff:0.0.0.0", tblTuple("[::ffff:0.0.0.0]:1000", "10.0.0.2:2000"), false, ErrInvalidTuple},
		{"remote ::ffff:0.0.0.0", tblTuple("10.0.0.1:1000", "[::ffff:0.0.0.0]:2000"), false, ErrInvalidTuple},
		{"local port 0", tblTuple("10.0.0.1:0", "10.0.0.2:2000"), false, ErrInvalidTuple},
		{"remote port 0", tblTuple("10.0.0.1:1000", "10.0.0.2:0"), false, ErrInvalidTuple},
		{"both ports 0 v6", tblTuple("[2001:db8::1]:0", "[2001:db8::2]:0"), false, ErrInvalidTuple},
		{"IPv4 local, IPv6 remote", tblTuple("10.0.0.1:1000", "[2001:db8::2]:2000"), false, ErrInvalidTuple},
		{"IPv6 local, IPv4 remote", tblTuple("[2001:db8::1]:1000", "10.0.0.2:2000"), false, ErrInvalidTuple},
		{"IPv4-mapped local, IPv6 remote", tblTuple("[::ffff:10.0.0.1]:1000", "[2001:db8::2]:2000"), false, ErrInvalidTuple},
		{"IPv6 local, IPv4-mapped remote", tblTuple("[2001:db8::1]:1000", "[::ffff:10.0.0.2]:2000"), false, ErrInvalidTuple},
		{"IPv4 local, IPv4-compatible remote", tblTuple("10.0.0.1:1000", "[::10.0.0.2]:2000"), false, ErrInvalidTuple},
		{"nil value", good, true, ErrNilValue},
		{"nil value v6", tblTuple("[2001:db8::1]:1000", "[2001:db8::2]:2000"), true, ErrNilValue},
	}
	sentinels := []error{ErrExists, ErrInvalidTuple, ErrNilValue, ErrTableFull}

	tab := New[int](WithFixedBuckets(), WithCapacity(16), WithLockStripes(2), WithSecret(tblSecret))
	for i := range 40 {
		require.NoError(t, tab.Insert(tblKey(i, i%2 == 1), new(i)))
	}
	before := tblCollect(t, tab)
	beforeStats := tab.Stats()

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := new(7)
			if c.nilV {
				v = nil
			}
			err := tab.Insert(c.tup, v)
			require.Error(t, err)
			require.ErrorIs(t, err, c.want)
			for _, s := range sentinels {
				if s != c.want {
					require.NotErrorIs(t, err, s)
				}
			}
			require.Equal(t, len(before), tab.Len())
			require.Equal(t, before, tblCollect(t, tab))
			_, ok := tab.Lookup(c.tup)
			require.False(t, ok, "Lookup found a rejected tuple")
			_, ok = tab.Delete(c.tup)
			require.False(t, ok, "Delete found a rejected tuple")
			got, found, err := tab.LookupOrInsert(c.tup, v)
			require.ErrorIs(t, err, c.want, "LookupOrInsert")
			for _, s := range sentinels {
				if s != c.want {
					require.NotErrorIs(t, err, s, "LookupOrInsert")
				}
			}
			require.False(t, found)
			require.Nil(t, got)
			require.False(t, tab.CompareAndDelete(c.tup, v))
			require.False(t, tab.CompareAndSwap(c.tup, v, new(8)))
			require.Equal(t, before, tblCollect(t, tab))
			st := tab.Stats()
			require.Equal(t, beforeStats.Entries, st.Entries)
			require.Equal(t, beforeStats.Nodes, st.Nodes)
		})
	}

	// ErrExists leaves the table unchanged too, in either spelling.
	for i := range 4 {
		k := tblKey(i, i%2 == 1)
		err := tab.Insert(k, new(99))
		require.ErrorIs(t, err, ErrExists)
		require.NotErrorIs(t, err, ErrInvalidTuple)
		err = tab.Insert(tblMapped(k), new(99))
		require.ErrorIs(t, err, ErrExists)
	}
	require.Equal(t, before, tblCollect(t, tab))
	require.Equal(t, len(before), tab.Len())

	// A present tuple with a nil value is still an error, and so is
	// comparing with nil a no-op.
	k := tblKey(0, false)
	got, found, err := tab.LookupOrInsert(k, nil)
	require.ErrorIs(t, err, ErrNilValue)
	require.False(t, found)
	require.Nil(t, got)
	require.False(t, tab.CompareAndDelete(k, nil))
	cur, ok := tab.Lookup(k)
	require.True(t, ok)
	require.False(t, tab.CompareAndSwap(k, nil, new(99)))
	require.False(t, tab.CompareAndSwap(k, cur, nil))
	require.Equal(t, before, tblCollect(t, tab))
}

// TestTableLookupOrInsert checks both answers of LookupOrInsert, in either
// spelling of an IPv4 key.
func TestTableLookupOrInsert(t *testing.T) {
	tab := New[string](WithFixedBuckets(), WithSecret(tblSecret))
	k := tblTuple("10.0.0.1:40000", "93.184.216.34:443")
	first, second := new("first"), new("second")

	got, found, err := tab.LookupOrInsert(k, first)
	require.NoError(t, err)
	require.False(t, found)
	require.Same(t, first, got)
	require.Equal(t, 1, tab.Len())

	got, found, err = tab.LookupOrInsert(tblMapped(k), second)
	require.NoError(t, err)
	require.True(t, found)
	require.Same(t, first, got, "the stored value, not the one offered")
	v, ok := tab.Lookup(k)
	require.True(t, ok)
	require.Same(t, first, v)
	require.Equal(t, 1, tab.Len())
}

// TestTableLookupOrInsertInsertedMeanwhile makes LookupOrInsert's lookup
// miss a key that another writer inserts before LookupOrInsert takes the
// lock: the lookup's walk is paused past the head of the chain while the
// key is inserted there; then LookupOrInsert must report the other
// writer's value, found, and insert nothing.
func TestTableLookupOrInsertInsertedMeanwhile(t *testing.T) {
	tab := New[string](WithFixedBuckets(), WithCapacity(16), WithLockStripes(2), WithSecret(tblSecret))
	ks := tblSameBucket(t, LinuxHasher, 3, 3, false)
	require.NoError(t, tab.Insert(ks[0], new("a")))
	require.NoError(t, tab.Insert(ks[1], new("b")))
	theirs, mine := new("theirs"), new("mine")
	visits := 0
	tab.visit = func(i uint32) {
		if i == visitWalkEnd || i == visitGrowing {
			return
		}
		if visits++; visits == 1 {
			require.NoError(t, tab.Insert(ks[2], theirs))
		}
	}
	got, found, err := tab.LookupOrInsert(ks[2], mine)
	tab.visit = nil
	require.NoError(t, err)
	require.Positive(t, visits, "the lookup did not walk the chain")
	require.True(t, found)
	require.Same(t, theirs, got)
	require.Equal(t, 3, tab.Len())
	v, ok := tab.Lookup(ks[2])
	require.True(t, ok)
	require.Same(t, theirs, v)
}

// TestTableLookupOrInsertPresentTakesNoLock checks that LookupOrInsert of
// a present key answers while a writer holds every stripe lock.
func TestTableLookupOrInsertPresentTakesNoLock(t *testing.T) {
	tab := New[string](WithFixedBuckets(), WithCapacity(16), WithLockStripes(2), WithSecret(tblSecret))
	k := tblKey(1, true)
	stored := new("stored")
	require.NoError(t, tab.Insert(k, stored))
	for i := range tab.cur().b.stripes {
		tab.cur().b.stripes[i].mu.Lock()
	}
	tblNoDeadlock(t, func() {
		got, found, err := tab.LookupOrInsert(tblMapped(k), new("other"))
		require.NoError(t, err)
		require.True(t, found)
		require.Same(t, stored, got)
	})
	for i := range tab.cur().b.stripes {
		tab.cur().b.stripes[i].mu.Unlock()
	}
}

// TestTableCompareAndDelete checks that CompareAndDelete removes a tuple
// only while it holds the value given: a reaper holding a flow's old value
// leaves alone the newer flow that took its 4-tuple.
func TestTableCompareAndDelete(t *testing.T) {
	tab := New[string](WithFixedBuckets(), WithSecret(tblSecret))
	k := tblTuple("[2001:db8::1]:40000", "[2001:db8::2]:443")
	old, newer := new("old"), new("newer")

	require.False(t, tab.CompareAndDelete(k, old), "absent")
	require.NoError(t, tab.Insert(k, old))
	v, ok := tab.Delete(k)
	require.True(t, ok)
	require.Same(t, old, v)
	require.NoError(t, tab.Insert(k, newer))

	require.False(t, tab.CompareAndDelete(k, old), "the 4-tuple holds a newer value")
	v, ok = tab.Lookup(k)
	require.True(t, ok)
	require.Same(t, newer, v)
	require.False(t, tab.CompareAndDelete(k, new("newer")), "an equal value is not the same value")
	require.Equal(t, 1, tab.Len())

	require.True(t, tab.CompareAndDelete(k, newer))
	_, ok = tab.Lookup(k)
	require.False(t, ok)
	require.Zero(t, tab.Len())
	require.False(t, tab.CompareAndDelete(k, newer), "deleted twice")
}

// TestTableCompareAndSwap checks that CompareAndSwap replaces a tuple's
// value only while it holds the value given, in either spelling of the
// tuple, and leaves the entry in place: the count, the chain and the home
// slot stay as they were.
func TestTableCompareAndSwap(t *testing.T) {
	tab := New[string](WithFixedBuckets(), WithSecret(tblSecret))
	k := tblTuple("192.0.2.1:40000", "198.51.100.2:443")
	timeWait, conn, later := new("time-wait"), new("connection"), new("later")

	require.False(t, tab.CompareAndSwap(k, timeWait, conn), "absent")
	_, ok := tab.Lookup(k)
	require.False(t, ok, "a failed swap inserts nothing")
	require.NoError(t, tab.Insert(k, timeWait))
	before := tab.Stats()

	require.False(t, tab.CompareAndSwap(k, new("time-wait"), conn), "an equal value is not the same value")
	require.False(t, tab.CompareAndSwap(k, conn, later), "the tuple does not hold conn")
	v, ok := tab.Lookup(k)
	require.True(t, ok)
	require.Same(t, timeWait, v)

	require.True(t, tab.CompareAndSwap(tblMapped(k), timeWait, conn), "IPv4-mapped spelling")
	v, ok = tab.Lookup(k)
	require.True(t, ok)
	require.Same(t, conn, v)
	require.False(t, tab.CompareAndSwap(k, timeWait, later), "swapped twice")
	require.True(t, tab.CompareAndSwap(k, conn, conn), "to the value it holds")

	after := tab.Stats()
	require.Equal(t, before.Entries, after.Entries)
	require.Equal(t, before.HomeEntries, after.HomeEntries)
	require.Equal(t, before.Nodes, after.Nodes)
	require.Equal(t, map[Tuple]*string{tblCanon(k): conn}, tblCollect(t, tab))
	require.False(t, tab.CompareAndDelete(k, timeWait))
	require.True(t, tab.CompareAndDelete(k, conn))
	require.Zero(t, tab.Len())
}

// TestTableLookupOrInsertRace has goroutines race to create the same flows,
// then race to delete them with the values they got: for each flow exactly
// one goroutine inserts, all get its value, and exactly one deletes it.
// Then they churn a few flows with both.
func TestTableLookupOrInsertRace(t *testing.T) {
	const goroutines, flows = 8, 256
	tab := New[int](WithFixedBuckets(), WithCapacity(64), WithLockStripes(4), WithSecret(tblSecret))
	keys := make([]Tuple, flows)
	for i := range keys {
		keys[i] = tblKey(i, i%2 == 1)
	}
	got := make([][]*int, goroutines)
	inserted, deleted := make([]atomic.Int32, flows), make([]atomic.Int32, flows)
	var start sync.WaitGroup
	var wg sync.WaitGroup
	start.Add(1)
	for g := range goroutines {
		got[g] = make([]*int, flows)
		wg.Go(func() {
			start.Wait()
			for i := range flows {
				i := (i + g*flows/goroutines) % flows // start apart, meet later
				v, found, err := tab.LookupOrInsert(keys[i], new(g))
				if err == nil && !found {
					inserted[i].Add(1)
				}
				got[g][i] = v
			}
		})
	}
	start.Done()
	wg.Wait()
	require.Equal(t, flows, tab.Len())
	for i := range flows {
		require.EqualValues(t, 1, inserted[i].Load(), "flow %d inserted %d times", i, inserted[i].Load())
		v, ok := tab.Lookup(keys[i])
		require.True(t, ok)
		for g := range goroutines {
			require.Same(t, v, got[g][i], "goroutine %d got another value for flow %d", g, i)
		}
	}

	start.Add(1)
	for g := range goroutines {
		wg.Go(func() {
			start.Wait()
			for i := range flows {
				i := (i + g*flows/goroutines) % flows
				if tab.CompareAndDelete(keys[i], got[g][i]) {
					deleted[i].Add(1)
				}
			}
		})
	}
	start.Done()
	wg.Wait()
	require.Zero(t, tab.Len())
	for i := range flows {
		require.EqualValues(t, 1, deleted[i].Load(), "flow %d deleted %d times", i, deleted[i].Load())
	}

	// Churn of a few flows, so that a lookup often misses a flow that
	// another goroutine inserts before this one takes the lock: found or
	// not, the answer names the value that is in the table, which is the
	// one offered only if this call inserted it.
	var wrong atomic.Int64
	for g := range goroutines {
		wg.Go(func() {
			for i := range 20000 {
				k := keys[(i+g)%4]
				mine := new(g)
				v, found, err := tab.LookupOrInsert(k, mine)
				if err != nil || v == nil || found == (v == mine) {
					wrong.Add(1)
				}
				tab.CompareAndDelete(k, v)
			}
		})
	}
	wg.Wait()
	require.Zero(t, wrong.Load())
	require.Zero(t, tab.Len())
}

func TestTableIPv4MappedIsOneKey(t *testing.T) {
	v4 := tblTuple("10.1.2.3:8080", "192.0.2.9:12345")
	mapped := tblMapped(v4)
	halfL := Tuple{Local: mapped.Local, Remote: v4.Remote}
	halfR := Tuple{Local: v4.Local, Remote: mapped.Remote}
	spellings := []Tuple{v4, mapped, halfL, halfR}
	require.True(t, mapped.Local.Addr().Is4In6())

	for _, h := range hashers {
		for _, ins := range spellings {
			for _, other := range spellings {
				tab := New[int](WithFixedBuckets(), WithHasher(h), WithCapacity(16), WithLockStripes(1))
				v := new(1)
				require.NoError(t, tab.Insert(ins, v))
				got, ok := tab.Lookup(other)
				require.True(t, ok, "%v: insert %v, lookup %v", h, ins, other)
				require.Same(t, v, got)
				require.ErrorIs(t, tab.Insert(other, new(2)), ErrExists)
				require.Equal(t, map[Tuple]*int{v4: v}, tblCollect(t, tab), "All yields the IPv4 form")
				for tup := range tab.All() {
					require.True(t, tup.Local.Addr().Is4() && tup.Remote.Addr().Is4())
				}
				got, ok = tab.Delete(other)
				require.True(t, ok)
				require.Same(t, v, got)
				require.Zero(t, tab.Len())
				_, ok = tab.Lookup(ins)
				require.False(t, ok)
			}
		}
	}
}

func TestTableZonesIgnored(t *testing.T) {
	base := tblTuple("[fe80::1]:5000", "[fe80::2]:6000")
	zoned := func(lz, rz string) Tuple {
		return Tuple{
			Local:  netip.AddrPortFrom(base.Local.Addr().WithZone(lz), base.Local.Port()),
			Remote: netip.AddrPortFrom(base.Remote.Addr().WithZone(rz), base.Remote.Port()),
		}
	}
	spellings := []Tuple{base, zoned("eth0", ""), zoned("eth1", "eth1"), zoned("", "wlan0")}
	for _, h := range hashers {
		for si, ins := range spellings {
			tab := New[int](WithFixedBuckets(), WithHasher(h))
			v := new(1)
			require.NoError(t, tab.Insert(ins, v))
			for _, other := range spellings {
				got, ok := tab.Lookup(other)
				require.True(t, ok, "%v: insert %v, lookup %v", h, ins, other)
				require.Same(t, v, got)
				require.ErrorIs(t, tab.Insert(other, new(2)), ErrExists)
			}
			require.Equal(t, map[Tuple]*int{base: v}, tblCollect(t, tab), "All yields no zone")
			got, ok := tab.Delete(spellings[(si+1)%len(spellings)])
			require.True(t, ok)
			require.Same(t, v, got)
			require.Zero(t, tab.Len())
		}
	}

	// A zone on an IPv4-mapped address is dropped with the mapping.
	tab := New[int]()
	v := new(3)
	z := Tuple{
		Local:  netip.AddrPortFrom(netip.MustParseAddr("::ffff:10.0.0.1").WithZone("eth0"), 1),
		Remote: netip.MustParseAddrPort("10.0.0.2:2"),
	}
	require.NoError(t, tab.Insert(z, v))
	got, ok := tab.Lookup(tblTuple("10.0.0.1:1", "10.0.0.2:2"))
	require.True(t, ok)
	require.Same(t, v, got)
}

func TestTableOptions(t *testing.T) {
	// The default: 16 per P, at least 64, one per 1024 buckets in large
	// tables, and at most one per 16 buckets.
	defStripes := max(64, ceilPow2(16*runtime.GOMAXPROCS(0)))
	cases := []struct {
		name                 string
		opts                 []Option
		buckets, lockStripes int
	}{
		{"default", nil, 1024, min(defStripes, 64)},
		{"cap -5", []Option{WithCapacity(-5)}, 16, 1},
		{"cap 0", []Option{WithCapacity(0)}, 16, 1},
		{"cap 1", []Option{WithCapacity(1)}, 16, 1},
		{"cap 15", []Option{WithCapacity(15)}, 16, 1},
		{"cap 16", []Option{WithCapacity(16)}, 16, 1},
		{"cap 17", []Option{WithCapacity(17)}, 32, 2},
		{"cap 300: a stripe per 16 buckets", []Option{WithCapacity(300)}, 512, min(defStripes, 32)},
		{"cap 1000", []Option{WithCapacity(1000)}, 1024, min(defStripes, 64)},
		{"cap 4096", []Option{WithCapacity(4096)}, 4096, min(defStripes, 256)},
		{"cap 100000", []Option{WithCapacity(100000)}, 1 << 17, min(max(defStripes, 128), 1<<13)},
		{"cap 1<<18: a stripe per 1024 buckets", []Option{WithCapacity(1 << 18)}, 1 << 18, min(max(defStripes, 256), 1<<14)},
		{"stripes -1", []Option{WithLockStripes(-1)}, 1024, 1},
		{"stripes 0", []Option{WithLockStripes(0)}, 1024, 1},
		{"stripes 1", []Option{WithLockStripes(1)}, 1024, 1},
		{"stripes 3", []Option{WithLockStripes(3)}, 1024, 4},
		{"stripes 64", []Option{WithLockStripes(64)}, 1024, 64},
		{"stripes 65", []Option{WithLockStripes(65)}, 1024, 128},
		{"stripes 5000 clamped", []Option{WithLockStripes(5000)}, 1024, 1024},
		{"stripes clamped to 16 buckets", []Option{WithCapacity(16), WithLockStripes(64)}, 16, 16},
		{"stripes clamped to 32 buckets", []Option{WithLockStripes(33), WithCapacity(20)}, 32, 32},
		{"last option wins", []Option{WithCapacity(16), WithCapacity(300), WithLockStripes(2), WithLockStripes(8)}, 512, 8},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tab := New[int](append(c.opts, WithFixedBuckets())...)
			st := tab.Stats()
			require.Equal(t, c.buckets, st.Buckets)
			require.Equal(t, c.lockStripes, st.LockStripes)
			require.Len(t, st.ChainLengths, 1)
			require.Equal(t, c.buckets, st.ChainLengths[0])
			require.Zero(t, st.Entries)
			require.Zero(t, st.LongestChain)
			require.Equal(t, c.buckets, st.Nodes, "one reserved node per bucket")
			require.Zero(t, st.HomeEntries)
			require.Zero(t, st.LookupRestarts)
		})
	}
}

// TestTableModelAcrossOptions runs random Insert, Delete and LookupOrInsert
// against a map model in tables of every shape the options make: bucket
// counts from the smallest up, stripes from one to more than the buckets
// (clamped), with and without home groups (where the stripes allow them),
// with keys drawn from sets of half, one and three times the bucket count,
// for four steps per key or 2000 (the table settles at three quarters of
// the set). Eight times in a run it checks the home-slot bookkeeping and
// that Len, Stats, Lookup, AppendLookups and All agree with the model.
func TestTableModelAcrossOptions(t *testing.T) {
	seed := uint64(0)
	var ran, grew atomic.Int32 // tables that may grow themselves, and that did
	for _, capacity := range []int{1, 64, 1024} {
		for _, stripes := range []int{1, 4, 64, 2048} {
			for _, grouped := range []bool{false, true} {
				for _, c := range []struct {
					perBucket float64
					grows     bool
				}{{0.5, false}, {1, false}, {3, false}, {3, true}} {
					perBucket := c.perBucket
					seed++
					name := fmt.Sprintf("cap=%d/stripes=%d/groups=%v/keys=%v", capacity, stripes, grouped, perBucket)
					opts := []Option{WithCapacity(capacity), WithLockStripes(stripes), WithSecret(tblSecret), withHomeGroups(grouped)}
					if c.grows {
						name += "/grows"
					} else {
						opts = append(opts, WithFixedBuckets())
					}
					t.Run(name, func(t *testing.T) {
						tab := New[int](opts...)
						st := tab.Stats()
						require.Equal(t, grouped && st.LockStripes <= st.Buckets/4, tab.cur().home.grouped())
						keys := make([]Tuple, int(perBucket*float64(st.Buckets)))
						for i := range keys {
							keys[i] = tblKey(i, i%3 == 0)
						}
						steps := max(2000, 4*len(keys))
						if testing.Short() {
							steps /= 4
						}
						checkEvery := steps / 8
						r := rand.New(rand.NewPCG(seed, 1))
						model := map[int]*int{}
						for step := range steps {
							i := r.IntN(len(keys))
							v := new(step)
							switch r.IntN(4) {
							case 0, 1:
								err := tab.Insert(keys[i], v)
								if _, ok := model[i]; ok {
									require.ErrorIs(t, err, ErrExists)
								} else {
									require.NoError(t, err)
									model[i] = v
								}
							case 2:
								got, ok := tab.Delete(keys[i])
								require.Equal(t, model[i] != nil, ok)
								require.Same(t, model[i], got)
								delete(model, i)
							case 3:
								got, found, err := tab.LookupOrInsert(keys[i], v)
								require.NoError(t, err)
								require.Equal(t, model[i] != nil, found)
								if !found {
									model[i] = v
								}
								require.Same(t, model[i], got)
							}
							if step%checkEvery != checkEvery-1 {
								continue
							}
							tab.growers.Wait()
							require.False(t, tab.cur().overfull(), "a stripe over its limit after the table grew")
							tblCheckHome(t, tab, step)
							require.Equal(t, len(model), tab.Len())
							require.Equal(t, len(model), tab.Stats().Entries)
							batch := tab.AppendLookups(nil, keys)
							for j, k := range keys {
								got, ok := tab.Lookup(k)
								require.Equal(t, model[j] != nil, ok, "key %d at step %d", j, step)
								require.Same(t, model[j], got)
								require.Same(t, model[j], batch[j])
							}
							n := 0
							for k, v := range tab.All() {
								require.Same(t, model[slices.Index(keys, k)], v)
								n++
							}
							require.Equal(t, len(model), n)
						}
						// (A table that went past twice its buckets need
						// not have grown: its growth, on a goroutine of its
						// own, may have found it back under its limit.)
						tab.growers.Wait()
						if c.grows {
							ran.Add(1)
						}
						if tab.Stats().Buckets > st.Buckets {
							grew.Add(1)
						}
					})
				}
			}
		}
	}
	if ran.Load() > 0 {
		require.Positive(t, grew.Load(), "no table grew itself")
	}
}

// tblSameBucket returns n tuples of the given family that hash, with h and
// tblSecret, into bucket b of a 16-bucket table, and (if otherH is valid)
// not all into one bucket under otherH.
func tblSameBucket(t *testing.T, h Hasher, b uint32, n int, v6 bool) []Tuple {
	t.Helper()
	var out []Tuple
	for i := 0; len(out) < n; i++ {
		require.Less(t, i, 1<<20)
		k := tblKey(i, v6)
		if HashTuple(k, h, tblSecret)&15 == b {
			out = append(out, k)
		}
	}
	return out
}

// TestTableHasherOption checks WithHasher through bucket placement: tuples
// chosen to collide under one hasher form one chain only under it.
func TestTableHasherOption(t *testing.T) {
	const n = 12
	for _, v6 := range []bool{false, true} {
		linux := tblSameBucket(t, LinuxHasher, 5, n, v6)
		xxh := tblSameBucket(t, XXH3Hasher, 9, n, v6)
		longest := func(keys []Tuple, opts ...Option) int {
			tab := New[int](append([]Option{WithFixedBuckets(), WithCapacity(16), WithSecret(tblSecret)}, opts...)...)
			for _, k := range keys {
				require.NoError(t, tab.Insert(k, new(0)))
			}
			st := tab.Stats()
			require.Equal(t, n, st.Entries)
			return st.LongestChain
		}
		require.Equal(t, n, longest(linux), "default is LinuxHasher")
		require.Equal(t, n, longest(linux, WithHasher(LinuxHasher)))
		require.Less(t, longest(linux, WithHasher(XXH3Hasher)), n)
		require.Equal(t, n, longest(xxh, WithHasher(XXH3Hasher)))
		require.Less(t, longest(xxh, WithHasher(LinuxHasher)), n)
		require.Less(t, longest(xxh), n)
		// An invalid hasher leaves the default (or an earlier choice).
		require.Equal(t, n, longest(linux, WithHasher(Hasher(2))))
		require.Equal(t, n, longest(linux, WithHasher(Hasher(255))))
		require.Equal(t, n, longest(xxh, WithHasher(XXH3Hasher), WithHasher(Hasher(7))))
	}
	require.Equal(t, LinuxHasher, New[int](WithFixedBuckets(), WithHasher(Hasher(3))).hasher)
	require.Equal(t, XXH3Hasher, New[int](WithFixedBuckets(), WithHasher(XXH3Hasher)).hasher)
}

func TestTableAllExactlyOnce(t *testing.T) {
	tab := New[int](WithFixedBuckets(), WithCapacity(16), WithLockStripes(4))
	want := map[Tuple]*int{}
	for i := range 300 {
		k := tblKey(i, i%3 == 0)
		v := new(i)
		if i%5 == 0 {
			require.NoError(t, tab.Insert(tblMapped(k), v)) // v4 as mapped, v6 unchanged
		} else {
			require.NoError(t, tab.Insert(k, v))
		}
		want[k] = v
	}
	got := tblCollect(t, tab)
	require.Len(t, got, len(want))
	for k, v := range want {
		require.Same(t, v, got[k], k)
	}
}

func TestTableAllEarlyBreak(t *testing.T) {
	tab := New[int](WithFixedBuckets(), WithCapacity(16), WithLockStripes(1))
	for i := range 50 {
		require.NoError(t, tab.Insert(tblKey(i, false), new(i)))
	}
	for _, stop := range []int{1, 2, 3, 17, 49, 50} {
		n := 0
		for range tab.All() {
			n++
			if n == stop {
				break
			}
		}
		require.Equal(t, stop, n)
		// No lock is left held: the single stripe still takes writes.
		k := tblKey(1000, false)
		require.NoError(t, tab.Insert(k, new(0)))
		_, ok := tab.Delete(k)
		require.True(t, ok)
	}
	n := 0
	tab.All()(func(Tuple, *int) bool { n++; return false })
	require.Equal(t, 1, n, "the iterator stops when yield returns false")
}

// tblNoDeadlock runs f and fails if it does not return within a generous
// time.
func tblNoDeadlock(t *testing.T, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("deadlock: the call did not return within 30 s")
	}
}

func TestTableAllBodyMayWrite(t *testing.T) {
	tab := New[int](WithFixedBuckets(), WithCapacity(16), WithLockStripes(1))
	orig := map[Tuple]*int{}
	for i := range 64 {
		k := tblKey(i, i%2 == 0)
		orig[k] = new(i)
		require.NoError(t, tab.Insert(k, orig[k]))
	}
	added := map[Tuple]*int{}
	seen := map[Tuple]int{}
	var errs []error
	tblNoDeadlock(t, func() {
		i := 0
		for tup, v := range tab.All() {
			seen[tup]++
			if o, ok := orig[tup]; ok {
				if v != o {
					errs = append(errs, fmt.Errorf("%v: value %p, want %p", tup, v, o))
				}
				if d, ok := tab.Delete(tup); !ok || d != o {
					errs = append(errs, fmt.Errorf("delete %v in body: %p %v", tup, d, ok))
				}
			} else if a, ok := added[tup]; !ok || a != v {
				errs = append(errs, fmt.Errorf("yielded unknown %v", tup))
			}
			// Insert, look up, count and iterate from inside the body.
			k := tblKey(10000+i, i%2 == 1)
			i++
			added[k] = new(-i)
			if err := tab.Insert(k, added[k]); err != nil {
				errs = append(errs, err)
			}
			if _, ok := tab.Lookup(k); !ok {
				errs = append(errs, fmt.Errorf("lookup %v in body", k))
			}
			_ = tab.Len()
			_ = tab.Stats()
			for range tab.All() {
				break
			}
		}
	})
	require.Empty(t, errs)
	for k := range orig {
		require.Equal(t, 1, seen[k], "original %v yielded %d times", k, seen[k])
		_, ok := tab.Lookup(k)
		require.False(t, ok)
	}
	for k, n := range seen {
		require.Equal(t, 1, n, k)
	}
	require.Equal(t, len(added), tab.Len())
	require.Equal(t, added, tblCollect(t, tab))
}

// TestTableAllWeaklyConsistent iterates while other goroutines insert and
// delete other keys: keys present for the whole iteration are yielded
// exactly once, and nothing is yielded twice or with a foreign value.
func TestTableAllWeaklyConsistent(t *testing.T) {
	type val struct{ tup Tuple }
	tab := New[val](WithFixedBuckets(), WithCapacity(32), WithLockStripes(4), WithSecret(tblSecret))
	const nPerm, nChurn = 200, 200
	perm := map[Tuple]*val{}
	for i := range nPerm {
		k := tblKey(i, i%2 == 0)
		perm[k] = &val{k}
		require.NoError(t, tab.Insert(k, perm[k]))
	}
	var stop atomic.Bool
	var churnOps atomic.Int64
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 42))
			present := make([]bool, nChurn)
			for !stop.Load() {
				j := r.IntN(nChurn/2)*2 + w // writer w owns keys j%2 == w
				k := tblKey(100000+j, j%3 == 0)
				if present[j] {
					if v, ok := tab.Delete(k); !ok || v.tup != k {
						t.Errorf("delete %v: %v %v", k, v, ok)
						return
					}
				} else if err := tab.Insert(k, &val{k}); err != nil {
					t.Errorf("insert %v: %v", k, err)
					return
				}
				present[j] = !present[j]
				churnOps.Add(1)
			}
		})
	}
	iters := 100
	if testing.Short() {
		iters = 30
	}
	for range iters {
		seen := map[Tuple]bool{}
		for tup, v := range tab.All() {
			require.False(t, seen[tup], "%v yielded twice", tup)
			seen[tup] = true
			require.Equal(t, tup, v.tup, "foreign value")
			if p, ok := perm[tup]; ok {
				require.Same(t, p, v)
			}
		}
		for k := range perm {
			require.True(t, seen[k], "permanent %v not yielded", k)
		}
	}
	stop.Store(true)
	wg.Wait()
	require.Positive(t, churnOps.Load())
}

// tblFuzzKeys are the key space of FuzzTable: 32 distinct keys (16 IPv4,
// 16 IPv6) crowded into 4 of 16 buckets under LinuxHasher and tblSecret,
// each with two spellings (tblFuzzSpell), 64 tuples in all.
var tblFuzzKeys = sync.OnceValue(func() []Tuple {
	var keys []Tuple
	for _, v6 := range []bool{false, true} {
		n := 0
		for i := 0; n < 16; i++ {
			var k Tuple
			if v6 {
				k = Tuple{
					Local:  netip.AddrPortFrom(netip.AddrFrom16([16]byte{0xfe, 0x80, 15: byte(i%7 + 1)}), uint16(1+i/7)),
					Remote: netip.AddrPortFrom(netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 14: byte(i >> 8), 15: byte(i)}), 443),
				}
			} else {
				k = Tuple{
					Local:  netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(i%5 + 1)}), uint16(30000+i)),
					Remote: netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, 100, byte(i >> 4)}), 80),
				}
			}
			if HashTuple(k, LinuxHasher, tblSecret)&15 < 4 {
				keys = append(keys, k)
				n++
			}
		}
	}
	return keys
})

// tblFuzzSpell returns spelling alt (0 or 1) of key k: IPv4 keys as IPv4
// or (partly) IPv4-mapped, IPv6 keys with or without zones.
func tblFuzzSpell(k Tuple, i, alt int) Tuple {
	if alt == 0 {
		return k
	}
	if k.Local.Addr().Is4() {
		m := tblMapped(k)
		switch i % 3 {
		case 1:
			m.Remote = k.Remote
		case 2:
			m.Local = k.Local
		}
		return m
	}
	return Tuple{
		Local:  netip.AddrPortFrom(k.Local.Addr().WithZone(fmt.Sprint("eth", i%3)), k.Local.Port()),
		Remote: netip.AddrPortFrom(k.Remote.Addr().WithZone("z"), k.Remote.Port()),
	}
}

var tblFuzzInvalid = []Tuple{
	{},
	tblTuple("0.0.0.0:1", "10.0.0.1:2"),
	tblTuple("10.0.0.1:0", "10.0.0.1:2"),
	tblTuple("[fe80::1]:1", "10.0.0.1:2"),
	tblTuple("[::ffff:10.0.0.1]:1", "[2001:db8::1]:2"),
	tblTuple("[2001:db8::1]:1", "[::]:2"),
}

// FuzzTable runs a sequence of operations decoded from the input against
// five tables (one per hasher, one with home groups, one whose home bitmap
// is a run of words, one that grows itself) and a map model.
func FuzzTable(f *testing.F) {
	f.Add([]byte{})
	var all []byte
	for i := range 64 {
		all = append(all, 0, byte(i))
	}
	all = append(all, 5, 0, 6, 0)
	for i := range 64 {
		all = append(all, 2, byte(63-i), 3, byte(i^1), 5, 0)
	}
	f.Add(all)
	f.Add([]byte{0, 0, 0, 1, 2, 1, 3, 1, 2, 0, 0, 1, 5, 0, 3, 0, 0, 3, 2, 2})
	f.Add([]byte{0, 7, 1, 9, 3, 8, 0, 8, 2, 9, 7, 0, 7, 1, 7, 2, 7, 3, 7, 4, 7, 5, 7, 6, 6, 0})
	f.Add([]byte{8, 4, 8, 5, 9, 68, 2, 4, 9, 5, 2, 4, 8, 4, 5, 0, 9, 4, 6, 0, 8, 9, 8, 9, 3, 8, 6, 0})
	r := rand.New(rand.NewPCG(2024, 7))
	for range 6 {
		b := make([]byte, 400)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		keys := tblFuzzKeys()
		canon := map[Tuple]int{}
		for i, k := range keys {
			canon[tblCanon(k)] = i
		}
		tabs := []*Table[int]{
			New[int](WithFixedBuckets(), WithCapacity(16), WithLockStripes(2), WithSecret(tblSecret)),
			New[int](WithFixedBuckets(), WithCapacity(16), WithLockStripes(2), WithSecret(tblSecret), WithHasher(XXH3Hasher)),
			New[int](WithFixedBuckets(), WithCapacity(16), WithLockStripes(2), WithSecret(tblSecret), withHomeGroups(true)),
			// 128 buckets under one lock: the home bitmap is a run of
			// words rather than the stripe's own word (home.go).
			New[int](WithFixedBuckets(), WithCapacity(128), WithLockStripes(1), WithSecret(tblSecret)),
			// A table that grows itself, from one bucket per stripe
			// (past 5 entries in one), and from where its Grows leave it.
			New[int](WithCapacity(16), WithLockStripes(16), WithSecret(tblSecret)),
		}
		const autoTab = 4
		// models[i] is what tabs[i] must hold: key index -> the very
		// pointer inserted (each table gets its own pointer; both point to
		// the same content).
		models := []map[int]*int{{}, {}, {}, {}, {}}
		// reserved[i] counts the home slots tabs[i]'s arrays reserved,
		// grows[i] its Grows.
		reserved := make([]int, len(tabs))
		for i, tab := range tabs {
			reserved[i] = tab.Stats().Buckets
		}
		grows := make([]int, len(tabs))
		// seen[autoTab] is the bucket count the table that grows itself
		// had after its last op 6: it doubled since as often as it has
		// more now.
		seen := make([]int, len(tabs))
		seen[autoTab] = reserved[autoTab]
		// finish[i], if set, lets a Grow of tabs[i] that stopped before
		// its first stripe run to its end.
		finish := make([]func() error, len(tabs))
		serial := 0
		if len(data) > 1024 {
			data = data[:1024]
		}
		// check compares a returned value with the model's pointer.
		// N.B. the loop asserts through rt, whose failures go to t but
		// which has no Helper method, and with a step message formatted
		// only on failure: testify marks each assertion a helper, and that
		// walk of the stack took most of an input's time.
		rt := tblFailOnly{t}
		check := func(want *int, wok bool, got *int, gok bool, msg tblStep) {
			require.Equal(rt, wok, gok, msg)
			if wok {
				require.Same(rt, want, got, msg)
				require.Equal(rt, *want, *got, msg)
			} else {
				require.Nil(rt, got, msg)
			}
		}
		for step := 0; step+1 < len(data); step += 2 {
			op, arg := data[step], int(data[step+1])
			ki, alt := (arg%64)/2, arg%2
			tup := tblFuzzSpell(keys[ki], ki, alt)
			serial++
			for ti, tab := range tabs {
				model := models[ti]
				msg := tblStep{ti, step, op % 10, tup}
				switch op % 10 {
				case 0, 1: // Insert
					v := new(serial)
					err := tab.Insert(tup, v)
					if old, ok := model[ki]; ok {
						require.ErrorIs(rt, err, ErrExists, msg)
						got, gok := tab.Lookup(keys[ki])
						check(old, true, got, gok, msg)
					} else {
						require.NoError(rt, err, msg)
						model[ki] = v
					}
				case 2: // Lookup, and AppendLookups of the same tuple twice
					want, ok := model[ki]
					got, gok := tab.Lookup(tup)
					check(want, ok, got, gok, msg)
					both := tab.AppendLookups(nil, []Tuple{tup, keys[ki]})
					require.Len(rt, both, 2, msg)
					for _, got := range both {
						check(want, ok, got, got != nil, msg)
					}
				case 3, 4: // Delete
					want, ok := model[ki]
					got, gok := tab.Delete(tup)
					check(want, ok, got, gok, msg)
					delete(model, ki)
				case 5: // All
					got := tblCollect(t, tab)
					require.Len(rt, got, len(model), msg)
					for tup, v := range got {
						i, ok := canon[tup]
						require.True(rt, ok, "%s: All yielded %v, not a canonical key", msg, tup)
						want, ok := model[i]
						check(want, ok, v, true, msg)
					}
				case 6: // Len, Stats; with arg&64, after a Grow to 2 or 4 times the buckets, else with arg&1 after Compact
					if finish[ti] != nil {
						require.NoError(rt, finish[ti](), msg)
						finish[ti] = nil
					}
					if ti == autoTab {
						tab.growers.Wait()
						require.False(rt, tab.cur().overfull(), msg)
						for ; seen[ti] < len(tab.cur().b.heads); seen[ti] *= 2 {
							reserved[ti] += 2 * seen[ti]
							grows[ti]++
						}
					}
					if n := len(tab.cur().b.heads); arg&64 != 0 && n < 1024 {
						n <<= 1 + arg>>7
						reserved[ti] += n
						grows[ti]++
						// (Not the table that grows itself: its growths
						// would run into the stopped one's hook.)
						if arg&32 != 0 && ti != autoTab {
							// The Grow stops before it moves any entry,
							// and the steps up to the next op 6 find the
							// table half grown (Stats would move the
							// rest): every entry is still found.
							next, wait := growPaused(t, tab, n)
							next()
							finish[ti] = wait
							for ki, want := range model {
								got, ok := tab.Lookup(keys[ki])
								check(want, true, got, ok, msg)
							}
							break
						}
						require.NoError(rt, tab.Grow(n-(arg&31)%(n/2)), msg) // rounded up to n
						require.Equal(rt, n, tab.Stats().Buckets, msg)
						require.NoError(rt, tab.Grow(n/2), msg) // never shrinks
						seen[ti] = n
					} else if arg&1 != 0 {
						tab.Compact()
					}
					require.Equal(rt, len(model), tab.Len(), msg)
					st := tab.Stats()
					require.Equal(rt, len(model), st.Entries, msg)
					// Beyond the home slots, a stripe carves a new batch
					// only when all it has carved is live: at most 32
					// keys are live, so the nodes stay within that plus a
					// batch per stripe, the home slots of every array and,
					// for each Grow, the rest of the chunk carved last
					// (64 nodes in these tables).
					require.LessOrEqual(rt, st.Nodes, reserved[ti]+32+st.LockStripes*slabBatch+grows[ti]*64, msg)
					tblCheckHome(rt, tab, msg)
				case 7: // bad input leaves the table unchanged
					bad := tblFuzzInvalid[arg%len(tblFuzzInvalid)]
					require.ErrorIs(rt, tab.Insert(bad, new(-1)), ErrInvalidTuple, msg)
					require.ErrorIs(rt, tab.Insert(tup, nil), ErrNilValue, msg)
					_, found, err := tab.LookupOrInsert(bad, new(-1))
					require.ErrorIs(rt, err, ErrInvalidTuple, msg)
					require.False(rt, found, msg)
					_, _, err = tab.LookupOrInsert(tup, nil)
					require.ErrorIs(rt, err, ErrNilValue, msg)
					require.False(rt, tab.CompareAndDelete(bad, new(-1)), msg)
					require.False(rt, tab.CompareAndDelete(tup, nil), msg)
					require.False(rt, tab.CompareAndSwap(bad, new(-1), new(-1)), msg)
					require.False(rt, tab.CompareAndSwap(tup, nil, new(-1)), msg)
					if cur, ok := model[ki]; ok {
						require.False(rt, tab.CompareAndSwap(tup, cur, nil), msg)
					}
					_, ok := tab.Lookup(bad)
					require.False(rt, ok, msg)
					want, wok := model[ki]
					got, gok := tab.Lookup(tup)
					check(want, wok, got, gok, msg)
					require.Equal(rt, len(model), tab.Len(), msg)
				case 8: // LookupOrInsert
					v := new(serial)
					got, found, err := tab.LookupOrInsert(tup, v)
					require.NoError(rt, err, msg)
					old, ok := model[ki]
					if !ok {
						old = v
						model[ki] = v
					}
					check(old, true, got, true, msg)
					require.Equal(rt, ok, found, msg)
				case 9: // CompareAndDelete or CompareAndSwap, with the value held or another
					old, ok := model[ki]
					if arg&64 != 0 {
						old, ok = new(serial), false
					}
					if arg&128 != 0 {
						v := new(serial)
						require.Equal(rt, ok, tab.CompareAndSwap(tup, old, v), msg)
						if ok {
							model[ki] = v
						}
						break
					}
					require.Equal(rt, ok, tab.CompareAndDelete(tup, old), msg)
					if ok {
						delete(model, ki)
					}
				}
				// The table that grows itself has grown before the next
				// step: the fuzzer needs each input to run the same code
				// every time (the stress and linearizability tests run
				// steps during growths).
				if ti == autoTab {
					tab.growers.Wait()
				}
			}
		}
		for ti, tab := range tabs {
			if finish[ti] != nil {
				require.NoError(t, finish[ti]())
			}
			require.Equal(t, len(models[ti]), tab.Len())
			got := tblCollect(t, tab)
			require.Len(t, got, len(models[ti]))
			for i, want := range models[ti] {
				require.Same(t, want, got[tblCanon(keys[i])])
			}
			tab.growers.Wait()
		}
	})
}

// tblStep names a step of FuzzTable in failure messages.
type tblStep struct {
	table, step int
	op          byte
	tup         Tuple
}

func (s tblStep) String() string {
	return fmt.Sprintf("table %d step %d op %d %v", s.table, s.step, s.op, s.tup)
}

// tblFailOnly passes failures to t and hides its Helper method (see
// FuzzTable).
type tblFailOnly struct{ t *testing.T }

func (f tblFailOnly) Errorf(format string, args ...any) { f.t.Errorf(format, args...) }
func (f tblFailOnly) FailNow()                          { f.t.FailNow() }

// tblCheckHome checks a quiescent table's home slot bookkeeping against its
// chains: every linked node is in one chain only; a home slot's free bit is
// set exactly when no chain links it, and only while its bucket is empty; an
// entry of another bucket in a home slot belongs to the same stripe; each
// stripe's free count matches its bits; and every node in a chain is live.
func tblCheckHome[T any](t require.TestingT, tab *Table[T], msg any) {
	if h, ok := t.(interface{ Helper() }); ok {
		h.Helper()
	}
	a := tab.cur()
	in := map[uint32]uint32{} // node -> bucket of the chain linking it
	for b := range a.b.heads {
		for l := a.b.heads[b].load(); !l.isNulls(); l = tab.nodes.at(l.index()).next.load() {
			_, dup := in[l.index()]
			require.False(t, dup, "%v: node %d in two chains", msg, l.index())
			in[l.index()] = uint32(b)
			require.Equal(t, uint32(b), a.b.bucket(uint32(tab.nodes.at(l.index()).key.meta.Load()>>32)), "%v: node %d in the chain of another bucket", msg, l.index())
			require.EqualValues(t, 1, tab.nodes.at(l.index()).seq.Load()&1, "%v: node %d linked but free", msg, l.index())
		}
	}
	free := make([]uint32, len(a.b.stripes))
	for b := range uint32(len(a.b.heads)) {
		w, m := a.home.bit(&a.b.stripes[b&a.b.stripeMask], b)
		owner, used := in[a.home.slot(b)]
		if !a.b.heads[b].load().isNulls() {
			require.True(t, used, "%v: bucket %d not empty, its home slot free", msg, b)
		}
		require.Equal(t, !used, *w&m != 0, "%v: free bit of bucket %d", msg, b)
		if used {
			require.Equal(t, b&a.b.stripeMask, owner&a.b.stripeMask, "%v: home slot of %d used by bucket %d of another stripe", msg, b, owner)
		} else {
			free[b&a.b.stripeMask]++
		}
	}
	for s := range a.b.stripes {
		require.Equal(t, free[s], a.b.stripes[s].homeFree, "%v: free home slots of stripe %d", msg, s)
		bitsSet := bits.OnesCount64(a.b.stripes[s].homeBits[0])
		if a.home.free != nil {
			for _, w := range a.home.free[uint32(s)*a.home.words : uint32(s+1)*a.home.words] {
				bitsSet += bits.OnesCount64(w)
			}
		}
		require.EqualValues(t, free[s], bitsSet, "%v: bits set in the run of stripe %d", msg, s)
	}
}

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
	tab := New[string](append([]Option{WithFixedBuckets(), WithCapacity(16), WithLockStripes(1), WithSecret(tblSecret)}, opts...)...)
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
		require.NoError(t, tab.Insert(f.filler(b), new("filler")))
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
	f.tab.visit = func(i uint32) {
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
				require.NoError(t, tab.Insert(kb[1+i], new("pre")))
			}
			vy, vx, vz := new("Y"), new("X"), new("Z")
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

// TestTableHomeAfterInserts checks placement after inserts only: every
// non-empty bucket holds one of its own entries at home, whatever the
// stripes (with one bucket per stripe nothing can be stolen; with fewer, an
// insert evicts a stealer from its bucket's home slot), and the
// bookkeeping holds.
func TestTableHomeAfterInserts(t *testing.T) {
	for _, stripes := range []int{1, 4, 256} {
		tab := New[int](WithFixedBuckets(), WithCapacity(256), WithLockStripes(stripes), WithSecret(tblSecret))
		v := new(0)
		for i := range 256 {
			require.NoError(t, tab.Insert(tblKey(i, i%2 == 0), v))
			if i%16 == 15 {
				tblCheckHome(t, tab, fmt.Sprintf("stripes %d", stripes))
			}
		}
		st := tab.Stats()
		t.Logf("stripes %d: %d of %d entries home", stripes, st.HomeEntries, st.Entries)
		require.Equal(t, st.Buckets-st.ChainLengths[0], st.HomeEntries)
	}
}

// TestTableHomeBitmapLines checks where each stripe's run of the home
// bitmap lives: in the stripe itself where the stripe covers 64 buckets or
// fewer, else in words that start a cache line of their own, for small and
// large tables.
func TestTableHomeBitmapLines(t *testing.T) {
	for _, c := range []struct{ capacity, stripes int }{
		{16, 1}, {16, 16}, {1024, 16}, {1024, 64}, {4096, 64}, {8192, 64},
		{1 << 16, 4}, {1 << 16, 64}, {1 << 20, 64},
	} {
		tab := New[int](WithFixedBuckets(), WithCapacity(c.capacity), WithLockStripes(c.stripes))
		perStripe := c.capacity / c.stripes
		for s := range tab.cur().b.stripes {
			require.EqualValues(t, perStripe, tab.cur().b.stripes[s].homeFree, "%+v", c)
		}
		if perStripe <= 64 {
			require.EqualValues(t, 1, tab.cur().home.words, "%+v", c)
			require.Nil(t, tab.cur().home.free, "%+v", c)
			for s := range tab.cur().b.stripes {
				require.Equal(t, perStripe, bits.OnesCount64(tab.cur().b.stripes[s].homeBits[0]), "%+v: stripe %d", c, s)
			}
			continue
		}
		require.NotZero(t, tab.cur().home.words, "%+v", c)
		require.Zero(t, tab.cur().home.words%8, "%+v", c)
		for s := range uint32(len(tab.cur().b.stripes)) {
			require.Zero(t, tab.cur().b.stripes[s].homeBits[0], "%+v", c)
			p := uintptr(unsafe.Pointer(&tab.cur().home.free[s*tab.cur().home.words]))
			require.Zero(t, p%cacheLineSize, "%+v: run of stripe %d at %#x", c, s, p)
		}
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
	vx, vy, vz := new("X"), new("Y"), new("Z")
	require.NoError(t, tab.Insert(y, vy))
	f.freeHome(t, f.b)
	require.NoError(t, tab.Insert(x, vx))
	require.Equal(t, homeSlot(f.b), f.headIndex(t, 0), "X did not steal B's home slot")
	require.NoError(t, tab.Insert(w, new("W"))) // 0: W -> X -> Y -> filler
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
	vx, vy, vz, vw := new("X"), new("Y"), new("Z"), new("W")
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
	vx, vy, vz := new("X"), new("Y"), new("Z")
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
			f.insertStealing(t, x, new("X"))
			require.NoError(t, f.tab.Insert(w, new("W"))) // A: W -> X -> filler
			wIdx := f.headIndex(t, f.a)
			return x, wIdx, func() {
				_, ok := f.tab.Delete(w) // W's node tops the free cache, X heads A
				require.True(t, ok)
				require.NoError(t, f.tab.Insert(z, new("Z"))) // moves X into W's node
				require.Equal(t, wIdx, f.headIndex(t, f.a))
			}
		}},
		{"stealer X evicted into the home slot W released", false, func(t *testing.T, f *tblNulls) (Tuple, uint32, func()) {
			ka, kb := f.byBkt[f.a], f.byBkt[f.b]
			const c = 7
			x, w, z := ka[0], ka[1], kb[0]
			f.insertStealing(t, x, new("X"))
			_, ok := f.tab.Delete(f.filler(c))
			require.True(t, ok)
			f.tab.cur().b.stripes[0].cache.free = nil
			require.NoError(t, f.tab.Insert(w, new("W"))) // steals C's home slot
			wIdx := f.headIndex(t, f.a)
			require.Equal(t, homeSlot(c), wIdx)
			return x, wIdx, func() {
				_, ok := f.tab.Delete(w)
				require.True(t, ok)
				require.NoError(t, f.tab.Insert(z, new("Z"))) // moves X into C's home slot
				require.Equal(t, wIdx, f.headIndex(t, f.a))
			}
		}},
		{"stealer X, deep in its chain, evicted into N's freed node past K", false, func(t *testing.T, f *tblNulls) (Tuple, uint32, func()) {
			// Z takes B's home slot back.
			return tblStealerPastK(t, f, func(x Tuple) { f.insertStealing(t, x, new("X")) }, f.byBkt[f.b][0], f.b, f.b)
		}},
		{"Y moved into the home slot of J, deleted", false, func(t *testing.T, f *tblNulls) (Tuple, uint32, func()) {
			ka := f.byBkt[f.a]
			y, j := ka[0], ka[1]
			require.NoError(t, f.tab.Insert(y, new("Y")))
			require.NoError(t, f.tab.Insert(j, new("J"))) // A: J -> Y -> filler
			_, ok := f.tab.Delete(f.filler(f.a))          // J moves home: A: J -> Y
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
				require.NoError(t, f.tab.Insert(x, new("X")))
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
	require.NoError(t, f.tab.Insert(k, new("K")))
	require.NoError(t, f.tab.Insert(n, new("N")))
	nIdx := f.headIndex(t, f.a)
	return k, nIdx, func() {
		_, ok := f.tab.Delete(n)
		require.True(t, ok)
		require.NoError(t, f.tab.Insert(z, new("Z")))
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
	vy, vj := new("Y"), new("J")
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
			vx, vw := new("X"), new("W")
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
			vz := new("new")
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

// TestTableAllocs pins Lookup, steady-state Insert+Delete,
// LookupOrInsert+CompareAndDelete and CompareAndSwap at zero allocations.
func TestTableAllocs(t *testing.T) {
	for _, h := range hashers {
		tab := New[int](WithFixedBuckets(), WithHasher(h), WithCapacity(256))
		k4, k6 := tblKey(1, false), tblKey(1, true)
		miss4, miss6 := tblKey(2, false), tblKey(2, true)
		for i := range 512 { // long chains, so misses walk
			require.NoError(t, tab.Insert(tblKey(100+i, i%2 == 0), new(i)))
		}
		require.NoError(t, tab.Insert(k4, new(4)))
		require.NoError(t, tab.Insert(tblMapped(k6), new(6)))
		for name, c := range map[string]struct {
			k  Tuple
			ok bool
		}{
			"hit v4": {k4, true}, "hit v4 mapped": {tblMapped(k4), true}, "hit v6": {k6, true},
			"miss v4": {miss4, false}, "miss v6": {miss6, false},
		} {
			bad := 0
			allocs := testing.AllocsPerRun(1000, func() {
				if _, ok := tab.Lookup(c.k); ok != c.ok {
					bad++
				}
			})
			require.Zero(t, bad, "%v %s", h, name)
			require.Zero(t, allocs, "%v %s", h, name)
		}

		keys := make([]Tuple, 64)
		vals := make([]*int, len(keys))
		for i := range keys {
			keys[i] = tblKey(5000+i, i%2 == 1)
			vals[i] = new(i)
		}
		var bad atomic.Int64
		pair := func(i int) {
			if tab.Insert(keys[i], vals[i]) != nil {
				bad.Add(1)
			}
			if v, ok := tab.Delete(keys[i]); !ok || v != vals[i] {
				bad.Add(1)
			}
		}
		for r := range 2000 { // warm up the free caches
			pair(r % len(keys))
		}
		n := 0
		allocs := testing.AllocsPerRun(2000, func() {
			pair(n % len(keys))
			n++
		})
		require.Zero(t, bad.Load())
		require.Zero(t, allocs, "%v: Insert+Delete", h)

		// The same with LookupOrInsert and CompareAndDelete, and
		// LookupOrInsert of a present key and CompareAndSwap there and
		// back.
		pair = func(i int) {
			if v, found, err := tab.LookupOrInsert(keys[i], vals[i]); err != nil || found || v != vals[i] {
				bad.Add(1)
			}
			if v, found, _ := tab.LookupOrInsert(keys[i], vals[0]); !found || v != vals[i] {
				bad.Add(1)
			}
			other := vals[(i+1)%len(vals)]
			if !tab.CompareAndSwap(keys[i], vals[i], other) || !tab.CompareAndSwap(keys[i], other, vals[i]) {
				bad.Add(1)
			}
			if !tab.CompareAndDelete(keys[i], vals[i]) {
				bad.Add(1)
			}
		}
		allocs = testing.AllocsPerRun(2000, func() {
			pair(n % len(keys))
			n++
		})
		require.Zero(t, bad.Load())
		require.Zero(t, allocs, "%v: LookupOrInsert+CompareAndSwap+CompareAndDelete", h)
	}
}

// A stripe fills one cache line on every target: these fail to compile
// where it does not, on 386 too (.ci/run vets the package for it, and vet
// type-checks with the target's sizes).
var (
	_ [unsafe.Sizeof(stripe{}) - cacheLineSize]struct{}
	_ [cacheLineSize - unsafe.Sizeof(stripe{})]struct{}
)

// TestTableMemoryLayout pins the entry and stripe sizes.
func TestTableMemoryLayout(t *testing.T) {
	require.LessOrEqual(t, unsafe.Sizeof(entry[int]{}), uintptr(60))
	require.LessOrEqual(t, unsafe.Sizeof(entry[[64]byte]{}), uintptr(60), "the value is held by pointer")
	require.Equal(t, uintptr(64), unsafe.Sizeof(stripe{}))
	require.Equal(t, uintptr(cacheLineSize), unsafe.Sizeof(stripe{}))
	require.Equal(t, uintptr(4), unsafe.Sizeof(linkField{}))
}

// TestTableMemoryPerEntry measures what a table holds on the heap per entry,
// at one random flow per bucket, after inserts and after 8 rounds of churn
// that each replace every flow (as many deletes of a random live flow and
// inserts of a new one). With the default options: at most 64 bytes from
// 2^16 entries up, and within a bound that the table held before its nodes
// came in chunks sized to it (a 2^10-entry table held 126 bytes per entry,
// 77 at 2^12) in smaller tables, whose lock stripes each cover fewer
// buckets. With the fewer stripes README suggests for small tables (one at
// 2^10, two at 2^12): at most 64. A table grown by Grow, or by itself from
// the default size, holds more, as it keeps every array's nodes.
func TestTableMemoryPerEntry(t *testing.T) {
	heap := func() int64 {
		var ms runtime.MemStats
		runtime.GC()
		runtime.GC() // and what the first cycle's cleanups freed
		runtime.ReadMemStats(&ms)
		return int64(ms.HeapAlloc)
	}
	for _, c := range []struct {
		n, stripes int     // stripes 0: the default
		grown      bool    // made for n/2 entries, filled, grown to n
		itself     bool    // made with the default capacity, grown by itself
		limit      float64 // bytes per entry; measured: see the log
		compacted  float64 // the same after Compact
	}{
		{1 << 10, 0, false, false, 90, 90}, // 78 and 83, 83
		{1 << 10, 1, false, false, 64, 64}, // 61 and 61, 61: one stripe, no stripe's imbalance
		{1 << 12, 0, false, false, 72, 72}, // 67 and 69, 69
		{1 << 12, 2, false, false, 64, 64}, // 62 and 63, 63
		{1 << 16, 0, false, false, 64, 64}, // 61 and 63, 63
		{1 << 16, 0, true, false, 64, 64},  // 62.5 and 63.5, 63.5: the first array's home slots released (see Table.Grow)
		// 64.5 to 76 and 97 to 109, then 66 (8 runs; when the growths
		// run differs): grown to 2^15 buckets by the inserts, to 2^16 by
		// the churn, with the nodes of the entries beyond the home slots
		// at 2^15 kept until Compact
		{1 << 16, 0, false, true, 120, 68},
	} {
		t.Run(fmt.Sprintf("n=%d/stripes=%d/grown=%v/itself=%v", c.n, c.stripes, c.grown, c.itself), func(t *testing.T) {
			r := rand.New(rand.NewPCG(5, 6))
			flow := func(i int) Tuple {
				return Tuple{
					Local:  netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, 1}), 443),
					Remote: netip.AddrPortFrom(netip.AddrFrom4([4]byte{100, byte(i >> 16), byte(i >> 8), byte(i)}), uint16(1024+r.IntN(60000))),
				}
			}
			live := make([]Tuple, c.n)
			for i := range live {
				live[i] = flow(i)
			}
			v := new(0)
			before := heap()
			opts := []Option{WithCapacity(c.n), WithSecret(tblSecret)}
			if c.grown {
				opts[0] = WithCapacity(c.n / 2)
			}
			if c.stripes > 0 {
				opts = append(opts, WithLockStripes(c.stripes))
			}
			if c.itself {
				opts = opts[1:]
			} else {
				opts = append(opts, WithFixedBuckets())
			}
			tab := New[int](opts...)
			for i, k := range live {
				if c.grown && i == c.n/2 {
					require.NoError(t, tab.Grow(c.n))
				}
				require.NoError(t, tab.Insert(k, v))
			}
			tab.growers.Wait()
			filled := float64(heap()-before) / float64(c.n)
			next := c.n
			for range 8 * c.n {
				j := r.IntN(c.n)
				_, ok := tab.Delete(live[j])
				require.True(t, ok)
				live[j] = flow(next)
				next++
				require.NoError(t, tab.Insert(live[j], v))
			}
			churned := float64(heap()-before) / float64(c.n)
			tab.Compact()
			compacted := float64(heap()-before) / float64(c.n)
			runtime.KeepAlive(live) // allocated before the table: not counted, but not freed either
			st := tab.Stats()
			runtime.KeepAlive(tab)
			t.Logf("%.1f bytes per entry after inserts, %.1f after churn, %.1f after Compact; %d nodes for %d entries in %d buckets", filled, churned, compacted, st.Nodes, st.Entries, st.Buckets)
			require.Equal(t, c.n, st.Entries)
			require.LessOrEqual(t, filled, c.limit, "after inserts")
			require.LessOrEqual(t, churned, c.limit, "after churn")
			require.LessOrEqual(t, compacted, c.compacted, "after Compact")
		})
	}
}

// TestTableChurnNoLeak fills a table, churns it, and checks that entries
// are recycled: the node count stays within the free caches' slack of the
// peak live count.
func TestTableChurnNoLeak(t *testing.T) {
	for _, c := range []struct{ n, stripes int }{
		{1 << 16, 0}, // default stripes: a loose bound
		{1 << 14, 4}, // few stripes: a tight one
	} {
		n, stripes := c.n, c.stripes
		t.Run(fmt.Sprintf("n=%d,stripes=%d", n, stripes), func(t *testing.T) {
			opts := []Option{WithCapacity(n)}
			if stripes > 0 {
				opts = append(opts, WithLockStripes(stripes))
			}
			tab := New[int](append(opts, WithFixedBuckets())...)
			v := new(0)
			key := func(i int) Tuple {
				return Tuple{
					Local:  netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, 1}), 443),
					Remote: netip.AddrPortFrom(netip.AddrFrom4([4]byte{100, byte(i >> 16), byte(i >> 8), byte(i)}), 40000),
				}
			}
			// live[s] counts the entries of stripe s, and excess[s] the
			// most it has held beyond its buckets' home slots.
			homes := len(tab.cur().b.heads) / len(tab.cur().b.stripes)
			live, excess := make([]int, len(tab.cur().b.stripes)), make([]int, len(tab.cur().b.stripes))
			stripeOf := func(tup Tuple) int {
				return int(HashTuple(tup, tab.hasher, tab.secret) & tab.cur().b.stripeMask)
			}
			// A stripe carves nodes only when its cache, the depot and
			// its free home slots are exhausted; its cache holds fewer
			// than slabCacheMax, and it carves slabBatch at a time.
			bound := func() int {
				b := len(tab.cur().b.heads)
				for s := range live {
					b += excess[s] + slabCacheMax + slabBatch
				}
				return b
			}
			add := func(i, d int) {
				s := stripeOf(key(i))
				live[s] += d
				excess[s] = max(excess[s], live[s]-homes)
			}
			bad := 0
			for i := range n {
				if tab.Insert(key(i), v) != nil {
					bad++
				}
				add(i, 1)
			}
			require.Zero(t, bad)
			st := tab.Stats()
			require.Equal(t, n, st.Entries)
			require.LessOrEqual(t, st.Nodes, bound())
			r := rand.New(rand.NewPCG(3, 4))
			next := n
			ids := make([]int, n)
			for i := range ids {
				ids[i] = i
			}
			for range 2 * n {
				j := r.IntN(len(ids))
				if _, ok := tab.Delete(key(ids[j])); !ok {
					bad++
				}
				add(ids[j], -1)
				ids[j] = next
				if tab.Insert(key(next), v) != nil {
					bad++
				}
				add(next, 1)
				next++
			}
			require.Zero(t, bad)
			st = tab.Stats()
			require.Equal(t, n, st.Entries)
			require.Equal(t, n, tab.Len())
			require.LessOrEqual(t, st.Nodes, bound(), "nodes leak: %d nodes for %d live", st.Nodes, n)
			tblCheckHome(t, tab, "after churn")
			t.Logf("after churn: %d of %d entries in their home slots", st.HomeEntries, st.Entries)
		})
	}
}

// Guard: the helpers above are only meaningful if errors wrap sentinels.
func TestTableErrorsWrapTuple(t *testing.T) {
	tab := New[int]()
	k := tblTuple("10.0.0.1:1", "10.0.0.2:2")
	require.NoError(t, tab.Insert(k, new(1)))
	err := tab.Insert(k, new(2))
	require.True(t, errors.Is(err, ErrExists))
	require.Contains(t, err.Error(), k.String())
}

// TestTableEdgeInput checks inputs that must neither panic nor match.
func TestTableEdgeInput(t *testing.T) {
	tab := New[int](WithFixedBuckets(), nil, WithCapacity(-1), WithLockStripes(0), nil)
	st := tab.Stats()
	require.Equal(t, 16, st.Buckets)
	require.Equal(t, 1, st.LockStripes)
	tup := Tuple{Local: netip.MustParseAddrPort("10.0.0.1:1000"), Remote: netip.MustParseAddrPort("10.0.0.2:80")}
	require.NoError(t, tab.Insert(tup, new(int)))
	for _, bad := range []Tuple{
		{Local: tup.Local},
		{Remote: tup.Remote},
		{Local: netip.AddrPortFrom(tup.Local.Addr(), 0), Remote: tup.Remote},
		{Local: tup.Local, Remote: netip.AddrPortFrom(tup.Remote.Addr(), 0)},
		{},
	} {
		_, ok := tab.Lookup(bad)
		require.False(t, ok, "%v", bad)
		_, ok = tab.Delete(bad)
		require.False(t, ok, "%v", bad)
	}
	require.Equal(t, 1, tab.Len())
}

// tblCheckAppendLookups checks AppendLookups against Lookup on tab, over
// batches of every length up to 3*lookupBatch+1 drawn from keys (present
// and absent ones, in several spellings) and the invalid tuples: every
// answer is Lookup's, in order, after dst's own values, which stay. It
// returns the number of answers that found a value.
func tblCheckAppendLookups(t *testing.T, tab *Table[int], keys []Tuple, r *rand.Rand) (found int) {
	t.Helper()
	pool := append(slices.Clone(keys), tblFuzzInvalid...)
	for _, k := range keys {
		if k.Local.Addr().Is4() {
			mapped := k
			mapped.Local = netip.AddrPortFrom(netip.AddrFrom16(k.Local.Addr().As16()), k.Local.Port())
			pool = append(pool, mapped)
		}
	}
	prefix := []*int{new(-1), nil, new(-2)}
	for n := range 3*lookupBatch + 2 {
		for range 20 {
			tups := make([]Tuple, n)
			for i := range tups {
				tups[i] = pool[r.IntN(len(pool))]
			}
			got := tab.AppendLookups(slices.Clone(prefix), tups)
			require.Len(t, got, len(prefix)+n)
			for i, p := range prefix {
				require.Same(t, p, got[i], "dst's own value %d", i)
			}
			for i, tup := range tups {
				want, ok := tab.Lookup(tup)
				if !ok {
					require.Nil(t, got[len(prefix)+i], "%v, %d of %d", tup, i, n)
					continue
				}
				require.Same(t, want, got[len(prefix)+i], "%v, %d of %d", tup, i, n)
				found++
			}
		}
	}
	return found
}

// TestTableAppendLookups checks AppendLookups against Lookup, on a table
// with home groups and one without, each holding some of the keys asked
// for; and that it allocates nothing when dst has room.
func TestTableAppendLookups(t *testing.T) {
	for _, grouped := range []bool{false, true} {
		t.Run(fmt.Sprintf("groups=%v", grouped), func(t *testing.T) {
			tab := New[int](WithFixedBuckets(), WithCapacity(64), WithLockStripes(4), withHomeGroups(grouped), WithSecret(tblSecret))
			require.Equal(t, grouped, tab.cur().home.grouped())
			var keys []Tuple
			for i := range 200 {
				k := tblKey(i, i%2 == 1)
				keys = append(keys, k)
				if i%3 != 0 { // a third absent
					require.NoError(t, tab.Insert(k, new(i)))
				}
			}
			found := tblCheckAppendLookups(t, tab, keys, rand.New(rand.NewPCG(1, 2)))
			require.Greater(t, found, 1000)

			require.Empty(t, tab.AppendLookups(nil, nil))
			dst := make([]*int, 0, len(keys))
			allocs := testing.AllocsPerRun(100, func() {
				dst = tab.AppendLookups(dst[:0], keys)
			})
			require.Zero(t, allocs)
		})
	}
}

// cur returns the table's current bucket array.
func (t *Table[T]) cur() *tableArray[T] { return t.arr.Load() }

// homeSlot returns the node index of bucket b's home slot in a table that
// never grew.
func homeSlot(b uint32) uint32 { return b + 1 }
