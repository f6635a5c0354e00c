package hash4

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// tblFuzzKeys are the key space of FuzzTable: 32 distinct keys (16 IPv4,
// 16 IPv6) crowded into 4 of 16 buckets under LinuxHasher and tblSecret,
// each with two spellings (tblFuzzSpell), 64 tuples in all.
var tblFuzzKeys = sync.OnceValue(func() []Tuple {
	var keys []Tuple
	for _, v6 := range []bool{false, true} {
		n := 0
		for i := 0; n < 16; i++ {
			var k Tuple
			if v6 {
				k = Tuple{
					Local:  netip.AddrPortFrom(netip.AddrFrom16([16]byte{0xfe, 0x80, 15: byte(i%7 + 1)}), uint16(1+i/7)),
					Remote: netip.AddrPortFrom(netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 14: byte(i >> 8), 15: byte(i)}), 443),
				}
			} else {
				k = Tuple{
					Local:  netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(i%5 + 1)}), uint16(30000+i)),
					Remote: netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, 100, byte(i >> 4)}), 80),
				}
			}
			if HashTuple(k, LinuxHasher, tblSecret)&15 < 4 {
				keys = append(keys, k)
				n++
			}
		}
	}
	return keys
})

// tblFuzzSpell returns spelling alt (0 or 1) of key k: IPv4 keys as IPv4
// or (partly) IPv4-mapped, IPv6 keys with or without zones.
func tblFuzzSpell(k Tuple, i, alt int) Tuple {
	if alt == 0 {
		return k
	}
	if k.Local.Addr().Is4() {
		m := tblMapped(k)
		switch i % 3 {
		case 1:
			m.Remote = k.Remote
		case 2:
			m.Local = k.Local
		}
		return m
	}
	return Tuple{
		Local:  netip.AddrPortFrom(k.Local.Addr().WithZone(fmt.Sprint("eth", i%3)), k.Local.Port()),
		Remote: netip.AddrPortFrom(k.Remote.Addr().WithZone("z"), k.Remote.Port()),
	}
}

// tblFuzzOps is the number of FuzzTable's ops: an input byte names op
// byte % tblFuzzOps.
const tblFuzzOps = 19

// tblFuzzAlloc is the allocator of FuzzTable's Connects, each of which
// narrows the range to the port of its key: its ports are all ports.
var tblFuzzAlloc = sync.OnceValue(func() *PortAllocator {
	a, err := NewPortAllocator(WithPortRange(PortRange{1, 65535}), WithPortSecret(1, 2), WithPerturbSeed(3))
	if err != nil {
		panic(err)
	}
	return a
})

// tblFuzzSince returns the time of TIME_WAIT mark s of FuzzTable: second s,
// or the zero time (no mark) for 0.
func tblFuzzSince(s int) time.Time {
	if s == 0 {
		return time.Time{}
	}
	return time.Unix(int64(s), 0)
}

var tblFuzzInvalid = []Tuple{
	{},
	tblTuple("0.0.0.0:1", "10.0.0.1:2"),
	tblTuple("10.0.0.1:0", "10.0.0.1:2"),
	tblTuple("[fe80::1]:1", "10.0.0.1:2"),
	tblTuple("[::ffff:10.0.0.1]:1", "[2001:db8::1]:2"),
	tblTuple("[2001:db8::1]:1", "[::]:2"),
}

