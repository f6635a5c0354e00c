package hash4

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"math"
	"math/rand/v2"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// parseHex32 parses a u32 written in hex, as in the vector file.
func parseHex32(t *testing.T, s string) uint32 {
	t.Helper()
	v, err := strconv.ParseUint(s, 16, 32)
	require.NoError(t, err, s)
	return uint32(v)
}

func parsePort(t *testing.T, s string) uint16 {
	t.Helper()
	v, err := strconv.ParseUint(s, 10, 16)
	require.NoError(t, err, s)
	return uint16(v)
}

// TestLinuxVectors checks every line of testdata/linux-hash-vectors.txt, values
// computed by the kernel's own functions on x86-64.
func TestLinuxVectors(t *testing.T) {
	f, err := os.Open("testdata/linux-hash-vectors.txt")
	require.NoError(t, err)
	defer f.Close()

	counts := map[string]int{}
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		lhs, rhs, ok := strings.Cut(text, " = ")
		require.True(t, ok, "line %d: no ' = ': %q", line, text)
		want := parseHex32(t, rhs)
		f := strings.Fields(lhs)
		addr := func(i int) netip.Addr {
			a, err := netip.ParseAddr(f[i])
			require.NoError(t, err, "line %d", line)
			return a
		}
		var got uint32
		switch f[0] {
		case "jhash3words":
			require.Len(t, f, 5, "line %d", line)
			got = JHash3Words(parseHex32(t, f[1]), parseHex32(t, f[2]), parseHex32(t, f[3]), parseHex32(t, f[4]))
		case "jhash2":
			require.Len(t, f, 3, "line %d", line)
			var words []uint32
			for _, w := range strings.Split(f[1], ",") {
				words = append(words, parseHex32(t, w))
			}
			got = JHash2(words, parseHex32(t, f[2]))
		case "jhash":
			require.Len(t, f, 3, "line %d", line)
			var key []byte
			if f[1] != "-" {
				key, err = hex.DecodeString(f[1])
				require.NoError(t, err, "line %d", line)
			}
			got = JHash(key, parseHex32(t, f[2]))
		case "inet_ehashfn":
			require.Len(t, f, 6, "line %d", line)
			got = InetEhashfn(addr(1), parsePort(t, f[2]), addr(3), parsePort(t, f[4]), parseHex32(t, f[5]))
		case "udp_ehashfn":
			require.Len(t, f, 6, "line %d", line)
			got = UDPEhashfn(addr(1), parsePort(t, f[2]), addr(3), parsePort(t, f[4]), parseHex32(t, f[5]))
		case "inet6_ehashfn":
			require.Len(t, f, 7, "line %d", line)
			got = Inet6Ehashfn(addr(1), parsePort(t, f[2]), addr(3), parsePort(t, f[4]), parseHex32(t, f[5]), parseHex32(t, f[6]))
		case "udp6_ehashfn":
			require.Len(t, f, 7, "line %d", line)
			got = UDP6Ehashfn(addr(1), parsePort(t, f[2]), addr(3), parsePort(t, f[4]), parseHex32(t, f[5]), parseHex32(t, f[6]))
		case "ipv4_portaddr_hash":
			require.Len(t, f, 4, "line %d", line)
			got = IPv4PortaddrHash(addr(1), parsePort(t, f[2]), parseHex32(t, f[3]))
		case "ipv6_portaddr_hash":
			require.Len(t, f, 4, "line %d", line)
			got = IPv6PortaddrHash(addr(1), parsePort(t, f[2]), parseHex32(t, f[3]))
		default:
			t.Fatalf("line %d: unknown function %q", line, f[0])
		}
		require.Equalf(t, want, got, "line %d: %s", line, text)
		counts[f[0]]++
	}
	require.NoError(t, sc.Err())
	// The file holds about 60 vectors of each of the nine functions; a
	// truncated copy must not pass quietly.
	require.Len(t, counts, 9)
	for name, n := range counts {
		require.GreaterOrEqual(t, n, 60, name)
	}
}

