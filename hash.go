package hash4

import (
	"crypto/rand"
	"encoding/binary"
	"math/bits"
	"net/netip"
	"strconv"

	"github.com/zeebo/xxh3"
)

// This file holds the hash functions of the Linux socket tables, bit-exact with
// the kernel on a little-endian host, and the hashing of a whole Tuple.
//
// Byte order. The kernel feeds addresses (__be32) and the remote port (__be16)
// to jhash as raw memory words, and the local port in host order. On x86-64
// the raw word of 10.0.0.1 is 0x0100000a and that of port 80 is 0x5000. The
// functions here take natural netip.Addr values and host-order ports and do
// that conversion themselves, so their results equal the kernel's.
//
// Address families. Every function reads an address through its 16-byte form
// (netip.Addr.As16): an IPv4 address is taken as its IPv4-mapped form
// ::ffff:a.b.c.d, the zone is ignored, and the zero Addr reads as ::. The IPv4
// functions hash the last 32 bits of that form, which is the IPv4 address
// itself for an IPv4 or IPv4-mapped address (so ::ffff:10.0.0.1 and 10.0.0.1
// hash alike). For any other IPv6 address they hash only those last 32 bits,
// as the kernel does with the local address in inet6_ehashfn: the result is
// well defined but weak against chosen addresses, so IPv6 peers belong in the
// IPv6 functions. The IPv6 functions hash an IPv4-mapped address unchanged,
// as the kernel does for a dual-stack socket.

// jhashInitval is JHASH_INITVAL, the arbitrary start of every jhash state.
const jhashInitval = 0xdeadbeef

// jhashMix is __jhash_mix from include/linux/jhash.h (Bob Jenkins' lookup3).
func jhashMix(a, b, c uint32) (uint32, uint32, uint32) {
	a -= c
	a ^= bits.RotateLeft32(c, 4)
	c += b
	b -= a
	b ^= bits.RotateLeft32(a, 6)
	a += c
	c -= b
	c ^= bits.RotateLeft32(b, 8)
	b += a
	a -= c
	a ^= bits.RotateLeft32(c, 16)
	c += b
	b -= a
	b ^= bits.RotateLeft32(a, 19)
	a += c
	c -= b
	c ^= bits.RotateLeft32(b, 4)
	b += a
	return a, b, c
}

// jhashFinal is __jhash_final from include/linux/jhash.h; it returns c.
func jhashFinal(a, b, c uint32) uint32 {
	c ^= b
	c -= bits.RotateLeft32(b, 14)
	a ^= c
	a -= bits.RotateLeft32(c, 11)
	b ^= a
	b -= bits.RotateLeft32(a, 25)
	c ^= b
	c -= bits.RotateLeft32(b, 16)
	a ^= c
	a -= bits.RotateLeft32(c, 4)
	b ^= a
	b -= bits.RotateLeft32(a, 14)
	c ^= b
	c -= bits.RotateLeft32(b, 24)
	return c
}

// JHash hashes an arbitrary byte string like the kernel's jhash(key, length,
// initval), reading the key as little-endian 32-bit words.
func JHash(key []byte, initval uint32) uint32 {
	a := jhashInitval + uint32(len(key)) + initval
	b, c := a, a
	if len(key) == 0 {
		return c
	}
	for len(key) > 12 {
		a += binary.LittleEndian.Uint32(key[0:4])
		b += binary.LittleEndian.Uint32(key[4:8])
		c += binary.LittleEndian.Uint32(key[8:12])
		a, b, c = jhashMix(a, b, c)
		key = key[12:]
	}
	// The last 1 to 12 bytes: byte i lands in a, b or c at bit 8*(i%4).
	var tail [12]byte
	copy(tail[:], key)
	a += binary.LittleEndian.Uint32(tail[0:4])
	b += binary.LittleEndian.Uint32(tail[4:8])
	c += binary.LittleEndian.Uint32(tail[8:12])
	return jhashFinal(a, b, c)
}

// JHash2 hashes a slice of 32-bit words like the kernel's jhash2(k, length,
// initval).
func JHash2(k []uint32, initval uint32) uint32 {
	a := jhashInitval + uint32(len(k))<<2 + initval
	b, c := a, a
	if len(k) == 0 {
		return c
	}
	for len(k) > 3 {
		a += k[0]
		b += k[1]
		c += k[2]
		a, b, c = jhashMix(a, b, c)
		k = k[3:]
	}
	switch len(k) {
	case 3:
		c += k[2]
		fallthrough
	case 2:
		b += k[1]
		fallthrough
	case 1:
		a += k[0]
	}
	return jhashFinal(a, b, c)
}

// JHash3Words hashes three words like the kernel's jhash_3words.
func JHash3Words(a, b, c, initval uint32) uint32 {
	v := initval + jhashInitval + 12
	return jhashFinal(a+v, b+v, c+v)
}

