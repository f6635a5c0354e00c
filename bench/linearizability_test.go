package bench

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/hash4/hash4"
	"github.com/stretchr/testify/require"
)

type linOp uint8

const (
	linInsert linOp = iota
	linLookup
	linDelete
	linLookupOrInsert
	linCompareAndDelete
	linCompareAndSwap
)

func (o linOp) String() string {
	return [...]string{"insert", "lookup", "delete", "lookupOrInsert", "compareAndDelete", "compareAndSwap"}[o]
}

// linInput is one call: val is the value's id for an insert or
// lookupOrInsert, and the id of the value compared for compareAndDelete and
// compareAndSwap; swap is the id of the value compareAndSwap offers.
type linInput struct {
	op   linOp
	key  int
	val  int
	swap int
}

// linOutput is one answer: for an insert, ok reports success (false:
// ErrExists); for lookup and delete, ok and val (0 when absent) as returned;
// for lookupOrInsert, found and the value returned; for compareAndDelete,
// deleted; for compareAndSwap, swapped.
type linOutput struct {
	ok  bool
	val int
}

// linModel is a map from key to value id, partitioned by key: a partition's
// state is the key's value id, 0 when absent.
var linModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		return groupByKey(history, func(op porcupine.Operation) int { return op.Input.(linInput).key })
	},
	PartitionEvent: func(history []porcupine.Event) [][]porcupine.Event {
		keyOf := map[int]int{} // event id -> key, from the call events
		for _, e := range history {
			if e.Kind == porcupine.CallEvent {
				keyOf[e.Id] = e.Value.(linInput).key
			}
		}
		return groupByKey(history, func(e porcupine.Event) int { return keyOf[e.Id] })
	},
	Init: func() any { return 0 },
	Step: func(state, input, output any) (bool, any) {
		s, in, out := state.(int), input.(linInput), output.(linOutput)
		switch in.op {
		case linInsert:
			if s == 0 {
				return out.ok, in.val
			}
			return !out.ok, s
		case linLookup:
			return out.ok == (s != 0) && out.val == s, s
		case linDelete:
			return out.ok == (s != 0) && out.val == s, 0
		case linLookupOrInsert:
			if s == 0 {
				return !out.ok && out.val == in.val, in.val
			}
			return out.ok && out.val == s, s
		case linCompareAndDelete:
			if s != 0 && s == in.val {
				return out.ok, 0
			}
			return !out.ok, s
		case linCompareAndSwap:
			if s != 0 && s == in.val {
				return out.ok, in.swap
			}
			return !out.ok, s
		}
		return false, s
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(linInput), output.(linOutput)
		if in.op == linCompareAndSwap {
			return fmt.Sprintf("%v(k%d, %d, %d) -> %v", in.op, in.key, in.val, in.swap, out.ok)
		}
		return fmt.Sprintf("%v(k%d, %d) -> %v %d", in.op, in.key, in.val, out.ok, out.val)
	},
}

// linSecret fixes the table's hash, so that keys can be chosen by bucket.
var linSecret = hash4.Secret{Ehash: 0x01234567, Ehash6Addr: 0x89abcdef, Seed: 0x0f1e2d3c4b5a6978}

// linGroupedBuckets is the bucket count of the runs with home groups: tables
// have them from 2^16 buckets on (see Table, Placement).
const linGroupedBuckets = 1 << 16

// linChainBucket is the bucket of the keys that share a chain.
const linChainBucket = 7

// The peers of linKey's tuples.
var (
	linRemote4 = netip.MustParseAddrPort("192.0.2.7:50000")
	linRemote6 = netip.MustParseAddrPort("[2001:db8:ffff::7]:50000")
)

// linKey returns distinct valid tuples: i < 2^24 selects the tuple, v6 the
// family.
func linKey(i int, v6 bool) Tuple {
	if v6 {
		a := [16]byte{0x20, 0x01, 0x0d, 0xb8, 12: 1, 13: byte(i >> 16), 14: byte(i >> 8), 15: byte(i)}
		return Tuple{
			Local:  netip.AddrPortFrom(netip.AddrFrom16(a), 443),
			Remote: linRemote6,
		}
	}
	return Tuple{
		Local:  netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 443),
		Remote: linRemote4,
	}
}

// linAs16 returns tup with both addresses in their 16-byte form: an IPv4
// tuple spelled IPv4-mapped, which the table takes for the same key.
func linAs16(tup Tuple) Tuple {
	tup.Local = netip.AddrPortFrom(netip.AddrFrom16(tup.Local.Addr().As16()), tup.Local.Port())
	tup.Remote = netip.AddrPortFrom(netip.AddrFrom16(tup.Remote.Addr().As16()), tup.Remote.Port())
	return tup
}

