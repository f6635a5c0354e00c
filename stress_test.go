package hash4

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// stressVal is a value that names its own key, so a reader can tell a value
// of another key (a torn or recycled read) from the right one.
type stressVal struct {
	tup Tuple // canonical form
	gen uint64
}

// stressKey returns key i of the stress key space, mixing families: every
// third key is IPv6, on link-local addresses so zones can be added.
func stressKey(i int) Tuple {
	if i%3 == 0 {
		return Tuple{
			Local:  netip.AddrPortFrom(netip.AddrFrom16([16]byte{0xfe, 0x80, 13: byte(i >> 16), 14: byte(i >> 8), 15: byte(i)}), uint16(1+i%1000)),
			Remote: netip.AddrPortFrom(netip.MustParseAddr("fe80::beef"), 8443),
		}
	}
	return Tuple{
		Local:  netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 443),
		Remote: netip.AddrPortFrom(netip.AddrFrom4([4]byte{172, 16, 0, byte(1 + i%7)}), uint16(20000+i%5000)),
	}
}

// stressSpell returns another spelling of the same key: IPv4-mapped for
// IPv4, zoned for IPv6.
func stressSpell(k Tuple, r *rand.Rand) Tuple {
	if r.IntN(2) == 0 {
		return k
	}
	if k.Local.Addr().Is4() {
		return tblMapped(k)
	}
	z := fmt.Sprint("if", r.IntN(3))
	return Tuple{
		Local:  netip.AddrPortFrom(k.Local.Addr().WithZone(z), k.Local.Port()),
		Remote: k.Remote,
	}
}

// TestStress churns a small table (long chains, constant recycling) from
// several writers while readers check that keys that are never deleted are
// always found and that every value returned belongs to the key asked for,
// by Lookup and by AppendLookups. Meanwhile
// a swapper changes the values of the keys never deleted with
// CompareAndSwap, so that readers also check that a swap never leaves a key
// missing.
func TestStress(t *testing.T) {
	t.Run("fixed", func(t *testing.T) { stress(t, stressFixed) })
	t.Run("grow", func(t *testing.T) { stress(t, stressGrow) })
	t.Run("autogrow", func(t *testing.T) { stress(t, stressAutoGrow) })
}

// stressMode is how the bucket count of stress's table changes.
type stressMode int

const (
	stressFixed    stressMode = iota // never: WithFixedBuckets, for long chains
	stressGrow                       // by Grow, and by the table itself
	stressAutoGrow                   // by the table itself only
)