// JHash2Words hashes two words like the kernel's jhash_2words.
func JHash2Words(a, b, initval uint32) uint32 {
	v := initval + jhashInitval + 8
	return jhashFinal(a+v, b+v, v)
}

// JHash1Word hashes one word like the kernel's jhash_1word.
func JHash1Word(a, initval uint32) uint32 {
	v := initval + jhashInitval + 4
	return jhashFinal(a+v, v, v)
}

// raw32 returns the kernel's s6_addr32[i] of address words w; raw32(w, 3) is
// the raw word of an IPv4 address.
func raw32(w *[2]uint64, i int) uint32 { return uint32(w[i>>1] >> (32 * (i & 1))) }

// wordsAreIPv4 reports whether w is an IPv4 (IPv4-mapped) address:
// ::ffff:0:0/96, whose s6_addr32[2] reads 0xffff0000 on little-endian.
func wordsAreIPv4(w *[2]uint64) bool {
	return w[0] == 0 && uint32(w[1]) == 0xffff0000
}

// ipv6AddrJhash is the kernel's __ipv6_addr_jhash: jhash2 of the four raw
// words of the address.
// It is JHash2 unrolled for four words, with no slice on the hot path.
func ipv6AddrJhash(w *[2]uint64, initval uint32) uint32 {
	a := jhashInitval + 4<<2 + initval
	b, c := a, a
	a, b, c = jhashMix(a+raw32(w, 0), b+raw32(w, 1), c+raw32(w, 2))
	return jhashFinal(a+raw32(w, 3), b, c)
}

// rawPort returns a host-order port as the kernel's __be16 read as a number.
func rawPort(port uint16) uint32 {
	return uint32(bits.ReverseBytes16(port))
}

// N.B. the hashes below take address words by pointer: Go passes arrays of
// more than one element in memory, and the pointer keeps the words where
// setWords wrote them.

// inetEhashWords is __inet_ehashfn with local port 0 (v4: both addresses
// IPv4) or inet6_ehashfn with local port 0, over address words. N.B. it
// spells out jhash_3words (and, through ipv6AddrJhash, jhash2) so that the
// mix and final steps inline: as calls they cost as much as their math.
func inetEhashWords(lw, rw *[2]uint64, v4 bool, rport uint16, secret, addrSecret uint32) uint32 {
	fw := raw32(rw, 3)
	if !v4 { // ipv6AddrJhash, in line: this is the lookup's hot path
		a := jhashInitval + 4<<2 + addrSecret
		b, c := a, a
		a, b, c = jhashMix(a+raw32(rw, 0), b+raw32(rw, 1), c+raw32(rw, 2))
		fw = jhashFinal(a+raw32(rw, 3), b, c)
	}
	v := secret + jhashInitval + 12 // jhash_3words
	return jhashFinal(raw32(lw, 3)+v, fw+v, rawPort(rport)+v)
}

// udpEhashWords is udp_ehashfn (v4) or udp6_ehashfn over address words: the
// local port stays inside the jhash.
func udpEhashWords(lw, rw *[2]uint64, v4 bool, lport, rport uint16, secret, addrSecret uint32) uint32 {
	ports := uint32(lport)<<16 | rawPort(rport)
	if v4 {
		return JHash3Words(raw32(lw, 3), raw32(rw, 3), ports, secret)
	}
	return JHash3Words(raw32(lw, 3), ipv6AddrJhash(rw, addrSecret), ports, secret)
}

// portaddrHashWords is ipv4_portaddr_hash (v4) or ipv6_portaddr_hash over
// address words: :: hashes as 0.0.0.0, IPv4-mapped as its IPv4 address.
func portaddrHashWords(w *[2]uint64, v4 bool, port uint16, mix uint32) uint32 {
	switch {
	case v4 || wordsAreIPv4(w):
		return JHash1Word(raw32(w, 3), mix) ^ uint32(port)
	case w[0] == 0 && w[1] == 0:
		return JHash1Word(0, mix) ^ uint32(port)
	}
	return ipv6AddrJhash(w, mix) ^ uint32(port)
}

// InetEhashfn returns the established-table hash of an IPv4 flow, as the
// kernel's inet_ehashfn (net/ipv4/inet_hashtables.c, Linux 6.15 and later):
// lport + jhash_3words(laddr, faddr, fport, secret). secret already includes
// net_hash_mix. An IPv6 address enters as the last 32 bits of its 16-byte
// form.
func InetEhashfn(laddr netip.Addr, lport uint16, faddr netip.Addr, fport uint16, secret uint32) uint32 {
	lw, fw := addrWords(laddr), addrWords(faddr)
	return uint32(lport) + inetEhashWords(&lw, &fw, true, fport, secret, 0)
}

