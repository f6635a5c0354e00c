package nat

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"sync/atomic"
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

// flowRank is where a NAT's flow stands among its mapping's, as
// lookupSet makes them.
type flowRank struct {
	name string
	nth  int // the mapping's flow it is: 1 its first
}

// flowRanks are the flows of BenchmarkLookupPaired: a mapping's first, its
// first sib, and the first with keys of its own.
var flowRanks = []flowRank{{"first", 1}, {"sib", 2}, {"keyed", 2 + numSibs}}

// kindOf names what f is of its mapping: its first flow, a sib, or keyed.
func kindOf(f *flow) string {
	switch {
	case f == &f.m.first:
		return "first"
	case f.flags.Load()&flagSib != 0:
		return "sib"
	}
	return "keyed"
}

// lookupSet makes n flows in a NAT and as many in a bare table, and returns
// the tuples of each, in random order. Each of the NAT's flows is its
// mapping's r.nth, made after flows to r.nth-1 other remotes: r.name says
// how a packet finds it after its mapping (kindOf).
func lookupSet(b testing.TB, n int, r flowRank) (nt *NAT, out, in []hash4.Tuple, bare *hash4.Table[benchValue], keys []hash4.Tuple) {
	var pool []netip.Addr
	for i := range 20 {
		pool = append(pool, netip.AddrFrom4([4]byte{192, 0, 2, byte(1 + i)}))
	}
	nt, _ = newTest(b, Config{External: pool, MaxFlows: r.nth * n, Blocks: Blocks{Size: 64}})
	bare = hash4.New[benchValue]()
	dst := ap("198.51.100.1", 443)
	for i := range n {
		src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 14), byte(i >> 6)}), uint16(1024+i%64))
		for j := 2; j <= r.nth; j++ {
			if _, why := nt.MapOutbound(UDP, src, remoteAt(j, 443)); why != DropNone {
				b.Fatal(why)
			}
		}
		e, why := nt.MapOutbound(UDP, src, dst)
		if why != DropNone {
			b.Fatal(why)
		}
		out = append(out, hash4.Tuple{Local: src, Remote: dst})
		in = append(in, hash4.Tuple{Local: e, Remote: dst})
		ps := &nt.proto[UDP]
		if f := ps.lookupOut(&out[i]); f == nil || ps.lookupIn(&in[i]) != f || kindOf(f) != r.name {
			b.Fatalf("flow %v -> %v not found both ways, or not its mapping's %s", src, dst, r.name)
		}
		k := hash4.Tuple{Local: src, Remote: dst}
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
		nt, out, in, bare, keys := lookupSet(b, n, flowRanks[0])
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
				if f := ps.lookup(&out[i%n], Inside); f != nil {
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
				if f := ps.lookup(&in[i%n], Outside); f != nil {
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

// createMappings are the UDP behaviours the creation benchmarks make flows
// with: the default, and Linux's.
var createMappings = []struct {
	name string
	b    Behaviors
}{
	{"EndpointIndependent", Behaviors{}},
	{"AddressAndPortDependent", Behaviors{Mapping: AddressAndPortDependent, Filtering: AddressAndPortDependent}},
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
	for _, c := range createMappings {
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

// BenchmarkMemoryPerFlow reports the heap per flow, tables included, at
// 100,000 flows: of 256 inside hosts on a pool of two addresses, and (pool=1024,
// endpoint-independent) of 4,096 hosts on a pool of 1,024, where each address
// has few mappings, spread over its ports.
func BenchmarkMemoryPerFlow(b *testing.B) {
	const flows = 100000
	for _, c := range createMappings {
		for _, pool := range []int{2, 1024} {
			if pool > 2 && c.b.Mapping == AddressAndPortDependent {
				continue // its flows hold no port of their own
			}
			b.Run(fmt.Sprintf("%s/pool=%d", c.name, pool), func(b *testing.B) {
				ext := make([]netip.Addr, pool)
				for i := range ext {
					ext[i] = netip.AddrFrom4([4]byte{192, 0, byte(2 + i>>8), byte(i)})
				}
				hosts := 256
				if pool > 2 {
					hosts = 4096
				}
				for range b.N {
					var before, after runtime.MemStats
					runtime.GC()
					runtime.ReadMemStats(&before)
					n, _ := newTest(b, Config{External: ext, UDP: c.b, MaxFlows: 2 * flows})
					for i := range flows {
						h := i % hosts
						src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, byte(h >> 8), byte(h)}), uint16(1024+i/hosts))
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
}

// BenchmarkMemoryFlood reports the heap a NAT holds after a flood: a
// million unanswered TCP flows (MapOutbound's, each from a new endpoint)
// at MaxFlows 10,000, early drop making room for each: bytes/dropped is
// the heap past the live flows' per flow the flood ended, which should be
// none (an ended flow leaves every table, list and wheel slot).
func BenchmarkMemoryFlood(b *testing.B) {
	const flows, max = 1000000, 10000
	for range b.N {
		var before, live, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		n, _ := newTest(b, Config{MaxFlows: max, Capacity: max})
		flood := func(from, to int) {
			for i := from; i < to; i++ {
				src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), 2}), uint16(1024+i%200))
				n.MapOutbound(TCP, src, remoteAt(i, 80))
			}
		}
		flood(0, max)
		runtime.GC()
		runtime.ReadMemStats(&live)
		flood(max, flows)
		runtime.GC()
		runtime.ReadMemStats(&after)
		if m := n.Metrics(); m.Flows != max || m.Expired[ExpiredEarlyDrop] != flows-max {
			b.Fatalf("flows %d, early dropped %d", m.Flows, m.Expired[ExpiredEarlyDrop])
		}
		dropped := float64(int64(after.HeapAlloc)-int64(live.HeapAlloc)) / (flows - max)
		if dropped > 4 {
			b.Errorf("%.1f bytes held per ended flow", dropped)
		}
		b.ReportMetric(dropped, "bytes/dropped")
		b.ReportMetric(float64(live.HeapAlloc-before.HeapAlloc)/max, "bytes/live")
		runtime.KeepAlive(n)
	}
}

// BenchmarkLookupPaired measures the three lookups of BenchmarkLookup in
// alternating blocks of 1024 within one loop, so that a machine whose load
// changes (this one is shared) weighs on all three alike: it reports each
// one's ns per lookup and the NAT's ratios to the bare table's. The NAT's
// flows are their mappings' first (flow=first), found through the
// mapping, a sib (flow=sib), found in it, or a flow with keys of its own
// (flow=keyed), found after it (flowRanks).
func BenchmarkLookupPaired(b *testing.B) {
	const block = 1024
	for _, r := range flowRanks {
		for _, n := range lookupSizes {
			b.Run(fmt.Sprintf("flow=%s/n=%d", r.name, n), func(b *testing.B) {
				lookupPaired(b, n, r, block)
			})
		}
	}
}

// lookupPaired is a BenchmarkLookupPaired sub-benchmark: n flows, each its
// mapping's r.nth, looked up in blocks of block. Each loop
// builds its keys from a packet's header fields, as a packet path does
// (flowKey): a lookup of tuples built beforehand, as a bare table's
// callers rarely have them, leaves out the cost of building the key,
// which the NAT, whose key is its mapping's, pays again.
func lookupPaired(b *testing.B, n int, r flowRank, block int) {
	nt, out, in, bare, keys := lookupSet(b, n, r)
	ps, now := &nt.proto[UDP], nt.now()
	hb, ho, hi := headersOf(keys), headersOf(out), headersOf(in)
	runtime.GC()
	b.ResetTimer()
	var tBare, tOut, tIn time.Duration
	var sink uint16
	j := 0
	for range b.N {
		t0 := time.Now()
		for k := range block {
			var key hash4.Tuple
			hb[(j+k)%n].key(&key)
			v, _ := bare.Lookup(key)
			sink += v.ext.Port()
		}
		t1 := time.Now()
		sink += natBlock(ps, ho, j, block, Inside, now)
		t2 := time.Now()
		sink += natBlock(ps, hi, j, block, Outside, now)
		t3 := time.Now()
		tBare, tOut, tIn = tBare+t1.Sub(t0), tOut+t2.Sub(t1), tIn+t3.Sub(t2)
		j = (j + block) % n
	}
	_ = sink
	reportPaired(b, b.N*block, "lookup", []string{"table", "out", "in"}, tBare, tOut, tIn)
}

// natBlock looks up the flows of block packets from side from, their
// headers hs[j:] (round to its start), as a packet's translation does
// (the flow's state, its clock, where its addresses go).
func natBlock(ps *protoState, hs []header, j, block int, from Side, now int64) (sink uint16) {
	for k := range block {
		var key hash4.Tuple
		hs[(j+k)%len(hs)].key(&key)
		if f := ps.lookup(&key, from); f != nil {
			f.touch(now)
			sink += f.out.port ^ f.in.port
		}
	}
	return sink
}

// header is the fields of a packet's header a key is built from.
type header struct {
	la, ra netip.Addr
	lp, rp uint16
}

func headersOf(ts []hash4.Tuple) []header {
	h := make([]header, len(ts))
	for i, t := range ts {
		h[i] = header{t.Local.Addr(), t.Remote.Addr(), t.Local.Port(), t.Remote.Port()}
	}
	return h
}

// key sets *k to h's tuple. N.B. not in line, as flowKey writes its
// caller's key: a compiler that kept the key in registers would leave out
// the stores a packet path makes.
//
//go:noinline
func (h *header) key(k *hash4.Tuple) {
	k.Local, k.Remote = netip.AddrPortFrom(h.la, h.lp), netip.AddrPortFrom(h.ra, h.rp)
}

// BenchmarkCreatePaired makes flows as BenchmarkCreate does in alternating
// blocks of 256 within one loop (as BenchmarkLookupPaired): Connect's, the
// NAT's, and the floor's, the table operations alone that the NAT's flow
// needs (floorTables). It reports each one's ns per flow and their ratios
// to Connect's. All three's tables are sized for the flows they hold
// (tables=sized: WithCapacity, Config.Capacity), or made as a NAT makes
// its tables by default, growing by themselves from 1,024 (tables=grown);
// they hold 16,384 flows, or a million (flows=1M: the NAT's and the
// floor's on 64 external addresses, a million mappings taking more ports
// than one address has), so that a flow's writes miss the caches. Each
// sub-benchmark is to be run in its own process (-bench
// 'CreatePaired/mapping=EndpointIndependent/tables=sized/flows=16K$'): one
// NAT's heap and collections would otherwise fall on the other's timings.
// flows=1M needs -benchtime past 4096x to make more flows than it holds.
func BenchmarkCreatePaired(b *testing.B) {
	for _, c := range createMappings {
		for _, size := range []struct {
			name     string
			capacity int
		}{{"sized", 0}, {"grown", 1024}} {
			for _, held := range []struct {
				name         string
				flows, addrs int
			}{{"16K", createRound, 1}, {"1M", 1 << 20, 64}} {
				b.Run("mapping="+c.name+"/tables="+size.name+"/flows="+held.name, func(b *testing.B) {
					createPaired(b, c.b, cmp.Or(size.capacity, held.flows), held.flows, held.addrs)
				})
			}
		}
	}
}

// createPaired is a BenchmarkCreatePaired sub-benchmark: tables of
// capacity, holding round flows, the NAT's and the floor's on addrs
// external addresses.
func createPaired(b *testing.B, bh Behaviors, capacity, round, addrs int) {
	const block = 256
	ext := make([]netip.Addr, addrs)
	for i := range ext {
		ext[i] = netip.AddrFrom4([4]byte{192, 0, 2, byte(1 + i)})
	}
	alloc, _ := hash4.NewPortAllocator(hash4.WithPortRange(hash4.PortRange{Low: 1024, High: 65535}))
	t := hash4.New[benchValue](hash4.WithCapacity(capacity))
	// The NAT's flows expire as a gateway's do, through its wheel: its
	// clock moves a second a block, and a flow unanswered for a round of
	// blocks ends (its timeout, a second short of the round, and the
	// tick a flow's end waits past it): before its key comes again, which
	// at flows=1M is the next round's.
	rounds := round / block
	n, clk := newTest(b, Config{External: ext, MaxFlows: 2 * round, UDP: bh,
		Capacity: capacity, Timeouts: Timeouts{UDPUnreplied: time.Duration(rounds-1) * time.Second}})
	fl := newFloorTables(ext, bh.Mapping == AddressAndPortDependent, capacity)
	var tConn, tNAT, tFloor time.Duration
	// The tables hold round flows: each block's new flows replace,
	// untimed, the block's made round before, as a gateway's flows come
	// and go (not a whole table at once).
	conns := make([]hash4.Tuple, round)
	b.ResetTimer()
	for j := range b.N {
		made := j * block % round
		b.StopTimer()
		if ended := clk.advance(time.Second); j > rounds && ended != block {
			b.Fatalf("block %d: %d flows expired, want %d", j, ended, block)
		}
		if j*block >= round {
			for k := range block {
				t.Delete(conns[made+k])
				fl.delete(createKey(j*block + k - round))
			}
		}
		b.StartTimer()
		t0 := time.Now()
		for k := range block {
			_, r := createKey(j*block + k)
			tup, err := t.Connect(alloc, ext[0], r, &benchValue{})
			if err != nil {
				b.Fatal(err)
			}
			conns[made+k] = tup
		}
		t1 := time.Now()
		for k := range block {
			src, r := createKey(j*block + k)
			if _, why := n.MapOutbound(UDP, src, r); why != DropNone {
				b.Fatal(why)
			}
		}
		t2 := time.Now()
		for k := range block {
			if err := fl.create(createKey(j*block + k)); err != nil {
				b.Fatal(err)
			}
		}
		t3 := time.Now()
		tConn, tNAT, tFloor = tConn+t1.Sub(t0), tNAT+t2.Sub(t1), tFloor+t3.Sub(t2)
	}
	reportPaired(b, b.N*block, "flow", []string{"connect", "nat", "floor"}, tConn, tNAT, tFloor)
}

// floorTables makes a NAT's flow with the table operations alone, in
// tables of its own: what no NAT on this table can do without, and so how
// near Connect's cost one can come. Address-and-port-dependent: the
// inside key's lookup (the packet's, which misses), Connect of the
// external key, the inside key's insert. Endpoint-independent, a new
// mapping and its first flow, which is in the mapping and has no keys of
// its own: the mapping's lookup (the packet's, which misses), its port
// taken (addrPorts.takeAny), its two keys' inserts (inside and external
// endpoint; the permit of address-dependent filtering is in the mapping:
// no table write). Each with the NAT's allocations (a flow, or a mapping
// that holds its first); no host count, flow limit, expiry timer,
// unassured list, permit or counter.
type floorTables struct {
	ext      []netip.Addr
	apdm     bool
	alloc    *hash4.PortAllocator
	fwd, rev *hash4.Table[flow]
	maps     *hash4.Table[mapping]
	extm     *hash4.Table[mapping]
	ports    []addrPorts // by ext's index
}

func newFloorTables(ext []netip.Addr, apdm bool, capacity int) *floorTables {
	alloc, _ := hash4.NewPortAllocator(hash4.WithPortRange(hash4.PortRange{Low: 1024, High: 65535}))
	c := hash4.WithCapacity(capacity)
	return &floorTables{ext: ext, apdm: apdm, alloc: alloc, fwd: hash4.New[flow](c), rev: hash4.New[flow](c),
		maps: hash4.New[mapping](c), extm: hash4.New[mapping](c), ports: make([]addrPorts, len(ext))}
}

// addr returns the external address, and its ports, of inside address a:
// one by a's last byte, as paired pooling keeps a host on one address.
func (ft *floorTables) addr(a netip.Addr) (netip.Addr, *addrPorts) {
	i := int(a.As4()[3]) % len(ft.ext)
	return ft.ext[i], &ft.ports[i]
}

func (ft *floorTables) create(src, r netip.AddrPort) error {
	key := hash4.Tuple{Local: src, Remote: r}
	ext, ports := ft.addr(src.Addr())
	if ft.apdm {
		if _, ok := ft.fwd.Lookup(key); ok {
			return hash4.ErrExists
		}
		f := &flow{in: epOf(src), remote: r}
		tup, err := ft.rev.Connect(ft.alloc, ext, r, f)
		if err != nil {
			return err
		}
		f.ext = tup.Local
		return ft.fwd.Insert(key, f)
	}
	mkey := hash4.Tuple{Local: src, Remote: sentinel4}
	if _, ok := ft.maps.Lookup(mkey); ok {
		return hash4.ErrExists
	}
	m := &mapping{key: mkey}
	port, ok := ports.takeAny(1024, 65535, randUint32(), anyParity, math.MaxUint32, ft.alloc)
	if !ok {
		return hash4.ErrNoPorts
	}
	m.ext = netip.AddrPortFrom(ext, port)
	m.first.in, m.first.remote, m.first.ext, m.first.m = epOf(src), r, m.ext, m
	if err := ft.maps.Insert(mkey, m); err != nil {
		return err
	}
	return ft.extm.Insert(hash4.Tuple{Local: m.ext, Remote: sentinel4}, m)
}

// delete undoes create(src, r).
func (ft *floorTables) delete(src, r netip.AddrPort) {
	if ft.apdm {
		if f, ok := ft.fwd.Lookup(hash4.Tuple{Local: src, Remote: r}); ok {
			ft.fwd.Delete(f.insideKey())
			ft.rev.Delete(f.extKey())
		}
		return
	}
	m, ok := ft.maps.Lookup(hash4.Tuple{Local: src, Remote: sentinel4})
	if !ok {
		return
	}
	ft.maps.Delete(m.key)
	ft.extm.Delete(hash4.Tuple{Local: m.ext, Remote: sentinel4})
	_, ports := ft.addr(src.Addr())
	ports.release(m.ext.Port())
}

// reportPaired reports the times of a paired benchmark's loops, named
// names, of ops operations each: each one's ns per op ("name-ns/per"),
// and each one's ratio to the first's ("name/first").
func reportPaired(b *testing.B, ops int, per string, names []string, times ...time.Duration) {
	for i, t := range times {
		b.ReportMetric(float64(t)/float64(ops), names[i]+"-ns/"+per)
	}
	for i := 1; i < len(times); i++ {
		b.ReportMetric(float64(times[i])/float64(times[0]), names[i]+"/"+names[0])
	}
}

// createKey returns the inside and remote endpoints of flow i of the
// creation benchmarks: 256 inside hosts, each with many flows, as a
// gateway's hosts are; a key comes again after 1,048,576 flows.
func createKey(i int) (src, r netip.AddrPort) {
	src = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}), uint16(1024+i>>8&0xfff))
	r = netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, byte(51 + i>>16&0xf), byte(i >> 8), byte(i)}), 443)
	return src, r
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

