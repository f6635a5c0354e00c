package hash4

// Benchmarks of the socket demultiplexers (udp.go, tcp.go). Each compares
// variants side by side in one function; compare them with
//
//	go test -run '^$' -bench 'UDP|TCP' -count=6 . > demux.txt
//	benchstat -col /hash4 -filter '.name:UDPLookup' demux.txt
//	benchstat -col /impl -filter '.name:TCPEstablished' demux.txt
//
// Targets (the UDP hash4 series measured 6.5x more packets per second with
// 500 connected sockets on one port):
//
//   - BenchmarkUDPLookup/connected: hash4=on at least 20x faster than
//     hash4=off, which scores the 501 sockets of the slot;
//   - BenchmarkUDPLookup/unconnected-*: hash4=on at most 5% slower than
//     hash4=off (the only extra work is reading the slot's hash4 count);
//   - BenchmarkTCPEstablished: impl=tcp within 10% of impl=table;
//   - BenchmarkTCPListener: listener lookups among 1K listeners;
//   - BenchmarkUDPBind: what filling a port with connected sockets costs;
//   - BenchmarkUDPRebind: what replacing one of them costs.

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
)

// demuxBenchSecret fixes bucket placement so that runs are comparable.
var demuxBenchSecret = Secret{Ehash: 0x6a09e667, Ehash6Addr: 0xbb67ae85, Seed: 0x3c6ef372a54ff53a}

// benchPeer returns the i-th of 64K distinct IPv4 peers.
func benchPeer(i int) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}), uint16(10000+i%1000))
}

// bindConnected binds a socket with port reuse on local and connects it to
// benchPeer(i).
func bindConnected(b *testing.B, tbl *UDPTable[int], local netip.AddrPort, v *int, i int) *UDPSocket[int] {
	s, err := tbl.Bind(local, v, WithReusePort())
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Connect(benchPeer(i)); err != nil {
		b.Fatal(err)
	}
	return s
}

