package bench

// Benchmarks on the shapes of real traffic, e.g.
// BenchmarkZipf/n=1M/impl=hash4:
//
//   - BenchmarkTurnover: each op deletes a random live flow and inserts a
//     new one, unrelated to it, that left the table long ago: both cold.
//   - BenchmarkZipf: lookups whose flows follow a Zipf law (s = 1.1), the
//     hot flows at random places in the table and in memory.
//   - BenchmarkNATMix: of every 100 ops, 98 Zipf lookups and one turnover
//     (its delete and its insert, one op each).
//   - BenchmarkBurst: lookups 16 at a time, of uniformly random flows
//     (mix=uniform) or as NATMix (mix=nat, the turnover between bursts):
//     Table.AppendLookups (impl=hash4-batch) against loops of Lookup
//     (impl=hash4) and of each peer's lookup (the RWMutex map's under one
//     RLock per burst). Time per op is per lookup (or write).
//
// The table holds n flows, half IPv4 and half IPv6, split between the
// goroutines as a NIC's receive-side scaling splits them between cores:
// each goroutine looks up, deletes and inserts its own share only, and the
// Zipf law ranks the flows of each share. A flow that a turnover deletes
// joins the back of its share's queue of flows not in the table, and the
// flow it inserts leaves the front of that queue: so it was deleted n/G
// turnovers ago (G goroutines), and its lines are cold.
//
// Each implementation is keyed in its own form, built outside the timer:
// hash4 by Tuple, whose conversion to its key form it does in every call,
// and the peers by flowKey, a flat 36-byte struct, which costs them none.
// hash4 has its default options but for its capacity; every map is sized
// for n. Run each implementation in a process of its own, in alternating
// rounds, from the repository's root:
//
//	for i in 1 2 3 4 5 6; do
//		for impl in hash4 xsync rwmutex syncmap; do
//			go test -run '^$' -bench "^Benchmark(Turnover|Zipf|NATMix|Burst)$/.*/impl=$impl(-batch)?$" -benchmem -count 1 ./bench
//		done
//	done > traffic.txt
//	benchstat -col /impl traffic.txt

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/hash4/hash4"
	"github.com/hash4/hash4/internal/benchkit"
	"github.com/puzpuzpuz/xsync/v4"
)

// flowKey is the peers' key: a flow's addresses (IPv4 as IPv4-mapped) and
// ports, 36 bytes with no pointer and no padding.
type flowKey struct {
	local, remote [16]byte
	lport, rport  uint16
}

func flowKeyOf(t Tuple) flowKey {
	return flowKey{t.Local.Addr().As16(), t.Remote.Addr().As16(), t.Local.Port(), t.Remote.Port()}
}

// flowMap is an implementation of the traffic benchmarks, keyed by K.
type flowMap[K comparable] interface {
	lookup(k *K) *benchVal
	insert(k *K, v *benchVal)
	delete(k *K)
	// lookupBurst appends the values of keys to dst.
	lookupBurst(dst []*benchVal, keys []K) []*benchVal
}

// trafficImpl makes an implementation and runs a benchmark on it.
type trafficImpl struct {
	name string
	run  func(b *testing.B, n int, body trafficBody)
}

// trafficBody is a benchmark's work, on the flows of one state (see
// flowRun).
type trafficBody int

const (
	bodyTurnover trafficBody = iota
	bodyZipf
	bodyNATMix
	bodyBurstUniform
	bodyBurstNAT
)

func (bd trafficBody) String() string {
	return [...]string{"turnover", "zipf", "natmix", "burst-uniform", "burst-nat"}[bd]
}

