package bench

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
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
	linStore
	linSwap
	linCompute
	linLookupOrCompute
	linClear
	linDeleteFuncSaw
	linDeleteFuncDel
	linTimeWait
	linConnect
	linConnectBusy
	linConnectFunc // as called; recorded as a claim and a publish, or as busy
	linClaim
	linPublish
)

func (o linOp) String() string {
	return [...]string{"insert", "lookup", "delete", "lookupOrInsert", "compareAndDelete", "compareAndSwap",
		"store", "swap", "compute", "lookupOrCompute", "clear", "deleteFunc.saw", "deleteFunc.del",
		"timeWait", "connect", "connect.busy", "connectFunc", "connectFunc.claim", "connectFunc.publish"}[o]
}

// linInput is one call: val is the value's id for an insert,
// lookupOrInsert, store, swap, lookupOrCompute and a compute with UpdateOp,
// and the id of the value compared for compareAndDelete and compareAndSwap;
// swap is the id of the value compareAndSwap offers. cop is the op a
// compute's function returns; fail makes a lookupOrCompute's function
// return an error.
//
// A Clear is recorded as one clear per key, each spanning the whole call:
// Clear empties each bucket once, under its lock, so each key is absent at
// some moment of the call, though one inserted after its bucket was emptied
// stays. A DeleteFunc is one deleteFunc.saw per key, spanning the call,
// with the value its function saw for the key, or 0 if it never saw the key
// (one present for the whole call it must see, so the key was absent at
// some moment of the call); and, if the function approved the deletion of
// the key, a deleteFunc.del of it with the value the function saw (val):
// DeleteFunc deletes the entry only if its value is still that one, as a
// compareAndDelete does.
//
// TIME_WAIT: a timeWait marks the key in TIME_WAIT since second val, or
// clears its mark for val 0. A Connect with WithTimeWaitReuse over the
// ports of the connect keys (linKeys) is a connect of the key it took,
// with val the new value's id; its policy allows a mark of since at most
// cut, any mark for cut 0. A Connect that found no port is one
// connect.busy per connect key, spanning the call: it tries each port
// once, each under its own lock, so each key was taken (present and not
// reusable, or held) at some moment of the call. A ConnectFunc that took a
// key is a connectFunc.claim, from its call to its function's start, when
// it held the key (free, or marked and allowed, which it then claims), and
// a connectFunc.publish of val, from its function's end to its return.
// Which key a Connect takes is the scan's business: the model takes any
// that it could.
type linInput struct {
	op   linOp
	key  int
	val  int
	swap int
	cut  int
	cop  hash4.ComputeOp
	fail bool
}

// linOutput is one answer: for an insert and a store, ok reports success
// (false: ErrExists); for lookup, delete and deleteFunc.saw, ok and val (0
// when absent) as returned or seen; for lookupOrInsert, found and the value
// returned; for compareAndDelete and deleteFunc.del, deleted; for
// compareAndSwap, swapped; for swap, loaded and the old value. For compute,
// saw and sawOK are what its function was given, val and ok what Compute
// returned; for lookupOrCompute, val and ok (loaded) as returned, called
// whether its function ran and err whether an error was returned. err is
// also the ErrExists of a lookupOrInsert, swap or compute of a key a
// ConnectFunc holds. For timeWait, ok reports the key present; for connect
// and connectFunc.publish, val is the old value handed back (0: none).
type linOutput struct {
	ok     bool
	val    int
	saw    int
	sawOK  bool
	called bool
	err    bool
}

// linState is a key's state in the model: its value id (0 when absent), the
// second its TIME_WAIT mark dates from (0 when unmarked), and the hold of a
// ConnectFunc on it.
type linState struct {
	val, since int
	hold       linHold
}

// linHold is a ConnectFunc's hold on a key: none, a claim of the flow it
// takes over (whose value stays visible until the publish), or a
// reservation (invisible, but the key is taken: a free key the ConnectFunc
// took, or a claimed flow deleted meanwhile).
type linHold uint8

const (
	linUnheld linHold = iota
	linClaimed
	linReserved
)

// removed is the state after a delete of s, present: gone, with its mark,
// but a claimed key stays held.
func (s linState) removed() linState {
	if s.hold == linClaimed {
		return linState{hold: linReserved}
	}
	return linState{}
}

// reusable reports whether a Connect whose policy allows marks up to cut
// (any, for 0) may take the key over.
func (s linState) reusable(cut int) bool {
	return s.val != 0 && s.hold == linUnheld && s.since != 0 && (cut == 0 || s.since <= cut)
}

// free reports whether a Connect may take the key as a free port.
func (s linState) free() bool { return s.val == 0 && s.hold == linUnheld }

