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
	tab := New[string](WithFixedBuckets(), WithSecret(tblSecret), WithHasher(LinuxHasher))
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
		vals[i] = valPtr(fmt.Sprint("v", i))
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
	err := tab.Insert(keys[0], valPtr("other"))
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
	nv := valPtr("again")
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

	tab := New[int](WithFixedBuckets(), WithCapacity(16), WithSecret(tblSecret), WithHasher(LinuxHasher))
	for i := range 40 {
		require.NoError(t, tab.Insert(tblKey(i, i%2 == 1), valPtr(i)))
	}
	before := tblCollect(t, tab)
	beforeStats := tab.Stats()

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := valPtr(7)
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
			require.False(t, tab.CompareAndSwap(c.tup, v, valPtr(8)))
			require.Equal(t, before, tblCollect(t, tab))
			st := tab.Stats()
			require.Equal(t, beforeStats.Entries, st.Entries)
			require.Equal(t, beforeStats.Nodes, st.Nodes)
		})
	}

	// ErrExists leaves the table unchanged too, in either spelling.
	for i := range 4 {
		k := tblKey(i, i%2 == 1)
		err := tab.Insert(k, valPtr(99))
		require.ErrorIs(t, err, ErrExists)
		require.NotErrorIs(t, err, ErrInvalidTuple)
		err = tab.Insert(tblMapped(k), valPtr(99))
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
	require.False(t, tab.CompareAndSwap(k, nil, valPtr(99)))
	require.False(t, tab.CompareAndSwap(k, cur, nil))
	require.Equal(t, before, tblCollect(t, tab))
}

