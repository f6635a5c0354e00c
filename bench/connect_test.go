package bench

// BenchmarkConnect measures Table.Connect, the kernel's source-port search
// (__inet_hash_connect), against the baseline a Go user would write with a
// concurrent map, e.g. BenchmarkConnect/policy=odd-even/occupancy=90%/impl=xsync.
// (The root package's BenchmarkConnect compares Connect with the strategies
// it replaced: impl=scan, the kernel's walk, and the older impl=rehash and
// impl=locked.) Compare with
//
//	go test -run '^$' -bench Connect -count=6 ./bench > connect.txt
//	benchstat -col /impl connect.txt
//
// The default range 32768-60999 is occupied to a given fraction toward one
// destination (random ports, inserted outside the timer). Each op connects
// one flow to that destination and then deletes one random live flow, so the
// occupancy stays put. Both implementations run the same scan: the same
// candidates in the same order (see connScan), and the same PRNG chooses the
// victims, so both take the same ports (TestConnectBenchImplsAgree).
//
// Both policies run. Under Flat the range is filled with random ports, and a
// scan ends after a few candidates at 90%. Under OddEven (the default) the
// range is filled by Connect itself, as a host that has been connecting for a
// while: ports of low's parity first, so from 50% on that half is full and
// every Connect scans it whole before it finds a port of the other parity.
// Each op frees a random port, so about half of the time it frees one of
// the full half, which the next Connect finds after a scan of half of it on
// average.

import (
	"encoding/binary"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/dchest/siphash"
	"github.com/hash4/hash4"
	"github.com/hash4/hash4/internal/benchkit"
	"github.com/puzpuzpuz/xsync/v4"
	"github.com/stretchr/testify/require"
)

// connBenchTable is Table.Connect.
type connBenchTable struct {
	t *hash4.Table[int]
	a *hash4.PortAllocator
	v *int
}