// linModel is a map from key to value id, partitioned by key: a partition's
// state is the key's linState.
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
	Init: func() any { return linState{} },
	Step: func(state, input, output any) (bool, any) {
		s, in, out := state.(linState), input.(linInput), output.(linOutput)
		held := s.hold == linReserved
		set := func(v int) linState { s.val = v; return s }
		switch in.op {
		case linInsert:
			if s.free() {
				return out.ok, linState{val: in.val}
			}
			return !out.ok, s
		case linLookup, linDeleteFuncSaw:
			return out.ok == (s.val != 0) && out.val == s.val, s
		case linDelete:
			if s.val == 0 {
				return !out.ok && out.val == 0, s
			}
			return out.ok && out.val == s.val, s.removed()
		case linLookupOrInsert:
			switch {
			case held:
				return out.err && !out.ok && out.val == 0, s
			case s.val == 0:
				return !out.err && !out.ok && out.val == in.val, linState{val: in.val}
			}
			return !out.err && out.ok && out.val == s.val, s
		case linCompareAndDelete, linDeleteFuncDel:
			if s.val != 0 && s.val == in.val {
				return out.ok, s.removed()
			}
			return !out.ok, s
		case linCompareAndSwap:
			if s.val != 0 && s.val == in.val {
				return out.ok, set(in.swap)
			}
			return !out.ok, s
		case linStore:
			if held {
				return !out.ok, s
			}
			return out.ok, set(in.val)
		case linSwap:
			if held {
				return out.err && !out.ok && out.val == 0, s
			}
			return !out.err && out.ok == (s.val != 0) && out.val == s.val, set(in.val)
		case linCompute:
			if held {
				return out.err && !out.sawOK && out.saw == 0 && !out.ok && out.val == 0, s
			}
			if out.err || out.sawOK != (s.val != 0) || out.saw != s.val {
				return false, s
			}
			switch in.cop {
			case hash4.UpdateOp:
				return out.ok && out.val == in.val, set(in.val)
			case hash4.DeleteOp:
				if s.val != 0 {
					s = s.removed()
				}
				return !out.ok && out.val == 0, s
			}
			return out.ok == (s.val != 0) && out.val == s.val, s
		case linLookupOrCompute:
			switch {
			case s.val != 0:
				return out.ok && out.val == s.val && !out.called && !out.err, s
			case held:
				return !out.ok && out.val == 0 && !out.called && out.err, s
			case in.fail:
				return !out.ok && out.val == 0 && out.called && out.err, s
			}
			return !out.ok && out.val == in.val && out.called && !out.err, linState{val: in.val}
		case linClear:
			if s.val == 0 {
				return true, s
			}
			return true, s.removed()
		case linTimeWait:
			if s.val == 0 {
				return !out.ok, s
			}
			s.since = in.val
			return out.ok, s
		case linConnect:
			switch {
			case s.free():
				return out.ok && out.val == 0, linState{val: in.val}
			case s.reusable(in.cut):
				return out.ok && out.val == s.val, linState{val: in.val}
			}
			return false, s
		case linConnectBusy:
			return !s.free() && !s.reusable(in.cut), s
		case linClaim:
			switch {
			case s.free():
				return out.ok, linState{hold: linReserved}
			case s.reusable(in.cut):
				s.hold = linClaimed
				return out.ok, s
			}
			return false, s
		case linPublish:
			switch s.hold {
			case linReserved:
				return out.ok && out.val == 0, linState{val: in.val}
			case linClaimed:
				return out.ok && out.val == s.val, linState{val: in.val}
			}
			return false, s
		}
		return false, s
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(linInput), output.(linOutput)
		switch in.op {
		case linCompareAndSwap:
			return fmt.Sprintf("%v(k%d, %d, %d) -> %v", in.op, in.key, in.val, in.swap, out.ok)
		case linCompute:
			return fmt.Sprintf("%v(k%d, op %d, %d) -> saw %d %v, %d %v, err %v", in.op, in.key, in.cop, in.val, out.saw, out.sawOK, out.val, out.ok, out.err)
		case linLookupOrCompute:
			return fmt.Sprintf("%v(k%d, %d, fail %v) -> %d %v, called %v, err %v", in.op, in.key, in.val, in.fail, out.val, out.ok, out.called, out.err)
		case linClear:
			return fmt.Sprintf("%v(k%d)", in.op, in.key)
		case linConnect, linConnectBusy, linClaim:
			return fmt.Sprintf("%v(k%d, %d, cut %d) -> %v %d", in.op, in.key, in.val, in.cut, out.ok, out.val)
		}
		return fmt.Sprintf("%v(k%d, %d) -> %v %d, err %v", in.op, in.key, in.val, out.ok, out.val, out.err)
	},
	DescribeState: func(state any) string {
		s := state.(linState)
		return fmt.Sprintf("%d since %d hold %d", s.val, s.since, s.hold)
	},
}

// errLinCompute is the error of the lookupOrCompute functions that fail.
var errLinCompute = errors.New("compute failed")

// linSecret fixes the table's hash, so that keys can be chosen by bucket.
var linSecret = hash4.Secret{Ehash: 0x01234567, Ehash6Addr: 0x89abcdef, Seed: 0x0f1e2d3c4b5a6978}

// linLargeBuckets is the bucket count of the runs on a large table, whose
// buckets' lines are beyond the caches.
const linLargeBuckets = 1 << 16

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

// linConnectPort is the local port of the first connect key (linKeys).
const linConnectPort = 40000

// linTimeWaitShare is the share of the ops on the connect keys (timeWait,
// Connect, ConnectFunc and more lookups), in hundredths of the others.
const linTimeWaitShare = 30

// linKeys returns the nKeys keys of a run: the first half in bucket
// linChainBucket of a table of the given bucket count (a long chain), the
// rest, the connect keys, anywhere: the flows from one local address to
// one peer on the consecutive local ports from linConnectPort, the ports
// of the run's Connects, of one family or the other as the seed goes. A
// tuple's hash is that of the tuple with local port 0 plus the local port
// (HashTuple), so a local port puts a key in the bucket chosen.
func linKeys(t *testing.T, seed uint64, buckets, nKeys int) []Tuple {
	mask := uint32(buckets - 1)
	var keys []Tuple
	for i := 0; len(keys) < nKeys/2; i++ {
		k := linKey(int(seed)*1000+i, i%2 == 1)
		k.Local = netip.AddrPortFrom(k.Local.Addr(), 0)
		port := uint16((linChainBucket - hash4.HashTuple(k, hash4.LinuxHasher, linSecret)) & mask)
		if port == 0 {
			continue
		}
		k.Local = netip.AddrPortFrom(k.Local.Addr(), port)
		require.Equal(t, uint32(linChainBucket), hash4.HashTuple(k, hash4.LinuxHasher, linSecret)&mask)
		keys = append(keys, k)
	}
	k := linKey(int(seed)*1000+999, seed%3 == 0)
	for j := range nKeys - nKeys/2 {
		k.Local = netip.AddrPortFrom(k.Local.Addr(), linConnectPort+uint16(j))
		keys = append(keys, k)
	}
	return keys
}

// linAllow returns the reuse policy of a connect of cut (see linInput).
func linAllow(cut int) hash4.ReusePolicy {
	return func(_ Tuple, since time.Time) bool { return cut == 0 || !since.After(time.Unix(int64(cut), 0)) }
}