// linKeys returns the nKeys keys of a run: the first half in bucket
// linChainBucket of a table of the given bucket count (a long chain), the
// rest anywhere. A tuple's hash is that of the tuple with local port 0 plus
// the local port (HashTuple), so a local port puts a key in the bucket
// chosen.
func linKeys(t *testing.T, seed uint64, buckets, nKeys int) []Tuple {
	mask := uint32(buckets - 1)
	var keys []Tuple
	for i := 0; len(keys) < nKeys; i++ {
		k := linKey(int(seed)*1000+i, i%2 == 1)
		if len(keys) < nKeys/2 {
			k.Local = netip.AddrPortFrom(k.Local.Addr(), 0)
			port := uint16((linChainBucket - hash4.HashTuple(k, hash4.LinuxHasher, linSecret)) & mask)
			if port == 0 {
				continue
			}
			k.Local = netip.AddrPortFrom(k.Local.Addr(), port)
			require.Equal(t, uint32(linChainBucket), hash4.HashTuple(k, hash4.LinuxHasher, linSecret)&mask)
		}
		keys = append(keys, k)
	}
	return keys
}

// linRun records a history of nClients goroutines doing opsPerClient random
// operations each on nKeys keys of a table of 16 buckets, or of
// linGroupedBuckets if grouped, so that it has home groups, and with
// linGrow, while another goroutine grows the table from 16 buckets to 1024
// (or from linGroupedBuckets to four times as many), a doubling at a time,
// each followed by a Compact, or with linGrowItself, while another inserts
// 2048 keys that no client uses, into a table filled with such keys to
// just under two per bucket (less 128 keys) if large, so that the table grows itself.
//
// Each client yields now and then between ops, and, to make the ops of
// different clients overlap where the clients take turns on one processor
// (GOMAXPROCS=1), now and then inside an op's interval: after the op's call
// time is taken, before it runs, or after it ran, before its return time.
// Another client's ops then fall within the interval; the checker takes
// the op to happen at any point of it.
func linRun(t *testing.T, seed uint64, stripes int, grouped bool, grow linGrowth, nClients, opsPerClient, nKeys int) []porcupine.Operation {
	t.Helper()
	buckets, grownTo := 16, 1024
	if grouped {
		buckets, grownTo = linGroupedBuckets, 4*linGroupedBuckets
	}
	opts := []hash4.Option{hash4.WithCapacity(buckets), hash4.WithLockStripes(stripes), hash4.WithSecret(linSecret)}
	if grow == linFixed {
		opts = append(opts, hash4.WithFixedBuckets())
	}
	tab := hash4.New[int](opts...)
	require.Equal(t, buckets, tab.Stats().Buckets)
	// The keys, each spelled two ways (linAs16).
	keys := linKeys(t, seed, buckets, nKeys)
	// Preallocated values: id c*opsPerClient+i+1 is client c's i-th insert.
	vals := make([]*int, nClients*opsPerClient+1)
	for i := 1; i < len(vals); i++ {
		v := i
		vals[i] = &v
	}
	// The keys no client uses, and their value.
	filler, fillerVal := 1<<22, -1
	if grow == linGrowItself {
		var err error
		for ; filler < 1<<22+max(0, 2*buckets-128) && err == nil; filler++ {
			err = tab.Insert(linKey(filler, filler%2 == 1), &fillerVal)
		}
		require.NoError(t, err)
		require.Equal(t, buckets, tab.Stats().Buckets, "the table grows only once the clients run")
	}

	var clock atomic.Int64
	var start, wg sync.WaitGroup
	var bad atomic.Value
	hist := make([][]porcupine.Operation, nClients)
	start.Add(1)
	wg.Add(nClients)
	for c := range nClients {
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, uint64(c)))
			ops := make([]porcupine.Operation, 0, opsPerClient)
			seen := make([]int, nKeys) // the last value id seen per key
			start.Wait()
			for i := range opsPerClient {
				ki := r.IntN(nKeys)
				k := keys[ki]
				if r.IntN(2) == 0 {
					k = linAs16(k)
				}
				in := linInput{key: ki}
				var out linOutput
				var got *int
				switch p := r.IntN(15); {
				case p < 4:
					in.op, in.val = linInsert, c*opsPerClient+i+1
				case p < 7:
					in.op = linDelete
				case p < 9:
					in.op = linLookup
				case p < 11:
					in.op, in.val = linLookupOrInsert, c*opsPerClient+i+1
				default:
					// Mostly the value this client last saw, which may
					// still be current; else any value.
					in.op, in.val = linCompareAndDelete, 1+r.IntN(len(vals)-1)
					if p >= 13 {
						in.op, in.swap = linCompareAndSwap, c*opsPerClient+i+1
					}
					if seen[ki] != 0 && r.IntN(4) != 0 {
						in.val = seen[ki]
					}
				}
				call := clock.Add(1)
				if r.IntN(8) == 0 {
					runtime.Gosched()
				}
				switch in.op {
				case linInsert:
					err := tab.Insert(k, vals[in.val])
					out.ok = err == nil
				case linLookup:
					got, out.ok = tab.Lookup(k)
				case linDelete:
					got, out.ok = tab.Delete(k)
				case linLookupOrInsert:
					var err error
					got, out.ok, err = tab.LookupOrInsert(k, vals[in.val])
					if err != nil {
						bad.Store(fmt.Sprintf("lookupOrInsert %v: %v", k, err))
					}
				case linCompareAndDelete:
					out.ok = tab.CompareAndDelete(k, vals[in.val])
				case linCompareAndSwap:
					out.ok = tab.CompareAndSwap(k, vals[in.val], vals[in.swap])
				}
				if r.IntN(8) == 0 {
					runtime.Gosched()
				}
				ret := clock.Add(1)
				switch {
				case in.op == linInsert && out.ok:
					seen[ki] = in.val
				case in.op == linCompareAndSwap && out.ok:
					seen[ki] = in.swap
				case got != nil:
					seen[ki] = *got
				}
				if got != nil {
					out.val = *got
					if out.val <= 0 || out.val >= len(vals) || vals[out.val] != got {
						bad.Store(fmt.Sprintf("%v %v returned a pointer that is no inserted value", in.op, k))
					}
				}
				ops = append(ops, porcupine.Operation{ClientId: c, Input: in, Call: call, Output: out, Return: ret})
				if r.IntN(4) == 0 {
					runtime.Gosched()
				}
			}
			hist[c] = ops
		}()
	}
	var grower sync.WaitGroup
	var done atomic.Bool
	switch grow {
	case linGrowItself:
		grower.Add(1)
		go func() {
			defer grower.Done()
			start.Wait()
			for i := range 2048 {
				if err := tab.Insert(linKey(filler+i, i%2 == 1), &fillerVal); err != nil {
					bad.Store(fmt.Sprintf("filler insert: %v", err))
				}
			}
		}()
	case linGrow:
		grower.Add(1)
		go func() {
			defer grower.Done()
			start.Wait()
			for b := 2 * buckets; b <= grownTo && !done.Load(); b *= 2 {
				if err := tab.Grow(b); err != nil {
					bad.Store(fmt.Sprintf("Grow(%d): %v", b, err))
				}
				tab.Compact()
				for range 1 + int(seed)%8 {
					runtime.Gosched()
				}
			}
		}()
	}
	start.Done()
	wg.Wait()
	done.Store(true)
	grower.Wait()
	require.Nil(t, bad.Load())
	if grow == linGrowItself {
		// The growth runs on a goroutine of the table's own, which the
		// insert that found its stripe over the limit started: its new
		// array is published at once, and Grow waits for it to end.
		require.Eventually(t, func() bool { return tab.Stats().Buckets > buckets }, 30*time.Second, time.Millisecond,
			"the table grew itself")
		require.NoError(t, tab.Grow(0))
	}
	var all []porcupine.Operation
	for _, h := range hist {
		all = append(all, h...)
	}
	return all
}