var trafficImpls = []trafficImpl{
	{"hash4", func(b *testing.B, n int, bd trafficBody) {
		flowRun(b, "hash4", n, bd, func(t Tuple) Tuple { return t }, func() flowMap[Tuple] {
			return flowHash4{hash4.New[benchVal](hash4.WithCapacity(n)), false}
		})
	}},
	{"hash4-lf1", func(b *testing.B, n int, bd trafficBody) {
		flowRun(b, "hash4-lf1", n, bd, func(t Tuple) Tuple { return t }, func() flowMap[Tuple] {
			return flowHash4{hash4.New[benchVal](hash4.WithCapacity(2 * n)), false}
		})
	}},
	{"hash4-batch", func(b *testing.B, n int, bd trafficBody) {
		flowRun(b, "hash4-batch", n, bd, func(t Tuple) Tuple { return t }, func() flowMap[Tuple] {
			return flowHash4{hash4.New[benchVal](hash4.WithCapacity(n)), true}
		})
	}},
	// The table with each hasher named, for BenchmarkTrafficHasher.
	{"hash4-linux", func(b *testing.B, n int, bd trafficBody) {
		flowRun(b, "hash4-linux", n, bd, func(t Tuple) Tuple { return t }, func() flowMap[Tuple] {
			return flowHash4{hash4.New[benchVal](hash4.WithCapacity(n), hash4.WithHasher(hash4.LinuxHasher)), bd >= bodyBurstUniform}
		})
	}},
	{"hash4-fold", func(b *testing.B, n int, bd trafficBody) {
		flowRun(b, "hash4-fold", n, bd, func(t Tuple) Tuple { return t }, func() flowMap[Tuple] {
			return flowHash4{hash4.New[benchVal](hash4.WithCapacity(n), hash4.WithHasher(hash4.FoldHasher)), bd >= bodyBurstUniform}
		})
	}},
	{"xsync", func(b *testing.B, n int, bd trafficBody) {
		flowRun(b, "xsync", n, bd, flowKeyOf, func() flowMap[flowKey] {
			return flowXsync{xsync.NewMap[flowKey, *benchVal](xsync.WithPresize(n))}
		})
	}},
	{"rwmutex", func(b *testing.B, n int, bd trafficBody) {
		flowRun(b, "rwmutex", n, bd, flowKeyOf, func() flowMap[flowKey] {
			return &flowRWMap{m: make(map[flowKey]*benchVal, n)}
		})
	}},
	{"syncmap", func(b *testing.B, n int, bd trafficBody) {
		flowRun(b, "syncmap", n, bd, flowKeyOf, func() flowMap[flowKey] {
			return new(flowSyncMap)
		})
	}},
}

// flowHash4 is a Table; batch makes lookupBurst one AppendLookups rather
// than a loop of Lookup.
type flowHash4 struct {
	t     *hash4.Table[benchVal]
	batch bool
}

func (m flowHash4) lookup(k *Tuple) *benchVal { v, _ := m.t.Lookup(*k); return v }
func (m flowHash4) delete(k *Tuple) {
	if _, ok := m.t.Delete(*k); !ok {
		panic("hash4: flow not found")
	}
}
func (m flowHash4) insert(k *Tuple, v *benchVal) {
	if err := m.t.Insert(*k, v); err != nil {
		panic(err)
	}
}
func (m flowHash4) lookupBurst(dst []*benchVal, keys []Tuple) []*benchVal {
	if m.batch {
		return m.t.AppendLookups(dst, keys)
	}
	for i := range keys {
		v, _ := m.t.Lookup(keys[i])
		dst = append(dst, v)
	}
	return dst
}

type flowXsync struct {
	m *xsync.Map[flowKey, *benchVal]
}

func (m flowXsync) lookup(k *flowKey) *benchVal { v, _ := m.m.Load(*k); return v }
func (m flowXsync) delete(k *flowKey) {
	if _, ok := m.m.LoadAndDelete(*k); !ok {
		panic("xsync: flow not found")
	}
}
func (m flowXsync) insert(k *flowKey, v *benchVal) { m.m.Store(*k, v) }
func (m flowXsync) lookupBurst(dst []*benchVal, keys []flowKey) []*benchVal {
	for i := range keys {
		v, _ := m.m.Load(keys[i])
		dst = append(dst, v)
	}
	return dst
}

type flowRWMap struct {
	mu sync.RWMutex
	m  map[flowKey]*benchVal
}

func (m *flowRWMap) lookup(k *flowKey) *benchVal {
	m.mu.RLock()
	v := m.m[*k]
	m.mu.RUnlock()
	return v
}
func (m *flowRWMap) delete(k *flowKey) {
	m.mu.Lock()
	_, ok := m.m[*k]
	delete(m.m, *k)
	m.mu.Unlock()
	if !ok {
		panic("rwmutex: flow not found")
	}
}
func (m *flowRWMap) insert(k *flowKey, v *benchVal) {
	m.mu.Lock()
	m.m[*k] = v
	m.mu.Unlock()
}
func (m *flowRWMap) lookupBurst(dst []*benchVal, keys []flowKey) []*benchVal {
	m.mu.RLock()
	for i := range keys {
		dst = append(dst, m.m[keys[i]])
	}
	m.mu.RUnlock()
	return dst
}

type flowSyncMap struct{ m sync.Map }

func (m *flowSyncMap) lookup(k *flowKey) *benchVal {
	v, ok := m.m.Load(*k)
	if !ok {
		return nil
	}
	return v.(*benchVal)
}
func (m *flowSyncMap) delete(k *flowKey) {
	if _, ok := m.m.LoadAndDelete(*k); !ok {
		panic("syncmap: flow not found")
	}
}
func (m *flowSyncMap) insert(k *flowKey, v *benchVal) { m.m.Store(*k, v) }
func (m *flowSyncMap) lookupBurst(dst []*benchVal, keys []flowKey) []*benchVal {
	for i := range keys {
		dst = append(dst, m.lookup(&keys[i]))
	}
	return dst
}

