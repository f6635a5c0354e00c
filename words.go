package hash4

import (
	"encoding/binary"
	"math/bits"
	"net/netip"
	"unsafe"
)

// This file holds the form in which tables store, compare and hash
// addresses: the 16 bytes of netip.Addr.As16 (IPv4 as IPv4-mapped, zone
// dropped) read as two little-endian words, so that an address is
// converted once per operation. The kernel's raw word s6_addr32[i] is
// raw32(&w, i).
//
// It reads a netip.Addr's bits, and a netip.AddrPort's address in place,
// through unsafe.Pointer (setWords, setWordsReprAt): As16's returned copy
// stalls on store-to-load forwarding, twice in every table operation.
// Nothing else in the package reads through unsafe.Pointer.

// addrReprKnown reports whether a netip.Addr starts with its 128 bits as
// two uint64s, the high half first, as it has since Go 1.18, and a
// netip.AddrPort with its Addr: checked once, against As16, on addresses of
// every kind. If a Go release changes that, setWords and Table.tupleKey
// fall back to As16 (and a test fails, to tell).
var addrReprKnown = checkAddrRepr()

// checkAddrRepr reports whether the words setWords reads from a netip.Addr's
// memory, and setWordsReprAt from a netip.AddrPort's, are those of As16, for an
// address of every kind.
func checkAddrRepr() bool {
	var a netip.Addr
	// N.B. the words are read with plain loads, which need uint64's
	// alignment only: 8 bytes on 64-bit targets, 4 on 386 and arm.
	if unsafe.Sizeof(a) < 16 || unsafe.Alignof(a) < unsafe.Alignof(uint64(0)) {
		return false
	}
	var fast, ref [2]uint64
	setWordsRepr(&fast, a) // the zero Addr
	setWordsAs16(&ref, a)
	if fast != ref {
		return false
	}
	for _, s := range []string{
		"192.0.2.1", "0.0.0.0", "255.255.255.255", "::ffff:198.51.100.7",
		"::", "::1", "2001:db8:102:304:506:708:90a:b0c", "fe80::1%eth0",
		"ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe", "8000::1",
	} {
		a := netip.MustParseAddr(s)
		setWordsRepr(&fast, a)
		setWordsAs16(&ref, a)
		if fast != ref {
			return false
		}
		ap := netip.AddrPortFrom(a, 0xfedc)
		setWordsReprAt(&fast, &ap)
		if fast != ref {
			return false
		}
	}
	return true
}

// addrWords returns the words of a.
func addrWords(a netip.Addr) (w [2]uint64) {
	setWords(&w, a)
	return w
}

// setWords sets *w to the words of a. N.B. hot paths fill words in place
// through this rather than copying a returned array: a 16-byte copy of words
// just written in 8-byte stores defeats store-to-load forwarding.
func setWords(w *[2]uint64, a netip.Addr) {
	if addrReprKnown {
		setWordsRepr(w, a)
		return
	}
	setWordsAs16(w, a)
}

// setWordsRepr is setWords reading a's bits from its memory: big-endian
// bytes read as little-endian words are the byte-swapped halves.
func setWordsRepr(w *[2]uint64, a netip.Addr) {
	u := (*[2]uint64)(unsafe.Pointer(&a))
	w[0], w[1] = bits.ReverseBytes64(u[0]), bits.ReverseBytes64(u[1])
}

// setWordsReprAt sets *w to the words of ap's address, read where *ap
// holds it: ap's memory starts with its Addr. N.B. table operations read
// their tuple's addresses through this (Table.tupleKey), to spare a copy
// of the tuple.
func setWordsReprAt(w *[2]uint64, ap *netip.AddrPort) {
	u := (*[2]uint64)(unsafe.Pointer(ap))
	w[0], w[1] = bits.ReverseBytes64(u[0]), bits.ReverseBytes64(u[1])
}

// setWordsAs16 is setWords through netip's API: the reference for
// setWordsRepr, and the fallback if the check of netip.Addr's memory fails.
func setWordsAs16(w *[2]uint64, a netip.Addr) {
	if a.Is4() {
		b := a.As4()
		w[0], w[1] = 0, 0xffff0000|uint64(binary.LittleEndian.Uint32(b[:]))<<32
		return
	}
	b := a.As16()
	w[0], w[1] = binary.LittleEndian.Uint64(b[:8]), binary.LittleEndian.Uint64(b[8:])
}

// wordsAddr is the inverse of addrWords, with IPv4-mapped addresses
// returned in their IPv4 form.
func wordsAddr(w [2]uint64) netip.Addr {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], w[0])
	binary.LittleEndian.PutUint64(b[8:], w[1])
	return netip.AddrFrom16(b).Unmap()
}