// BenchmarkUDPLookup looks up packets in a table holding, on 10.0.0.1:5000,
// 500 sockets connected to distinct peers and one unconnected socket (all
// with port reuse), plus one unconnected socket on 10.0.0.1:6000, one on
// 0.0.0.0:7000, and reuseport groups of 64 unconnected sockets, as a
// server with a socket per thread has, on 10.0.0.2:5353 and on
// 10.0.0.3:5353, whose hash2 slot also holds a connected socket bound to
// another address:
//
//   - connected: packets of the 500 connected flows;
//   - unconnected-exact: packets to 10.0.0.1:6000, a port with no connected
//     socket, from many peers;
//   - unconnected-wildcard: packets to 10.0.0.1:7000, which only the
//     wildcard socket takes;
//   - reuseport=64: packets to 10.0.0.2:5353, which the packet's flow
//     hash spreads over the group;
//   - reuseport=64-connected-neighbour: the same to 10.0.0.3:5353.
func BenchmarkUDPLookup(b *testing.B) {
	tbl := NewUDPTable[int](WithSecret(demuxBenchSecret))
	v := new(int)
	const connected = 500
	conn := make([]Tuple, connected)
	local := netip.MustParseAddrPort("10.0.0.1:5000")
	for i := range conn {
		bindConnected(b, tbl, local, v, i)
		conn[i] = Tuple{Local: local, Remote: benchPeer(i)}
	}
	for _, a := range []string{"10.0.0.1:5000", "10.0.0.1:6000", "0.0.0.0:7000"} {
		if _, err := tbl.Bind(netip.MustParseAddrPort(a), v, WithReusePort()); err != nil {
			b.Fatal(err)
		}
	}
	for _, a := range []string{"10.0.0.2:5353", "10.0.0.3:5353"} {
		for range 64 {
			if _, err := tbl.Bind(netip.MustParseAddrPort(a), v, WithReusePort()); err != nil {
				b.Fatal(err)
			}
		}
	}
	neighbour, err := tbl.Bind(udpSlotMate(tbl, netip.MustParseAddrPort("10.0.0.3:5353")), v)
	if err != nil {
		b.Fatal(err)
	}
	if err := neighbour.Connect(benchPeer(0)); err != nil {
		b.Fatal(err)
	}
	n := 0
	for _, b := range *tbl.slots[portaddrHash(local.Addr(), 5000, tbl.mix)&tbl.mask].chain.Load() {
		if b.local == local {
			n++
		}
	}
	if n != connected+1 {
		b.Fatalf("the slot of %v holds %d sockets", local, n)
	}
	packets := func(dst string) []Tuple {
		p := make([]Tuple, 1024)
		for i := range p {
			p[i] = Tuple{Local: netip.MustParseAddrPort(dst), Remote: benchPeer(1000 + i)}
		}
		return p
	}
	exact, wild, group := packets("10.0.0.1:6000"), packets("10.0.0.1:7000"), packets("10.0.0.2:5353")
	for _, p := range [][]Tuple{exact, wild, group} {
		slot := &tbl.slots[portaddrHash(p[0].Local.Addr(), p[0].Local.Port(), tbl.mix)&tbl.mask]
		if slot.hash4Cnt.Load() != 0 {
			b.Fatalf("the slot of %v counts connected sockets", p[0].Local)
		}
	}
	for _, c := range []struct {
		name string
		pkts []Tuple
	}{
		{"connected", conn},
		{"unconnected-exact", exact},
		{"unconnected-wildcard", wild},
		{"reuseport=64", group},
		{"reuseport=64-connected-neighbour", packets("10.0.0.3:5353")},
	} {
		for _, off := range []bool{false, true} {
			name := "on"
			if off {
				name = "off"
			}
			b.Run(fmt.Sprintf("%s/hash4=%s", c.name, name), func(b *testing.B) {
				tbl.hash4Off = off
				defer func() { tbl.hash4Off = false }()
				pkts := c.pkts
				miss := 0
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if _, ok := tbl.Lookup(pkts[i%len(pkts)]); !ok {
						miss++
					}
				}
				if miss != 0 {
					b.Fatalf("%d misses", miss)
				}
			})
		}
	}
}

// BenchmarkUDPBind binds n sockets with port reuse on one address and port
// of a new table and connects each to a peer of its own, as a server with a
// connected socket per client does; time per table.
func BenchmarkUDPBind(b *testing.B) {
	v := new(int)
	local := netip.MustParseAddrPort("10.0.0.1:443")
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("sockets=%d", n), func(b *testing.B) {
			b.ResetTimer()
			for range b.N {
				tbl := NewUDPTable[int](WithSecret(demuxBenchSecret))
				for i := range n {
					bindConnected(b, tbl, local, v, i)
				}
			}
		})
	}
}

// BenchmarkUDPRebind keeps n sockets connected on one address and port, as
// BenchmarkUDPBind leaves them, and per op closes one of them, picked at
// random, and binds and connects another in its stead, as such a server
// does when a client leaves and another comes.
func BenchmarkUDPRebind(b *testing.B) {
	v := new(int)
	local := netip.MustParseAddrPort("10.0.0.1:443")
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("sockets=%d", n), func(b *testing.B) {
			tbl := NewUDPTable[int](WithSecret(demuxBenchSecret))
			socks := make([]*UDPSocket[int], n)
			for i := range n {
				socks[i] = bindConnected(b, tbl, local, v, i)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			b.ResetTimer()
			for range b.N {
				i := rng.IntN(n)
				if err := socks[i].Close(); err != nil {
					b.Fatal(err)
				}
				socks[i] = bindConnected(b, tbl, local, v, i)
			}
		})
	}
}

