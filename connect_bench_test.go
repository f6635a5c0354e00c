package hash4

// BenchmarkConnect measures Table.Connect, the kernel's source-port search
// (__inet_hash_connect), with the occupancy index of a busy destination
// (impl=hash4) against the kernel's scan (impl=scan) and its predecessors,
// e.g. BenchmarkConnect/policy=odd-even/occupancy=90%/impl=rehash. The map
// baseline, impl=xsync, is in bench/ (bench/connect_test.go), beside
// Connect. Compare with
//
//	go test -run '^$' -bench Connect -count=6 . > connect.txt
//	benchstat -col /impl connect.txt
//
// The default range 32768-60999 is occupied to a given fraction toward one
// destination (random ports, inserted outside the timer). Each op connects
// one flow to that destination and then deletes one random live flow, so the
// occupancy stays put. Every implementation runs the same scan: the same
// PortAllocator (same secret and perturb seed) chooses the candidates, and
// the same PRNG chooses the victims, so all of them take the same ports.
//
// Both policies run. Under Flat the range is filled with random ports, and a
// scan ends after a few candidates at 90%. Under OddEven (the default) the
// range is filled by Connect itself, as a host that has been connecting for a
// while: ports of low's parity first, so from 50% on that half is full and
// every Connect scans it whole before it finds a port of the other parity,
// the cost the kernel's "refine source port selection" patch measured. That
// is the state the kernel authors sped up with the hash-once and lock-free
// pre-check patches, and the state this benchmark keeps: each op frees a
// random port, so about half of the time it frees one of the full half,
// which the next Connect finds after a scan of half of it on average.