// linEvents converts a history of operations into one of events.
func linEvents(ops []porcupine.Operation) []porcupine.Event {
	type timed struct {
		at int64
		e  porcupine.Event
	}
	var ts []timed
	for id, op := range ops {
		ts = append(ts,
			timed{op.Call, porcupine.Event{ClientId: op.ClientId, Kind: porcupine.CallEvent, Value: op.Input, Id: id}},
			timed{op.Return, porcupine.Event{ClientId: op.ClientId, Kind: porcupine.ReturnEvent, Value: op.Output, Id: id}})
	}
	sort.SliceStable(ts, func(i, j int) bool {
		if ts[i].at != ts[j].at {
			return ts[i].at < ts[j].at
		}
		return ts[i].e.Kind == porcupine.CallEvent && ts[j].e.Kind == porcupine.ReturnEvent
	})
	out := make([]porcupine.Event, len(ts))
	for i, x := range ts {
		out[i] = x.e
	}
	return out
}

// linGrowth is how the table of a linRun grows while the clients run.
type linGrowth int

const (
	linFixed      linGrowth = iota // it does not
	linGrow                        // by Grow
	linGrowItself                  // by inserts of keys no client uses
)

func (g linGrowth) String() string { return [...]string{"fixed", "Grow", "itself"}[g] }