func (c *connBenchTable) Connect() uint16 {
	tup, err := c.t.Connect(c.a, benchkit.ConnLocal, benchkit.ConnRemote, c.v)
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

// connBenchXsync is the baseline a Go user would write today: an xsync.Map
// keyed by Tuple, the candidates of Connect's scan in the same order
// (connScan), and per candidate a Load, then a LoadOrStore of a port that
// looks free.
type connBenchXsync struct {
	m *xsync.Map[Tuple, *int]
	s *connScan
	v *int
}

func (c *connBenchXsync) Connect() uint16 {
	port, ok := c.s.selectPort(func(p uint16) bool {
		k := benchkit.ConnTuple[Tuple](p)
		if _, taken := c.m.Load(k); taken {
			return false
		}
		_, loaded := c.m.LoadOrStore(k, c.v)
		return !loaded
	})
	if !ok {
		panic("no port")
	}
	return port
}

func (c *connBenchXsync) Delete(p uint16) {
	if _, ok := c.m.LoadAndDelete(benchkit.ConnTuple[Tuple](p)); !ok {
		panic("not found")
	}
}

func (c *connBenchXsync) Prefill(p uint16) { c.m.Store(benchkit.ConnTuple[Tuple](p), c.v) }

var connBenchImpls = []struct {
	name string
	new  func(rng hash4.PortRange, policy hash4.Policy, n int) benchkit.Conn
}{
	{"hash4", func(rng hash4.PortRange, policy hash4.Policy, n int) benchkit.Conn {
		a, err := hash4.NewPortAllocator(hash4.WithPortRange(rng), hash4.WithPolicy(policy),
			hash4.WithPortSecret(benchkit.ConnK0, benchkit.ConnK1), hash4.WithPerturbSeed(benchkit.ConnSeed))
		if err != nil {
			panic(err)
		}
		t := hash4.New[int](hash4.WithCapacity(n), hash4.WithSecret(hash4.Secret{Ehash: 0x9e3779b9, Ehash6Addr: 0x7f4a7c15, Seed: 1}))
		return &connBenchTable{t: t, a: a, v: new(int)}
	}},
	{"xsync", func(rng hash4.PortRange, policy hash4.Policy, n int) benchkit.Conn {
		return &connBenchXsync{m: xsync.NewMap[Tuple, *int](xsync.WithPresize(n)), s: newConnScan(rng, policy), v: new(int)}
	}},
}

// connScan is the candidate scan of an allocator made with the benchmark's
// keys, for flows from benchkit.ConnLocal to benchkit.ConnRemote, with no port
// reserved or bound: the scan of __inet_hash_connect as PortAllocator
// documents it, written out here, as a map's user would, from the keys the
// benchmark gives the allocator. It starts at the destination's keyed port
// offset plus its perturb slot, walks the range with step 2 (ports of low's
// parity, then the others; in a range of odd size, the one port the first
// pass leaves out last) or 1 (Flat), and a port taken advances the slot by
// the port's index in its pass, at least a keyed random multiple of the
// step below 8 steps, plus the step.
type connScan struct {
	low, high, step uint32 // high is one past the last port
	offset          uint32 // keyed offset of the destination
	index           uint32 // of the destination's perturb slot
	slot            uint32 // its value
	inc0, inc1      uint64 // key of the random part of an advance
}

func newConnScan(rng hash4.PortRange, policy hash4.Policy) *connScan {
	s := &connScan{low: uint32(rng.Low), high: uint32(rng.High) + 1, step: 2}
	if policy == hash4.Flat {
		s.step = 1
	}
	l, r := benchkit.ConnLocal.As16(), benchkit.ConnRemote.Addr().As16()
	msg := append(append(l[:], r[:]...), byte(benchkit.ConnRemote.Port()>>8), byte(benchkit.ConnRemote.Port()))
	off := siphash.Hash(benchkit.ConnK0, benchkit.ConnK1, msg)
	s.offset, s.index = uint32(off>>32), uint32(off&0xffff)
	// The perturb table and the advance key, from the seed.
	var seed [32]byte
	binary.LittleEndian.PutUint64(seed[:8], benchkit.ConnSeed)
	copy(seed[8:], "hash4 perturb seed")
	src := rand.NewChaCha8(seed)
	for i := uint32(0); i < 1<<16; i += 2 {
		v := src.Uint64()
		switch s.index {
		case i:
			s.slot = uint32(v)
		case i + 1:
			s.slot = uint32(v >> 32)
		}
	}
	s.inc0, s.inc1 = src.Uint64(), src.Uint64()
	return s
}

// selectPort returns the first candidate for which try returns true, and
// advances the perturb slot.
func (s *connScan) selectPort(try func(uint16) bool) (uint16, bool) {
	n := s.high - s.low
	if s.step == 2 && n > 1 {
		n &^= 1
	}
	start := (s.slot + s.offset) % n
	if s.step == 2 {
		start &^= 1
	}
	pass := func(offset, from, to uint32) (uint16, uint32, bool) {
		port := s.low + offset
		for i := from; i < to; i += s.step {
			if try(uint16(port)) {
				return uint16(port), i, true
			}
			if port += s.step; port >= s.high {
				port -= n
			}
		}
		return 0, 0, false
	}
	p, i, ok := pass(start, 0, n)
	if !ok && s.step == 2 && n > 1 {
		p, i, ok = pass(start+1, 0, n)
		if !ok && (s.high-s.low)&1 == 1 {
			left := uint32(0) // low, or the last port if the first pass began at low
			if start == 0 {
				left = s.high - 1 - s.low
			}
			p, i, ok = pass(left, n-1, n)
		}
	}
	if !ok {
		return 0, false
	}
	var b [8]byte
	binary.LittleEndian.PutUint32(b[0:4], s.index)
	binary.LittleEndian.PutUint32(b[4:8], s.slot)
	if r := uint32(siphash.Hash(s.inc0, s.inc1, b[:])&7) * s.step; r > i {
		i = r
	}
	s.slot += i + s.step
	return p, true
}

func BenchmarkConnect(b *testing.B) {
	for _, policy := range []hash4.Policy{hash4.OddEven, hash4.Flat} {
		for _, occ := range benchkit.ConnOccupancies {
			for _, impl := range connBenchImpls {
				occName, _ := benchkit.ConnOccupancy(occ, hash4.DefaultPortRange.Size())
				name := "policy=" + strings.ToLower(policy.String()) + "/" + occName + "/impl=" + impl.name
				b.Run(name, func(b *testing.B) {
					s := newConnBenchState(impl.new, hash4.DefaultPortRange, policy, occ)
					b.ReportAllocs()
					for b.Loop() {
						s.Op()
					}
				})
			}
		}
	}
}

// newConnBenchState returns an implementation made by newImpl for rng and
// policy, with a random occ per mille of rng in use (see
// benchkit.NewConnState).
func newConnBenchState(newImpl func(hash4.PortRange, hash4.Policy, int) benchkit.Conn, rng hash4.PortRange, policy hash4.Policy, occ int) *benchkit.ConnState {
	_, inUse := benchkit.ConnOccupancy(occ, rng.Size())
	return benchkit.NewConnState(newImpl(rng, policy, rng.Size()), rng.Low, rng.High, policy == hash4.OddEven, inUse)
}

// TestConnectBenchImplsAgree checks the premise of BenchmarkConnect: both
// implementations take the same ports, so they do the same scans, under
// both policies, in ranges of even and odd size, down to the last free port.
func TestConnectBenchImplsAgree(t *testing.T) {
	for _, policy := range []hash4.Policy{hash4.Flat, hash4.OddEven} {
		for _, rng := range []hash4.PortRange{{Low: 40000, High: 41999}, {Low: 40000, High: 40998}, {Low: 50001, High: 50005}} {
			var want []uint16
			for _, impl := range connBenchImpls {
				s := newConnBenchState(impl.new, rng, policy, 900)
				var got []uint16
				for range 1000 {
					got = append(got, s.Op())
				}
				require.Len(t, s.Live, rng.Size()*900/1000, impl.name)
				// Then fill the range: the last ports come from the
				// second pass and, in a range of odd size, the port the
				// first pass leaves out.
				for range rng.Size() - len(s.Live) {
					got = append(got, s.C.Connect())
				}
				if want == nil {
					want = got
					continue
				}
				require.Equal(t, want, got, "%s, %v, %v", impl.name, policy, rng)
			}
		}
	}
}
