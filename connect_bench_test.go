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
	"strings"
	"testing"

	"github.com/hash4/hash4/internal/benchkit"
	"github.com/stretchr/testify/require"
)

// connBenchTable is Table.connect with one of its strategies: hash4
// (connectIndexed, what Connect uses), scan (connectHashOnce), rehash and
// locked.
type connBenchTable struct {
	t        *Table[int]
	a        *PortAllocator
	strategy connectStrategy
	v        *int
}

func (c *connBenchTable) Connect() uint16 {
	tup, err := c.t.connect(c.a, benchkit.ConnLocal, benchkit.ConnRemote, c.v, c.strategy, nil)
	if err != nil {
		panic(err)
	}
	return tup.Local.Port()
}

func (c *connBenchTable) Delete(p uint16) {
	if _, ok := c.t.Delete(benchkit.ConnTuple[Tuple](p)); !ok {
		panic("not found")
	}
}

func (c *connBenchTable) Prefill(p uint16) {
	if err := c.t.Insert(benchkit.ConnTuple[Tuple](p), c.v); err != nil {
		panic(err)
	}
}

var connBenchImpls = []struct {
	name string
	new  func(a *PortAllocator, n int) benchkit.Conn
}{
	{"hash4", func(a *PortAllocator, n int) benchkit.Conn { return connBenchNewTable(a, n, connectIndexed) }},
	{"scan", func(a *PortAllocator, n int) benchkit.Conn { return connBenchNewTable(a, n, connectHashOnce) }},
	{"rehash", func(a *PortAllocator, n int) benchkit.Conn { return connBenchNewTable(a, n, connectRehash) }},
	{"locked", func(a *PortAllocator, n int) benchkit.Conn { return connBenchNewTable(a, n, connectLocked) }},
}

func connBenchNewTable(a *PortAllocator, n int, s connectStrategy) benchkit.Conn {
	t := New[int](WithCapacity(n), WithSecret(Secret{Ehash: 0x9e3779b9, Ehash6Addr: 0x7f4a7c15, Seed: 1}))
	return &connBenchTable{t: t, a: a, strategy: s, v: new(int)}
}

func BenchmarkConnect(b *testing.B) {
	for _, policy := range []Policy{OddEven, Flat} {
		for _, occ := range benchkit.ConnOccupancies {
			for _, impl := range connBenchImpls {
				occName, _ := benchkit.ConnOccupancy(occ, DefaultPortRange.Size())
				name := "policy=" + strings.ToLower(policy.String()) + "/" + occName + "/impl=" + impl.name
				b.Run(name, func(b *testing.B) {
					s := newConnBenchState(impl.new, DefaultPortRange, policy, occ)
					b.ReportAllocs()
					b.ResetTimer()
					for range b.N {
						s.Op()
					}
				})
			}
		}
	}
}

// newConnBenchState returns an implementation made by newImpl, with an
// allocator over rng and a random occ per mille of rng in use (see
// benchkit.NewConnState), after a warm-up of connBenchWarmup ops (in which
// Connect builds the index of a busy destination, once).
func newConnBenchState(newImpl func(*PortAllocator, int) benchkit.Conn, rng PortRange, policy Policy, occ int) *benchkit.ConnState {
	a, err := NewPortAllocator(WithPortRange(rng), WithPolicy(policy),
		WithPortSecret(benchkit.ConnK0, benchkit.ConnK1), WithPerturbSeed(benchkit.ConnSeed))
	if err != nil {
		panic(err)
	}
	_, inUse := benchkit.ConnOccupancy(occ, rng.Size())
	s := benchkit.NewConnState(newImpl(a, rng.Size()), rng.Low, rng.High, policy == OddEven, inUse)
	for range connBenchWarmup {
		s.Op()
	}
	return s
}

// connBenchWarmup is the number of ops newConnBenchState runs untimed.
const connBenchWarmup = 100

// TestConnectBenchImplsAgree checks the premise of BenchmarkConnect: every
// implementation takes the same ports, so they do the same scans.
func TestConnectBenchImplsAgree(t *testing.T) {
	var want []uint16
	for _, impl := range connBenchImpls {
		s := newConnBenchState(impl.new, PortRange{40000, 41999}, Flat, 900)
		var got []uint16
		for range 1000 {
			got = append(got, s.Op())
		}
		require.Len(t, s.Live, 1800, impl.name)
		if want == nil {
			want = got
			continue
		}
		require.Equal(t, want, got, impl.name)
	}
}
