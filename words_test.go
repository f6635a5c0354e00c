package hash4

import (
	"math/rand/v2"
	"net/netip"
	"testing"
)

// TestAddrReprKnown fails if setWords no longer reads netip.Addr's memory:
// answers stay right (it falls back to As16), but every operation is slower.
func TestAddrReprKnown(t *testing.T) {
	if !addrReprKnown {
		t.Fatal("netip.Addr no longer holds its 128 bits first, high half first: setWords falls back to As16")
	}
}

// TestSetWords checks setWords, through the memory of netip.Addr, against
// the reference that goes through As16, on addresses of every kind, and
// wordsAddr as its inverse.
func TestSetWords(t *testing.T) {
	r := rand.New(rand.NewPCG(6, 56))
	addrs := []netip.Addr{{}, netip.IPv4Unspecified(), netip.IPv6Unspecified(), netip.IPv6LinkLocalAllNodes()}
	for range 5000 {
		var b [16]byte
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		a6 := netip.AddrFrom16(b)
		a4 := netip.AddrFrom4([4]byte(b[:4]))
		addrs = append(addrs, a6, a4, a6.WithZone("eth0"), netip.AddrFrom16(a4.As16()))
	}
	for _, a := range addrs {
		var got, want [2]uint64
		setWords(&got, a)
		setWordsAs16(&want, a)
		if got != want {
			t.Fatalf("setWords(%v) = %#x, As16 gives %#x", a, got, want)
		}
		if !a.IsValid() {
			continue
		}
		if back := wordsAddr(got); back != a.WithZone("").Unmap() {
			t.Fatalf("wordsAddr(setWords(%v)) = %v", a, back)
		}
	}
}

// TestSetWordsAllocs pins setWords to no allocation.
func TestSetWordsAllocs(t *testing.T) {
	a := netip.MustParseAddr("2001:db8::1%eth0")
	var w [2]uint64
	if n := testing.AllocsPerRun(100, func() { setWords(&w, a) }); n != 0 {
		t.Fatalf("setWords allocates %v times", n)
	}
}

// TestTupleKey checks the key a table makes of a tuple, reading the tuple
// in place and hashing in line, against the reference: the words of As16
// and HashTuple, for both hashers, on tuples of every kind of address and
// port, with the fast path and with the As16 fallback. N.B. it must not
// run in parallel with other tests: it sets addrReprKnown for the fallback.
func TestTupleKey(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 57))
	addr := func(v4 bool) netip.Addr {
		var b [16]byte
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		switch {
		case v4:
			return netip.AddrFrom4([4]byte(b[:4]))
		case r.IntN(4) == 0:
			return netip.AddrFrom16(netip.AddrFrom4([4]byte(b[:4])).As16()) // IPv4-mapped
		case r.IntN(4) == 0:
			return netip.AddrFrom16(b).WithZone("eth0")
		}
		return netip.AddrFrom16(b)
	}
	var tups []Tuple
	for i := range 2000 {
		v4 := i%2 == 0
		tups = append(tups, Tuple{
			Local:  netip.AddrPortFrom(addr(v4), uint16(r.Uint32())),
			Remote: netip.AddrPortFrom(addr(v4), uint16(r.Uint32())),
		})
	}
	for _, fast := range []bool{true, false} {
		saved := addrReprKnown
		addrReprKnown = fast && saved
		for _, h := range []Hasher{LinuxHasher, XXH3Hasher} {
			tab := New[int](WithFixedBuckets(), WithCapacity(16), WithSecret(tblSecret), WithHasher(LinuxHasher), WithHasher(h))
			for _, tup := range tups {
				var got, want key
				tab.tupleKey(&got, &tup)
				setWordsAs16(&want.local, tup.Local.Addr())
				setWordsAs16(&want.remote, tup.Remote.Addr())
				want.meta = uint64(HashTuple(tup, h, tblSecret))<<32 | uint64(tup.Local.Port())<<16 | uint64(tup.Remote.Port())
				if got != want {
					addrReprKnown = saved
					t.Fatalf("fast path %v, %v: key of %v = %#x, want %#x", fast, h, tup, got, want)
				}
			}
		}
		addrReprKnown = saved
	}
}