// TestSmallWordHashes pins jhash_2words and jhash_1word, which the vector file
// reaches only through the port+address hashes, to their definitions.
func TestSmallWordHashes(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 1000 {
		a, b, iv := r.Uint32(), r.Uint32(), r.Uint32()
		v := iv + jhashInitval + 8
		require.Equal(t, jhashFinal(a+v, b+v, v), JHash2Words(a, b, iv))
		// jhash_1word(a) is jhash2 of one word: both start at
		// 0xdeadbeef + 4 + iv and add a to the first word.
		require.Equal(t, JHash2([]uint32{a}, iv), JHash1Word(a, iv))
		// jhash2 of two words and jhash_2words agree likewise.
		require.Equal(t, JHash2([]uint32{a, b}, iv), JHash2Words(a, b, iv))
		// jhash of 12 little-endian bytes is jhash_3words on the same state.
		var key [12]byte
		binary.LittleEndian.PutUint32(key[0:], a)
		binary.LittleEndian.PutUint32(key[4:], b)
		binary.LittleEndian.PutUint32(key[8:], iv)
		require.Equal(t, JHash3Words(a, b, iv, iv), JHash(key[:], iv))
	}
}

// TestAddressFamilies pins the documented treatment of addresses of the
// other family.
func TestAddressFamilies(t *testing.T) {
	v4 := netip.MustParseAddr("10.0.0.1")
	mapped := netip.MustParseAddr("::ffff:10.0.0.1")
	peer4 := netip.MustParseAddr("192.0.2.7")
	peerMapped := netip.MustParseAddr("::ffff:192.0.2.7")
	const secret, addrSecret = 0x12345678, 0x9abcdef0

	// IPv4-mapped is IPv4 for the IPv4 functions.
	require.Equal(t, InetEhashfn(v4, 1, peer4, 2, secret), InetEhashfn(mapped, 1, peerMapped, 2, secret))
	require.Equal(t, UDPEhashfn(v4, 1, peer4, 2, secret), UDPEhashfn(mapped, 1, peerMapped, 2, secret))
	require.Equal(t, IPv4PortaddrHash(v4, 9, secret), IPv4PortaddrHash(mapped, 9, secret))
	// An IPv4 address is its mapped form for the IPv6 functions.
	require.Equal(t, Inet6Ehashfn(mapped, 1, peerMapped, 2, secret, addrSecret), Inet6Ehashfn(v4, 1, peer4, 2, secret, addrSecret))
	require.Equal(t, UDP6Ehashfn(mapped, 1, peerMapped, 2, secret, addrSecret), UDP6Ehashfn(v4, 1, peer4, 2, secret, addrSecret))
	require.Equal(t, IPv4PortaddrHash(v4, 9, secret), IPv6PortaddrHash(v4, 9, secret))
	require.Equal(t, IPv6PortaddrHash(mapped, 9, secret), IPv6PortaddrHash(v4, 9, secret))
	// :: and 0.0.0.0 hash alike, and so does the zero Addr.
	require.Equal(t, IPv4PortaddrHash(netip.IPv4Unspecified(), 9, secret), IPv6PortaddrHash(netip.IPv6Unspecified(), 9, secret))
	require.Equal(t, IPv6PortaddrHash(netip.IPv6Unspecified(), 9, secret), IPv6PortaddrHash(netip.Addr{}, 9, secret))
	// IPv6 addresses in the IPv4 functions: the last 32 bits, like the local
	// address in inet6_ehashfn.
	v6 := netip.MustParseAddr("2001:db8::a00:1") // last word 10.0.0.1
	require.Equal(t, InetEhashfn(v4, 1, peer4, 2, secret), InetEhashfn(v6, 1, peer4, 2, secret))
	// Zones are not hashed.
	ll := netip.MustParseAddr("fe80::1")
	require.Equal(t, Inet6Ehashfn(ll, 1, ll, 2, secret, addrSecret), Inet6Ehashfn(ll.WithZone("eth0"), 1, ll.WithZone("eth1"), 2, secret, addrSecret))
}

// randomTuple returns a random tuple of the given family (true: IPv4).
func randomTuple(r *rand.Rand, v4 bool) Tuple {
	var l, rem netip.Addr
	if v4 {
		l = netip.AddrFrom4([4]byte(binary.LittleEndian.AppendUint32(nil, r.Uint32())))
		rem = netip.AddrFrom4([4]byte(binary.LittleEndian.AppendUint32(nil, r.Uint32())))
	} else {
		var a, b [16]byte
		binary.LittleEndian.PutUint64(a[0:], r.Uint64())
		binary.LittleEndian.PutUint64(a[8:], r.Uint64())
		binary.LittleEndian.PutUint64(b[0:], r.Uint64())
		binary.LittleEndian.PutUint64(b[8:], r.Uint64())
		a[0], b[0] = 0x20, 0x20 // keep clear of ::ffff:0:0/96
		l, rem = netip.AddrFrom16(a), netip.AddrFrom16(b)
	}
	return Tuple{
		Local:  netip.AddrPortFrom(l, uint16(r.Uint32())),
		Remote: netip.AddrPortFrom(rem, uint16(r.Uint32())),
	}
}