// linRun records a history of nClients goroutines doing opsPerClient random
// operations each on nKeys keys of a table of 16 buckets, or of
// linLargeBuckets if large, and with linGrow, while another goroutine grows
// the table from 16 buckets to 1024 (or from linLargeBuckets to four times
// as many), a doubling at a time,
// each followed by a Compact, or with linGrowItself, while another inserts
// 2048 keys that no client uses, into a table filled with such keys to
// just under two per bucket (less 128 keys) if large, so that the table grows itself.
//
// A client's ops include TIME_WAIT marks of the connect keys (linKeys), and
// Connects and ConnectFuncs with WithTimeWaitReuse over their ports.
//
// Each client yields now and then between ops, and, to make the ops of
// different clients overlap where the clients take turns on one processor
// (GOMAXPROCS=1), now and then inside an op's interval: after the op's call
// time is taken, before it runs, or after it ran, before its return time.
// Another client's ops then fall within the interval; the checker takes
// the op to happen at any point of it.
func linRun(t *testing.T, seed uint64, large bool, grow linGrowth, nClients, opsPerClient, nKeys int) []porcupine.Operation {
	t.Helper()
	buckets, grownTo := 16, 1024
	if large {
		buckets, grownTo = linLargeBuckets, 4*linLargeBuckets
	}
	opts := []hash4.Option{hash4.WithCapacity(buckets), hash4.WithSecret(linSecret)}
	if grow == linFixed {
		opts = append(opts, hash4.WithFixedBuckets())
	}
	tab := hash4.New[int](opts...)
	require.Equal(t, buckets, tab.Stats().Buckets)
	// The keys, each spelled two ways (linAs16).
	keys := linKeys(t, seed, buckets, nKeys)
	// The Connects' allocator, whose range is the connect keys' ports, and
	// their flow.
	connKeys := keys[nKeys/2:]
	alloc, err := hash4.NewPortAllocator(hash4.WithPolicy(hash4.Flat),
		hash4.WithPortRange(hash4.PortRange{Low: linConnectPort, High: linConnectPort + uint16(len(connKeys)-1)}))
	require.NoError(t, err)
	connLocal, connRemote := connKeys[0].Local.Addr(), connKeys[0].Remote
	// The index of each key in the form the table gives it (DeleteFunc).
	keyIndex := make(map[Tuple]int, nKeys)
	for i, k := range keys {
		keyIndex[k] = i
	}
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
			// id returns the id of a value the table gave, 0 for nil.
			id := func(what string, v *int) int {
				if v == nil {
					return 0
				}
				if *v <= 0 || *v >= len(vals) || vals[*v] != v {
					bad.Store(fmt.Sprintf("%v gave a pointer that is no inserted value", what))
					return 0
				}
				return *v
			}
			// A Clear or DeleteFunc walks every bucket: on a large
			// table (large), too slow under the race detector to make
			// at random, client 0 makes one, a DeleteFunc or a Clear as
			// the seed is odd or even, at an op of the middle half of
			// its run.
			scanAt := -1
			if large && c == 0 {
				scanAt = opsPerClient/4 + r.IntN(opsPerClient/2)
			}
			start.Wait()
			for i := range opsPerClient {
				ki := r.IntN(nKeys)
				k := keys[ki]
				if r.IntN(2) == 0 {
					k = linAs16(k)
				}
				fresh := c*opsPerClient + i + 1 // this op's own value id
				in := linInput{key: ki}
				var out linOutput
				var got *int
				expect := 0     // the value a DeleteFunc approves, 0 for any
				linger := false // yield inside the op's interval, both sides
				switch p := r.IntN(100 + linTimeWaitShare); {
				case p >= 100:
					// TIME_WAIT: a mark or a lookup of a connect key, or
					// a Connect over the connect keys' ports.
					ki = nKeys/2 + r.IntN(len(connKeys))
					k, in.key = keys[ki], ki
					if r.IntN(2) == 0 {
						k = linAs16(k)
					}
					switch q := p - 100; {
					case q < 10:
						in.op, in.val = linTimeWait, r.IntN(4)
					case q < 18:
						in.op, in.val, in.cut = linConnect, fresh, r.IntN(3)
					case q < 24:
						in.op, in.val, in.cut = linConnectFunc, fresh, r.IntN(3)
					default:
						// Lookups that linger, to meet the takeovers.
						in.op, linger = linLookup, true
					}
				case p < 17:
					in.op, in.val = linInsert, fresh
				case p < 30:
					in.op = linDelete
				case p < 38:
					in.op = linLookup
				case p < 46:
					in.op, in.val = linLookupOrInsert, fresh
				case p < 62:
					// Mostly the value this client last saw, which may
					// still be current; else any value.
					in.op, in.val = linCompareAndDelete, 1+r.IntN(len(vals)-1)
					if p >= 54 {
						in.op, in.swap = linCompareAndSwap, fresh
					}
					if seen[ki] != 0 && r.IntN(4) != 0 {
						in.val = seen[ki]
					}
				case p < 68:
					in.op, in.val = linStore, fresh
				case p < 74:
					in.op, in.val = linSwap, fresh
				case p < 83:
					in.op, in.cop = linCompute, hash4.ComputeOp(r.IntN(3))
					if in.cop == hash4.UpdateOp {
						in.val = fresh
					}
				case p < 91:
					in.op, in.val, in.fail = linLookupOrCompute, fresh, r.IntN(4) == 0
				case large:
					// Too slow to make at random here (below).
					in.op = linLookup
				case p < 96:
					in.op = linDeleteFuncDel
				default:
					in.op = linClear
				}
				if i == scanAt {
					in.op = [...]linOp{linClear, linDeleteFuncDel}[seed%2]
				}
				if in.op == linDeleteFuncDel && r.IntN(2) == 0 {
					// The function approves key ki only, and half the
					// time only with the value this client last saw.
					expect = seen[ki]
				}
				if in.op == linClear && grow == linGrowItself {
					// A Clear before the table began to grow would take
					// away the fill that makes it grow: wait for the
					// filler's inserts to start the growth.
					for deadline := time.Now().Add(30 * time.Second); tab.Metrics().Buckets == buckets; runtime.Gosched() {
						if time.Now().After(deadline) {
							bad.Store("the table did not begin to grow")
							break
						}
					}
				}
				var sights [][2]int          // a DeleteFunc's: key, value id seen
				var claimed, published int64 // a ConnectFunc's function's start and end
				call := clock.Add(1)
				if r.IntN(8) == 0 || linger {
					runtime.Gosched()
				}
				// expectErr reports an error that is not ErrExists, the
				// error of a write of a key a ConnectFunc holds.
				expectErr := func(err error) {
					if err != nil && !errors.Is(err, hash4.ErrExists) {
						bad.Store(fmt.Sprintf("%v %v: %v", in.op, k, err))
					}
				}
				switch in.op {
				case linInsert:
					err := tab.Insert(k, vals[in.val])
					out.ok = err == nil
					expectErr(err)
				case linLookup:
					got, out.ok = tab.Lookup(k)
				case linDelete:
					got, out.ok = tab.Delete(k)
				case linLookupOrInsert, linSwap:
					var err error
					if in.op == linSwap {
						got, out.ok, err = tab.Swap(k, vals[in.val])
					} else {
						got, out.ok, err = tab.LookupOrInsert(k, vals[in.val])
					}
					out.err = err != nil
					expectErr(err)
				case linCompareAndDelete:
					out.ok = tab.CompareAndDelete(k, vals[in.val])
				case linCompareAndSwap:
					out.ok = tab.CompareAndSwap(k, vals[in.val], vals[in.swap])
				case linStore:
					err := tab.Store(k, vals[in.val])
					out.ok = err == nil
					expectErr(err)
				case linCompute:
					calls := 0
					var err error
					got, out.ok, err = tab.Compute(k, func(old *int, loaded bool) (*int, hash4.ComputeOp) {
						calls++
						out.saw, out.sawOK = id("compute", old), loaded
						if in.cop == hash4.UpdateOp {
							return vals[in.val], in.cop
						}
						return old, in.cop
					})
					out.err = err != nil
					expectErr(err)
					if calls != 1 && !out.err || calls != 0 && out.err {
						bad.Store(fmt.Sprintf("compute %v: %d calls, %v", k, calls, err))
					}
				case linLookupOrCompute:
					calls := 0
					var err error
					got, out.ok, err = tab.LookupOrCompute(k, func() (*int, error) {
						calls++
						if in.fail {
							return nil, errLinCompute
						}
						return vals[in.val], nil
					})
					out.called, out.err = calls > 0, err != nil
					if calls > 1 || (err != nil && !errors.Is(err, errLinCompute) && !errors.Is(err, hash4.ErrExists)) {
						bad.Store(fmt.Sprintf("lookupOrCompute %v: %d calls, %v", k, calls, err))
					}
				case linDeleteFuncDel:
					approved := false
					n := tab.DeleteFunc(func(tup Tuple, v *int) bool {
						j, ok := keyIndex[tup]
						if !ok {
							return false // a key no client uses
						}
						vid := id("deleteFunc", v)
						sights = append(sights, [2]int{j, vid})
						if j == ki && !approved && (expect == 0 || vid == expect) {
							approved, in.val = true, vid
							return true
						}
						return false
					})
					out.ok = n == 1
					if n > 1 || n == 1 && !approved {
						bad.Store(fmt.Sprintf("deleteFunc deleted %d, approved %v", n, approved))
					}
					if !approved {
						in.op = linDeleteFuncSaw // no deletion to record
					}
				case linClear:
					tab.Clear()
				case linTimeWait:
					since := time.Time{}
					if in.val != 0 {
						since = time.Unix(int64(in.val), 0)
					}
					out.ok = tab.TimeWait(k, since)
				case linConnect, linConnectFunc:
					local := connLocal
					if r.IntN(2) == 0 {
						local = netip.AddrFrom16(local.As16())
					}
					reuse := hash4.WithTimeWaitReuse(linAllow(in.cut), &got)
					var tup Tuple
					var err error
					if in.op == linConnect {
						tup, err = tab.Connect(alloc, local, connRemote, vals[in.val], reuse)
					} else {
						calls := 0
						var v *int
						tup, v, err = tab.ConnectFunc(alloc, local, connRemote, func(Tuple) (*int, error) {
							calls++
							claimed = clock.Add(1)
							// Let others meet the key held.
							runtime.Gosched()
							published = clock.Add(1)
							return vals[in.val], nil
						}, reuse)
						if calls != 1 && err == nil || calls != 0 && err != nil || err == nil && v != vals[in.val] {
							bad.Store(fmt.Sprintf("connectFunc: %d calls, %v, %v", calls, v, err))
						}
					}
					switch j, ok := keyIndex[tup]; {
					case err == nil && ok:
						in.key, out.ok = j, true
					case errors.Is(err, hash4.ErrNoPorts) && got == nil:
						in.op = linConnectBusy
					default:
						bad.Store(fmt.Sprintf("%v took %v, handing back %v: %v", in.op, tup, got, err))
					}
				}
				if r.IntN(8) == 0 || linger {
					runtime.Gosched()
				}
				ret := clock.Add(1)
				switch {
				case in.op == linConnect, in.op == linConnectFunc:
					seen[in.key] = in.val
				case in.op == linInsert && out.ok, in.op == linStore && out.ok, in.op == linSwap && !out.err:
					seen[ki] = in.val
				case in.op == linCompareAndSwap && out.ok:
					seen[ki] = in.swap
				case got != nil:
					seen[ki] = *got
				}
				out.val = id(in.op.String(), got)
				switch in.op {
				case linConnectBusy:
					for j := nKeys / 2; j < nKeys; j++ {
						ops = append(ops, porcupine.Operation{ClientId: c, Input: linInput{op: linConnectBusy, key: j, cut: in.cut}, Call: call, Output: linOutput{}, Return: ret})
					}
				case linConnectFunc:
					ops = append(ops,
						porcupine.Operation{ClientId: c, Input: linInput{op: linClaim, key: in.key, cut: in.cut}, Call: call, Output: linOutput{ok: true}, Return: claimed},
						porcupine.Operation{ClientId: c, Input: linInput{op: linPublish, key: in.key, val: in.val}, Call: published, Output: out, Return: ret})
				case linClear:
					for j := range nKeys {
						ops = append(ops, porcupine.Operation{ClientId: c, Input: linInput{op: linClear, key: j}, Call: call, Output: linOutput{}, Return: ret})
					}
				case linDeleteFuncDel, linDeleteFuncSaw:
					saw := make([]bool, nKeys)
					for _, s := range sights {
						saw[s[0]], seen[s[0]] = true, s[1]
						ops = append(ops, porcupine.Operation{ClientId: c, Input: linInput{op: linDeleteFuncSaw, key: s[0]},
							Call: call, Output: linOutput{ok: true, val: s[1]}, Return: ret})
					}
					for j := range nKeys {
						if !saw[j] {
							ops = append(ops, porcupine.Operation{ClientId: c, Input: linInput{op: linDeleteFuncSaw, key: j},
								Call: call, Output: linOutput{}, Return: ret})
						}
					}
					if in.op == linDeleteFuncDel {
						ops = append(ops, porcupine.Operation{ClientId: c, Input: in, Call: call, Output: out, Return: ret})
					}
				default:
					ops = append(ops, porcupine.Operation{ClientId: c, Input: in, Call: call, Output: out, Return: ret})
				}
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
	overlapping, duringTakeover := 0, 0
	outcomes := map[string]int{}
	// The outcomes the histories must hold, each at least once.
	wanted := []string{
		"compareAndSwap true", "store", "swap true", "swap false",
		"compute update true", "compute delete true", "compute cancel true", "compute cancel false",
		"lookupOrCompute true", "lookupOrCompute called", "lookupOrCompute failed",
		"deleteFunc.del true", "deleteFunc.saw true", "deleteFunc.saw false", "clear",
		"timeWait true", "timeWait false", "connect free", "connect takeover", "connect.busy",
		"connectFunc.claim", "connectFunc.publish free", "connectFunc.publish takeover",
		"a write failing on a held key",
	}
	lacking := func() bool {
		if overlapping == 0 || duringTakeover == 0 ||
			outcomes["connect takeover"] < runs || outcomes["connectFunc.publish takeover"] < runs {
			return true
		}
		for _, o := range wanted {
			if outcomes[o] == 0 {
				return true
			}
		}
		return false
	}
	// On a loaded machine the clients may happen to run one at a time; keep
	// going (bounded) until some history is really concurrent, with a
	// lookup overlapping a takeover, and the histories hold every outcome
	// checked below: some, such as a write failing on a key a ConnectFunc
	// holds, need the clients to interleave too.
	for run := 0; run < runs || lacking() && run < 10*runs; run++ {
		large, grow := run%4 >= 2, linGrowth(run%12/4)
		hist := linRun(t, uint64(run+1), large, grow, 4, ops, 4)
		// A Clear or DeleteFunc is recorded as several operations of one
		// interval; each call has a call time of its own.
		calls := map[int64]bool{}
		for _, op := range hist {
			if op.Input.(linInput).op != linPublish { // a ConnectFunc's second
				calls[op.Call] = true
			}
			outcomes[linOutcome(op)]++
		}
		require.Len(t, calls, 4*ops)
		overlapping += linOverlapping(hist)
		duringTakeover += linDuringTakeover(hist)
		res, info := porcupine.CheckOperationsVerbose(linModel, hist, 30*time.Second)
		if res == porcupine.Illegal {
			// The history, drawn, for whoever looks into it.
			path := filepath.Join(os.TempDir(), fmt.Sprintf("hash4-linearizability-run%d-%d.html", run, time.Now().UnixNano()))
			if err := porcupine.VisualizePath(linModel, info, path); err == nil {
				t.Logf("the rejected history: %s", path)
			}
		}
		require.Equal(t, porcupine.Ok, res, "run %d (large %v, growth %v): history not linearizable", run, large, grow)
		if run%5 == 0 {
			require.Equal(t, porcupine.Ok, porcupine.CheckEventsTimeout(linModel, linEvents(hist), 30*time.Second), "run %d as events", run)
		}
	}
	// The histories are concurrent, not a sequence of isolated calls, and
	// hold each op with each of its outcomes that change or find a value.
	t.Logf("%d operations overlap another client's, %d lookups a takeover; outcomes %v", overlapping, duringTakeover, outcomes)
	require.Positive(t, overlapping)
	require.Positive(t, duringTakeover, "lookups concurrent with a takeover of their key")
	require.GreaterOrEqual(t, outcomes["connect takeover"], runs)
	require.GreaterOrEqual(t, outcomes["connectFunc.publish takeover"], runs)
	for _, o := range wanted {
		require.Positive(t, outcomes[o], "the histories hold %s", o)
	}
}

// linOutcome names an operation's op and outcome: for a compute, what its
// function returned and whether it saw a value.
func linOutcome(op porcupine.Operation) string {
	in, out := op.Input.(linInput), op.Output.(linOutput)
	switch in.op {
	case linStore, linClaim:
		if in.op == linStore && !out.ok {
			return "a write failing on a held key"
		}
		return in.op.String()
	case linClear, linConnectBusy:
		return in.op.String()
	case linConnect, linPublish:
		if out.val != 0 {
			return in.op.String() + " takeover"
		}
		return in.op.String() + " free"
	case linLookupOrInsert, linSwap:
		if out.err {
			return "a write failing on a held key"
		}
	case linCompute:
		if out.err {
			return "a write failing on a held key"
		}
		return fmt.Sprintf("%v %v %v", in.op, [...]string{"cancel", "update", "delete"}[in.cop], out.sawOK)
	case linLookupOrCompute:
		switch {
		case out.err:
			return "lookupOrCompute failed"
		case out.called:
			return "lookupOrCompute called"
		}
	}
	return fmt.Sprintf("%v %v", in.op, out.ok)
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

// linDuringTakeover counts lookups whose interval overlaps that of a
// takeover of their key by a Connect, or by a ConnectFunc's publish.
func linDuringTakeover(hist []porcupine.Operation) int {
	n := 0
	for _, a := range hist {
		in := a.Input.(linInput)
		if in.op != linLookup {
			continue
		}
		for _, b := range hist {
			tin := b.Input.(linInput)
			if (tin.op == linConnect || tin.op == linPublish) && tin.key == in.key && b.Output.(linOutput).val != 0 &&
				a.Call < b.Return && b.Call < a.Return {
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

	// The ops added since: each case follows insert(k1, 7) at [0, 1], and
	// each wrong output is rejected beside the right one.
	at := func(client int, in linInput, out linOutput, call, ret int64) []porcupine.Operation {
		return []porcupine.Operation{linOpAt(client, in, out, call, ret)}
	}
	then := func(ops ...[]porcupine.Operation) []porcupine.Operation {
		var all []porcupine.Operation
		for _, o := range ops {
			all = append(all, o...)
		}
		return all
	}
	after := func(out linOutput) []porcupine.Operation { return at(0, look, out, 4, 5) }
	absent, has8 := linOutput{}, linOutput{ok: true, val: 8}
	store := linInput{op: linStore, key: 1, val: 8}
	swap := linInput{op: linSwap, key: 1, val: 8}
	compute := func(op hash4.ComputeOp, v int) linInput { return linInput{op: linCompute, key: 1, cop: op, val: v} }
	loc := linInput{op: linLookupOrCompute, key: 1, val: 8}
	locFail := linInput{op: linLookupOrCompute, key: 1, val: 8, fail: true}
	clear := func(key int) linInput { return linInput{op: linClear, key: key} }
	saw := linInput{op: linDeleteFuncSaw, key: 1}
	dfDel := func(v int) linInput { return linInput{op: linDeleteFuncDel, key: 1, val: v} }
	for _, c := range []struct {
		name string
		ops  []porcupine.Operation
		want porcupine.CheckResult
	}{
		{"store", then(at(1, store, linOutput{ok: true}, 2, 3), after(has8)), porcupine.Ok},
		{"lookup of the value a store replaced", then(at(1, store, linOutput{ok: true}, 2, 3), after(found)), porcupine.Illegal},
		{"store failing", at(1, store, linOutput{}, 2, 3), porcupine.Illegal},

		{"swap", then(at(1, swap, found, 2, 3), after(has8)), porcupine.Ok},
		{"swap loading nothing from a present key", at(1, swap, absent, 2, 3), porcupine.Illegal},
		{"swap loading a value never held", at(1, swap, linOutput{ok: true, val: 9}, 2, 3), porcupine.Illegal},
		{"lookup of the value a swap replaced", then(at(1, swap, found, 2, 3), after(found)), porcupine.Illegal},
		{"swap concurrent with a delete loading nothing", then(at(1, swap, absent, 2, 5), at(0, del, found, 3, 4), after(has8)), porcupine.Ok},

		{"compute update", then(at(1, compute(hash4.UpdateOp, 8), linOutput{saw: 7, sawOK: true, ok: true, val: 8}, 2, 3), after(has8)), porcupine.Ok},
		{"compute seeing no value of a present key", at(1, compute(hash4.UpdateOp, 8), linOutput{ok: true, val: 8}, 2, 3), porcupine.Illegal},
		{"compute seeing the value without loaded", at(1, compute(hash4.UpdateOp, 8), linOutput{saw: 7, ok: true, val: 8}, 2, 3), porcupine.Illegal},
		{"compute update returning the old value", at(1, compute(hash4.UpdateOp, 8), linOutput{saw: 7, sawOK: true, ok: true, val: 7}, 2, 3), porcupine.Illegal},
		{"lookup of the value a compute replaced", then(at(1, compute(hash4.UpdateOp, 8), linOutput{saw: 7, sawOK: true, ok: true, val: 8}, 2, 3), after(found)), porcupine.Illegal},
		{"compute delete", then(at(1, compute(hash4.DeleteOp, 0), linOutput{saw: 7, sawOK: true}, 2, 3), after(absent)), porcupine.Ok},
		{"compute delete keeping the value", at(1, compute(hash4.DeleteOp, 0), linOutput{saw: 7, sawOK: true, ok: true, val: 7}, 2, 3), porcupine.Illegal},
		{"lookup of the value a compute deleted", then(at(1, compute(hash4.DeleteOp, 0), linOutput{saw: 7, sawOK: true}, 2, 3), after(found)), porcupine.Illegal},
		{"compute cancel", then(at(1, compute(hash4.CancelOp, 0), linOutput{saw: 7, sawOK: true, ok: true, val: 7}, 2, 3), after(found)), porcupine.Ok},
		{"compute cancel returning no value", at(1, compute(hash4.CancelOp, 0), linOutput{saw: 7, sawOK: true}, 2, 3), porcupine.Illegal},
		{"compute cancel of an absent key", then(at(0, del, found, 2, 3), at(1, compute(hash4.CancelOp, 0), absent, 4, 5)), porcupine.Ok},
		{"compute cancel inventing a value", then(at(0, del, found, 2, 3), at(1, compute(hash4.CancelOp, 0), linOutput{ok: true, val: 7}, 4, 5)), porcupine.Illegal},

		{"lookupOrCompute of a present key", at(1, loc, found, 2, 3), porcupine.Ok},
		{"lookupOrCompute inserting over a present key", at(1, loc, linOutput{val: 8, called: true}, 2, 3), porcupine.Illegal},
		{"lookupOrCompute calling its function for a present key", at(1, loc, linOutput{ok: true, val: 7, called: true}, 2, 3), porcupine.Illegal},
		{"lookupOrCompute of an absent key", then(at(0, del, found, 2, 3), at(1, loc, linOutput{val: 8, called: true}, 4, 5), at(0, look, has8, 6, 7)), porcupine.Ok},
		{"lookupOrCompute of an absent key without its function", then(at(0, del, found, 2, 3), at(1, loc, linOutput{val: 8}, 4, 5)), porcupine.Illegal},
		{"lookupOrCompute failing", then(at(0, del, found, 2, 3), at(1, locFail, linOutput{called: true, err: true}, 4, 5), at(0, look, absent, 6, 7)), porcupine.Ok},
		{"lookup of the value of a failed lookupOrCompute", then(at(0, del, found, 2, 3), at(1, locFail, linOutput{called: true, err: true}, 4, 5), at(0, look, has8, 6, 7)), porcupine.Illegal},
		{"lookupOrCompute failing without its function", then(at(0, del, found, 2, 3), at(1, locFail, linOutput{err: true}, 4, 5)), porcupine.Illegal},

		{"clear", then(at(1, clear(1), absent, 2, 3), after(absent)), porcupine.Ok},
		{"lookup of a value cleared", then(at(1, clear(1), absent, 2, 3), after(found)), porcupine.Illegal},
		{"lookup concurrent with a clear", then(at(1, clear(1), absent, 2, 5), at(0, look, found, 4, 6)), porcupine.Ok},
		{"insert failing after a clear", then(at(1, clear(1), absent, 2, 3), at(0, linInput{op: linInsert, key: 1, val: 8}, linOutput{}, 4, 5)), porcupine.Illegal},
		{"key 2 cleared, key 1 kept", then(at(1, clear(2), absent, 2, 3), after(found)), porcupine.Ok},

		{"deleteFunc seeing the value", at(1, saw, found, 2, 3), porcupine.Ok},
		{"deleteFunc missing a key present throughout", at(1, saw, absent, 2, 3), porcupine.Illegal},
		{"deleteFunc missing a key deleted meanwhile", then(at(1, saw, absent, 2, 5), at(0, del, found, 3, 4)), porcupine.Ok},
		{"deleteFunc seeing a value never held", at(1, saw, linOutput{ok: true, val: 9}, 2, 3), porcupine.Illegal},
		{"deleteFunc deleting", then(at(1, saw, found, 2, 3), at(1, dfDel(7), linOutput{ok: true}, 2, 3), after(absent)), porcupine.Ok},
		{"lookup of the value deleteFunc deleted", then(at(1, saw, found, 2, 3), at(1, dfDel(7), linOutput{ok: true}, 2, 3), after(found)), porcupine.Illegal},
		{"deleteFunc failing to delete the value it saw", at(1, dfDel(7), linOutput{}, 2, 3), porcupine.Illegal},
		{"deleteFunc failing after a swap", then(at(1, dfDel(7), linOutput{}, 2, 5), at(0, swap, found, 3, 4)), porcupine.Ok},
		{"deleteFunc deleting a value that is not the key's", at(1, dfDel(9), linOutput{ok: true}, 2, 3), porcupine.Illegal},
	} {
		ops := append([]porcupine.Operation{linOpAt(0, ins, linOutput{ok: true}, 0, 1)}, c.ops...)
		require.Equal(t, c.want, porcupine.CheckOperationsTimeout(linModel, ops, 10*time.Second), c.name)
	}

	// TIME_WAIT: each case follows insert(k1, 7) at [0, 1], and mostly a
	// mark of k1 at [2, 3] (marked).
	tw := func(since int) linInput { return linInput{op: linTimeWait, key: 1, val: since} }
	conn := func(cut, v int) linInput { return linInput{op: linConnect, key: 1, cut: cut, val: v} }
	busy := func(cut int) linInput { return linInput{op: linConnectBusy, key: 1, cut: cut} }
	claim := linInput{op: linClaim, key: 1}
	publish := linInput{op: linPublish, key: 1, val: 8}
	ok, none := linOutput{ok: true}, linOutput{}
	old := func(v int) linOutput { return linOutput{ok: true, val: v} }
	marked := at(1, tw(1), ok, 2, 3)
	ins9 := linInput{op: linInsert, key: 1, val: 9}
	for _, c := range []struct {
		name string
		ops  []porcupine.Operation
		want porcupine.CheckResult
	}{
		{"timeWait of a present key", then(marked, at(0, look, found, 4, 5)), porcupine.Ok},
		{"timeWait reporting a present key absent", at(1, tw(1), none, 2, 3), porcupine.Illegal},
		{"timeWait reporting an absent key present", then(at(0, del, found, 2, 3), at(1, tw(1), ok, 4, 5)), porcupine.Illegal},

		{"takeover", then(marked, at(1, conn(0, 8), old(7), 4, 5), at(0, look, has8, 6, 7)), porcupine.Ok},
		{"takeover handing back a value the key never had", then(marked, at(1, conn(0, 8), old(9), 4, 5)), porcupine.Illegal},
		{"takeover handing back nothing", then(marked, at(1, conn(0, 8), ok, 4, 5)), porcupine.Illegal},
		{"takeover of an unmarked key", at(1, conn(0, 8), old(7), 2, 3), porcupine.Illegal},
		{"takeover of a key whose mark was cleared", then(marked, at(1, tw(0), ok, 4, 5), at(1, conn(0, 8), old(7), 6, 7)), porcupine.Illegal},
		{"takeover of a mark the policy allows", then(at(1, tw(2), ok, 2, 3), at(1, conn(2, 8), old(7), 4, 5)), porcupine.Ok},
		{"takeover of a mark the policy refuses", then(at(1, tw(3), ok, 2, 3), at(1, conn(2, 8), old(7), 4, 5)), porcupine.Illegal},
		{"lookup of the old value during a takeover", then(marked, at(1, conn(0, 8), old(7), 4, 7), at(0, look, found, 5, 6)), porcupine.Ok},
		{"lookup of the new value during a takeover", then(marked, at(1, conn(0, 8), old(7), 4, 7), at(0, look, has8, 5, 6)), porcupine.Ok},
		{"lookup finding nothing during a takeover", then(marked, at(1, conn(0, 8), old(7), 4, 7), at(0, look, absent, 5, 6)), porcupine.Illegal},
		{"lookup finding nothing between the mark and the takeover", then(marked, at(0, look, absent, 4, 5), at(1, conn(0, 8), old(7), 6, 7)), porcupine.Illegal},
		{"lookup of the old value after a takeover", then(marked, at(1, conn(0, 8), old(7), 4, 5), at(0, look, found, 6, 7)), porcupine.Illegal},
		{"takeover of the value a store put in", then(marked, at(0, store, ok, 4, 5), at(1, conn(0, 9), old(8), 6, 7)), porcupine.Ok},
		{"takeover after a delete and an insert", then(marked, at(0, del, found, 4, 5), at(0, ins9, ok, 6, 7), at(1, conn(0, 8), old(9), 8, 9)), porcupine.Illegal},
		{"takeover after a delete, an insert and a mark", then(marked, at(0, del, found, 4, 5), at(0, ins9, ok, 6, 7), at(1, tw(1), ok, 8, 9), at(1, conn(0, 8), old(9), 10, 11)), porcupine.Ok},
		{"two takeovers of one mark", then(marked, at(1, conn(0, 8), old(7), 4, 7), at(0, conn(0, 9), old(8), 5, 6)), porcupine.Illegal},
		{"connect of a free key", then(at(0, del, found, 2, 3), at(1, conn(0, 8), ok, 4, 5), at(0, look, has8, 6, 7)), porcupine.Ok},
		{"connect of a free key handing back a value", then(at(0, del, found, 2, 3), at(1, conn(0, 8), old(7), 4, 5)), porcupine.Illegal},
		{"connect of a present unmarked key as free", at(1, conn(0, 8), ok, 2, 3), porcupine.Illegal},
		{"no port: the key present and unmarked", at(1, busy(0), none, 2, 3), porcupine.Ok},
		{"no port: the mark refused", then(at(1, tw(3), ok, 2, 3), at(1, busy(2), none, 4, 5)), porcupine.Ok},
		{"no port: the key marked and allowed", then(marked, at(1, busy(0), none, 4, 5)), porcupine.Illegal},
		{"no port: the key free", then(at(0, del, found, 2, 3), at(1, busy(0), none, 4, 5)), porcupine.Illegal},
		{"no port: the key deleted meanwhile", then(at(1, busy(0), none, 2, 5), at(0, del, found, 3, 4)), porcupine.Ok},

		{"connectFunc taking over", then(marked, at(1, claim, ok, 4, 5), at(0, look, found, 6, 7), at(1, publish, old(7), 8, 9), at(0, look, has8, 10, 11)), porcupine.Ok},
		{"connectFunc taking over an unmarked key", at(1, claim, ok, 2, 3), porcupine.Illegal},
		{"lookup finding nothing during a claim", then(marked, at(1, claim, ok, 4, 5), at(0, look, absent, 6, 7), at(1, publish, old(7), 8, 9)), porcupine.Illegal},
		{"connectFunc handing back a value the key never had", then(marked, at(1, claim, ok, 4, 5), at(1, publish, old(9), 6, 7)), porcupine.Illegal},
		{"connectFunc handing back the value a store put in meanwhile", then(marked, at(1, claim, ok, 4, 5), at(0, linInput{op: linStore, key: 1, val: 9}, ok, 6, 7), at(1, publish, old(9), 8, 9)), porcupine.Ok},
		{"connect taking a claimed key over", then(marked, at(1, claim, ok, 4, 5), at(0, conn(0, 9), old(7), 6, 7)), porcupine.Illegal},
		{"no port: the key claimed", then(marked, at(1, claim, ok, 4, 5), at(0, busy(0), none, 6, 7)), porcupine.Ok},
		{"a claimed key deleted meanwhile stays held", then(marked, at(1, claim, ok, 4, 5), at(0, del, found, 6, 7), at(0, ins9, none, 8, 9), at(0, look, absent, 10, 11), at(1, publish, ok, 12, 13)), porcupine.Ok},
		{"connectFunc handing back the value deleted meanwhile", then(marked, at(1, claim, ok, 4, 5), at(0, del, found, 6, 7), at(1, publish, old(7), 8, 9)), porcupine.Illegal},
		{"insert of a claimed key deleted meanwhile", then(marked, at(1, claim, ok, 4, 5), at(0, del, found, 6, 7), at(0, ins9, ok, 8, 9), at(1, publish, ok, 10, 11)), porcupine.Illegal},
		{"connectFunc taking a free key", then(at(0, del, found, 2, 3), at(1, claim, ok, 4, 5), at(0, look, absent, 6, 7), at(0, ins9, none, 8, 9), at(1, publish, ok, 10, 11)), porcupine.Ok},
		{"lookup of a key connectFunc holds", then(at(0, del, found, 2, 3), at(1, claim, ok, 4, 5), at(0, look, linOutput{ok: true, val: 8}, 6, 7), at(1, publish, ok, 8, 9)), porcupine.Illegal},
		{"swap of a key connectFunc holds", then(at(0, del, found, 2, 3), at(1, claim, ok, 4, 5), at(0, swap, linOutput{}, 6, 7), at(1, publish, ok, 8, 9)), porcupine.Illegal},
		{"swap failing on a key connectFunc holds", then(at(0, del, found, 2, 3), at(1, claim, ok, 4, 5), at(0, swap, linOutput{err: true}, 6, 7), at(1, publish, ok, 8, 9)), porcupine.Ok},
		{"connectFunc handing back a value for a free key", then(at(0, del, found, 2, 3), at(1, claim, ok, 4, 5), at(1, publish, old(7), 6, 7)), porcupine.Illegal},
	} {
		ops := append([]porcupine.Operation{linOpAt(0, ins, linOutput{ok: true}, 0, 1)}, c.ops...)
		require.Equal(t, c.want, porcupine.CheckOperationsTimeout(linModel, ops, 10*time.Second), c.name)
	}

	// A real history made wrong by one edit: the last lookup that found a
	// value is changed to return a value never inserted.
	hist := linRun(t, 99, false, linFixed, 3, 60, 2)
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

	// And a real history whose first takeover hands back a value never
	// inserted (the first of a few seeds whose run has one).
	edited = false
	for seed := uint64(100); seed < 120 && !edited; seed++ {
		hist = linRun(t, seed, false, linFixed, 3, 60, 2)
		require.True(t, porcupine.CheckOperations(linModel, hist))
		for i := range hist {
			if in := hist[i].Input.(linInput); (in.op == linConnect || in.op == linPublish) && hist[i].Output.(linOutput).val != 0 {
				hist[i].Output = linOutput{ok: true, val: 1 << 30}
				edited = true
				break
			}
		}
	}
	require.True(t, edited, "no run took a flow over")
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