// BenchmarkCreateParallel makes new flows from every goroutine at once,
// each its own (a new inside endpoint toward a new remote, 4,096 hosts on
// 64 external addresses), on tables sized for them, against Connect of as
// many flows to a table: run with -cpu 1,2, what the NAT's shared state
// (its counters, its list of unassured flows, its wheel's slot of a tick)
// costs as goroutines are added, next to what the table's cost.
func BenchmarkCreateParallel(b *testing.B) {
	ext := make([]netip.Addr, 64)
	for i := range ext {
		ext[i] = netip.AddrFrom4([4]byte{192, 0, 2, byte(1 + i)})
	}
	key := func(i uint32) (src, r netip.AddrPort) {
		h := i % 4096
		src = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, byte(h >> 8), byte(h)}), uint16(1024+i/4096))
		r = netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, byte(i >> 8), byte(i)}), uint16(443+i>>16))
		return src, r
	}
	b.Run("impl=Connect", func(b *testing.B) {
		alloc, _ := hash4.NewPortAllocator(hash4.WithPortRange(hash4.PortRange{Low: 1024, High: 65535}))
		t := hash4.New[benchValue](hash4.WithCapacity(max(b.N, 1024)))
		var next atomic.Uint32
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				_, r := key(next.Add(1))
				if _, err := t.Connect(alloc, ext[0], r, &benchValue{}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	for _, c := range createMappings {
		b.Run("impl=NAT/mapping="+c.name, func(b *testing.B) {
			n, _ := newTest(b, Config{External: ext, UDP: c.b, MaxFlows: max(b.N, 1024), Capacity: max(b.N, 1024)})
			var next atomic.Uint32
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					src, r := key(next.Add(1))
					if _, why := n.MapOutbound(UDP, src, r); why != DropNone {
						b.Error(why)
						return
					}
				}
			})
		})
	}
}

// BenchmarkTranslate times a known UDP flow's packet out and its reply
// in (Outbound and Inbound, 64-byte payloads), the packet path's whole
// work for a flow that exists: parse, checks, lookup, rewrite.
func BenchmarkTranslate(b *testing.B) {
	n, c := packetNAT(b, Config{})
	out := build(spec{proto: ipUDP, src: in4, dst: remote4, payload: make([]byte, 64)})
	c.reset()
	n.Outbound(bytes.Clone(out), c.emit)
	ext := netip.AddrPortFrom(ext1, binary.BigEndian.Uint16(c.pkts[0][20:]))
	in := build(spec{proto: ipUDP, src: remote4, dst: ext, payload: make([]byte, 64)})
	bo, bi := make([]byte, len(out)), make([]byte, len(in))
	emit := func(Side, []byte) {}
	b.ResetTimer()
	for range b.N {
		copy(bo, out)
		copy(bi, in)
		if n.Outbound(bo, emit) != DropNone || n.Inbound(bi, emit) != DropNone {
			b.Fatal("dropped")
		}
	}
}