// TestTableLookupOrInsert checks both answers of LookupOrInsert, in either
// spelling of an IPv4 key.
func TestTableLookupOrInsert(t *testing.T) {
	tab := New[string](WithFixedBuckets(), WithSecret(tblSecret), WithHasher(LinuxHasher))
	k := tblTuple("10.0.0.1:40000", "93.184.216.34:443")
	first, second := valPtr("first"), valPtr("second")

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
	tab := New[string](WithFixedBuckets(), WithCapacity(16), WithSecret(tblSecret), WithHasher(LinuxHasher))
	ks := tblSameBucket(t, LinuxHasher, 3, 3, false)
	require.NoError(t, tab.Insert(ks[0], valPtr("a")))
	require.NoError(t, tab.Insert(ks[1], valPtr("b")))
	theirs, mine := valPtr("theirs"), valPtr("mine")
	visits := 0
	hooksOf(tab).visit = func(i uint32) {
		if i == visitWalkEnd || i == visitGrowing {
			return
		}
		if visits++; visits == 1 {
			require.NoError(t, tab.Insert(ks[2], theirs))
		}
	}
	got, found, err := tab.LookupOrInsert(ks[2], mine)
	hooksOf(tab).visit = nil
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
// a present key answers while a writer holds every bucket lock.
func TestTableLookupOrInsertPresentTakesNoLock(t *testing.T) {
	tab := New[string](WithFixedBuckets(), WithCapacity(16), WithSecret(tblSecret), WithHasher(LinuxHasher))
	k := tblKey(1, true)
	stored := valPtr("stored")
	require.NoError(t, tab.Insert(k, stored))
	for i := range tab.cur().lines {
		tab.cur().lines[i].lock()
	}
	tblNoDeadlock(t, func() {
		got, found, err := tab.LookupOrInsert(tblMapped(k), valPtr("other"))
		require.NoError(t, err)
		require.True(t, found)
		require.Same(t, stored, got)
	})
	for i := range tab.cur().lines {
		tab.cur().lines[i].unlock()
	}
}

// TestTableCompareAndDelete checks that CompareAndDelete removes a tuple
// only while it holds the value given: a reaper holding a flow's old value
// leaves alone the newer flow that took its 4-tuple.
func TestTableCompareAndDelete(t *testing.T) {
	tab := New[string](WithFixedBuckets(), WithSecret(tblSecret), WithHasher(LinuxHasher))
	k := tblTuple("[2001:db8::1]:40000", "[2001:db8::2]:443")
	old, newer := valPtr("old"), valPtr("newer")

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
	require.False(t, tab.CompareAndDelete(k, valPtr("newer")), "an equal value is not the same value")
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
	tab := New[string](WithFixedBuckets(), WithSecret(tblSecret), WithHasher(LinuxHasher))
	k := tblTuple("192.0.2.1:40000", "198.51.100.2:443")
	timeWait, conn, later := valPtr("time-wait"), valPtr("connection"), valPtr("later")

	require.False(t, tab.CompareAndSwap(k, timeWait, conn), "absent")
	_, ok := tab.Lookup(k)
	require.False(t, ok, "a failed swap inserts nothing")
	require.NoError(t, tab.Insert(k, timeWait))
	before := tab.Stats()

	require.False(t, tab.CompareAndSwap(k, valPtr("time-wait"), conn), "an equal value is not the same value")
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
	require.Equal(t, before.InLine, after.InLine)
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
	tab := New[int](WithFixedBuckets(), WithCapacity(64), WithSecret(tblSecret), WithHasher(LinuxHasher))
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
		wg.Add(1)
		go func() {
			defer wg.Done()
			start.Wait()
			for i := range flows {
				i := (i + g*flows/goroutines) % flows // start apart, meet later
				v, found, err := tab.LookupOrInsert(keys[i], valPtr(g))
				if err == nil && !found {
					inserted[i].Add(1)
				}
				got[g][i] = v
			}
		}()
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
		wg.Add(1)
		go func() {
			defer wg.Done()
			start.Wait()
			for i := range flows {
				i := (i + g*flows/goroutines) % flows
				if tab.CompareAndDelete(keys[i], got[g][i]) {
					deleted[i].Add(1)
				}
			}
		}()
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
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20000 {
				k := keys[(i+g)%4]
				mine := valPtr(g)
				v, found, err := tab.LookupOrInsert(k, mine)
				if err != nil || v == nil || found == (v == mine) {
					wrong.Add(1)
				}
				tab.CompareAndDelete(k, v)
			}
		}()
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
				tab := New[int](WithFixedBuckets(), WithHasher(h), WithCapacity(16))
				v := valPtr(1)
				require.NoError(t, tab.Insert(ins, v))
				got, ok := tab.Lookup(other)
				require.True(t, ok, "%v: insert %v, lookup %v", h, ins, other)
				require.Same(t, v, got)
				require.ErrorIs(t, tab.Insert(other, valPtr(2)), ErrExists)
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
			v := valPtr(1)
			require.NoError(t, tab.Insert(ins, v))
			for _, other := range spellings {
				got, ok := tab.Lookup(other)
				require.True(t, ok, "%v: insert %v, lookup %v", h, ins, other)
				require.Same(t, v, got)
				require.ErrorIs(t, tab.Insert(other, valPtr(2)), ErrExists)
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
	v := valPtr(3)
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
	cases := []struct {
		name    string
		opts    []Option
		buckets int
	}{
		{"default", nil, 1024},
		{"cap 0 is the default", []Option{WithCapacity(0)}, 1024},
		{"cap 1", []Option{WithCapacity(1)}, 16},
		{"cap 15", []Option{WithCapacity(15)}, 16},
		{"cap 16", []Option{WithCapacity(16)}, 16},
		{"cap 17", []Option{WithCapacity(17)}, 32},
		{"cap 300", []Option{WithCapacity(300)}, 512},
		{"cap 1000", []Option{WithCapacity(1000)}, 1024},
		{"cap 4096", []Option{WithCapacity(4096)}, 4096},
		{"cap 100000", []Option{WithCapacity(100000)}, 1 << 17},
		{"cap 1e6", []Option{WithCapacity(1e6)}, 1 << 20},
		{"last option wins", []Option{WithCapacity(16), WithCapacity(300)}, 512},
		{"max buckets below the default", []Option{WithMaxBuckets(100)}, 64},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tab := New[int](append(c.opts, WithFixedBuckets())...)
			st := tab.Stats()
			require.Equal(t, c.buckets, st.Buckets)
			require.Len(t, st.ChainLengths, 1)
			require.Equal(t, c.buckets, st.ChainLengths[0])
			require.Zero(t, st.Entries)
			require.Zero(t, st.LongestChain)
			require.Zero(t, st.Nodes)
			require.Zero(t, st.InLine)
			require.Zero(t, st.LookupRestarts)
		})
	}
}