// stress runs the writers, the swapper and the readers on a table of 32
// buckets; with stressGrow, another goroutine grows the table meanwhile,
// doubling it every eighth of the run up to 4096
// buckets, while the table grows itself as well (then Grow may find it
// grown already); with stressAutoGrow, the writers' inserts grow it.
func stress(t *testing.T, mode stressMode) {
	const (
		nPerm     = 128
		nWriters  = 2
		nReaders  = 2
		perWriter = 768
	)
	dur := 2 * time.Second
	if testing.Short() {
		dur = 500 * time.Millisecond
	}
	opts := []Option{WithCapacity(32), WithSecret(tblSecret), WithHasher(LinuxHasher)}
	if mode == stressFixed {
		opts = append(opts, WithFixedBuckets())
	}
	grow := mode != stressFixed
	tab := New[stressVal](opts...)

	perm := make([]Tuple, nPerm)
	// permVal[i] holds key i's two values, which the swapper alternates;
	// permCur[i] (the swapper's, read after Wait) is the one it holds.
	permVal := make([][2]*stressVal, nPerm)
	permCur := make([]int, nPerm)
	for i := range perm {
		perm[i] = stressKey(i)
		permVal[i] = [2]*stressVal{{tup: tblCanon(perm[i])}, {tup: tblCanon(perm[i])}}
		require.NoError(t, tab.Insert(perm[i], permVal[i][0]))
	}
	isPermVal := func(i int, v *stressVal) bool { return v != nil && (v == permVal[i][0] || v == permVal[i][1]) }
	churn := make([]Tuple, nWriters*perWriter) // writer w owns churn[w*perWriter:]
	for i := range churn {
		churn[i] = stressKey(nPerm + i)
	}

	var (
		stop      atomic.Bool
		failures  atomic.Int64
		wg        sync.WaitGroup
		inserts   atomic.Int64
		lookups   atomic.Int64
		churnHits atomic.Int64
		// batchLookups counts the AppendLookups calls of the readers.
		batchLookups atomic.Int64
		swaps        atomic.Int64
		// compacted counts the entries moved and chunks released by
		// the compactions that follow each Grow, with stressGrow.
		compacted atomic.Int64
		// growerDone is set when stressGrow's grower has returned.
		growerDone atomic.Bool
	)
	fail := func(format string, args ...any) {
		if failures.Add(1) <= 10 {
			t.Errorf(format, args...)
		}
		stop.Store(true)
	}
	present := make([][]*stressVal, nWriters) // each writer's model, read after Wait

	for w := range nWriters {
		own := churn[w*perWriter : (w+1)*perWriter]
		model := make([]*stressVal, len(own))
		present[w] = model
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 0x57e55))
			gen := uint64(0)
			for n := 0; !stop.Load(); n++ {
				j := r.IntN(len(own))
				k := stressSpell(own[j], r)
				if cur := model[j]; cur != nil {
					if r.IntN(8) == 0 {
						if err := tab.Insert(k, &stressVal{tup: cur.tup}); err == nil {
							fail("insert of present %v succeeded", k)
						}
						continue
					}
					v, ok := tab.Delete(k)
					if !ok || v != cur {
						fail("writer %d: delete %v = %p %v, want %p", w, k, v, ok, cur)
					}
					model[j] = nil
				} else {
					gen++
					v := &stressVal{tup: tblCanon(own[j]), gen: gen}
					if err := tab.Insert(k, v); err != nil {
						fail("writer %d: insert %v: %v", w, k, err)
					}
					model[j] = v
					inserts.Add(1)
				}
			}
		}()
	}
	wg.Add(1)
	go func() { // the swapper
		defer wg.Done()
		r := rand.New(rand.NewPCG(0x5a, 0x5a))
		for !stop.Load() {
			i := r.IntN(nPerm)
			k := stressSpell(perm[i], r)
			cur, next := permVal[i][permCur[i]], permVal[i][1-permCur[i]]
			if tab.CompareAndSwap(k, next, cur) {
				fail("swapper: %v swapped from a value it does not hold", k)
			}
			if !tab.CompareAndSwap(k, cur, next) {
				fail("swapper: %v did not swap from the value it holds", k)
			}
			permCur[i] = 1 - permCur[i]
			swaps.Add(1)
		}
	}()
	if mode == stressGrow {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer growerDone.Store(true)
			for b := 64; b <= 4096 && !stop.Load(); b *= 2 {
				time.Sleep(dur / 8)
				if err := tab.Grow(b); err != nil {
					fail("Grow(%d): %v", b, err)
				}
				// Flows that peak and go, then a compaction
				// that moves the churned entries out of the
				// chunks those flows left nearly free.
				peak := make([]Tuple, 1024)
				for i := range peak {
					peak[i] = stressKey(nPerm + len(churn) + i)
					if err := tab.Insert(peak[i], &stressVal{tup: tblCanon(peak[i])}); err != nil {
						fail("peak insert: %v", err)
					}
				}
				for _, k := range peak {
					if _, ok := tab.Delete(k); !ok {
						fail("peak delete: %v missing", k)
					}
				}
				moved, released := tab.compact()
				compacted.Add(int64(moved + released))
			}
		}()
	}
	for rd := range nReaders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(rd), 0x7ead))
			var batch []Tuple
			var batchIdx []int
			var got []*stressVal
			for n := 0; !stop.Load(); n++ {
				if n%64 == 1 { // a batch of permanent and churned keys
					batch, batchIdx = batch[:0], batchIdx[:0]
					for range 11 {
						if i := r.IntN(2 * nPerm); i < nPerm {
							batch, batchIdx = append(batch, stressSpell(perm[i], r)), append(batchIdx, i)
						} else {
							c := churn[r.IntN(len(churn))]
							batch, batchIdx = append(batch, stressSpell(c, r)), append(batchIdx, -1)
						}
					}
					got = tab.AppendLookups(got[:0], batch)
					for j, v := range got {
						switch i := batchIdx[j]; {
						case i >= 0 && !isPermVal(i, v):
							fail("reader %d: batch: permanent %v: got %+v", rd, batch[j], v)
						case i < 0 && v != nil && (v.tup != tblCanon(batch[j]) || v.gen == 0):
							fail("reader %d: batch: %v returned value %+v of another key", rd, batch[j], v)
						}
					}
					batchLookups.Add(1)
				} else if n%2 == 0 {
					i := r.IntN(nPerm)
					k := stressSpell(perm[i], r)
					v, ok := tab.Lookup(k)
					if !ok {
						fail("reader %d: permanent %v not found", rd, k)
					} else if !isPermVal(i, v) {
						fail("reader %d: permanent %v: got value of %v", rd, k, v.tup)
					}
				} else {
					c := churn[r.IntN(len(churn))]
					k := stressSpell(c, r)
					if v, ok := tab.Lookup(k); ok {
						churnHits.Add(1)
						if v == nil || v.tup != tblCanon(c) || v.gen == 0 {
							fail("reader %d: %v returned value %+v of another key", rd, k, v)
						}
					}
				}
				lookups.Add(1)
				if n%4096 == 4095 { // now and then, a full iteration
					seen := 0
					for tup, v := range tab.All() {
						if v.tup != tup {
							fail("All: %v yielded with value of %v", tup, v.tup)
						}
						seen++
					}
					if seen < nPerm {
						fail("All yielded %d entries, fewer than the %d permanent ones", seen, nPerm)
					}
				}
			}
		}()
	}
	time.Sleep(dur)
	// N.B. the run goes on past dur (bounded) until every event that the
	// checks below count has happened: on a loaded machine some of the
	// goroutines may not have run at all by then.
	happened := func() bool {
		return inserts.Load() > nWriters*perWriter && churnHits.Load() > 0 && batchLookups.Load() > 0 && swaps.Load() > 0 &&
			(mode != stressGrow || compacted.Load() > 0 || growerDone.Load()) && (!grow || len(tab.cur().lines) > 32)
	}
	for deadline := time.Now().Add(30 * time.Second); !stop.Load() && !happened() && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	tab.growers.Wait()
	require.Zero(t, failures.Load())

	want := map[Tuple]*stressVal{}
	for i, k := range perm {
		want[tblCanon(k)] = permVal[i][permCur[i]]
	}
	for _, model := range present {
		for _, v := range model {
			if v != nil {
				want[v.tup] = v
			}
		}
	}
	require.Equal(t, len(want), tab.Len())
	got := tblCollect(t, tab)
	require.Equal(t, len(want), len(got))
	for k, v := range want {
		require.Same(t, v, got[k], k)
	}
	st := tab.Stats()
	require.Equal(t, len(want), st.Entries)
	if !grow {
		require.Greater(t, st.LongestChain, 4, "chains are long")
	} else {
		require.Greater(t, st.Buckets, 32, "the table grew")
	}
	t.Logf("inserts %d, swaps %d, lookups %d (churn hits %d, batches %d), restarts %d, nodes %d, buckets %d, compacted %d",
		inserts.Load(), swaps.Load(), lookups.Load(), churnHits.Load(), batchLookups.Load(), st.LookupRestarts, st.Nodes, st.Buckets, compacted.Load())
	if mode == stressAutoGrow {
		limit := tab.growLimit(tab.cur())
		require.LessOrEqual(t, int64(st.Entries), limit+limit/64, "over its limit after the table grew")
	}
	if mode == stressGrow {
		require.Positive(t, compacted.Load(), "no compaction moved an entry or released a chunk")
	}
	require.Greater(t, inserts.Load(), int64(nWriters*perWriter), "the writers churned")
	require.Positive(t, churnHits.Load())
	require.Positive(t, batchLookups.Load())
	require.Positive(t, swaps.Load())
	// Recycling: every insert beyond the live set reused a node, but for
	// what the shards' caches hold and the rest of the chunk carved last.
	peak := 0
	if mode == stressGrow {
		peak = 1024
	}
	require.LessOrEqual(t, st.Nodes, nPerm+len(churn)+peak+len(tab.shards)*(shardCacheMax+slabBatch)+64)
	require.Less(t, int64(st.Nodes), inserts.Load()+nPerm)
	require.Positive(t, st.InLine)
	tblCheckBuckets(t, tab, "after the stress")
}