// BenchmarkTCPEstablished looks up established flows in a plain Table
// (impl=table) and in a TCPTable's established table through
// TCPTable.Lookup (impl=tcp), both holding the same 1024 flows; the
// TCPTable also holds 1000 listeners.
func BenchmarkTCPEstablished(b *testing.B) {
	const n = 1024
	flows := make([]Tuple, n)
	for i := range flows {
		flows[i] = Tuple{Local: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}), 443), Remote: benchPeer(i)}
	}
	plain := New[int](WithSecret(demuxBenchSecret))
	tcp := NewTCPTable[int](WithSecret(demuxBenchSecret))
	v := new(int)
	for _, f := range flows {
		if err := plain.Insert(f, v); err != nil {
			b.Fatal(err)
		}
		if err := tcp.Established().Insert(f, v); err != nil {
			b.Fatal(err)
		}
	}
	for i := range 1000 {
		if _, err := tcp.Listen(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), 443), v); err != nil {
			b.Fatal(err)
		}
	}
	for _, impl := range []struct {
		name   string
		lookup func(Tuple) (*int, bool)
	}{{"table", plain.Lookup}, {"tcp", tcp.Lookup}} {
		b.Run("impl="+impl.name, func(b *testing.B) {
			miss := 0
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, ok := impl.lookup(flows[i%n]); !ok {
					miss++
				}
			}
			if miss != 0 {
				b.Fatalf("%d misses", miss)
			}
		})
	}
}

// BenchmarkTCPListener looks up segments that open connections (no
// established flow) in a TCPTable with 1024 established flows and 1000
// listeners: 918 on concrete addresses (10.1.x.y:443), 10 on 0.0.0.0
// ports 8000-8009, and reuseport groups of 8 and 64 on 10.3.0.8:443 and
// 10.3.0.64:443.
//
//   - exact: segments to the concrete listeners;
//   - wildcard: segments to the wildcard ports, which first miss the
//     exact chain;
//   - reuseport=n: segments to the group of n, which the segment's hash
//     spreads over its listeners.
func BenchmarkTCPListener(b *testing.B) {
	tcp := NewTCPTable[int](WithSecret(demuxBenchSecret))
	v := new(int)
	for i := range 1024 {
		f := Tuple{Local: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}), 443), Remote: benchPeer(i)}
		if err := tcp.Established().Insert(f, v); err != nil {
			b.Fatal(err)
		}
	}
	var exact, wild []Tuple
	for i := range 918 {
		a := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), 443)
		if _, err := tcp.Listen(a, v); err != nil {
			b.Fatal(err)
		}
		exact = append(exact, Tuple{Local: a, Remote: benchPeer(2000 + i)})
	}
	for i := range 10 {
		if _, err := tcp.Listen(netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(8000+i)), v); err != nil {
			b.Fatal(err)
		}
	}
	// Reuseport groups of 8 and 64 listeners, on addresses of their own.
	groups := map[int][]Tuple{8: nil, 64: nil}
	for n := range groups {
		grp := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 3, 0, byte(n)}), 443)
		for range n {
			if _, err := tcp.Listen(grp, v, WithReusePort()); err != nil {
				b.Fatal(err)
			}
		}
		for i := range 1000 {
			groups[n] = append(groups[n], Tuple{Local: grp, Remote: benchPeer(4000 + i)})
		}
	}
	for i := range 1000 {
		wild = append(wild, Tuple{Local: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 2, byte(i >> 8), byte(i)}), uint16(8000+i%10)), Remote: benchPeer(3000 + i)})
	}
	for _, c := range []struct {
		name string
		pkts []Tuple
	}{{"exact", exact}, {"wildcard", wild}, {"reuseport=8", groups[8]}, {"reuseport=64", groups[64]}} {
		b.Run("listeners=1000/"+c.name, func(b *testing.B) {
			miss := 0
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, ok := tcp.Lookup(c.pkts[i%len(c.pkts)]); !ok {
					miss++
				}
			}
			if miss != 0 {
				b.Fatalf("%d misses", miss)
			}
		})
	}
}
