package bench

// Benchmarks on the shapes of real traffic, at 1M flows, half IPv4 and
// half IPv6, e.g. BenchmarkZipf/n=1M/impl=hash4:
//
//   - BenchmarkZipf: lookups whose flows follow a Zipf law (s = 1.1), the
//     hot flows at random places in the table.
//   - BenchmarkTurnover: each op deletes a random live flow and inserts a
//     new one, unrelated to it, that left the table long ago: both cold.
//   - BenchmarkNATMix: of every 100 ops, 98 Zipf lookups and one turnover
//     (its delete and its insert, one op each).
//   - BenchmarkUniform: lookups of every flow in turn, in a random order.
//   - BenchmarkUniformWrites: of every 20 ops, 18 uniform lookups and one
//     turnover (two ops): 90% lookups, 10% writes.
//   - BenchmarkBurst: lookups 16 at a time, uniform (mix=uniform) or as
//     NATMix (mix=nat, the turnover between bursts): Table.AppendLookups
//     (impl=hash4-batch) against loops of Lookup (impl=hash4) and of each
//     peer's lookup (the RWMutex map's under one RLock per burst). Time
//     per op is per lookup (or write).
//
// The peers: xsync (xsync v4's Map), syncmap (sync.Map), rwmutex (a Go
// map behind one sync.RWMutex) and shard256 (256 Go maps, each behind a
// sync.RWMutex of its own, chosen by a seeded hash of the key's words).
// Every map but sync.Map is sized for the flows up front; hash4 has its
// default options but for its capacity.
//
// The table holds the flows, split between the goroutines as a NIC's
// receive-side scaling splits them between cores: each goroutine looks
// up, deletes and inserts its own share only, and the Zipf law ranks the
// flows of each share. A flow that a turnover deletes joins the back of
// its share's queue of flows not in the table, and the flow it inserts
// leaves the front of that queue: so it was deleted n/G turnovers ago (G
// goroutines), and its lines are cold.
//
// Each implementation is keyed in its own form, built outside the timer:
// hash4 by Tuple, whose conversion to its key form it does in every call,
// and the peers by flowKey, a flat 36-byte struct, which costs them none.
//
// Which flows are hot, where keys live, what stays warm and how many flows
// n=1M is are choices that can move hash4's ratio to its peers. The
// -traffic.* flags (trafficFlags) make each, and their defaults are the
// hardest for hash4 of those measured one at a time, or, where none moved
// the ratio beyond the noise of alternating rounds, the one closest to a
// gateway (docs/performance.md, "Traffic shapes"):
//
//   - hot=last: the table is filled coldest flow first, so that the
//     hottest flows of each share are the last inserted. A flow takes its
//     bucket's home slot if it is free when it arrives, so hash4 finds
//     early flows at home more often than late ones, which cost it more
//     lines; and a peer that allocates an entry per insert (xsync) finds
//     the late, hot entries side by side in memory. Filled in an order
//     unrelated to the ranks (hot=random), hash4 read clearly better
//     ratios in Zipf and NATMix.
//   - keys=packed: each implementation's keys side by side in its own
//     form, as a program holds them (a 36-byte key straddles two lines
//     one time in two, a 64-byte Tuple never); every key on a line of its
//     own, or read in the order of the ops, did not move the ratios.
//   - law=share: each goroutine looks up its own flows, as receive-side
//     scaling gives them; one law over all flows for both did not move
//     the ratio.
//   - warm=kept: the filled state is kept between the runs of a
//     sub-benchmark, as a gateway's table lives on; a fresh fill per run
//     did not move the ratios beyond their noise, and costs a fill per run.
//   - flows=1<<20, against tables sized for them; 1,000,000 flows left
//     hash4's table (sized for 2^20 either way) less full, and read lower
//     ratios.
//
// Each implementation reports its CPU time per op (cpu-ns/op) beside its
// time, and the share of the machine's processors that other work kept
// busy during its run (others-share).
//
// Measure with cmd/ratios, which builds this package's test binary once,
// runs each implementation in a process of its own, in rounds that
// alternate their order, and prints hash4's ratio to the fastest peer in
// each round and the median of those ratios; from the repository's root:
//
//	go run ./bench/cmd/ratios -rounds 6 -o traffic.txt
//	go run ./bench/cmd/ratios -rounds 6 -base ../hash4-main   # this hash4 over another checkout's
//	go run ./bench/cmd/ratios -work Zipf -variant line=-traffic.keys=line
//
// One implementation by hand: go test -run '^$' -benchmem
// -bench '^BenchmarkZipf$/^n=1M$/^impl=xsync$' ./bench