func withLocalPort(t Tuple, p uint16) Tuple {
	t.Local = netip.AddrPortFrom(t.Local.Addr(), p)
	return t
}

var hashers = []Hasher{LinuxHasher, XXH3Hasher, FoldHasher}

// TestPortIdentity checks hash(t with port p) == hash(t with port 0) + p for
// every local port, both families and both hashers.
func TestPortIdentity(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, h := range hashers {
		for _, v4 := range []bool{true, false} {
			for range 8 {
				s := Secret{Ehash: r.Uint32(), Ehash6Addr: r.Uint32(), Seed: r.Uint64()}
				tup := randomTuple(r, v4)
				base := HashTuple(withLocalPort(tup, 0), h, s)
				for p := range 1 << 16 {
					got := HashTuple(withLocalPort(tup, uint16(p)), h, s)
					if got != base+uint32(p) {
						t.Fatalf("%v %v port %d: hash %#x, want %#x", h, tup, p, got, base+uint32(p))
					}
				}
			}
		}
	}
}

// TestTupleHashLinuxForm checks that the Linux hasher is the kernel's function
// for each family, and that a v4-mapped tuple hashes like its IPv4 form.
func TestTupleHashLinuxForm(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for range 1000 {
		s := Secret{Ehash: r.Uint32(), Ehash6Addr: r.Uint32(), Seed: r.Uint64()}
		t4 := randomTuple(r, true)
		require.Equal(t,
			InetEhashfn(t4.Local.Addr(), t4.Local.Port(), t4.Remote.Addr(), t4.Remote.Port(), s.Ehash),
			HashTuple(t4, LinuxHasher, s))
		mapped := Tuple{
			Local:  netip.AddrPortFrom(netip.AddrFrom16(t4.Local.Addr().As16()), t4.Local.Port()),
			Remote: netip.AddrPortFrom(netip.AddrFrom16(t4.Remote.Addr().As16()), t4.Remote.Port()),
		}
		for _, h := range hashers {
			require.Equal(t, HashTuple(t4, h, s), HashTuple(mapped, h, s), "%v", h)
		}
		t6 := randomTuple(r, false)
		require.Equal(t,
			Inet6Ehashfn(t6.Local.Addr(), t6.Local.Port(), t6.Remote.Addr(), t6.Remote.Port(), s.Ehash, s.Ehash6Addr),
			HashTuple(t6, LinuxHasher, s))
	}
	// The XXH3 hasher reads the whole local address; the Linux IPv6 form
	// only its last word.
	s := NewSecret()
	a := Tuple{Local: netip.MustParseAddrPort("[2001:db8::1]:1"), Remote: netip.MustParseAddrPort("[2001:db8::2]:2")}
	b := Tuple{Local: netip.MustParseAddrPort("[2001:db9::1]:1"), Remote: a.Remote}
	require.Equal(t, HashTuple(a, LinuxHasher, s), HashTuple(b, LinuxHasher, s))
	require.NotEqual(t, HashTuple(a, XXH3Hasher, s), HashTuple(b, XXH3Hasher, s))
}

// chiSquare returns the chi-square statistic of counts against a uniform
// distribution, and the bounds that a uniform hash stays within with
// overwhelming probability (six standard deviations of the statistic,
// which is close to normal with mean df and variance 2 df at this size).
func chiSquare(counts []int, n int) (stat, lo, hi float64) {
	want := float64(n) / float64(len(counts))
	for _, c := range counts {
		d := float64(c) - want
		stat += d * d / want
	}
	df := float64(len(counts) - 1)
	sd := math.Sqrt(2 * df)
	return stat, df - 6*sd, df + 6*sd
}