// trafficZipfS is the exponent of the flows' Zipf law.
const trafficZipfS = 1.1

// trafficStream is the number of lookups drawn in advance for each share,
// repeated as the benchmark runs.
const trafficStream = 1 << 20

// flowShare is the flows of one goroutine, in the form K of one
// implementation.
type flowShare[K comparable] struct {
	live  []K      // the share's flows in the table
	queue []K      // a ring of the share's flows not in the table
	q     int      // the front of queue
	zipf  []uint32 // indexes into live, drawn from the Zipf law
	z     int
	walk  []K // live shuffled, for uniform lookups (no turnover)
	w     int
	rng   benchkit.Rand
	val   benchVal
}

// turnover deletes a random flow of the share and inserts the flow at the
// front of its queue in its place.
func (s *flowShare[K]) turnover(m flowMap[K]) {
	j := int((s.rng.Next() >> 32) * uint64(len(s.live)) >> 32)
	m.delete(&s.live[j])
	m.insert(&s.queue[s.q], &s.val)
	s.live[j], s.queue[s.q] = s.queue[s.q], s.live[j]
	if s.q++; s.q == len(s.queue) {
		s.q = 0
	}
}

// nextZipf returns the next flow of the share's Zipf stream.
func (s *flowShare[K]) nextZipf() *K {
	k := &s.live[s.zipf[s.z]]
	if s.z++; s.z == len(s.zipf) {
		s.z = 0
	}
	return k
}

// nextUniform returns the next flow of the share's walk.
func (s *flowShare[K]) nextUniform() *K {
	k := &s.walk[s.w]
	if s.w++; s.w == len(s.walk) {
		s.w = 0
	}
	return k
}

// flowState is an implementation filled with the flows, and their shares.
type flowState[K comparable] struct {
	m      flowMap[K]
	shares []*flowShare[K]
}

// flowCache keeps one state between the runs of a sub-benchmark.
var flowCache struct {
	key   string
	state any
}

// trafficTuples returns 2n distinct flows, half IPv4 and half IPv6, the
// same in every process.
func trafficTuples(n int) []Tuple {
	r := rand.New(rand.NewPCG(46, uint64(n)))
	tups := make([]Tuple, 2*n)
	for i := range tups {
		tups[i] = benchkit.Key[Tuple](r, i, i%2 == 0)
	}
	return tups
}

// flowPrepare returns a state of the implementation made by mk, holding n
// flows, kept from the last call if that was for the same implementation,
// body and goroutine count. It stops the timer while it builds one; the
// caller resets it.
func flowPrepare[K comparable](b *testing.B, impl string, n int, bd trafficBody, conv func(Tuple) K, mk func() flowMap[K]) *flowState[K] {
	b.StopTimer()
	defer b.StartTimer()
	procs := runtime.GOMAXPROCS(0)
	key := fmt.Sprintf("%s/%d/%v/%d", impl, n, bd, procs)
	if st, ok := flowCache.state.(*flowState[K]); ok && flowCache.key == key {
		return st
	}
	flowCache.state = nil
	runtime.GC()
	tups := trafficTuples(n)
	r := rand.New(rand.NewPCG(47, uint64(n)))
	st := &flowState[K]{m: mk()}
	per := n / procs
	for g := range procs {
		s := &flowShare[K]{live: make([]K, per), queue: make([]K, per), rng: benchkit.Rand(uint64(g)*0x9e3779b97f4a7c15 + 1)}
		for i := range per {
			s.live[i] = conv(tups[g*per+i])
			s.queue[i] = conv(tups[n+g*per+i])
		}
		// Ranks to flows: the hot flows at random places.
		perm := r.Perm(per)
		zipf := rand.NewZipf(r, trafficZipfS, 1, uint64(per-1))
		s.zipf = make([]uint32, trafficStream)
		for i := range s.zipf {
			s.zipf[i] = uint32(perm[zipf.Uint64()])
		}
		s.z = r.IntN(trafficStream)
		if bd == bodyBurstUniform {
			s.walk = make([]K, per)
			for i, j := range r.Perm(per) {
				s.walk[i] = s.live[j]
			}
		}
		st.shares = append(st.shares, s)
	}
	tups = nil
	// Filled in an order unrelated to that of the lookups.
	for _, i := range r.Perm(per * procs) {
		s := st.shares[i/per]
		st.m.insert(&s.live[i%per], &s.val)
	}
	flowCache.key, flowCache.state = key, st
	runtime.GC()
	return st
}