// Inet6Ehashfn returns the established-table hash of an IPv6 flow, as the
// kernel's inet6_ehashfn (net/ipv6/inet6_hashtables.c): lport +
// jhash_3words(last word of laddr, jhash2(faddr, 4, addr), fport, secret),
// where addr is addrSecret. Only the last 32 bits of the local address take part; the remote
// address is hashed whole. An IPv4 address is read as its IPv4-mapped form.
func Inet6Ehashfn(laddr netip.Addr, lport uint16, faddr netip.Addr, fport uint16, secret, addrSecret uint32) uint32 {
	lw, fw := addrWords(laddr), addrWords(faddr)
	return uint32(lport) + inetEhashWords(&lw, &fw, false, fport, secret, addrSecret)
}

// UDPEhashfn returns the UDP 4-tuple hash of an IPv4 flow, as the kernel's
// udp_ehashfn (net/ipv4/udp.c). Unlike InetEhashfn it keeps the local port
// inside the jhash, so it has no port identity.
func UDPEhashfn(laddr netip.Addr, lport uint16, faddr netip.Addr, fport uint16, secret uint32) uint32 {
	lw, fw := addrWords(laddr), addrWords(faddr)
	return udpEhashWords(&lw, &fw, true, lport, fport, secret, 0)
}

// UDP6Ehashfn returns the UDP 4-tuple hash of an IPv6 flow, as the kernel's
// udp6_ehashfn (net/ipv6/udp.c), with the local port inside the jhash.
func UDP6Ehashfn(laddr netip.Addr, lport uint16, faddr netip.Addr, fport uint16, secret, addrSecret uint32) uint32 {
	lw, fw := addrWords(laddr), addrWords(faddr)
	return udpEhashWords(&lw, &fw, false, lport, fport, secret, addrSecret)
}

// IPv4PortaddrHash returns the (address, port) hash of the UDP hash2 and TCP
// listener tables, as the kernel's ipv4_portaddr_hash: jhash_1word(addr,
// mix) ^ port. mix is net_hash_mix.
func IPv4PortaddrHash(addr netip.Addr, port uint16, mix uint32) uint32 {
	w := addrWords(addr)
	return portaddrHashWords(&w, true, port, mix)
}

// IPv6PortaddrHash returns the (address, port) hash of the UDP hash2 and TCP
// listener tables for an IPv6 address, as the kernel's ipv6_portaddr_hash:
// :: and IPv4-mapped addresses hash like their IPv4 form (so :: and 0.0.0.0
// hash alike), others as jhash2 of the four words; then ^ port.
func IPv6PortaddrHash(addr netip.Addr, port uint16, mix uint32) uint32 {
	w := addrWords(addr)
	return portaddrHashWords(&w, false, port, mix)
}

// Secret holds the keys of a table's hash functions. Tables draw their own
// with NewSecret unless given one; a fixed Secret makes bucket placement
// reproducible (for tests and benchmarks) and predictable to anyone who knows
// it. The zero Secret is valid but public.
type Secret struct {
	// Ehash is the initval of the outer jhash of the Linux hasher, the
	// kernel's inet_ehash_secret plus net_hash_mix.
	Ehash uint32
	// Ehash6Addr is the initval of the jhash2 over a remote IPv6 address,
	// the kernel's tcp_ipv6_hash_secret.
	Ehash6Addr uint32
	// Seed seeds the XXH3 hasher, and the keys of the fold hasher.
	Seed uint64
}

// NewSecret returns a Secret drawn from crypto/rand.
func NewSecret() Secret {
	var b [16]byte
	rand.Read(b[:]) // never fails since Go 1.24
	return Secret{
		Ehash:      binary.LittleEndian.Uint32(b[0:4]),
		Ehash6Addr: binary.LittleEndian.Uint32(b[4:8]),
		Seed:       binary.LittleEndian.Uint64(b[8:16]),
	}
}

// Hasher chooses how a table hashes tuples. Every hasher hashes the tuple
// with local port 0 and adds the local port, so for any tuple t and port p,
// hash(t with local port p) == hash(t with local port 0) + p, exactly.
type Hasher uint8

const (
	// LinuxHasher hashes like the kernel's established table: InetEhashfn
	// when both addresses are IPv4 or IPv4-mapped, Inet6Ehashfn otherwise.
	// Its buckets are the kernel's for the same secret. It is the default
	// of NewTCPTable.
	LinuxHasher Hasher = iota
	// XXH3Hasher hashes the whole remote address, the remote port and the
	// whole local address with seeded XXH3. Unlike the Linux IPv6 form it
	// reads all 128 bits of the local address.
	XXH3Hasher
	// FoldHasher hashes both whole addresses and the remote port with
	// three folded 64-bit multiplies (the high and low halves of the
	// 128-bit product XORed, as wyhash and foldhash do), keyed by four
	// words drawn from the secret's Seed. It is the fastest of the three,
	// for IPv6 flows most of all, and like them unpredictable to anyone
	// without the secret. It is the default of New.
	FoldHasher
)