// TestLinearizability checks recorded concurrent histories, some made while
// the table grows by Grow or by itself, against the map model.
func TestLinearizability(t *testing.T) {
	runs, ops := 20, 150
	if testing.Short() {
		runs = 8
	}
	overlapping, swapped := 0, 0
	// On a loaded machine the clients may happen to run one at a time; keep
	// going (bounded) until some history is really concurrent.
	for run := 0; run < runs || (overlapping == 0 && run < 10*runs); run++ {
		stripes, grouped, grow := 1+run%2, run%4 >= 2, linGrowth(run%12/4)
		hist := linRun(t, uint64(run+1), stripes, grouped, grow, 4, ops, 4)
		require.Len(t, hist, 4*ops)
		overlapping += linOverlapping(hist)
		for _, op := range hist {
			if op.Input.(linInput).op == linCompareAndSwap && op.Output.(linOutput).ok {
				swapped++
			}
		}
		res := porcupine.CheckOperationsTimeout(linModel, hist, 30*time.Second)
		require.Equal(t, porcupine.Ok, res, "run %d (%d stripes, home groups %v, growth %v): history not linearizable", run, stripes, grouped, grow)
		if run%5 == 0 {
			require.Equal(t, porcupine.Ok, porcupine.CheckEventsTimeout(linModel, linEvents(hist), 30*time.Second), "run %d as events", run)
		}
	}
	// The histories are concurrent, not a sequence of isolated calls.
	t.Logf("%d operations overlap another client's; %d swaps succeeded", overlapping, swapped)
	require.Positive(t, overlapping)
	require.Positive(t, swapped, "the histories hold successful swaps")
}

// linOverlapping counts operations whose interval overlaps that of an
// operation of another client.
func linOverlapping(hist []porcupine.Operation) int {
	n := 0
	for i, a := range hist {
		for j, b := range hist {
			if i != j && a.ClientId != b.ClientId && a.Call < b.Return && b.Call < a.Return {
				n++
				break
			}
		}
	}
	return n
}

// linOpAt builds one operation of a handmade history.
func linOpAt(client int, in linInput, out linOutput, call, ret int64) porcupine.Operation {
	return porcupine.Operation{ClientId: client, Input: in, Output: out, Call: call, Return: ret}
}