// TestOptionPanics: a negative or meaningless option value, or an option
// that the constructor cannot use, panics in the constructor with a message
// that names the option; so does the zero value of each table on first use.
func TestOptionPanics(t *testing.T) {
	cases := []struct {
		name, says string
		f          func()
	}{
		{"negative capacity", "WithCapacity(-5)", func() { New[int](WithCapacity(-5)) }},
		{"negative stripes", "WithLockStripes(-3)", func() { NewTCPTable[int](WithLockStripes(-3)) }},
		{"too many stripes", "WithLockStripes(1073741825)", func() { NewUDPTable[int](WithLockStripes(1<<30 + 1)) }},
		{"stripes for a Table", "New: WithLockStripes does not apply", func() { New[int](WithLockStripes(4)) }},
		{"stripes 0 for a Table", "New: WithLockStripes does not apply", func() { New[int](WithLockStripes(0)) }},
		{"nil Table, Lookup", "hash4: nil *Table: make one with New", func() { (*Table[int])(nil).Lookup(tblTuple("10.0.0.1:1", "10.0.0.2:2")) }},
		{"nil Table, Delete", "nil *Table", func() { (*Table[int])(nil).Delete(tblTuple("10.0.0.1:1", "10.0.0.2:2")) }},
		{"nil Table, Len", "nil *Table", func() { (*Table[int])(nil).Len() }},
		{"nil UDPTable, Lookup", "hash4: nil *UDPTable: make one with NewUDPTable", func() { (*UDPTable[int])(nil).Lookup(tblTuple("10.0.0.1:1", "10.0.0.2:2")) }},
		{"nil TCPTable, Lookup", "hash4: nil *TCPTable: make one with NewTCPTable", func() { (*TCPTable[int])(nil).Lookup(tblTuple("10.0.0.1:1", "10.0.0.2:2")) }},
		{"nil function, Compute", "hash4: Compute(10.0.0.1:1->10.0.0.2:2, nil): nil function", func() { _, _, _ = New[int]().Compute(tblTuple("10.0.0.1:1", "10.0.0.2:2"), nil) }},
		{"nil function, LookupOrCompute", "hash4: LookupOrCompute(10.0.0.1:1->10.0.0.2:2, nil): nil function", func() {
			_, _, _ = New[int]().LookupOrCompute(tblTuple("10.0.0.1:1", "10.0.0.2:2"), nil)
		}},
		{"nil function, DeleteFunc", "hash4: DeleteFunc(nil): nil function", func() { New[int]().DeleteFunc(nil) }},
		{"no such hasher", "WithHasher(99)", func() { New[int](WithHasher(99)) }},
		{"TCP, negative capacity", "WithCapacity(-1)", func() { NewTCPTable[int](WithCapacity(-1)) }},
		{"UDP, no such hasher", "WithHasher(9)", func() { NewUDPTable[int](WithHasher(9)) }},
		{"UDP, negative stripes", "WithLockStripes(-1)", func() { NewUDPTable[int](WithLockStripes(-1)) }},
		{"UDP, a hasher", "NewUDPTable: WithHasher does not apply", func() { NewUDPTable[int](WithHasher(XXH3Hasher)) }},
		{"UDP, fixed buckets", "NewUDPTable: WithFixedBuckets does not apply", func() { NewUDPTable[int](WithFixedBuckets()) }},
		{"UDP, a bound on buckets", "NewUDPTable: WithMaxBuckets does not apply", func() { NewUDPTable[int](WithMaxBuckets(1 << 10)) }},
		{"zero Table, Lookup", "Table used without New", func() { new(Table[int]).Lookup(tblTuple("10.0.0.1:1", "10.0.0.2:2")) }},
		{"zero Table, Insert", "Table used without New", func() { _ = new(Table[int]).Insert(tblTuple("10.0.0.1:1", "10.0.0.2:2"), valPtr(1)) }},
		{"zero Table, Len", "Table used without New", func() { new(Table[int]).Len() }},
		{"zero Table, Grow", "Table used without New", func() { _ = new(Table[int]).Grow(4096) }},
		{"zero Table, All", "Table used without New", func() {
			for range new(Table[int]).All() {
			}
		}},
		{"zero Table, AppendLookups", "Table used without New", func() { new(Table[int]).AppendLookups(nil, []Tuple{{}}) }},
		{"zero UDPTable, Lookup", "UDPTable used without NewUDPTable", func() { new(UDPTable[int]).Lookup(tblTuple("10.0.0.1:1", "10.0.0.2:2")) }},
		{"zero UDPTable, Bind", "UDPTable used without NewUDPTable", func() { _, _ = new(UDPTable[int]).Bind(netip.MustParseAddrPort("10.0.0.1:1"), valPtr(1)) }},
		{"zero TCPTable, Lookup", "TCPTable used without NewTCPTable", func() { new(TCPTable[int]).Lookup(tblTuple("10.0.0.1:1", "10.0.0.2:2")) }},
		{"zero TCPTable, Listen", "TCPTable used without NewTCPTable", func() { _, _ = new(TCPTable[int]).Listen(netip.MustParseAddrPort("10.0.0.1:1"), valPtr(1)) }},
		{"zero TCPTable, Established", "TCPTable used without NewTCPTable", func() { new(TCPTable[int]).Established() }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				r := recover()
				require.NotNil(t, r, "no panic")
				require.Contains(t, fmt.Sprint(r), c.says)
			}()
			c.f()
		})
	}
	// Options that apply are accepted by every constructor.
	require.NotNil(t, NewUDPTable[int](WithCapacity(0), WithLockStripes(0), WithSecret(Secret{})))
	require.NotNil(t, NewTCPTable[int](WithHasher(XXH3Hasher), WithFixedBuckets()))
}