// String returns "linux", "xxh3" or "fold".
func (h Hasher) String() string {
	switch h {
	case LinuxHasher:
		return "linux"
	case XXH3Hasher:
		return "xxh3"
	case FoldHasher:
		return "fold"
	}
	return "Hasher(" + strconv.Itoa(int(h)) + ")"
}

// valid reports whether h names a hasher.
func (h Hasher) valid() bool { return h <= FoldHasher }

// HashTuple returns the hash a table with hasher h and secret s gives the
// tuple: the hash of t with local port 0, plus the local port.
func HashTuple(t Tuple, h Hasher, s Secret) uint32 {
	lw, rw := addrWords(t.Local.Addr()), addrWords(t.Remote.Addr())
	return hashPort0(h, &s, &lw, &rw, t.Remote.Port()) + uint32(t.Local.Port())
}

// hashPort0 returns the hash of the flow (local:0, remote:rport), addresses
// given by addrWords. The caller adds the local port: hashes of consecutive
// ports are consecutive, so connect() computes this once and walks candidate
// ports with one addition. For the Linux hasher it equals InetEhashfn or
// Inet6Ehashfn with local port 0, reading the same raw words.
func hashPort0(h Hasher, s *Secret, local, remote *[2]uint64, rport uint16) uint32 {
	switch h {
	case XXH3Hasher:
		return xxh3Port0(s, local, remote, rport)
	case FoldHasher:
		k := foldKeys(s.Seed)
		return foldPort0(&k, local, remote, rport)
	}
	return inetEhashWords(local, remote, wordsAreIPv4(local) && wordsAreIPv4(remote), rport, s.Ehash, s.Ehash6Addr)
}

// tableHash is hashPort0 with the fold hasher's keys given, for tables,
// which draw them once. N.B. the fold hasher is written out here, where it
// costs no call of its own: as calls, the steps from a table's tuple to its
// hash cost a lookup of a cached key as much as the hash itself.
func tableHash(h Hasher, s *Secret, fk *[4]uint64, local, remote *[2]uint64, rport uint16) uint32 {
	switch h {
	case FoldHasher:
		x := foldMul(local[0]^fk[0], local[1]^fk[1])
		y := foldMul(remote[0]^fk[2], remote[1]^fk[3])
		f := foldMul(x^uint64(rport)^fk[1], y^fk[0])
		return uint32(f) ^ uint32(f>>32)
	case XXH3Hasher:
		return xxh3Port0(s, local, remote, rport)
	}
	return inetEhashWords(local, remote, wordsAreIPv4(local) && wordsAreIPv4(remote), rport, s.Ehash, s.Ehash6Addr)
}

// xxh3Port0 is hashPort0 for the XXH3 hasher: seeded XXH3 of the remote
// address, the remote port and the local address.
func xxh3Port0(s *Secret, local, remote *[2]uint64, rport uint16) uint32 {
	var buf [34]byte
	binary.LittleEndian.PutUint64(buf[0:], remote[0])
	binary.LittleEndian.PutUint64(buf[8:], remote[1])
	binary.BigEndian.PutUint16(buf[16:], rport)
	binary.LittleEndian.PutUint64(buf[18:], local[0])
	binary.LittleEndian.PutUint64(buf[26:], local[1])
	x := xxh3.HashSeed(buf[:], s.Seed)
	return uint32(x) ^ uint32(x>>32)
}

// foldKeys returns the four keys of the fold hasher drawn from seed, by
// splitmix64, so that keys of nearby seeds share no bits.
func foldKeys(seed uint64) (k [4]uint64) {
	for i := range k {
		seed += 0x9e3779b97f4a7c15
		z := seed
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		k[i] = z ^ z>>31
	}
	return k
}

// foldMul returns the 128-bit product of a and b folded to 64 bits: high
// half XOR low half.
func foldMul(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

// foldPort0 is hashPort0 for the fold hasher. N.B. each address is mixed
// whole with keys of its own before the remote port joins, in the last
// multiply: a port XORed into an address word would let two tuples whose
// address and port differ by the same bits collide whatever the keys.
func foldPort0(k *[4]uint64, local, remote *[2]uint64, rport uint16) uint32 {
	return tableHash(FoldHasher, nil, k, local, remote, rport)
}

// isIPv4 reports whether addr is an IPv4 or IPv4-mapped IPv6 address.
func isIPv4(addr netip.Addr) bool {
	return addr.Is4() || addr.Is4In6()
}