// FuzzTable runs a sequence of operations decoded from the input against
// five tables (one per hasher, one with home groups, one whose home bitmap
// is a run of words, one that grows itself) and a map model, which holds
// the keys' TIME_WAIT marks too: the Connects of ops 17 and 18 may take a
// marked key over.
func FuzzTable(f *testing.F) {
	f.Add([]byte{})
	var all []byte
	for i := range 64 {
		all = append(all, 0, byte(i))
	}
	all = append(all, 5, 0, 6, 0)
	for i := range 64 {
		all = append(all, 2, byte(63-i), 3, byte(i^1), 5, 0)
	}
	f.Add(all)
	f.Add([]byte{0, 0, 0, 1, 2, 1, 3, 1, 2, 0, 0, 1, 5, 0, 3, 0, 0, 3, 2, 2})
	f.Add([]byte{0, 7, 1, 9, 3, 8, 0, 8, 2, 9, 7, 0, 7, 1, 7, 2, 7, 3, 7, 4, 7, 5, 7, 6, 6, 0})
	f.Add([]byte{8, 4, 8, 5, 9, 68, 2, 4, 9, 5, 2, 4, 8, 4, 5, 0, 9, 4, 6, 0, 8, 9, 8, 9, 3, 8, 6, 0})
	// The read-modify-write and bulk operations: Store, Swap, Compute with
	// each op (and nil, and an unknown op), LookupOrCompute failing and
	// not, DeleteFunc, Clear, each checked by All and Stats.
	f.Add([]byte{
		10, 0, 10, 2, 11, 2, 11, 5, 10, 5, 5, 0, 2, 5,
		12, 64 | 7, 12, 64 | 9, 12, 7, 12, 128 | 7, 12, 64 | 32 | 11, 12, 192 | 9, 5, 0, 6, 0,
		13, 9, 13, 11, 13, 64 | 13, 13, 64 | 11, 5, 0,
		0, 20, 0, 22, 0, 24, 0, 26, 0, 28, 14, 0, 5, 0, 6, 1, 14, 1, 5, 0,
		0, 40, 0, 42, 10, 44, 15, 0, 5, 0, 6, 0, 10, 40, 2, 40,
	})
	// TIME_WAIT (key 2, arg 4, or 5 for its other spelling; the marks' since
	// and the policies' cut in arg's top bits): marks, cleared or kept by a
	// Store and a CompareAndSwap, dropped by each delete, and Connects and
	// ConnectFuncs taking the key free, over, or not at all.
	f.Add([]byte{
		0, 4, 16, 64 | 4, 17, 64 | 4, 2, 4, 5, 0, 6, 0,
		16, 128 | 4, 17, 128 | 4, 17, 4, 17, 192 | 5, 2, 5,
		3, 4, 17, 4, 2, 4, 16, 64 | 4, 3, 4, 0, 4, 17, 64 | 4,
		16, 64 | 4, 10, 4, 9, 128 | 4, 17, 64 | 4, 16, 4, 16, 64 | 5, 16, 4, 17, 64 | 4, 6, 0,
		16, 64 | 4, 18, 4, 16, 64 | 4, 18, 64 | 4, 2, 4, 16, 64 | 4, 18, 128 | 4, 18, 128 | 5, 18, 4,
		16, 64 | 4, 18, 192 | 4, 2, 4, 18, 192 | 4, 18, 4, 18, 4, 5, 0, 6, 0,
		16, 64 | 4, 9, 4, 0, 4, 17, 64 | 4, 16, 64 | 4, 12, 128 | 4, 0, 4, 17, 64 | 4,
		16, 64 | 4, 14, 2, 0, 4, 17, 64 | 4, 16, 64 | 4, 15, 0, 0, 4, 17, 64 | 4,
		16, 64 | 4, 6, 64, 17, 64 | 4, 0, 40, 16, 192 | 40, 6, 64 | 32, 17, 192 | 40, 6, 0,
		16, 64 | 7, 16, 64 | 35, 0, 40, 16, 64 | 40, 6, 1, 5, 0,
	})
	r := rand.New(rand.NewPCG(2024, 7))
	for range 6 {
		b := make([]byte, 400)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		keys := tblFuzzKeys()
		canon := map[Tuple]int{}
		for i, k := range keys {
			canon[tblCanon(k)] = i
		}
		tabs := []*Table[int]{
			// 16 buckets: 32 keys make chains of several nodes.
			New[int](WithFixedBuckets(), WithCapacity(16), WithSecret(tblSecret), WithHasher(LinuxHasher)),
			New[int](WithFixedBuckets(), WithCapacity(16), WithSecret(tblSecret), WithHasher(LinuxHasher), WithHasher(XXH3Hasher)),
			New[int](WithFixedBuckets(), WithCapacity(16), WithSecret(tblSecret), WithHasher(FoldHasher)),
			// 128 buckets: most keys in line.
			New[int](WithFixedBuckets(), WithCapacity(128), WithSecret(tblSecret), WithHasher(LinuxHasher)),
			// A table that grows itself, past 32 entries, and from where
			// its Grows leave it.
			New[int](WithCapacity(16), WithSecret(tblSecret), WithHasher(LinuxHasher)),
		}
		const autoTab = 4
		// models[i] is what tabs[i] must hold: key index -> the very
		// pointer inserted (each table gets its own pointer; both point to
		// the same content).
		models := []map[int]*int{{}, {}, {}, {}, {}}
		// marks[i] are tabs[i]'s TIME_WAIT marks: key index -> since
		// (see tblFuzzSince).
		marks := []map[int]int{{}, {}, {}, {}, {}}
		// finish[i], if set, lets a Grow of tabs[i] that stopped before
		// its first stripe run to its end.
		finish := make([]func() error, len(tabs))
		serial := 0
		if len(data) > 1024 {
			data = data[:1024]
		}
		// check compares a returned value with the model's pointer.
		// N.B. the loop asserts through rt, whose failures go to t but
		// which has no Helper method, and with a step message formatted
		// only on failure: testify marks each assertion a helper, and that
		// walk of the stack took most of an input's time.
		rt := tblFailOnly{t}
		check := func(want *int, wok bool, got *int, gok bool, msg tblStep) {
			require.Equal(rt, wok, gok, msg)
			if wok {
				require.Same(rt, want, got, msg)
				require.Equal(rt, *want, *got, msg)
			} else {
				require.Nil(rt, got, msg)
			}
		}
		for step := 0; step+1 < len(data); step += 2 {
			op, arg := data[step], int(data[step+1])
			ki, alt := (arg%64)/2, arg%2
			tup := tblFuzzSpell(keys[ki], ki, alt)
			serial++
			for ti, tab := range tabs {
				model, mark := models[ti], marks[ti]
				// remove is a delete of key i in the model: its mark goes.
				remove := func(i int) {
					delete(model, i)
					delete(mark, i)
				}
				msg := tblStep{ti, step, op % tblFuzzOps, tup}
				switch op % tblFuzzOps {
				case 0, 1: // Insert
					v := valPtr(serial)
					err := tab.Insert(tup, v)
					if old, ok := model[ki]; ok {
						require.ErrorIs(rt, err, ErrExists, msg)
						got, gok := tab.Lookup(keys[ki])
						check(old, true, got, gok, msg)
					} else {
						require.NoError(rt, err, msg)
						model[ki] = v
					}
				case 2: // Lookup, and AppendLookups of the same tuple twice
					want, ok := model[ki]
					got, gok := tab.Lookup(tup)
					check(want, ok, got, gok, msg)
					both := tab.AppendLookups(nil, []Tuple{tup, keys[ki]})
					require.Len(rt, both, 2, msg)
					for _, got := range both {
						check(want, ok, got, got != nil, msg)
					}
				case 3, 4: // Delete
					want, ok := model[ki]
					got, gok := tab.Delete(tup)
					check(want, ok, got, gok, msg)
					remove(ki)
				case 5: // All
					got := tblCollect(t, tab)
					require.Len(rt, got, len(model), msg)
					for tup, v := range got {
						i, ok := canon[tup]
						require.True(rt, ok, "%s: All yielded %v, not a canonical key", msg, tup)
						want, ok := model[i]
						check(want, ok, v, true, msg)
					}
				case 6: // Len, Stats; with arg&64, after a Grow to 2 or 4 times the buckets, else with arg&1 after Compact
					if finish[ti] != nil {
						require.NoError(rt, finish[ti](), msg)
						finish[ti] = nil
					}
					if ti == autoTab {
						tab.growers.Wait()
						limit := tab.growLimit(tab.cur())
						require.LessOrEqual(rt, int64(tab.Len()), limit+limit/64, msg)
					}
					if n := len(tab.cur().lines); arg&64 != 0 && n < 1024 {
						n <<= 1 + arg>>7
						// (Not the table that grows itself: its growths
						// would run into the stopped one's hook.)
						if arg&32 != 0 && ti != autoTab {
							// The Grow stops before it moves any entry,
							// and the steps up to the next op 6 find the
							// table half grown (Stats would move the
							// rest): every entry is still found.
							next, wait := growPaused(t, tab, n)
							next()
							finish[ti] = wait
							for ki, want := range model {
								got, ok := tab.Lookup(keys[ki])
								check(want, true, got, ok, msg)
							}
							break
						}
						require.NoError(rt, tab.Grow(n-(arg&31)%(n/2)), msg) // rounded up to n
						require.Equal(rt, n, tab.Stats().Buckets, msg)
						require.NoError(rt, tab.Grow(n/2), msg) // never shrinks
					} else if arg&1 != 0 {
						tab.Compact()
					}
					require.Equal(rt, len(model), tab.Len(), msg)
					tblCheckMarks(rt, tab, mark, msg)
					st := tab.Stats()
					require.Equal(rt, len(model), st.Entries, msg)
					// A shard carves a new batch only when its cache and
					// the depot are empty: at most 32 keys are live, so
					// the nodes stay within that plus what every shard's
					// cache may hold and take at once, and the rest of the
					// chunk carved last (64 nodes in these tables).
					require.LessOrEqual(rt, st.Nodes, 32+len(tab.shards)*(shardCacheMax+slabBatch)+64, msg)
					tblCheckBuckets(rt, tab, msg)
				case 7: // bad input leaves the table unchanged
					bad := tblFuzzInvalid[arg%len(tblFuzzInvalid)]
					require.ErrorIs(rt, tab.Insert(bad, valPtr(-1)), ErrInvalidTuple, msg)
					require.ErrorIs(rt, tab.Insert(tup, nil), ErrNilValue, msg)
					_, found, err := tab.LookupOrInsert(bad, valPtr(-1))
					require.ErrorIs(rt, err, ErrInvalidTuple, msg)
					require.False(rt, found, msg)
					_, _, err = tab.LookupOrInsert(tup, nil)
					require.ErrorIs(rt, err, ErrNilValue, msg)
					require.False(rt, tab.CompareAndDelete(bad, valPtr(-1)), msg)
					require.False(rt, tab.CompareAndDelete(tup, nil), msg)
					require.False(rt, tab.CompareAndSwap(bad, valPtr(-1), valPtr(-1)), msg)
					require.False(rt, tab.CompareAndSwap(tup, nil, valPtr(-1)), msg)
					if cur, ok := model[ki]; ok {
						require.False(rt, tab.CompareAndSwap(tup, cur, nil), msg)
					}
					_, ok := tab.Lookup(bad)
					require.False(rt, ok, msg)
					want, wok := model[ki]
					got, gok := tab.Lookup(tup)
					check(want, wok, got, gok, msg)
					require.Equal(rt, len(model), tab.Len(), msg)
				case 8: // LookupOrInsert
					v := valPtr(serial)
					got, found, err := tab.LookupOrInsert(tup, v)
					require.NoError(rt, err, msg)
					old, ok := model[ki]
					if !ok {
						old = v
						model[ki] = v
					}
					check(old, true, got, true, msg)
					require.Equal(rt, ok, found, msg)
				case 9: // CompareAndDelete or CompareAndSwap, with the value held or another
					old, ok := model[ki]
					if arg&64 != 0 {
						old, ok = valPtr(serial), false
					}
					if arg&128 != 0 {
						v := valPtr(serial)
						require.Equal(rt, ok, tab.CompareAndSwap(tup, old, v), msg)
						if ok {
							model[ki] = v
						}
						break
					}
					require.Equal(rt, ok, tab.CompareAndDelete(tup, old), msg)
					if ok {
						remove(ki)
					}
				case 10: // Store
					v := valPtr(serial)
					require.NoError(rt, tab.Store(tup, v), msg)
					model[ki] = v
				case 11: // Swap
					v := valPtr(serial)
					want, wok := model[ki]
					old, loaded, err := tab.Swap(tup, v)
					require.NoError(rt, err, msg)
					check(want, wok, old, loaded, msg)
					model[ki] = v
				case 12: // Compute: the op is in arg's top bits (3: unknown), nil with arg&32
					want, wok := model[ki]
					op := ComputeOp(arg >> 6)
					v := valPtr(serial)
					if arg&32 != 0 {
						v = nil
					}
					calls := 0
					got, gok, err := tab.Compute(tup, func(old *int, loaded bool) (*int, ComputeOp) {
						calls++
						check(want, wok, old, loaded, msg)
						return v, op
					})
					require.Equal(rt, 1, calls, msg)
					switch {
					case op == DeleteOp:
						require.NoError(rt, err, msg)
						check(nil, false, got, gok, msg)
						remove(ki)
					case op == CancelOp:
						require.NoError(rt, err, msg)
						check(want, wok, got, gok, msg)
					case op != UpdateOp || v == nil:
						require.Error(rt, err, msg)
						if v == nil && op == UpdateOp {
							require.ErrorIs(rt, err, ErrNilValue, msg)
						}
						check(want, wok, got, gok, msg)
					default:
						require.NoError(rt, err, msg)
						check(v, true, got, gok, msg)
						model[ki] = v
					}
				case 13: // LookupOrCompute; f fails with arg&64
					want, wok := model[ki]
					v := valPtr(serial)
					calls := 0
					fail := errors.New("f failed")
					got, loaded, err := tab.LookupOrCompute(tup, func() (*int, error) {
						calls++
						if arg&64 != 0 {
							return nil, fail
						}
						return v, nil
					})
					switch {
					case wok:
						require.NoError(rt, err, msg)
						require.Zero(rt, calls, msg)
						check(want, true, got, loaded, msg)
					case arg&64 != 0:
						require.Equal(rt, 1, calls, msg)
						require.ErrorIs(rt, err, fail, msg)
						require.False(rt, loaded, msg)
						require.Nil(rt, got, msg)
					default:
						require.Equal(rt, 1, calls, msg)
						require.NoError(rt, err, msg)
						require.False(rt, loaded, msg)
						require.Same(rt, v, got, msg)
						model[ki] = v
					}
				case 14: // DeleteFunc of the keys whose index is arg mod 3, mod 3
					seen := map[int]bool{}
					n := tab.DeleteFunc(func(tup Tuple, v *int) bool {
						i, ok := canon[tup]
						require.True(rt, ok, "%s: DeleteFunc gave %v, not a canonical key", msg, tup)
						require.False(rt, seen[i], "%s: DeleteFunc gave %v twice", msg, tup)
						seen[i] = true
						check(model[i], true, v, true, msg)
						return i%3 == arg%3
					})
					require.Len(rt, seen, len(model), msg)
					want := 0
					for i := range model {
						if i%3 == arg%3 {
							remove(i)
							want++
						}
					}
					require.Equal(rt, want, n, msg)
				case 15: // Clear
					tab.Clear()
					clear(model)
					clear(mark)
					require.Zero(rt, tab.Len(), msg)
				case 16: // TimeWait: since arg>>6 (see tblFuzzSince), 0 clears
					want, ok := model[ki]
					require.Equal(rt, ok, tab.TimeWait(tup, tblFuzzSince(arg>>6)), msg)
					switch {
					case !ok:
					case arg>>6 == 0:
						delete(mark, ki)
					default:
						mark[ki] = arg >> 6
					}
					got, gok := tab.Lookup(tup)
					check(want, ok, got, gok, msg)
				case 17: // Connect to the key's port: without reuse for arg>>6 == 0, else with a policy that allows marks up to arg>>6 - 1, any for 1
					want, wok := model[ki]
					since, marked := mark[ki]
					cut := arg>>6 - 1
					takes := !wok || marked && (cut == 0 || 0 < cut && since <= cut)
					opts := []ConnectOption{WithConnectRange(PortRange{tup.Local.Port(), tup.Local.Port()})}
					old := valPtr(-1) // overwritten with reuse
					if cut >= 0 {
						opts = append(opts, WithTimeWaitReuse(func(got Tuple, s time.Time) bool {
							require.Equal(rt, tblCanon(keys[ki]), got, msg)
							require.Equal(rt, tblFuzzSince(since), s, msg)
							return cut == 0 || s.Unix() <= int64(cut)
						}, &old))
					}
					v := valPtr(serial)
					got, err := tab.Connect(tblFuzzAlloc(), tup.Local.Addr(), tup.Remote, v, opts...)
					switch {
					case !takes:
						require.ErrorIs(rt, err, ErrNoPorts, msg)
						v = want // unchanged
					default:
						require.NoError(rt, err, msg)
						require.Equal(rt, tblCanon(keys[ki]), got, msg)
						model[ki] = v
						delete(mark, ki)
					}
					if cut >= 0 {
						// The value taken over, if any.
						check(want, takes && wok, old, old != nil, msg)
					} else {
						require.Equal(rt, -1, *old, msg)
					}
					got2, gok := tab.Lookup(tup)
					check(v, takes || wok, got2, gok, msg)
				case 18: // ConnectFunc to the key's port taking any mark: f deletes the flow with arg&64, fails with arg&128, and clears the mark if it fails for the key's other spelling
					want, wok := model[ki]
					_, marked := mark[ki]
					over := wok && marked // a takeover, else a free port
					del, fail := arg&64 != 0, arg&128 != 0
					v := valPtr(serial)
					errF := errors.New("f failed")
					calls := 0
					var old *int
					got, gv, err := tab.ConnectFunc(tblFuzzAlloc(), tup.Local.Addr(), tup.Remote, func(ft Tuple) (*int, error) {
						calls++
						require.Equal(rt, tblCanon(keys[ki]), ft, msg)
						// While f runs the old value stays, and the
						// tuple is held.
						got, gok := tab.Lookup(tup)
						check(want, over, got, gok, msg)
						require.ErrorIs(rt, tab.Insert(tup, valPtr(-1)), ErrExists, msg)
						require.Equal(rt, over, tab.TimeWait(tup, tblFuzzSince(3)), msg)
						if del {
							got, gok := tab.Delete(tup)
							check(want, over, got, gok, msg)
							got, gok = tab.Lookup(tup)
							check(nil, false, got, gok, msg)
						}
						if fail && alt == 1 {
							require.Equal(rt, over && !del, tab.TimeWait(tup, time.Time{}), msg)
						}
						if fail {
							return nil, errF
						}
						return v, nil
					}, WithConnectRange(PortRange{tup.Local.Port(), tup.Local.Port()}), WithTimeWaitReuse(func(Tuple, time.Time) bool { return true }, &old))
					switch {
					case wok && !marked:
						require.ErrorIs(rt, err, ErrNoPorts, msg)
						require.Zero(rt, calls, msg)
					case fail:
						require.ErrorIs(rt, err, errF, msg)
						require.Equal(rt, 1, calls, msg)
						require.Nil(rt, gv, msg)
						switch {
						case del:
							remove(ki)
						case over && alt == 1:
							delete(mark, ki)
						case over:
							mark[ki] = 3 // f's mark
						}
					default:
						require.NoError(rt, err, msg)
						require.Equal(rt, 1, calls, msg)
						require.Equal(rt, tblCanon(keys[ki]), got, msg)
						require.Same(rt, v, gv, msg)
						model[ki] = v
						delete(mark, ki)
					}
					check(want, over && !del && !fail && err == nil, old, old != nil, msg)
					want, wok = model[ki]
					got2, gok := tab.Lookup(tup)
					check(want, wok, got2, gok, msg)
				}
				// The table that grows itself has grown before the next
				// step: the fuzzer needs each input to run the same code
				// every time (the stress and linearizability tests run
				// steps during growths).
				if ti == autoTab {
					tab.growers.Wait()
				}
			}
		}
		for ti, tab := range tabs {
			if finish[ti] != nil {
				require.NoError(t, finish[ti]())
			}
			require.Equal(t, len(models[ti]), tab.Len())
			tblCheckMarks(t, tab, marks[ti], "the end")
			got := tblCollect(t, tab)
			require.Len(t, got, len(models[ti]))
			for i, want := range models[ti] {
				require.Same(t, want, got[tblCanon(keys[i])])
			}
			tab.growers.Wait()
		}
	})
}

