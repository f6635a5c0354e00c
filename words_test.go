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