import (
	"encoding/binary"
	"flag"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/hash4/hash4"
	"github.com/hash4/hash4/bench/internal/machine"
	"github.com/hash4/hash4/internal/benchkit"
	"github.com/puzpuzpuz/xsync/v4"
)

// trafficFlags choose the variant of the traffic benchmarks; the file's
// comment says why their defaults are what they are.
var trafficFlags = struct {
	keys, hot, law, warm *string
	flows                *int
}{
	keys: flag.String("traffic.keys", "packed",
		"where the traffic benchmarks' keys live: packed (each implementation's keys side by side, in its form), "+
			"line (every key on a cache line of its own) or stream (lookups read their keys in the order of the ops; "+
			"Zipf, Uniform and Burst mix=uniform only)"),
	hot: flag.String("traffic.hot", "last",
		"which flows are hot, by their place in the fill: last (the hottest inserted last), first (inserted first) or random"),
	law: flag.String("traffic.law", "share",
		"share (each goroutine looks up its own flows, ranked by a law of their own) or shared (every goroutine draws "+
			"from one law over all flows; the workloads that write keep shares)"),
	warm: flag.String("traffic.warm", "kept",
		"kept (the filled state is kept between the runs of a sub-benchmark) or fresh (filled anew for each run)"),
	flows: flag.Int("traffic.flows", 1<<20, "the number of flows of n=1M"),
}

// trafficOpts is the variant the flags chose.
type trafficOpts struct {
	keys, hot, law, warm string
	flows                int
}

// trafficOptions returns the variant of the flags, or an error for a value
// none knows.
func trafficOptions() (trafficOpts, error) {
	o := trafficOpts{*trafficFlags.keys, *trafficFlags.hot, *trafficFlags.law, *trafficFlags.warm, *trafficFlags.flows}
	for _, c := range []struct {
		name, v string
		ok      []string
	}{
		{"keys", o.keys, []string{"packed", "line", "stream"}},
		{"hot", o.hot, []string{"random", "first", "last"}},
		{"law", o.law, []string{"share", "shared"}},
		{"warm", o.warm, []string{"kept", "fresh"}},
	} {
		found := false
		for _, ok := range c.ok {
			found = found || c.v == ok
		}
		if !found {
			return o, fmt.Errorf("-traffic.%s=%q: want one of %q", c.name, c.v, c.ok)
		}
	}
	if o.flows < 2*runtime.GOMAXPROCS(0) {
		return o, fmt.Errorf("-traffic.flows=%d: want at least two per goroutine", o.flows)
	}
	return o, nil
}

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

// trafficImpl is an implementation: run runs a benchmark on it, and check
// runs turnovers on a small state of it and checks what it holds.
type trafficImpl struct {
	name  string
	run   func(b *testing.B, bd trafficBody)
	check func(t *testing.T, o trafficOpts, bd trafficBody)
}

// flowImpl returns the implementation name that mk makes, sized for n
// flows and keyed by K, which conv converts Tuples to.
func flowImpl[K comparable](name string, conv func(Tuple) K, mk func(n int, bd trafficBody) flowMap[K]) trafficImpl {
	return trafficImpl{
		name,
		func(b *testing.B, bd trafficBody) { flowRun(b, name, bd, conv, mk) },
		func(t *testing.T, o trafficOpts, bd trafficBody) { flowCheck(t, o, bd, conv, mk) },
	}
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
	bodyUniform
	bodyUniformWrites
)

func (bd trafficBody) String() string {
	return [...]string{"turnover", "zipf", "natmix", "burst-uniform", "burst-nat", "uniform", "uniform-writes"}[bd]
}