// tblCheckMarks checks that tab has exactly the TIME_WAIT marks of model:
// key index -> since (see tblFuzzSince), of the keys tblFuzzKeys.
func tblCheckMarks(t require.TestingT, tab *Table[int], model map[int]int, msg any) {
	c := tab.clients()
	if c == nil || !c.marks.made() {
		require.Empty(t, model, msg)
		return
	}
	require.Equal(t, int64(len(model)), c.marks.n.Load(), msg)
	n := 0
	for s := range c.marks.shards.Load() {
		for k, m := range c.marks.shards.Load()[s].marks {
			require.False(t, m.claimed, msg)
			n++
			found := false
			for i, since := range model {
				var want key
				tup := tblFuzzKeys()[i]
				tab.tupleKey(&want, &tup)
				if want == k {
					require.Equal(t, tblFuzzSince(since), m.since, msg)
					found = true
				}
			}
			require.True(t, found, "%v: a mark the model does not have", msg)
		}
	}
	require.Equal(t, len(model), n, msg)
}

// tblStep names a step of FuzzTable in failure messages.
type tblStep struct {
	table, step int
	op          byte
	tup         Tuple
}

func (s tblStep) String() string {
	return fmt.Sprintf("table %d step %d op %d %v", s.table, s.step, s.op, s.tup)
}

// tblFailOnly passes failures to t and hides its Helper method (see
// FuzzTable).
type tblFailOnly struct{ t *testing.T }

func (f tblFailOnly) Errorf(format string, args ...any) { f.t.Errorf(format, args...) }

func (f tblFailOnly) FailNow() { f.t.FailNow() }