func TestBucketDistribution(t *testing.T) {
	const buckets = 1 << 16
	for _, h := range hashers {
		for _, v4 := range []bool{true, false} {
			name := h.String() + map[bool]string{true: "/ipv4", false: "/ipv6"}[v4]
			t.Run(name+"/random-remote", func(t *testing.T) {
				r := rand.New(rand.NewPCG(7, 8))
				s := Secret{Ehash: r.Uint32(), Ehash6Addr: r.Uint32(), Seed: r.Uint64()}
				local := randomTuple(r, v4).Local
				counts := make([]int, buckets)
				const n = 16 * buckets
				for range n {
					tup := randomTuple(r, v4)
					tup.Local = local // a server: one local address and port
					counts[HashTuple(tup, h, s)&(buckets-1)]++
				}
				stat, lo, hi := chiSquare(counts, n)
				require.Greater(t, stat, lo)
				require.Less(t, stat, hi)
			})
			t.Run(name+"/sequential-local-ports", func(t *testing.T) {
				r := rand.New(rand.NewPCG(9, 10))
				s := Secret{Ehash: r.Uint32(), Ehash6Addr: r.Uint32(), Seed: r.Uint64()}
				counts := make([]int, buckets)
				n := 0
				// A client: one local address, 16 destinations, every
				// port from 1024 up to each.
				base := randomTuple(r, v4)
				for range 16 {
					dst := randomTuple(r, v4).Remote
					for p := 1024; p < 1<<16; p++ {
						tup := Tuple{Local: netip.AddrPortFrom(base.Local.Addr(), uint16(p)), Remote: dst}
						counts[HashTuple(tup, h, s)&(buckets-1)]++
						n++
					}
				}
				// Consecutive ports fill consecutive buckets, so the
				// counts are flatter than random: only the upper bound
				// of a uniform hash applies.
				stat, _, hi := chiSquare(counts, n)
				require.Less(t, stat, hi)
			})
		}
	}
}

func TestHashTupleAllocs(t *testing.T) {
	s := NewSecret()
	r := rand.New(rand.NewPCG(11, 12))
	t4, t6 := randomTuple(r, true), randomTuple(r, false)
	for _, h := range hashers {
		var sink uint32
		allocs := testing.AllocsPerRun(1000, func() {
			sink += HashTuple(t4, h, s) + HashTuple(t6, h, s)
		})
		require.Zero(t, allocs, "%v", h)
		_ = sink
	}
}

func TestHasherString(t *testing.T) {
	require.Equal(t, "linux", LinuxHasher.String())
	require.Equal(t, "xxh3", XXH3Hasher.String())
	require.Equal(t, "fold", FoldHasher.String())
	require.Equal(t, "Hasher(7)", Hasher(7).String())
}

// FuzzTupleHash checks determinism, the port identity and the IPv4-mapped
// equivalence on any input.
func FuzzTupleHash(f *testing.F) {
	f.Add([]byte("0123456789abcdef0123456789abcdef"), uint16(80), uint16(12345), uint64(0x1234), true)
	f.Add(make([]byte, 32), uint16(0), uint16(65535), uint64(0), false)
	f.Fuzz(func(t *testing.T, addrs []byte, rport, lport uint16, key uint64, v4 bool) {
		var a, b [16]byte
		copy(a[:], addrs)
		if len(addrs) > 16 {
			copy(b[:], addrs[16:])
		}
		la, ra := netip.AddrFrom16(a), netip.AddrFrom16(b)
		if v4 {
			la, ra = netip.AddrFrom4([4]byte(a[:4])), netip.AddrFrom4([4]byte(b[:4]))
		}
		s := Secret{Ehash: uint32(key), Ehash6Addr: uint32(key >> 32), Seed: key * 0x9e3779b97f4a7c15}
		tup := Tuple{Local: netip.AddrPortFrom(la, lport), Remote: netip.AddrPortFrom(ra, rport)}
		for _, h := range hashers {
			got := HashTuple(tup, h, s)
			if again := HashTuple(tup, h, s); again != got {
				t.Fatalf("%v: not deterministic: %#x then %#x", h, got, again)
			}
			if base := HashTuple(withLocalPort(tup, 0), h, s); got != base+uint32(lport) {
				t.Fatalf("%v: identity broken: hash %#x, port-0 hash %#x, port %d", h, got, base, lport)
			}
			if v4 {
				mapped := Tuple{
					Local:  netip.AddrPortFrom(netip.AddrFrom16(la.As16()), lport),
					Remote: netip.AddrPortFrom(netip.AddrFrom16(ra.As16()), rport),
				}
				if m := HashTuple(mapped, h, s); m != got {
					t.Fatalf("%v: IPv4-mapped form hashes to %#x, IPv4 form to %#x", h, m, got)
				}
			}
		}
	})
}