// readOnly reports whether bd only looks flows up.
func (bd trafficBody) readOnly() bool {
	return bd == bodyZipf || bd == bodyUniform || bd == bodyBurstUniform
}

// batched reports whether bd looks flows up in bursts.
func (bd trafficBody) batched() bool { return bd == bodyBurstUniform || bd == bodyBurstNAT }

func sameTuple(t Tuple) Tuple { return t }

var trafficImpls = []trafficImpl{
	flowImpl("hash4", sameTuple, func(n int, _ trafficBody) flowMap[Tuple] {
		return flowHash4{hash4.New[benchVal](hash4.WithCapacity(n)), false}
	}),
	// The table sized for half its flows, two per bucket, the load past
	// which it grows itself (docs/performance.md, "Load factor").
	flowImpl("hash4-half", sameTuple, func(n int, _ trafficBody) flowMap[Tuple] {
		return flowHash4{hash4.New[benchVal](hash4.WithCapacity(n / 2)), false}
	}),
	flowImpl("hash4-batch", sameTuple, func(n int, _ trafficBody) flowMap[Tuple] {
		return flowHash4{hash4.New[benchVal](hash4.WithCapacity(n)), true}
	}),
	// The table with each hasher named, for BenchmarkTrafficHasher.
	flowImpl("hash4-linux", sameTuple, func(n int, bd trafficBody) flowMap[Tuple] {
		return flowHash4{hash4.New[benchVal](hash4.WithCapacity(n), hash4.WithHasher(hash4.LinuxHasher)), bd.batched()}
	}),
	flowImpl("hash4-fold", sameTuple, func(n int, bd trafficBody) flowMap[Tuple] {
		return flowHash4{hash4.New[benchVal](hash4.WithCapacity(n), hash4.WithHasher(hash4.FoldHasher)), bd.batched()}
	}),
	flowImpl("xsync", flowKeyOf, func(n int, _ trafficBody) flowMap[flowKey] {
		return flowXsync{xsync.NewMap[flowKey, *benchVal](xsync.WithPresize(n))}
	}),
	flowImpl("rwmutex", flowKeyOf, func(n int, _ trafficBody) flowMap[flowKey] {
		return &flowRWMap{m: make(map[flowKey]*benchVal, n)}
	}),
	flowImpl("shard256", flowKeyOf, func(n int, _ trafficBody) flowMap[flowKey] { return newFlowShards(n) }),
	flowImpl("syncmap", flowKeyOf, func(int, trafficBody) flowMap[flowKey] { return new(flowSyncMap) }),
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
		panic("rwmutex, shard256: flow not found")
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

// flowShards is the sharded map a Go program writes: 256 maps, each behind
// a sync.RWMutex of its own on a cache line of its own, the shard chosen by
// the top byte of a seeded multiply-xor hash of the key's words (cheaper
// than a second full hash; the map within hashes the key again, with its
// own seed). A burst takes each shard's lock per lookup, as its flows fall
// in different shards.
type flowShards struct {
	seed   uint64
	shards [256]flowShard
}

// flowShard is a shard, on a cache line of its own.
type flowShard struct {
	flowRWMap
	_ [64 - unsafe.Sizeof(flowRWMap{})%64]byte
}

// newFlowShards returns a sharded map sized for n flows: each shard for
// its share and a margin of 1/8, about 9 standard deviations of its count
// at 1M flows, so that none grows.
func newFlowShards(n int) *flowShards {
	m := &flowShards{seed: rand.Uint64() | 1}
	per := n / len(m.shards)
	for i := range m.shards {
		m.shards[i].m = make(map[flowKey]*benchVal, per+per/8)
	}
	return m
}

func (m *flowShards) shard(k *flowKey) *flowShard {
	le := binary.LittleEndian
	h := (le.Uint64(k.local[8:]) ^ le.Uint64(k.remote[:8]) ^ m.seed) * 0x9e3779b97f4a7c15
	h ^= (le.Uint64(k.remote[8:]) ^ uint64(k.lport)<<16 ^ uint64(k.rport) ^ le.Uint64(k.local[:8])) * 0xc2b2ae3d27d4eb4f
	return &m.shards[(h^h>>29)*0xbf58476d1ce4e5b9>>56]
}

// lookup is flowRWMap's, written out: a call would cost a lookup a few
// percent.
func (m *flowShards) lookup(k *flowKey) *benchVal {
	s := m.shard(k)
	s.mu.RLock()
	v := s.m[*k]
	s.mu.RUnlock()
	return v
}
func (m *flowShards) delete(k *flowKey)              { m.shard(k).delete(k) }
func (m *flowShards) insert(k *flowKey, v *benchVal) { m.shard(k).insert(k, v) }
func (m *flowShards) lookupBurst(dst []*benchVal, keys []flowKey) []*benchVal {
	for i := range keys {
		dst = append(dst, m.lookup(&keys[i]))
	}
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

// keySlab is an array of keys of type K, stride bytes apart: the keys side
// by side (stride their size), or each at the start of a line of its own.
type keySlab[K any] struct {
	p      unsafe.Pointer
	stride uintptr
	n      int
	mem    any // the slice that holds them, typed for the collector
}

// lineKey is a flowKey alone on a cache line.
type lineKey struct {
	k flowKey
	_ [64 - unsafe.Sizeof(flowKey{})]byte
}

// newKeySlab returns a slab of n keys, each alone on a line if line is
// set (Tuple already is: 64 bytes, in an array that starts a page).
func newKeySlab[K any](n int, line bool) keySlab[K] {
	var k K
	if line && unsafe.Sizeof(k) < 64 {
		if _, ok := any(k).(flowKey); !ok {
			panic(fmt.Sprintf("no line layout for %T", k))
		}
		s := make([]lineKey, n+1)
		p := unsafe.Pointer(unsafe.SliceData(s))
		p = unsafe.Add(p, (64-uintptr(p)%64)%64) // s has a line to spare
		return keySlab[K]{p, 64, n, s}
	}
	s := make([]K, n)
	return keySlab[K]{unsafe.Pointer(unsafe.SliceData(s)), unsafe.Sizeof(k), n, s}
}

// at returns the i'th key.
func (s keySlab[K]) at(i int) *K { return (*K)(unsafe.Add(s.p, uintptr(i)*s.stride)) }

// trafficZipfS is the exponent of the flows' Zipf law.
const trafficZipfS = 1.1

// trafficStream is the number of Zipf lookups drawn in advance for each
// goroutine (at most 8 per flow it draws from), repeated as the benchmark
// runs.
const trafficStream = 1 << 20

// flowShare is the flows of one goroutine, in the form K of one
// implementation.
type flowShare[K comparable] struct {
	live   keySlab[K] // every flow in the table: this share's at [lo, lo+per)
	lo     int
	per    int
	queue  keySlab[K] // a ring of the share's flows not in the table
	q      int        // the front of queue
	zipf   []uint32   // indexes into live, drawn from the Zipf law
	z      int
	unif   []uint32 // indexes into live in a random order, each once
	u      int
	zkeys  keySlab[K] // for -traffic.keys=stream, live[zipf[i]] and
	ukeys  keySlab[K] // live[unif[i]], copied
	rng    benchkit.Rand
	val    benchVal
	stream bool
}

// turnover deletes a random flow of the share and inserts the flow at the
// front of its queue in its place.
func (s *flowShare[K]) turnover(m flowMap[K]) {
	j := s.lo + int((s.rng.Next()>>32)*uint64(s.per)>>32)
	live, next := s.live.at(j), s.queue.at(s.q)
	m.delete(live)
	m.insert(next, &s.val)
	*live, *next = *next, *live
	if s.q++; s.q == s.queue.n {
		s.q = 0
	}
}

// nextZipf returns the next flow of the share's Zipf stream.
func (s *flowShare[K]) nextZipf() *K { return s.next(s.zipf, &s.z, s.zkeys) }

// nextUniform returns the next flow of the share's uniform stream.
func (s *flowShare[K]) nextUniform() *K { return s.next(s.unif, &s.u, s.ukeys) }

// next returns the flow at *pos in stream, from the copies in keys under
// -traffic.keys=stream, and moves *pos on.
func (s *flowShare[K]) next(stream []uint32, pos *int, keys keySlab[K]) *K {
	i := *pos
	if *pos++; *pos == len(stream) {
		*pos = 0
	}
	if s.stream {
		return keys.at(i)
	}
	return s.live.at(int(stream[i]))
}

// flowState is an implementation filled with the flows, and their shares.
type flowState[K comparable] struct {
	m      flowMap[K]
	live   keySlab[K] // every flow in the table
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

// flowPrepare returns a state of the implementation made by mk, holding
// the flows, as the flags say (trafficFlags): kept from the last call if
// that was for the same implementation, body, goroutine count and flags,
// unless -traffic.warm=fresh. It stops the timer while it builds one; the
// caller resets it.
func flowPrepare[K comparable](b *testing.B, impl string, bd trafficBody, conv func(Tuple) K, mk func(n int, bd trafficBody) flowMap[K]) *flowState[K] {
	b.StopTimer()
	defer b.StartTimer()
	o, err := trafficOptions()
	if err != nil {
		b.Fatal(err)
	}
	procs := runtime.GOMAXPROCS(0)
	key := fmt.Sprintf("%s/%v/%d/%+v", impl, bd, procs, o)
	if st, ok := flowCache.state.(*flowState[K]); ok && flowCache.key == key && o.warm == "kept" {
		return st
	}
	flowCache.state = nil
	runtime.GC()
	st := newFlowState(o, procs, bd, conv, mk)
	flowCache.key, flowCache.state = key, st
	runtime.GC()
	return st
}

// newFlowState returns a state of the implementation made by mk, holding
// o.flows flows (rounded down to a multiple of procs), for bd run by procs
// goroutines.
func newFlowState[K comparable](o trafficOpts, procs int, bd trafficBody, conv func(Tuple) K, mk func(n int, bd trafficBody) flowMap[K]) *flowState[K] {
	per := o.flows / procs
	n := per * procs
	tups := trafficTuples(n)
	r := rand.New(rand.NewPCG(47, uint64(n)))
	line := o.keys == "line"
	live := newKeySlab[K](n, line)
	for i := range n {
		*live.at(i) = conv(tups[i])
	}
	// Ranks to flows: ranks[g][k] is the slot in live of rank k of
	// goroutine g's law, the hot flows at random places in live.
	shared := o.law == "shared" && bd.readOnly()
	ranks := make([][]uint32, procs)
	for g := range procs {
		if shared && g > 0 {
			ranks[g] = ranks[0]
			continue
		}
		lo, cnt := g*per, per
		if shared {
			lo, cnt = 0, n
		}
		ranks[g] = make([]uint32, cnt)
		for k, i := range r.Perm(cnt) {
			ranks[g][k] = uint32(lo + i)
		}
	}
	st := &flowState[K]{m: mk(n, bd), live: live}
	for g := range procs {
		s := &flowShare[K]{live: live, lo: g * per, per: per, queue: newKeySlab[K](per, line),
			rng: benchkit.Rand(uint64(g)*0x9e3779b97f4a7c15 + 1), stream: o.keys == "stream" && bd.readOnly()}
		for i := range per {
			*s.queue.at(i) = conv(tups[n+g*per+i])
		}
		rk := ranks[g]
		zipf := rand.NewZipf(r, trafficZipfS, 1, uint64(len(rk)-1))
		s.zipf = make([]uint32, min(trafficStream, 8*len(rk)))
		for i := range s.zipf {
			s.zipf[i] = rk[zipf.Uint64()]
		}
		s.z = r.IntN(len(s.zipf))
		s.unif = make([]uint32, len(rk))
		for i, j := range r.Perm(len(rk)) {
			s.unif[i] = rk[j]
		}
		s.u = r.IntN(len(s.unif))
		if s.stream {
			s.zkeys, s.ukeys = newKeySlab[K](len(s.zipf), false), newKeySlab[K](len(s.unif), false)
			for i, j := range s.zipf {
				*s.zkeys.at(i) = *live.at(int(j))
			}
			for i, j := range s.unif {
				*s.ukeys.at(i) = *live.at(int(j))
			}
		}
		st.shares = append(st.shares, s)
	}
	tups = nil
	// The fill: in an order unrelated to the ranks, or by rank, each
	// goroutine's flows of rank k in turn, the hottest first or last.
	var order []uint32
	switch o.hot {
	case "random":
		for _, i := range r.Perm(n) {
			order = append(order, uint32(i))
		}
	default:
		for k := range len(ranks[0]) {
			for g := range procs {
				if !shared || g == 0 {
					order = append(order, ranks[g][k])
				}
			}
		}
		if o.hot == "last" {
			for i, j := 0, len(order)-1; i < j; i, j = i+1, j-1 {
				order[i], order[j] = order[j], order[i]
			}
		}
	}
	for _, i := range order {
		st.m.insert(live.at(int(i)), &st.shares[0].val)
	}
	return st
}

// flowCheck builds a small state of the implementation made by mk in the
// variant o, runs turnovers and lookups on it as bd would, and fails t
// unless it holds exactly the live flows.
func flowCheck[K comparable](t *testing.T, o trafficOpts, bd trafficBody, conv func(Tuple) K, mk func(n int, bd trafficBody) flowMap[K]) {
	const procs = 2
	st := newFlowState(o, procs, bd, conv, mk)
	var vals []*benchVal
	for _, s := range st.shares {
		for range 2 * s.per {
			if !bd.readOnly() {
				s.turnover(st.m)
			}
			keys := []K{*s.nextZipf(), *s.nextUniform()}
			for _, v := range st.m.lookupBurst(vals[:0], keys) {
				if v == nil {
					t.Fatalf("a lookup of a live flow missed")
				}
			}
		}
	}
	for i := range st.live.n {
		if st.m.lookup(st.live.at(i)) == nil {
			t.Fatalf("live flow %d missing", i)
		}
	}
	for _, s := range st.shares {
		for i := range s.queue.n {
			if st.m.lookup(s.queue.at(i)) != nil {
				t.Fatalf("flow %d of a queue present", i)
			}
		}
	}
}

// trafficCycle is the length of NATMix's cycle of ops: 98 lookups and the
// delete and insert of one turnover.
const trafficCycle = 100

// trafficWritesCycle is UniformWrites' cycle: 18 lookups and a turnover.
const trafficWritesCycle = 20

// trafficBurst is the number of lookups in a burst.
const trafficBurst = 16

// flowRun runs body bd on a state of the implementation made by mk.
func flowRun[K comparable](b *testing.B, impl string, bd trafficBody, conv func(Tuple) K, mk func(n int, bd trafficBody) flowMap[K]) {
	st := flowPrepare(b, impl, bd, conv, mk)
	m := st.m
	b.ReportAllocs()
	b.ResetTimer()
	// On a machine that other work shares: the CPU time of the run per op
	// (cpu-ns/op over GOMAXPROCS times ns/op is the share of the
	// processors it had), and the share of the machine's processors that
	// other work kept busy meanwhile (others-share, 0 on a quiet machine),
	// by which a runner tells a disturbed run.
	cpu0, busy0, t0 := machine.CPUTime(), machine.Busy(), time.Now()
	defer func() {
		wall, cpu := time.Since(t0), machine.CPUTime()-cpu0
		if cpu0 >= 0 && b.N > 0 {
			b.ReportMetric(float64(cpu)/float64(b.N), "cpu-ns/op")
		}
		if busy0 >= 0 && cpu0 >= 0 && wall > 0 {
			others := float64(machine.Busy()-busy0-cpu) / (float64(wall) * float64(runtime.NumCPU()))
			b.ReportMetric(max(others, 0), "others-share")
		}
	}()
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
		case bodyUniform:
			for pb.Next() {
				if m.lookup(s.nextUniform()) == nil {
					misses++
				}
			}
		case bodyNATMix, bodyUniformWrites:
			cycle, next := trafficCycle, s.nextZipf
			if bd == bodyUniformWrites {
				cycle, next = trafficWritesCycle, s.nextUniform
			}
			for c := 0; pb.Next(); {
				if c++; c < cycle-1 {
					if m.lookup(next()) == nil {
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
					impl.run(b, bd)
				})
			}
		}
	}
}

var trafficPeers = []string{"hash4", "xsync", "rwmutex", "shard256", "syncmap"}

// BenchmarkTurnover measures turnover ops: the delete of a random flow and
// the insert of a new one, both cold, as one op.
func BenchmarkTurnover(b *testing.B) { trafficEach(b, bodyTurnover, "", trafficPeers...) }

// BenchmarkZipf measures lookups of flows drawn from a Zipf law.
func BenchmarkZipf(b *testing.B) { trafficEach(b, bodyZipf, "", trafficPeers...) }

// BenchmarkNATMix measures 98 Zipf lookups and one turnover (two ops) in
// every 100 ops.
func BenchmarkNATMix(b *testing.B) { trafficEach(b, bodyNATMix, "", trafficPeers...) }

// BenchmarkUniform measures lookups of every flow in turn, in a random
// order.
func BenchmarkUniform(b *testing.B) { trafficEach(b, bodyUniform, "", trafficPeers...) }

// BenchmarkUniformWrites measures 18 uniform lookups and one turnover (two
// ops) in every 20 ops.
func BenchmarkUniformWrites(b *testing.B) { trafficEach(b, bodyUniformWrites, "", trafficPeers...) }

// BenchmarkBurst measures lookups in bursts of 16, uniform (mix=uniform)
// or as NATMix (mix=nat).
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
	for _, bd := range []trafficBody{bodyTurnover, bodyZipf, bodyNATMix, bodyUniform, bodyUniformWrites, bodyBurstUniform, bodyBurstNAT} {
		trafficEach(b, bd, fmt.Sprintf("body=%v/", bd), "hash4-linux", "hash4-fold")
	}
}

