package nat

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/hash4/hash4"
)

// Per-packet lookups and flow creation against hash4's own: a packet's
// flow found from inside and from outside against a bare Table.Lookup of
// as many flows that reads one field of its value, as any caller of Lookup
// does; and a new flow (a mapping and its
// first flow, or an address-and-port-dependent flow) against Table.Connect
// of a flow to a new destination. Run them in one go test run and compare
// with benchstat (docs/performance.md, "The nat package").

// benchValue stands for a caller's flow in the bare table: a cache line,
// as the part of a NAT's flow a packet reads is.
type benchValue struct {
	ext netip.AddrPort
	_   [32]byte
}

// lookupSet makes n flows in a NAT and as many in a bare table, and returns
// the tuples of each, in random order.
func lookupSet(b testing.TB, n int) (nt *NAT, out, in []hash4.Tuple, bare *hash4.Table[benchValue], keys []hash4.Tuple) {
	var pool []netip.Addr
	for i := range 20 {
		pool = append(pool, netip.AddrFrom4([4]byte{192, 0, 2, byte(1 + i)}))
	}
	nt, _ = newTest(b, Config{External: pool, MaxFlows: 2 * n, Blocks: Blocks{Size: 64}})
	bare = hash4.New[benchValue]()
	r := ap("198.51.100.1", 443)
	for i := range n {
		src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 14), byte(i >> 6)}), uint16(1024+i%64))
		e, why := nt.MapOutbound(UDP, src, r)
		if why != DropNone {
			b.Fatal(why)
		}
		out = append(out, hash4.Tuple{Local: src, Remote: r})
		in = append(in, hash4.Tuple{Local: e, Remote: r})
		k := hash4.Tuple{Local: src, Remote: r}
		bare.Insert(k, &benchValue{ext: e})
		keys = append(keys, k)
	}
	// Each its own order: a loop that follows another over the same flows
	// would find them in the cache.
	rnd := rand.New(rand.NewPCG(1, 2))
	shuffle := func(s []hash4.Tuple) []hash4.Tuple {
		t := make([]hash4.Tuple, n)
		for i, j := range rnd.Perm(n) {
			t[i] = s[j]
		}
		return t
	}
	return nt, shuffle(out), shuffle(in), bare, shuffle(keys)
}

// lookupSizes are the flow counts of BenchmarkLookup.
var lookupSizes = []int{1 << 10, 1 << 16, 1 << 20}

func BenchmarkLookup(b *testing.B) {
	for _, n := range lookupSizes {
		nt, out, in, bare, keys := lookupSet(b, n)
		// The fill's garbage is collected before each timed loop, not
		// during it.
		b.Run(fmt.Sprintf("Table/%d", n), func(b *testing.B) {
			runtime.GC()
			b.ResetTimer()
			var sink uint16
			for i := range b.N {
				v, _ := bare.Lookup(keys[i%n])
				sink += v.ext.Port()
			}
			_ = sink
		})
		// Outbound and Inbound: what a packet's translation does to find
		// its flow (flowOf: the table's lookup, the flow's state and clock,
		// where its addresses go), without the parse and the rewrite.
		b.Run(fmt.Sprintf("Outbound/%d", n), func(b *testing.B) {
			runtime.GC()
			b.ResetTimer()
			ps, now := &nt.proto[UDP], nt.now()
			var sink uint16
			for i := range b.N {
				if f, ok := ps.fwd.Lookup(out[i%n]); ok && f.state.Load() == stateLive {
					f.touch(now)
					sink += f.out.port
				}
			}
			_ = sink
		})
		b.Run(fmt.Sprintf("Inbound/%d", n), func(b *testing.B) {
			runtime.GC()
			b.ResetTimer()
			ps, now := &nt.proto[UDP], nt.now()
			var sink uint16
			for i := range b.N {
				if f, ok := ps.rev.Lookup(in[i%n]); ok && f.state.Load() == stateLive {
					f.touch(now)
					sink += f.in.port
				}
			}
			_ = sink
		})
		// MapOutbound and MapInbound: the same through the endpoint API,
		// which checks and normalizes its input first.
		b.Run(fmt.Sprintf("MapOutbound/%d", n), func(b *testing.B) {
			runtime.GC()
			b.ResetTimer()
			var sink uint16
			for i := range b.N {
				t := out[i%n]
				e, _ := nt.MapOutbound(UDP, t.Local, t.Remote)
				sink += e.Port()
			}
			_ = sink
		})
		b.Run(fmt.Sprintf("MapInbound/%d", n), func(b *testing.B) {
			runtime.GC()
			b.ResetTimer()
			var sink uint16
			for i := range b.N {
				t := in[i%n]
				a, _ := nt.MapInbound(UDP, t.Remote, t.Local)
				sink += a.Port()
			}
			_ = sink
		})
	}
}