// trafficCycle is the length of NATMix's cycle of ops: 98 lookups and the
// delete and insert of one turnover.
const trafficCycle = 100

// trafficBurst is the number of lookups in a burst.
const trafficBurst = 16

// flowRun runs body bd on a state of the implementation made by mk.
func flowRun[K comparable](b *testing.B, impl string, n int, bd trafficBody, conv func(Tuple) K, mk func() flowMap[K]) {
	st := flowPrepare(b, impl, n, bd, conv, mk)
	m := st.m
	if bd == bodyTurnover {
		b.ReportAllocs()
	}
	b.ResetTimer()
	var gid atomic.Uint64
	b.RunParallel(func(pb *testing.PB) {
		s := st.shares[int(gid.Add(1)-1)%len(st.shares)]
		misses := 0
		switch bd {
		case bodyTurnover:
			for pb.Next() {
				s.turnover(m)
			}
		case bodyZipf:
			for pb.Next() {
				if m.lookup(s.nextZipf()) == nil {
					misses++
				}
			}
		case bodyNATMix:
			for c := 0; pb.Next(); {
				if c++; c < trafficCycle-1 {
					if m.lookup(s.nextZipf()) == nil {
						misses++
					}
					continue
				}
				// The turnover's two ops.
				s.turnover(m)
				c = 0
				if !pb.Next() {
					break
				}
			}
		case bodyBurstUniform, bodyBurstNAT:
			var keys [trafficBurst]K
			vals := make([]*benchVal, 0, trafficBurst)
			for more, owed := true, 0; more; {
				// mix=nat: a turnover (two ops) between bursts
				// once 98 lookups have run since the last, so
				// that no burst holds a flow deleted since it
				// was gathered.
				if bd == bodyBurstNAT && owed >= trafficCycle-2 {
					owed -= trafficCycle - 2
					if !pb.Next() {
						break
					}
					s.turnover(m)
					if !pb.Next() {
						break
					}
				}
				k := 0
				for ; k < trafficBurst; k++ {
					if more = pb.Next(); !more {
						break
					}
					if bd == bodyBurstUniform {
						keys[k] = *s.nextUniform()
					} else {
						keys[k] = *s.nextZipf()
					}
				}
				owed += k
				vals = m.lookupBurst(vals[:0], keys[:k])
				for _, v := range vals {
					if v == nil {
						misses++
					}
				}
			}
		}
		if misses > 0 {
			b.Errorf("%d lookups of present flows missed", misses)
		}
	})
}

// trafficEach runs bd for every implementation of impls.
func trafficEach(b *testing.B, bd trafficBody, prefix string, impls ...string) {
	for _, impl := range trafficImpls {
		for _, name := range impls {
			if impl.name == name {
				b.Run(fmt.Sprintf("n=1M/%simpl=%s", prefix, impl.name), func(b *testing.B) {
					impl.run(b, 1<<20, bd)
				})
			}
		}
	}
}

var trafficPeers = []string{"hash4", "hash4-lf1", "xsync", "rwmutex", "syncmap"}

// BenchmarkTurnover measures turnover ops: the delete of a random flow and
// the insert of a new one, both cold, as one op.
func BenchmarkTurnover(b *testing.B) { trafficEach(b, bodyTurnover, "", trafficPeers...) }

// BenchmarkZipf measures lookups of flows drawn from a Zipf law.
func BenchmarkZipf(b *testing.B) { trafficEach(b, bodyZipf, "", trafficPeers...) }

// BenchmarkNATMix measures 98 Zipf lookups and one turnover (two ops) in
// every 100 ops.
func BenchmarkNATMix(b *testing.B) { trafficEach(b, bodyNATMix, "", trafficPeers...) }

// BenchmarkBurst measures lookups in bursts of 16, of uniformly random
// flows (mix=uniform) or as NATMix (mix=nat).
func BenchmarkBurst(b *testing.B) {
	impls := append([]string{"hash4-batch"}, trafficPeers...)
	trafficEach(b, bodyBurstUniform, "mix=uniform/", impls...)
	trafficEach(b, bodyBurstNAT, "mix=nat/", impls...)
}

// BenchmarkTrafficHasher runs every workload above on a table with
// LinuxHasher and one with FoldHasher, bursts through AppendLookups: the
// measure by which New's default hasher is chosen (docs/performance.md,
// "The hasher").
func BenchmarkTrafficHasher(b *testing.B) {
	for _, bd := range []trafficBody{bodyTurnover, bodyZipf, bodyNATMix, bodyBurstUniform, bodyBurstNAT} {
		trafficEach(b, bd, fmt.Sprintf("body=%v/", bd), "hash4-linux", "hash4-fold")
	}
}