// raceLookups runs readers goroutines that call probe, each with a PRNG of
// its own, for 1.5 s (0.3 s with -short), or longer until a probe has been
// made; then it sets stop, waits for wg, which must also count the writers
// that watch stop, and fails the test if any probe failed. probe returns ""
// or a description of the failed lookup. It returns the number of probes.
func raceLookups(t *testing.T, stop *atomic.Bool, wg *sync.WaitGroup, readers int, seed uint64, probe func(rng *rand.Rand) string) int64 {
	t.Helper()
	var probes, failures atomic.Int64
	var first atomic.Value
	for r := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(r), seed))
			for !stop.Load() {
				if msg := probe(rng); msg != "" {
					failures.Add(1)
					first.CompareAndSwap(nil, msg)
				}
				probes.Add(1)
			}
		}()
	}
	d := 1500 * time.Millisecond
	if testing.Short() {
		d = 300 * time.Millisecond
	}
	time.Sleep(d)
	// N.B. the readers go on past d (bounded) until one has probed: on a
	// loaded machine they may not have run at all by then.
	for deadline := time.Now().Add(30 * time.Second); probes.Load() == 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	if f := failures.Load(); f > 0 {
		t.Fatalf("%d of %d probes failed; first: %v", f, probes.Load(), first.Load())
	}
	return probes.Load()
}

// groupProbe returns a raceLookups probe of a socket table with a reuseport
// group on group, whose values all begin with G, and a socket named
// otherName on other: a packet from a random peer to group must reach a
// member of the group, and one to other, that socket.
func groupProbe(lookup func(Tuple) (*string, bool), group, other netip.AddrPort, otherName string) func(*rand.Rand) string {
	return func(rng *rand.Rand) string {
		remote := netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(rng.IntN(256))}), uint16(1000+rng.IntN(1000)))
		if v, ok := lookup(Tuple{Local: group, Remote: remote}); !ok || (*v)[0] != 'G' {
			return fmt.Sprintf("Lookup(%v from %v) = %v, %v", group, remote, v, ok)
		}
		if v, ok := lookup(Tuple{Local: other, Remote: remote}); !ok || *v != otherName {
			return fmt.Sprintf("Lookup(%v from %v) = %v, %v", other, remote, v, ok)
		}
		return ""
	}
}