import (
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var (
	connBenchLocal  = netip.MustParseAddr("10.1.2.3")
	connBenchRemote = netip.MustParseAddrPort("192.0.2.80:443")
)

// connBencher is one implementation of connect-and-delete.
type connBencher interface {
	connect() Tuple
	delete(Tuple)
	prefill(Tuple)
}

// connBenchTable is Table.connect with one of its strategies: hash4
// (connectHashOnce, what Connect uses), rehash and locked.
type connBenchTable struct {
	t        *Table[int]
	a        *PortAllocator
	strategy connectStrategy
	v        *int
}

func (c *connBenchTable) connect() Tuple {
	tup, err := c.t.connect(c.a, connBenchLocal, connBenchRemote, c.v, c.strategy, nil)
	if err != nil {
		panic(err)
	}
	return tup
}

func (c *connBenchTable) delete(tup Tuple) {
	if _, ok := c.t.Delete(tup); !ok {
		panic("not found")
	}
}

func (c *connBenchTable) prefill(tup Tuple) {
	if err := c.t.Insert(tup, c.v); err != nil {
		panic(err)
	}
}

var connBenchImpls = []struct {
	name string
	new  func(a *PortAllocator, n int) connBencher
}{
	{"hash4", func(a *PortAllocator, n int) connBencher { return connBenchNewTable(a, n, connectIndexed) }},
	{"scan", func(a *PortAllocator, n int) connBencher { return connBenchNewTable(a, n, connectHashOnce) }},
	{"rehash", func(a *PortAllocator, n int) connBencher { return connBenchNewTable(a, n, connectRehash) }},
	{"locked", func(a *PortAllocator, n int) connBencher { return connBenchNewTable(a, n, connectLocked) }},
}

func connBenchNewTable(a *PortAllocator, n int, s connectStrategy) connBencher {
	t := New[int](WithCapacity(n), WithSecret(Secret{Ehash: 0x9e3779b9, Ehash6Addr: 0x7f4a7c15, Seed: 1}))
	return &connBenchTable{t: t, a: a, strategy: s, v: new(int)}
}

// connBenchTuple returns the flow from local port p to the destination.
func connBenchTuple(p uint16) Tuple {
	return Tuple{Local: netip.AddrPortFrom(connBenchLocal, p), Remote: connBenchRemote}
}

// connBenchRand is xorshift64*, cheap enough not to show in the op.
type connBenchRand uint64

func (r *connBenchRand) next() uint64 {
	x := uint64(*r)
	x ^= x >> 12
	x ^= x << 25
	x ^= x >> 27
	*r = connBenchRand(x)
	return x * 0x2545f4914f6cdd1d
}

func BenchmarkConnect(b *testing.B) {
	for _, policy := range []Policy{OddEven, Flat} {
		for _, occ := range []int{0, 500, 900, 990, 999} { // per mille
			for _, impl := range connBenchImpls {
				pct := strconv.Itoa(occ / 10)
				if occ%10 != 0 {
					pct += "." + strconv.Itoa(occ%10)
				}
				name := "policy=" + strings.ToLower(policy.String()) + "/occupancy=" + pct + "%/impl=" + impl.name
				b.Run(name, func(b *testing.B) {
					s := newConnBenchState(impl.new, DefaultPortRange, policy, occ)
					b.ReportAllocs()
					b.ResetTimer()
					for range b.N {
						s.op()
					}
				})
			}
		}
	}
}

// connBenchState is an implementation with a range occupied to a fraction,
// and the live flows.
type connBenchState struct {
	c connBencher
	r connBenchRand
	// The live flows, by local port: the only part that differs. (A slice
	// of whole Tuples would be 1.8 MB for the default range, and reading a
	// random victim from it would miss the cache on every op.)
	live []uint16
}

// newConnBenchState returns an implementation made by newImpl, with an
// allocator over rng and a random occ per mille of rng in use, after a
// warm-up of connBenchWarmup ops (in which Connect builds the index of a
// busy destination, once).
func newConnBenchState(newImpl func(*PortAllocator, int) connBencher, rng PortRange, policy Policy, occ int) *connBenchState {
	a, err := NewPortAllocator(WithPortRange(rng), WithPolicy(policy),
		WithPortSecret(0x0123456789abcdef, 0xfedcba9876543210), WithPerturbSeed(7))
	if err != nil {
		panic(err)
	}
	size := rng.Size()
	s := &connBenchState{c: newImpl(a, size), r: 0x9e3779b97f4a7c15, live: make([]uint16, 0, size+1)}
	ports := make([]uint16, 0, size)
	for p := int(rng.Low); p <= int(rng.High); p++ {
		ports = append(ports, uint16(p))
	}
	for i := len(ports) - 1; i > 0; i-- {
		j := int(s.r.next() % uint64(i+1))
		ports[i], ports[j] = ports[j], ports[i]
	}
	for _, p := range ports[:size*occ/1000] {
		if policy == OddEven {
			p = s.c.connect().Local.Port()
		} else {
			s.c.prefill(connBenchTuple(p))
		}
		s.live = append(s.live, p)
	}
	for range connBenchWarmup {
		s.op()
	}
	return s
}

// connBenchWarmup is the number of ops newConnBenchState runs untimed.
const connBenchWarmup = 100

// op connects one flow, then deletes a random live one, and returns the
// local port taken.
func (s *connBenchState) op() uint16 {
	p := s.c.connect().Local.Port()
	s.live = append(s.live, p)
	j := int(uint64(uint32(s.r.next())) * uint64(len(s.live)) >> 32) // in [0, len)
	s.c.delete(connBenchTuple(s.live[j]))
	s.live[j] = s.live[len(s.live)-1]
	s.live = s.live[:len(s.live)-1]
	return p
}

// TestConnectBenchImplsAgree checks the premise of BenchmarkConnect: every
// implementation takes the same ports, so they do the same scans.
func TestConnectBenchImplsAgree(t *testing.T) {
	var want []uint16
	for _, impl := range connBenchImpls {
		s := newConnBenchState(impl.new, PortRange{40000, 41999}, Flat, 900)
		var got []uint16
		for range 1000 {
			got = append(got, s.op())
		}
		require.Len(t, s.live, 1800, impl.name)
		if want == nil {
			want = got
			continue
		}
		require.Equal(t, want, got, impl.name)
	}
}