// FuzzHashForms checks each hash of hash.go against its kernel definition
// written with the general jhash functions over the raw words of the
// addresses (s6_addr32, read from the 16-byte form as little-endian words,
// as on x86): the byte and word forms of jhash agree on any whole words,
// the fixed-size forms equal jhash2, and the socket hashes, whose fast
// paths read netip.Addr's memory and spell the jhash steps out, equal
// their definitions. The vectors of TestLinuxVectors pin these definitions
// to the kernel.
func FuzzHashForms(f *testing.F) {
	f.Add([]byte("0123456789abcdef0123456789abcdef"), uint16(80), uint16(12345), uint64(0x1234))
	f.Add(make([]byte, 40), uint16(0), uint16(65535), uint64(0))
	f.Fuzz(func(t *testing.T, data []byte, lport, fport uint16, key uint64) {
		iv, iv2 := uint32(key), uint32(key>>32)
		words := make([]uint32, len(data)/4)
		for i := range words {
			words[i] = binary.LittleEndian.Uint32(data[4*i:])
		}
		if got, want := JHash(data[:4*len(words)], iv), JHash2(words, iv); got != want {
			t.Fatalf("jhash of %d whole words %#x, jhash2 %#x", len(words), got, want)
		}
		var w [3]uint32
		copy(w[:], words)
		a, b, c := w[0], w[1], w[2]
		if got, want := JHash3Words(a, b, c, iv), JHash2(w[:3], iv); got != want {
			t.Fatalf("jhash_3words %#x, jhash2 %#x", got, want)
		}
		if got, want := JHash2Words(a, b, iv), JHash2(w[:2], iv); got != want {
			t.Fatalf("jhash_2words %#x, jhash2 %#x", got, want)
		}
		if got, want := JHash1Word(a, iv), JHash2(w[:1], iv); got != want {
			t.Fatalf("jhash_1word %#x, jhash2 %#x", got, want)
		}

		var lb, fb [16]byte
		copy(lb[:], data)
		if len(data) > 16 {
			copy(fb[:], data[16:])
		}
		raw := func(b [16]byte) [4]uint32 {
			var r [4]uint32
			for i := range r {
				r[i] = binary.LittleEndian.Uint32(b[4*i:])
			}
			return r
		}
		ports := uint32(lport)<<16 | uint32(fport>>8|fport<<8) // fport as the kernel's __be16
		// IPv6, and IPv4 read through its IPv4-mapped form.
		l6, f6 := netip.AddrFrom16(lb), netip.AddrFrom16(fb)
		lr, fr := raw(lb), raw(fb)
		fhash := JHash2(fr[:], iv2)
		if got, want := Inet6Ehashfn(l6, lport, f6, fport, iv, iv2), uint32(lport)+JHash3Words(lr[3], fhash, ports&0xffff, iv); got != want {
			t.Fatalf("inet6_ehashfn(%v, %v) %#x, want %#x", l6, f6, got, want)
		}
		if got, want := UDP6Ehashfn(l6, lport, f6, fport, iv, iv2), JHash3Words(lr[3], fhash, ports, iv); got != want {
			t.Fatalf("udp6_ehashfn(%v, %v) %#x, want %#x", l6, f6, got, want)
		}
		want6 := JHash2(lr[:], iv) ^ uint32(lport)
		if u := l6.Unmap(); u.Is4() || u.IsUnspecified() {
			want6 = JHash1Word(raw(u.As16())[3], iv) ^ uint32(lport) // hashed as IPv4; :: as 0.0.0.0
		}
		if got := IPv6PortaddrHash(l6, lport, iv); got != want6 {
			t.Fatalf("ipv6_portaddr_hash(%v) %#x, want %#x", l6, got, want6)
		}
		l4, f4 := netip.AddrFrom4([4]byte(lb[:4])), netip.AddrFrom4([4]byte(fb[:4]))
		l4r, f4r := binary.LittleEndian.Uint32(lb[:4]), binary.LittleEndian.Uint32(fb[:4])
		if got, want := InetEhashfn(l4, lport, f4, fport, iv), uint32(lport)+JHash3Words(l4r, f4r, ports&0xffff, iv); got != want {
			t.Fatalf("inet_ehashfn(%v, %v) %#x, want %#x", l4, f4, got, want)
		}
		if got, want := UDPEhashfn(l4, lport, f4, fport, iv), JHash3Words(l4r, f4r, ports, iv); got != want {
			t.Fatalf("udp_ehashfn(%v, %v) %#x, want %#x", l4, f4, got, want)
		}
		if got, want := IPv4PortaddrHash(l4, lport, iv), JHash1Word(l4r, iv)^uint32(lport); got != want {
			t.Fatalf("ipv4_portaddr_hash(%v) %#x, want %#x", l4, got, want)
		}
	})
}