// TestLinearizabilityCheckerCanFail shows that the model and checker reject
// a history no map could produce, and accept its legal variants.
func TestLinearizabilityCheckerCanFail(t *testing.T) {
	ins := linInput{op: linInsert, key: 1, val: 7}
	del := linInput{op: linDelete, key: 1}
	look := linInput{op: linLookup, key: 1}
	found := linOutput{ok: true, val: 7}

	// A lookup returns the value after its delete completed.
	stale := []porcupine.Operation{
		linOpAt(0, ins, linOutput{ok: true}, 0, 1),
		linOpAt(0, del, found, 2, 3),
		linOpAt(1, look, found, 4, 5),
	}
	require.Equal(t, porcupine.Illegal, porcupine.CheckOperationsTimeout(linModel, stale, 10*time.Second))
	require.False(t, porcupine.CheckOperations(linModel, stale))
	require.Equal(t, porcupine.Illegal, porcupine.CheckEventsTimeout(linModel, linEvents(stale), 10*time.Second))

	// Concurrent with the delete, the same answer is legal.
	overlap := []porcupine.Operation{
		linOpAt(0, ins, linOutput{ok: true}, 0, 1),
		linOpAt(0, del, found, 2, 5),
		linOpAt(1, look, found, 4, 6),
	}
	require.Equal(t, porcupine.Ok, porcupine.CheckOperationsTimeout(linModel, overlap, 10*time.Second))

	// Two deletes of one insert both succeeding: illegal, even concurrent.
	double := []porcupine.Operation{
		linOpAt(0, ins, linOutput{ok: true}, 0, 1),
		linOpAt(0, del, found, 2, 5),
		linOpAt(1, del, found, 3, 6),
	}
	require.Equal(t, porcupine.Illegal, porcupine.CheckOperationsTimeout(linModel, double, 10*time.Second))

	// A value returned for a key that was only ever given another value,
	// with an independent legal key alongside: partitioning keeps the
	// verdict.
	foreign := []porcupine.Operation{
		linOpAt(0, ins, linOutput{ok: true}, 0, 1),
		linOpAt(1, linInput{op: linInsert, key: 2, val: 9}, linOutput{ok: true}, 0, 1),
		linOpAt(0, linInput{op: linLookup, key: 2}, linOutput{ok: true, val: 9}, 2, 3),
		linOpAt(1, look, linOutput{ok: true, val: 9}, 2, 3),
	}
	require.Equal(t, porcupine.Illegal, porcupine.CheckOperationsTimeout(linModel, foreign, 10*time.Second))
	require.Equal(t, porcupine.Ok, porcupine.CheckOperationsTimeout(linModel, foreign[:3], 10*time.Second))

	// lookupOrInsert reporting an insert over a present key, and
	// compareAndDelete failing on the current value: both illegal alone,
	// both legal concurrent with a delete.
	loi := linInput{op: linLookupOrInsert, key: 1, val: 8}
	cad := linInput{op: linCompareAndDelete, key: 1, val: 7}
	for _, bad := range []porcupine.Operation{
		linOpAt(1, loi, linOutput{ok: false, val: 8}, 2, 3),
		linOpAt(1, cad, linOutput{ok: false}, 2, 3),
	} {
		alone := []porcupine.Operation{linOpAt(0, ins, linOutput{ok: true}, 0, 1), bad}
		require.Equal(t, porcupine.Illegal, porcupine.CheckOperationsTimeout(linModel, alone, 10*time.Second), "%v", bad.Input)
		withDelete := append(alone, linOpAt(0, del, found, 2, 3))
		require.Equal(t, porcupine.Ok, porcupine.CheckOperationsTimeout(linModel, withDelete, 10*time.Second), "%v", bad.Input)
	}
	// compareAndDelete of a value the key never had succeeding.
	wrong := []porcupine.Operation{
		linOpAt(0, ins, linOutput{ok: true}, 0, 1),
		linOpAt(1, linInput{op: linCompareAndDelete, key: 1, val: 9}, linOutput{ok: true}, 2, 3),
	}
	require.Equal(t, porcupine.Illegal, porcupine.CheckOperationsTimeout(linModel, wrong, 10*time.Second))

	// compareAndSwap: a lookup after it finds the new value, never the old
	// nor none, and a swap from the value held does not fail.
	cas := linInput{op: linCompareAndSwap, key: 1, val: 7, swap: 8}
	for _, c := range []struct {
		ops  []porcupine.Operation
		want porcupine.CheckResult
	}{
		{[]porcupine.Operation{linOpAt(1, cas, linOutput{ok: true}, 2, 3), linOpAt(0, look, linOutput{ok: true, val: 8}, 4, 5)}, porcupine.Ok},
		{[]porcupine.Operation{linOpAt(1, cas, linOutput{ok: true}, 2, 3), linOpAt(0, look, found, 4, 5)}, porcupine.Illegal},
		{[]porcupine.Operation{linOpAt(1, cas, linOutput{ok: true}, 2, 3), linOpAt(0, look, linOutput{}, 4, 5)}, porcupine.Illegal},
		{[]porcupine.Operation{linOpAt(1, cas, linOutput{ok: false}, 2, 3)}, porcupine.Illegal},
		{[]porcupine.Operation{linOpAt(1, linInput{op: linCompareAndSwap, key: 1, val: 9, swap: 8}, linOutput{ok: true}, 2, 3)}, porcupine.Illegal},
	} {
		ops := append([]porcupine.Operation{linOpAt(0, ins, linOutput{ok: true}, 0, 1)}, c.ops...)
		require.Equal(t, c.want, porcupine.CheckOperationsTimeout(linModel, ops, 10*time.Second), "%v", c.ops)
	}

	// A real history made wrong by one edit: the last lookup that found a
	// value is changed to return a value never inserted.
	hist := linRun(t, 99, 1, false, linFixed, 3, 60, 2)
	require.True(t, porcupine.CheckOperations(linModel, hist))
	edited := false
	for i := len(hist) - 1; i >= 0 && !edited; i-- {
		if in := hist[i].Input.(linInput); in.op == linLookup {
			hist[i].Output = linOutput{ok: true, val: 1 << 30}
			edited = true
		}
	}
	require.True(t, edited)
	require.Equal(t, porcupine.Illegal, porcupine.CheckOperationsTimeout(linModel, hist, 10*time.Second))
}

// groupByKey splits items into groups of equal key, in increasing key order,
// keeping the order of items within a group: one partition per key.
func groupByKey[E any](items []E, key func(E) int) [][]E {
	m := map[int][]E{}
	for _, it := range items {
		k := key(it)
		m[k] = append(m[k], it)
	}
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	out := make([][]E, 0, len(m))
	for _, k := range keys {
		out = append(out, m[k])
	}
	return out
}