// createRound is how many flows a creation benchmark makes before it
// clears them, untimed: the tables stay near one size, the ports free.
const createRound = 1 << 14

func BenchmarkCreate(b *testing.B) {
	ext := netip.MustParseAddr("192.0.2.1")
	b.Run("Connect", func(b *testing.B) {
		alloc, _ := hash4.NewPortAllocator(hash4.WithPortRange(hash4.PortRange{Low: 1024, High: 65535}))
		t := hash4.New[benchValue](hash4.WithCapacity(createRound))
		for i := range b.N {
			if i%createRound == 0 && i > 0 {
				b.StopTimer()
				t.Clear()
				b.StartTimer()
			}
			r := netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, byte(i >> 8), byte(i)}), 443)
			if _, err := t.Connect(alloc, ext, r, &benchValue{}); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, c := range []struct {
		name string
		b    Behaviors
	}{
		{"EndpointIndependent", Behaviors{}},
		{"AddressAndPortDependent", Behaviors{Mapping: AddressAndPortDependent, Filtering: AddressAndPortDependent}},
	} {
		b.Run(c.name, func(b *testing.B) {
			n, _ := newTest(b, Config{External: []netip.Addr{ext}, UDP: c.b, MaxFlows: 2 * createRound})
			for i := range b.N {
				if i%createRound == 0 && i > 0 {
					b.StopTimer()
					n.Flush()
					b.StartTimer()
				}
				// 256 inside hosts, each with many flows, as a
				// gateway's hosts are.
				createBlock(b, n, i%createRound, 1)
			}
		})
	}
}

// BenchmarkMemoryPerFlow reports the heap a flow (with its mapping, for
// endpoint-independent mapping) holds, tables included, at 100,000 flows
// of 256 hosts: bytes/flow.
func BenchmarkMemoryPerFlow(b *testing.B) {
	const flows = 100000
	for _, c := range []struct {
		name string
		b    Behaviors
	}{
		{"EndpointIndependent", Behaviors{}},
		{"AddressAndPortDependent", Behaviors{Mapping: AddressAndPortDependent, Filtering: AddressAndPortDependent}},
	} {
		b.Run(c.name, func(b *testing.B) {
			for range b.N {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				n, _ := newTest(b, Config{External: []netip.Addr{ext1, ext2}, UDP: c.b, MaxFlows: 2 * flows})
				for i := range flows {
					src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}), uint16(1024+i>>8))
					r := netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, byte(i >> 8), byte(i)}), 443)
					if _, why := n.MapOutbound(UDP, src, r); why != DropNone {
						b.Fatal(why)
					}
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/flows, "bytes/flow")
				runtime.KeepAlive(n)
			}
		})
	}
}