// TestTableModelAcrossOptions runs random Insert, Delete and LookupOrInsert
// against a map model in tables of every shape the options make: bucket
// counts from the smallest up, with keys drawn from sets of half, one and
// three times the bucket count, for four steps per key or 2000 (the table
// settles at three quarters of the set). Eight times in a run it checks the
// buckets' invariants and that Len, Stats, Lookup, AppendLookups and All
// agree with the model.
func TestTableModelAcrossOptions(t *testing.T) {
	seed := uint64(0)
	var ran, grew atomic.Int32 // tables that may grow themselves, and that did
	for _, capacity := range []int{1, 64, 1024, 4096} {
		for _, c := range []struct {
			perBucket float64
			grows     bool
		}{{0.5, false}, {1, false}, {3, false}, {3, true}} {
			perBucket := c.perBucket
			seed++
			name := fmt.Sprintf("cap=%d/keys=%v", capacity, perBucket)
			opts := []Option{WithCapacity(capacity), WithSecret(tblSecret), WithHasher(LinuxHasher)}
			if c.grows {
				name += "/grows"
			} else {
				opts = append(opts, WithFixedBuckets())
			}
			t.Run(name, func(t *testing.T) {
				tab := New[int](opts...)
				st := tab.Stats()
				keys := make([]Tuple, int(perBucket*float64(st.Buckets)))
				index := make(map[Tuple]int, len(keys)) // a key's place in keys
				for i := range keys {
					keys[i] = tblKey(i, i%3 == 0)
					index[keys[i]] = i
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
					v := valPtr(step)
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
					if c.grows {
						require.LessOrEqual(t, int64(tab.Len()), tab.growLimit(tab.cur())+tab.growLimit(tab.cur())/64, "over its limit after the table grew")
					}
					tblCheckBuckets(t, tab, step)
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
						j, ok := index[k]
						require.True(t, ok, "All yielded %v, never inserted", k)
						require.Same(t, model[j], v)
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
				require.NoError(t, tab.Insert(k, valPtr(0)))
			}
			st := tab.Stats()
			require.Equal(t, n, st.Entries)
			return st.LongestChain
		}
		def := tblSameBucket(t, defaultHasher, 11, n, v6)
		require.Equal(t, n, longest(def), "default is defaultHasher")
		require.Equal(t, n, longest(linux, WithHasher(LinuxHasher)))
		require.Less(t, longest(linux, WithHasher(XXH3Hasher)), n)
		require.Equal(t, n, longest(xxh, WithHasher(XXH3Hasher)))
		require.Less(t, longest(xxh, WithHasher(LinuxHasher)), n)
		require.Less(t, longest(xxh), n)
		fold := tblSameBucket(t, FoldHasher, 7, n, v6)
		require.Equal(t, n, longest(fold, WithHasher(FoldHasher)))
		require.Less(t, longest(fold, WithHasher(LinuxHasher)), n)
		require.Less(t, longest(linux, WithHasher(FoldHasher)), n)
	}
	require.Equal(t, XXH3Hasher, New[int](WithFixedBuckets(), WithHasher(XXH3Hasher)).hasher)
}

// TestTableAllocs pins Lookup, steady-state Insert+Delete,
// LookupOrInsert+CompareAndDelete and CompareAndSwap at zero allocations.
func TestTableAllocs(t *testing.T) {
	for _, h := range hashers {
		tab := New[int](WithFixedBuckets(), WithHasher(h), WithCapacity(256))
		k4, k6 := tblKey(1, false), tblKey(1, true)
		miss4, miss6 := tblKey(2, false), tblKey(2, true)
		for i := range 512 { // long chains, so misses walk
			require.NoError(t, tab.Insert(tblKey(100+i, i%2 == 0), valPtr(i)))
		}
		require.NoError(t, tab.Insert(k4, valPtr(4)))
		require.NoError(t, tab.Insert(tblMapped(k6), valPtr(6)))
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
			vals[i] = valPtr(i)
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

// A bucket line, a node and a shard fill one cache line each on every
// target: these fail to compile where they do not, on 386 too (.ci/run vets
// the package for it, and vet type-checks with the target's sizes).
var (
	_ [unsafe.Sizeof(bucket[int]{}) - cacheLineSize]struct{}
	_ [cacheLineSize - unsafe.Sizeof(bucket[int]{})]struct{}
	_ [unsafe.Sizeof(node[int]{}) - cacheLineSize]struct{}
	_ [cacheLineSize - unsafe.Sizeof(node[int]{})]struct{}
	_ [unsafe.Sizeof(shard{}) - cacheLineSize]struct{}
	_ [cacheLineSize - unsafe.Sizeof(shard{})]struct{}
	_ [unsafe.Sizeof(stripe{}) - cacheLineSize]struct{}
	_ [cacheLineSize - unsafe.Sizeof(stripe{})]struct{}
)

// TestTableMemoryLayout pins the sizes of what a table is made of, and
// that the 56 bytes of every bucket line's entry and every node's lie in one
// cache line, in every array size: the heap places an array of 64-byte
// elements on a 64-byte boundary, but for an 8-byte header before arrays
// with pointers of 512 bytes to 32 KiB, which moves the 8 bytes of padding
// at each element's end to the next line.
func TestTableMemoryLayout(t *testing.T) {
	require.Equal(t, uintptr(56), unsafe.Sizeof(entry[int]{}))
	require.Equal(t, uintptr(56), unsafe.Sizeof(entry[[64]byte]{}), "the value is held by pointer")
	require.Equal(t, uintptr(cacheLineSize), unsafe.Sizeof(bucket[[64]byte]{}))
	require.Equal(t, uintptr(4), unsafe.Sizeof(linkField{}))
	inLine := func(p unsafe.Pointer) bool {
		return uintptr(p)%cacheLineSize+unsafe.Sizeof(entry[int]{}) <= cacheLineSize
	}
	for n := minBuckets; n <= 1<<16; n *= 2 {
		a := newBucketArray[int](n, 0, false)
		for i := range a.lines {
			require.True(t, inLine(unsafe.Pointer(&a.lines[i])), "%d buckets: line %d at %p", n, i, &a.lines[i])
		}
	}
	for _, capacity := range []int{32, 1 << 12, 1 << 17} {
		tab := New[int](WithCapacity(capacity))
		for i := range 1000 {
			require.NoError(t, tab.Insert(tblKey(i, false), valPtr(1)))
		}
		carved, _ := tab.nodes.stats()
		for i := uint32(1); i <= uint32(carved); i++ {
			require.True(t, inLine(unsafe.Pointer(tab.nodes.at(i))), "capacity %d: node %d at %p", capacity, i, tab.nodes.at(i))
		}
	}
}

// TestTableMemoryPerEntry measures what a table holds on the heap per entry,
// at as many random flows as it was made for, after inserts and after 8
// rounds of churn that each replace every flow (as many deletes of a random
// live flow and inserts of a new one), and after Compact. A table made for
// n flows of 2^k has n buckets, one flow per bucket: 64 bytes of bucket
// line per flow, and 64-byte nodes for the 37% of flows beyond one per
// bucket, 88 bytes in all. Grown by Grow to the same size, it holds as
// much: growth moves nodes into the new array rather than copying them,
// and the old array goes back to the heap. Grown by itself from the
// default size, it has doubled only past two flows per bucket, and holds
// n/2 buckets and fewer bytes. Smaller tables hold a few more: a chunk of
// nodes, and the shards, are a larger part of them.
func TestTableMemoryPerEntry(t *testing.T) {
	if raceEnabled {
		// It measures the Go heap, which the race detector does not
		// change, over 2 million deletes and inserts that it makes
		// twenty times slower: the runs without it check the bounds.
		t.Skip("the heap's bounds are checked without the race detector")
	}
	heap := func() int64 {
		var ms runtime.MemStats
		runtime.GC()
		runtime.GC() // and what the first cycle's cleanups freed
		runtime.ReadMemStats(&ms)
		return int64(ms.HeapAlloc)
	}
	for _, c := range []struct {
		n         int
		grown     bool    // made for n/2 entries, filled, grown to n
		itself    bool    // made with the default capacity, grown by itself
		limit     float64 // bytes per entry; measured: see the log
		compacted float64 // the same after Compact
	}{
		{1 << 10, false, false, 102, 102}, // 93.8 and 98.9
		{1 << 12, false, false, 97, 97},   // 94.1 and 94.4
		{1 << 16, false, false, 91, 91},   // 88.0 and 88.1
		{1 << 16, true, false, 91, 91},    // 87.9 and 88.4
		{1 << 16, false, true, 79, 79},    // 75.8 and 76.5, at two flows per bucket
	} {
		t.Run(fmt.Sprintf("n=%d/grown=%v/itself=%v", c.n, c.grown, c.itself), func(t *testing.T) {
			// The least of three builds: now and then the runtime
			// allocates a few KB while one runs (5.5 bytes per entry
			// at 2^10).
			filled, churned, compacted := math.Inf(1), math.Inf(1), math.Inf(1)
			for range 3 {
				f, ch, co := memoryPerEntry(t, c.n, c.grown, c.itself, heap)
				filled, churned, compacted = min(filled, f), min(churned, ch), min(compacted, co)
			}
			require.LessOrEqual(t, filled, c.limit, "after inserts")
			require.LessOrEqual(t, churned, c.limit, "after churn")
			require.LessOrEqual(t, compacted, c.compacted, "after Compact")
		})
	}
}

// memoryPerEntry builds a table of n flows as a case of
// TestTableMemoryPerEntry says (grown, itself), churns it and compacts it,
// and returns the heap it holds per entry after each step.
func memoryPerEntry(t *testing.T, n int, grown, itself bool, heap func() int64) (filled, churned, compacted float64) {
	r := rand.New(rand.NewPCG(5, 6))
	flow := func(i int) Tuple {
		return Tuple{
			Local:  netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, 1}), 443),
			Remote: netip.AddrPortFrom(netip.AddrFrom4([4]byte{100, byte(i >> 16), byte(i >> 8), byte(i)}), uint16(1024+r.IntN(60000))),
		}
	}
	live := make([]Tuple, n)
	for i := range live {
		live[i] = flow(i)
	}
	v := valPtr(0)
	before := heap()
	opts := []Option{WithCapacity(n), WithSecret(tblSecret), WithHasher(LinuxHasher)}
	if grown {
		opts[0] = WithCapacity(n / 2)
	}
	if itself {
		opts = opts[1:]
	} else {
		opts = append(opts, WithFixedBuckets())
	}
	tab := New[int](opts...)
	for i, k := range live {
		if grown && i == n/2 {
			require.NoError(t, tab.Grow(n))
		}
		require.NoError(t, tab.Insert(k, v))
	}
	tab.growers.Wait()
	filled = float64(heap()-before) / float64(n)
	next := n
	churnFlows(t, tab, live, r, flow, &next, v, 8*n)
	churned = float64(heap()-before) / float64(n)
	tab.Compact()
	compacted = float64(heap()-before) / float64(n)
	runtime.KeepAlive(live) // allocated before the table: not counted, but not freed either
	st := tab.Stats()
	runtime.KeepAlive(tab)
	t.Logf("%.1f bytes per entry after inserts, %.1f after churn, %.1f after Compact; %d nodes for %d entries in %d buckets, %d in line", filled, churned, compacted, st.Nodes, st.Entries, st.Buckets, st.InLine)
	require.Equal(t, n, st.Entries)
	return filled, churned, compacted
}

// churnFlows deletes a random flow of live from tab and inserts flow(*next)
// with value v in its place, count times, counting *next up.
func churnFlows(t *testing.T, tab *Table[int], live []Tuple, r *rand.Rand, flow func(int) Tuple, next *int, v *int, count int) {
	t.Helper()
	for range count {
		j := r.IntN(len(live))
		_, ok := tab.Delete(live[j])
		require.True(t, ok)
		live[j] = flow(*next)
		*next++
		require.NoError(t, tab.Insert(live[j], v))
	}
}

// TestTableChurnNoLeak fills a table, churns it, and checks that nodes are
// recycled: the nodes the table holds stay within the free caches' slack
// of the most entries its chains held at once.
func TestTableChurnNoLeak(t *testing.T) {
	for _, n := range []int{1 << 14, 1 << 16} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			tab := New[int](WithCapacity(n), WithFixedBuckets())
			v := valPtr(0)
			key := func(i int) Tuple {
				return Tuple{
					Local:  netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, 1}), 443),
					Remote: netip.AddrPortFrom(netip.AddrFrom4([4]byte{100, byte(i >> 16), byte(i >> 8), byte(i)}), 40000),
				}
			}
			// per[b] counts the entries of bucket b; chained those
			// beyond one per bucket, the entries in nodes, and most
			// the most of them at once.
			per := make([]int, len(tab.cur().lines))
			chained, most := 0, 0
			add := func(i, d int) {
				b := HashTuple(key(i), tab.hasher, tab.secret) & tab.cur().mask
				if d > 0 && per[b] > 0 || d < 0 && per[b] > 1 {
					chained += d
				}
				per[b] += d
				most = max(most, chained)
			}
			// Each shard's cache holds at most shardCacheMax free
			// nodes, and takes slabBatch at a time; the last chunk
			// carved may hold nodes not handed out yet.
			bound := func() int {
				return most + len(tab.shards)*(shardCacheMax+slabBatch) + 1<<tab.nodes.shift()
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
			require.Equal(t, n-chained, st.InLine)
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
			require.Equal(t, n-chained, st.InLine, "a non-empty bucket holds an entry in its line")
			require.LessOrEqual(t, st.Nodes, bound(), "nodes leak: %d nodes for %d chained at most", st.Nodes, most)
			tblCheckBuckets(t, tab, "after churn")
			t.Logf("after churn: %d of %d entries in line; %d nodes, %d chained at most", st.InLine, st.Entries, st.Nodes, most)
		})
	}
}