// BenchmarkTrafficLoad runs lookups and turnover on a table sized for its
// flows (one per bucket when full) and on one sized for half (two per
// bucket): the measure by which WithCapacity's load factor is chosen
// (docs/performance.md, "Load factor").
func BenchmarkTrafficLoad(b *testing.B) {
	for _, bd := range []trafficBody{bodyZipf, bodyUniform, bodyTurnover} {
		trafficEach(b, bd, fmt.Sprintf("body=%v/", bd), "hash4", "hash4-half")
	}
}

// TestTrafficImpls runs every implementation of the traffic benchmarks on
// 512 flows, and hash4 and the RWMutex map (a key of each form) in every
// variant of the flags, and checks what each holds.
func TestTrafficImpls(t *testing.T) {
	base := trafficOpts{keys: "packed", hot: "random", law: "share", warm: "kept", flows: 512}
	variants := []trafficOpts{base}
	for _, v := range []func(*trafficOpts){
		func(o *trafficOpts) { o.keys = "line" },
		func(o *trafficOpts) { o.keys = "stream" },
		func(o *trafficOpts) { o.hot = "first" },
		func(o *trafficOpts) { o.hot = "last" },
		func(o *trafficOpts) { o.law, o.hot = "shared", "last" },
		func(o *trafficOpts) { o.flows = 500 },
	} {
		o := base
		v(&o)
		variants = append(variants, o)
	}
	for _, impl := range trafficImpls {
		for i, o := range variants {
			if i > 0 && impl.name != "hash4" && impl.name != "rwmutex" {
				continue
			}
			for _, bd := range []trafficBody{bodyZipf, bodyNATMix} {
				t.Run(fmt.Sprintf("%s/%v/%+v", impl.name, bd, o), func(t *testing.T) {
					impl.check(t, o, bd)
				})
			}
		}
	}
}

// TestKeySlabLine checks that a slab of keys alone on a line puts each at
// the start of a line.
func TestKeySlabLine(t *testing.T) {
	s := newKeySlab[flowKey](100, true)
	for i := range s.n {
		if p := uintptr(unsafe.Pointer(s.at(i))); p%64 != 0 {
			t.Fatalf("key %d at %#x, not at a line's start", i, p)
		}
	}
	*s.at(99) = flowKey{lport: 7}
	if s.at(99).lport != 7 || s.at(98).lport != 0 {
		t.Fatalf("keys overlap")
	}
}