// BenchmarkLookupPaired measures the three lookups of BenchmarkLookup in
// alternating blocks of 1024 within one loop, so that a machine whose load
// changes (this one is shared) weighs on all three alike: it reports each
// one's ns per lookup and the NAT's ratios to the bare table's.
func BenchmarkLookupPaired(b *testing.B) {
	const block = 1024
	for _, n := range lookupSizes {
		nt, out, in, bare, keys := lookupSet(b, n)
		ps, now := &nt.proto[UDP], nt.now()
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			runtime.GC()
			b.ResetTimer()
			var tBare, tOut, tIn time.Duration
			var sink uint16
			j := 0
			for range b.N {
				t0 := time.Now()
				for k := range block {
					v, _ := bare.Lookup(keys[(j+k)%n])
					sink += v.ext.Port()
				}
				t1 := time.Now()
				for k := range block {
					if f, ok := ps.fwd.Lookup(out[(j+k)%n]); ok && f.state.Load() == stateLive {
						f.touch(now)
						sink += f.out.port
					}
				}
				t2 := time.Now()
				for k := range block {
					if f, ok := ps.rev.Lookup(in[(j+k)%n]); ok && f.state.Load() == stateLive {
						f.touch(now)
						sink += f.in.port
					}
				}
				t3 := time.Now()
				tBare, tOut, tIn = tBare+t1.Sub(t0), tOut+t2.Sub(t1), tIn+t3.Sub(t2)
				j = (j + block) % n
			}
			_ = sink
			ops := float64(b.N * block)
			b.ReportMetric(float64(tBare)/ops, "table-ns/lookup")
			b.ReportMetric(float64(tOut)/ops, "out-ns/lookup")
			b.ReportMetric(float64(tIn)/ops, "in-ns/lookup")
			b.ReportMetric(float64(tOut)/float64(tBare), "out/table")
			b.ReportMetric(float64(tIn)/float64(tBare), "in/table")
		})
	}
}

// BenchmarkCreatePaired makes flows as BenchmarkCreate does, Connect's and
// the NAT's in alternating blocks of 256 within one loop (as
// BenchmarkLookupPaired), and reports each one's ns per flow and the
// NAT's ratios to Connect's.
func BenchmarkCreatePaired(b *testing.B) {
	const block = 256
	ext := netip.MustParseAddr("192.0.2.1")
	alloc, _ := hash4.NewPortAllocator(hash4.WithPortRange(hash4.PortRange{Low: 1024, High: 65535}))
	t := hash4.New[benchValue](hash4.WithCapacity(createRound))
	eim, _ := newTest(b, Config{External: []netip.Addr{ext}, MaxFlows: 2 * createRound})
	apdm, _ := newTest(b, Config{External: []netip.Addr{ext}, MaxFlows: 2 * createRound,
		UDP: Behaviors{Mapping: AddressAndPortDependent, Filtering: AddressAndPortDependent}})
	var tConn, tEIM, tAPDM time.Duration
	made := 0
	b.ResetTimer()
	for range b.N {
		if made+block > createRound {
			t.Clear()
			eim.Flush()
			apdm.Flush()
			made = 0
		}
		t0 := time.Now()
		for k := range block {
			i := made + k
			r := netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, byte(i >> 8), byte(i)}), 443)
			if _, err := t.Connect(alloc, ext, r, &benchValue{}); err != nil {
				b.Fatal(err)
			}
		}
		t1 := time.Now()
		createBlock(b, eim, made, block)
		t2 := time.Now()
		createBlock(b, apdm, made, block)
		t3 := time.Now()
		tConn, tEIM, tAPDM = tConn+t1.Sub(t0), tEIM+t2.Sub(t1), tAPDM+t3.Sub(t2)
		made += block
	}
	ops := float64(b.N * block)
	b.ReportMetric(float64(tConn)/ops, "connect-ns/flow")
	b.ReportMetric(float64(tEIM)/ops, "eim-ns/flow")
	b.ReportMetric(float64(tAPDM)/ops, "apdm-ns/flow")
	b.ReportMetric(float64(tEIM)/float64(tConn), "eim/connect")
	b.ReportMetric(float64(tAPDM)/float64(tConn), "apdm/connect")
}

// createBlock makes flows from-from+count of the creation benchmarks in n.
func createBlock(b *testing.B, n *NAT, from, count int) {
	for i := from; i < from+count; i++ {
		src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}), uint16(1024+i>>8))
		r := netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, byte(i >> 8), byte(i)}), 443)
		if _, why := n.MapOutbound(UDP, src, r); why != DropNone {
			b.Fatal(why)
		}
	}
}