// Guard: the helpers above are only meaningful if errors wrap sentinels.
func TestTableErrorsWrapTuple(t *testing.T) {
	tab := New[int]()
	k := tblTuple("10.0.0.1:1", "10.0.0.2:2")
	require.NoError(t, tab.Insert(k, valPtr(1)))
	err := tab.Insert(k, valPtr(2))
	require.True(t, errors.Is(err, ErrExists))
	require.Contains(t, err.Error(), k.String())
}

// TestTableEdgeInput checks inputs that must neither panic nor match.
func TestTableEdgeInput(t *testing.T) {
	tab := New[int](WithFixedBuckets(), nil, WithCapacity(1), nil)
	st := tab.Stats()
	require.Equal(t, 16, st.Buckets)
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

// cur returns the table's current bucket array.
func (t *Table[T]) cur() *bucketArray[T] { return t.arr.Load() }

// hooksOf returns tab's test hooks, which it makes on first use. Call it
// before tab is shared.
func hooksOf[T any](tab *Table[T]) *testHooks {
	if tab.hooks == nil {
		tab.hooks = new(testHooks)
		tab.nodes.hooks = tab.hooks
	}
	return tab.hooks
}

// tblCheckBuckets checks the buckets' invariants in tab, which no writer
// changes meanwhile: each bucket is unlocked, and holds an entry in its line
// if its chain has any (bucket's rule 1); each entry, in line or in the
// chain, is live and of the bucket's hash; each chain ends on its own
// marker; the entries add up to Len.
func tblCheckBuckets[T any](t require.TestingT, tab *Table[T], msg any) {
	a := tab.cur()
	n := 0
	for b := range a.lines {
		line := &a.lines[b]
		seq := line.seq.Load()
		require.Zero(t, seq&(seqLock|seqMoved), "%v: bucket %d locked or moved", msg, b)
		l := line.next.load()
		if !line.live() {
			require.Equal(t, nullsLink(a.nullsBase+uint32(b)), l, "%v: bucket %d empty in line, not in its chain", msg, b)
			continue
		}
		for e := &line.entry; ; {
			require.True(t, e.live(), "%v: a free entry in bucket %d", msg, b)
			require.Equal(t, uint32(b), uint32(e.key.meta.Load()>>32)&a.mask, "%v: an entry of another bucket in %d", msg, b)
			n++
			if l = e.next.load(); l.isNulls() {
				break
			}
			e = &tab.nodes.at(l.index()).entry
		}
		require.Equal(t, nullsLink(a.nullsBase+uint32(b)), l, "%v: bucket %d ends on another marker", msg, b)
	}
	require.Equal(t, tab.Len(), n, "%v: entries counted and found", msg)
}

// TestKeyValid checks the writers' check of a key, key.valid, against
// validate on tuples of every kind of address and port: they agree.
func TestKeyValid(t *testing.T) {
	addrs := []netip.Addr{{}, netip.IPv4Unspecified(), netip.IPv6Unspecified(),
		netip.MustParseAddr("::ffff:0.0.0.0"), netip.MustParseAddr("::%eth0"),
		netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("::ffff:10.0.0.2"),
		netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("fe80::1%eth0"),
		netip.MustParseAddr("::1"), netip.MustParseAddr("0.0.0.1"), netip.MustParseAddr("255.255.255.255")}
	tab := New[int]()
	n := 0
	for _, la := range addrs {
		for _, ra := range addrs {
			for _, lp := range []uint16{0, 1, 65535} {
				for _, rp := range []uint16{0, 80} {
					tup := Tuple{Local: netip.AddrPortFrom(la, lp), Remote: netip.AddrPortFrom(ra, rp)}
					var k key
					tab.tupleKey(&k, &tup)
					require.Equal(t, validate(tup) == nil, k.valid(), "%v", tup)
					if k.valid() {
						n++
					}
				}
			}
		}
	}
	require.Positive(t, n)
}
