package hash4

import (
	"errors"
	"fmt"
	"math/rand"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"syscall"
	"testing"
	"testing/quick"
	"time"

	"github.com/stretchr/testify/require"
)

// Tests of Table.Connect: the port allocator (portalloc.go) driving inserts
// into a table. portalloc_test.go covers selectPort on its own.

var (
	connLocal  = netip.MustParseAddr("10.0.0.1")
	connLocal2 = netip.MustParseAddr("10.0.0.2")
	connMapped = netip.MustParseAddr("::ffff:10.0.0.1") // connLocal, IPv4-mapped
	connDsts   = []netip.AddrPort{
		netip.MustParseAddrPort("192.0.2.1:443"),
		netip.MustParseAddrPort("192.0.2.1:80"), // same address, other port
		netip.MustParseAddrPort("198.51.100.7:443"),
	}
	connSecret = Secret{Ehash: 0x1234567, Ehash6Addr: 0x89abcdef, Seed: 42}
)

// connTable returns a table with a fixed secret sized for about n entries.
func connTable(n int, opts ...Option) *Table[int] {
	return New[int](append([]Option{WithFixedBuckets(), WithCapacity(n), WithSecret(connSecret)}, opts...)...)
}

// connFill connects from local to remote until the allocator runs out of
// ports and returns the ports taken, in order. Every Connect but the last
// must succeed; the last must fail with ErrNoPorts.
func connFill(t testing.TB, tb *Table[int], a *PortAllocator, local netip.Addr, remote netip.AddrPort, opts ...ConnectOption) []uint16 {
	t.Helper()
	var ports []uint16
	for {
		v := new(int)
		tup, err := tb.Connect(a, local, remote, v, opts...)
		if err != nil {
			require.ErrorIs(t, err, ErrNoPorts)
			require.ErrorIs(t, err, syscall.EADDRNOTAVAIL)
			return ports
		}
		got, ok := tb.Lookup(tup)
		require.True(t, ok, "%v", tup)
		require.Same(t, v, got, "%v", tup)
		ports = append(ports, tup.Local.Port())
		require.LessOrEqual(t, len(ports), 65535, "Connect never runs out")
	}
}

// connScenario is one random run for TestConnectProperties: an allocator
// (range, policy, reserved ports), binds, TIME_WAIT marks, and a sequence
// of operations on a table.
type connScenario struct {
	Rng      PortRange
	Policy   Policy
	Reserved []uint16
	Ops      []connOp
}

type connOpKind uint8

const (
	connOpConnect connOpKind = iota
	connOpDelete
	connOpBind
	connOpRelease
	connOpTimeWait
)

type connOp struct {
	Kind   connOpKind
	Local  netip.Addr     // connect, bind
	Dst    netip.AddrPort // connect
	Sub    PortRange      // connect: WithConnectRange unless zero
	Port   uint16         // bind
	Victim int            // delete, release, timewait: index, modulo the live count (+1 for timewait: an absent flow)
	// Reuse is a connect's TIME_WAIT policy: 0 none, 1 any mark, n > 1
	// marks of since at most n-1 (see tblFuzzSince).
	Reuse int
	// Func makes a connect a ConnectFunc: 1 plain, 2 whose function
	// deletes the flow, 3 whose function fails.
	Func  int
	Since int // timewait: since (see tblFuzzSince), 0 clears
}

func (o connOp) String() string {
	switch o.Kind {
	case connOpConnect:
		return fmt.Sprintf("connect %v->%v sub=%v reuse=%d func=%d", o.Local, o.Dst, o.Sub, o.Reuse, o.Func)
	case connOpDelete:
		return fmt.Sprintf("delete #%d", o.Victim)
	case connOpBind:
		return fmt.Sprintf("bind %v", netip.AddrPortFrom(o.Local, o.Port))
	case connOpTimeWait:
		return fmt.Sprintf("timewait #%d since %d", o.Victim, o.Since)
	}
	return fmt.Sprintf("release #%d", o.Victim)
}

// connAbsent is a flow no scenario connects, for TimeWait of an absent flow.
var connAbsent = Tuple{netip.AddrPortFrom(connLocal, 1), netip.MustParseAddrPort("203.0.113.1:1")}

// connBindAddrs are the addresses binds hold ports for: the two locals
// (one in mapped form), the IPv4 wildcard, which covers both, and the IPv6
// wildcard, which covers neither.
var connBindAddrs = []netip.Addr{connLocal, connLocal2, connMapped, netip.IPv4Unspecified(), netip.IPv6Unspecified()}

// Generate implements quick.Generator.
func (connScenario) Generate(r *rand.Rand, _ int) reflect.Value {
	var s connScenario
	size := []int{1, 2, 3, 4, 5, 8, 1 + r.Intn(40)}[r.Intn(7)]
	low := 1 + r.Intn(65536-size)
	switch r.Intn(6) {
	case 0:
		low = 1
	case 1:
		low = 65536 - size // High = 65535
	}
	s.Rng = PortRange{uint16(low), uint16(low + size - 1)}
	s.Policy = Policy(r.Intn(2))
	for range r.Intn(size/2 + 2) {
		s.Reserved = append(s.Reserved, uint16(low+r.Intn(size)))
	}
	if r.Intn(2) == 0 { // outside the range: no effect
		s.Reserved = append(s.Reserved, uint16(1+r.Intn(65535)))
	}
	locals := []netip.Addr{connLocal, connLocal2, connMapped}
	near := func() uint16 { // a port in or near the range, never 0
		return uint16(min(max(low-2+r.Intn(size+4), 1), 65535))
	}
	for range 3*size + 10 + r.Intn(3*size+10) {
		op := connOp{Victim: r.Intn(1 << 20)}
		switch k := r.Intn(23); {
		case k < 11:
			op.Kind = connOpConnect
		case k < 12:
			op.Kind = connOpConnect
			op.Sub = PortRange{near(), near()}
			if r.Intn(3) == 0 {
				op.Sub.Low = 0
			}
		case k < 17:
			op.Kind = connOpDelete
		case k < 19:
			op.Kind = connOpBind
			op.Local = connBindAddrs[r.Intn(len(connBindAddrs))]
			op.Port = near()
		case k < 20:
			op.Kind = connOpRelease
		default:
			op.Kind = connOpTimeWait
			op.Since = r.Intn(4)
		}
		if op.Kind == connOpConnect {
			op.Local = locals[r.Intn(len(locals))]
			op.Dst = connDsts[r.Intn(len(connDsts))]
			if r.Intn(2) == 0 {
				op.Reuse = 1 + r.Intn(3)
			}
			if r.Intn(4) == 0 {
				op.Func = 1 + r.Intn(3)
			}
		}
		s.Ops = append(s.Ops, op)
	}
	return reflect.ValueOf(s)
}

// connEffectiveRange applies a WithConnectRange option as documented: each
// bound replaces the allocator's if it lies inside, Low first.
func connEffectiveRange(r, sub PortRange) PortRange {
	eff := r
	if sub == (PortRange{}) {
		return eff
	}
	if r.Low <= sub.Low && sub.Low <= r.High {
		eff.Low = sub.Low
	}
	if eff.Low <= sub.High && sub.High <= r.High {
		eff.High = sub.High
	}
	return eff
}

// run executes s against a table and checks every Connect against a model
// of the live tuples, their TIME_WAIT marks and the held ports. It returns
// how many flows Connects took over.
func (s connScenario) run(t *testing.T) (tookOver int) {
	a, err := NewPortAllocator(WithPortRange(s.Rng), WithPolicy(s.Policy), WithReservedPorts(s.Reserved...),
		WithPortSecret(uint64(s.Rng.Low), 5), WithPerturbSeed(uint64(len(s.Ops))))
	require.NoError(t, err)
	reserved := make(map[uint16]bool)
	for _, p := range s.Reserved {
		reserved[p] = true
	}
	tb := connTable(64)

	type bind struct {
		addr    [16]byte
		port    uint16
		release func()
	}
	var binds []bind
	// held: Connect skips a port held for any address, as the kernel's
	// connect() skips a port any bind() holds.
	held := func(_ netip.Addr, p uint16) bool {
		for _, b := range binds {
			if b.port == p {
				return true
			}
		}
		return false
	}
	live := make(map[Tuple]*int)
	var order []Tuple        // live tuples, for picking victims
	marks := map[Tuple]int{} // TIME_WAIT marks: since (see tblFuzzSince)
	errF := errors.New("f failed")

	for i, op := range s.Ops {
		msg := fmt.Sprintf("op %d: %v (range %v, %v)", i, op, s.Rng, s.Policy)
		switch op.Kind {
		case connOpConnect:
			var opts []ConnectOption
			if op.Sub != (PortRange{}) {
				opts = append(opts, WithConnectRange(op.Sub))
			}
			// reusable reports whether the policy allows the mark of tup.
			reusable := func(tup Tuple) bool {
				since, ok := marks[tup]
				return ok && (op.Reuse == 1 || op.Reuse > 1 && since <= op.Reuse-1)
			}
			var old *int
			if op.Reuse != 0 {
				opts = append(opts, WithTimeWaitReuse(func(tup Tuple, since time.Time) bool {
					require.Equal(t, tblFuzzSince(marks[tup]), since, msg)
					return op.Reuse == 1 || since.Unix() <= int64(op.Reuse-1)
				}, &old))
			}
			local := op.Local.Unmap()
			eff := connEffectiveRange(s.Rng, op.Sub)
			flat := s.Policy == Flat || op.Sub != (PortRange{})
			var free []uint16 // candidates Connect may take: free, or in TIME_WAIT and allowed
			for p := int(eff.Low); p <= int(eff.High); p++ {
				tup := Tuple{netip.AddrPortFrom(local, uint16(p)), op.Dst}
				if !reserved[uint16(p)] && !held(local, uint16(p)) && (live[tup] == nil || reusable(tup)) {
					free = append(free, uint16(p))
				}
			}
			v := new(int)
			var tup, offered Tuple
			var err error
			calls := 0
			if op.Func == 0 {
				tup, err = tb.Connect(a, op.Local, op.Dst, v, opts...)
			} else {
				var got *int
				tup, got, err = tb.ConnectFunc(a, op.Local, op.Dst, func(ft Tuple) (*int, error) {
					calls++
					offered = ft
					// The old flow, if one is taken over, stays while f
					// runs: a delete leaves the tuple held.
					want := live[ft]
					got, ok := tb.Lookup(ft)
					require.Equal(t, want != nil, ok, msg)
					require.Same(t, want, got, msg)
					require.ErrorIs(t, tb.Insert(ft, new(int)), ErrExists, msg)
					switch op.Func {
					case 2:
						got, ok := tb.Delete(ft)
						require.Equal(t, want != nil, ok, msg)
						require.Same(t, want, got, msg)
						if want != nil {
							delete(live, ft)
							delete(marks, ft)
							order = slices.DeleteFunc(order, func(o Tuple) bool { return o == ft })
						}
						_, ok = tb.Lookup(ft)
						require.False(t, ok, msg)
					case 3:
						return nil, errF
					}
					return v, nil
				}, opts...)
				if err == nil {
					require.Same(t, v, got, msg)
				}
			}
			require.Equal(t, op.Func != 0 && (err == nil || errors.Is(err, errF)), calls == 1, msg)
			if errors.Is(err, errF) {
				// f failed: nothing changed, but what f did; a flow taken
				// over keeps its mark.
				require.Nil(t, old, msg)
				require.Contains(t, free, offered.Local.Port(), msg)
				got, ok := tb.Lookup(offered)
				require.Equal(t, live[offered] != nil, ok, msg)
				require.Same(t, live[offered], got, msg)
				break
			}
			if err != nil {
				require.Nil(t, old, msg)
				require.ErrorIs(t, err, ErrNoPorts, msg)
				require.ErrorIs(t, err, syscall.EADDRNOTAVAIL, msg)
				// With step 2 and an odd range, one port of low's parity
				// is not a candidate in a given call (as in the kernel).
				size := eff.Size()
				if !flat && size > 1 && size%2 == 1 && len(free) == 1 {
					require.Equal(t, eff.Low%2, free[0]%2, "%s: free port %v", msg, free)
				} else {
					require.Empty(t, free, "%s: ErrNoPorts with free ports", msg)
				}
				break
			}
			p := tup.Local.Port()
			require.Equal(t, local, tup.Local.Addr(), msg)
			require.Equal(t, op.Dst, tup.Remote, msg)
			require.True(t, eff.Low <= p && p <= eff.High, "%s: port %d out of range %v", msg, p, eff)
			require.False(t, reserved[p], "%s: reserved port %d", msg, p)
			require.False(t, held(local, p), "%s: port %d held by Bind", msg, p)
			require.Contains(t, free, p, msg)
			// A flow taken over hands its value back, once: its mark goes.
			require.Same(t, live[tup], old, msg)
			if old != nil {
				tookOver++
			}
			got, ok := tb.Lookup(tup)
			require.True(t, ok, msg)
			require.Same(t, v, got, msg)
			if live[tup] == nil {
				order = append(order, tup)
			}
			live[tup] = v
			delete(marks, tup)
		case connOpDelete:
			if len(order) == 0 {
				break
			}
			j := op.Victim % len(order)
			tup := order[j]
			order[j] = order[len(order)-1]
			order = order[:len(order)-1]
			got, ok := tb.Delete(tup)
			require.True(t, ok, msg)
			require.Same(t, live[tup], got, msg)
			delete(live, tup)
			delete(marks, tup)
			_, ok = tb.Lookup(tup)
			require.False(t, ok, msg)
		case connOpTimeWait:
			tup := connAbsent
			if j := op.Victim % (len(order) + 1); j < len(order) {
				tup = order[j]
			}
			require.Equal(t, live[tup] != nil, tb.TimeWait(tup, tblFuzzSince(op.Since)), msg)
			switch {
			case live[tup] == nil:
			case op.Since == 0:
				delete(marks, tup)
			default:
				marks[tup] = op.Since
			}
		case connOpBind:
			release, err := a.Bind(netip.AddrPortFrom(op.Local, op.Port))
			if err == nil {
				binds = append(binds, bind{op.Local.As16(), op.Port, release})
			} else {
				require.ErrorIs(t, err, ErrPortInUse, msg)
			}
		case connOpRelease:
			if len(binds) == 0 {
				break
			}
			j := op.Victim % len(binds)
			binds[j].release()
			binds = slices.Delete(binds, j, j+1)
		}
		require.Equal(t, len(live), tb.Len(), msg)
		if c := tb.clients(); c != nil {
			require.Equal(t, int64(len(marks)), c.marks.n.Load(), msg)
		}
	}
	// The table holds exactly the model, each tuple once.
	seen := make(map[Tuple]bool)
	for tup, v := range tb.All() {
		require.False(t, seen[tup], "%v twice", tup)
		seen[tup] = true
		require.Same(t, live[tup], v, "%v", tup)
	}
	require.Len(t, seen, len(live))
	return tookOver
}

// TestConnectProperties checks Connect over random ranges, reserved ports,
// binds, per-call ranges and sequences of connects and deletes to a few
// destinations from a few local addresses: every port is in range, not
// reserved, not held for that local address; the tuple is in the table with
// the value given and unique among the live ones; and Connect fails only
// when no candidate port is free for that flow, so a port in use toward one
// destination is reused toward the others. Flows marked in TIME_WAIT count
// as free for a Connect or ConnectFunc whose policy allows them, which
// takes them over, handing back the old value.
func TestConnectProperties(t *testing.T) {
	cfg := &quick.Config{MaxCount: 400, Rand: rand.New(rand.NewSource(1))}
	var runs, connects, tookOver int
	require.NoError(t, quick.Check(func(s connScenario) bool {
		tookOver += s.run(t)
		runs++
		for _, op := range s.Ops {
			if op.Kind == connOpConnect {
				connects++
			}
		}
		return true
	}, cfg))
	require.Equal(t, 400, runs)
	t.Logf("%d connects, %d takeovers", connects, tookOver)
	require.Greater(t, connects, 400*20)
	require.Greater(t, tookOver, 100)
}

// connFuzzSource is a rand.Source that plays back fuzz input: each draw
// takes the next two bytes, then zeros once the input runs out. Int31 sees
// them as a value below 2^16, so Intn(n) is the bytes' value modulo n (or
// masked, for a power of two), and every draw of Generate, whose largest n
// is 2^20, is one the fuzzer can steer.
type connFuzzSource struct{ data []byte }

func (s *connFuzzSource) Int63() int64 {
	var v uint64
	if len(s.data) >= 2 {
		v = uint64(s.data[0]) | uint64(s.data[1])<<8
		s.data = s.data[2:]
	} else {
		s.data = nil
	}
	return int64(v << 32) // Int31 is Int63 >> 32
}

func (*connFuzzSource) Seed(int64) {}

// FuzzConnect runs TestConnectProperties's scenarios, drawn from the fuzz
// input instead of a seeded generator, and checks every step against the
// same model; then the differential test of the occupancy index
// (runIndexDiff), seeded by the input.
func FuzzConnect(f *testing.F) {
	f.Add([]byte{})
	r := rand.New(rand.NewSource(7))
	for _, n := range []int{64, 256, 1024, 4096} {
		b := make([]byte, n)
		r.Read(b)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 8192 {
			data = data[:8192]
		}
		seed := uint64(len(data))
		for _, b := range data {
			seed = seed*0x100000001b3 ^ uint64(b)
		}
		s := connScenario{}.Generate(rand.New(&connFuzzSource{data}), 0).Interface().(connScenario)
		s.run(t)
		// The differential test of the occupancy index, seeded by data.
		runIndexDiff(t, seed, len(data)%512)
	})
}

// TestConnectPortReusedPerDestination: uniqueness is per 4-tuple, not per
// port. With a one-port range, each destination (address or port differing)
// and each local address gets that port once.
func TestConnectPortReusedPerDestination(t *testing.T) {
	for _, policy := range []Policy{OddEven, Flat} {
		a := newTestAllocator(t, WithPortRange(PortRange{40000, 40000}), WithPolicy(policy))
		tb := connTable(16)
		for _, local := range []netip.Addr{connLocal, connLocal2} {
			for _, dst := range connDsts {
				tup, err := tb.Connect(a, local, dst, new(int))
				require.NoError(t, err, "%v %v->%v", policy, local, dst)
				require.Equal(t, Tuple{netip.AddrPortFrom(local, 40000), dst}, tup)
				_, err = tb.Connect(a, local, dst, new(int))
				require.ErrorIs(t, err, ErrNoPorts, "%v %v->%v", policy, local, dst)
			}
		}
		require.Equal(t, 2*len(connDsts), tb.Len())
	}
}

// TestConnectOddEven connects toward one destination over the default range
// with the OddEven policy: the first half of the Connects (14116) take ports
// of low's parity (even), the next ones odd ports. (Each of those scans the
// whole even half first, the kernel's known cost, so the test takes only a
// few of them and fills the rest of the range by Insert.)
func TestConnectOddEven(t *testing.T) {
	a := newTestAllocator(t)
	require.Equal(t, DefaultPortRange, a.Range())
	require.Equal(t, OddEven, a.Policy())
	tb := connTable(DefaultPortRange.Size())
	dst := connDsts[0]
	const half, odd = 28232 / 2, 6
	taken := make(map[uint16]bool)
	for i := range half + odd {
		tup, err := tb.Connect(a, connLocal, dst, new(int))
		require.NoError(t, err, "connect %d", i)
		p := tup.Local.Port()
		require.Equal(t, i >= half, p%2 == 1, "connect %d took port %d", i, p)
		require.False(t, taken[p], "port %d twice", p)
		taken[p] = true
	}
	require.Equal(t, half+odd, tb.Len())
	// Take the rest of the range: then nothing is left.
	for p := 32768; p <= 60999; p++ {
		if !taken[uint16(p)] {
			require.NoError(t, tb.Insert(Tuple{netip.AddrPortFrom(connLocal, uint16(p)), dst}, new(int)))
		}
	}
	_, err := tb.Connect(a, connLocal, dst, new(int))
	require.ErrorIs(t, err, ErrNoPorts)
	require.Equal(t, 28232, tb.Len())
}

// TestConnectFlat: the Flat policy and a per-call range take both parities
// from the start.
func TestConnectFlat(t *testing.T) {
	parities := func(ports []uint16) (even, odd int) {
		for _, p := range ports {
			if p%2 == 0 {
				even++
			} else {
				odd++
			}
		}
		return even, odd
	}
	connectN := func(a *PortAllocator, n int, opts ...ConnectOption) []uint16 {
		tb := connTable(n)
		var ports []uint16
		for range n {
			tup, err := tb.Connect(a, connLocal, connDsts[0], new(int), opts...)
			require.NoError(t, err)
			ports = append(ports, tup.Local.Port())
		}
		return ports
	}

	// Control: OddEven takes only even ports at first.
	even, odd := parities(connectN(newTestAllocator(t), 200))
	require.Equal(t, 200, even)
	require.Zero(t, odd)

	even, odd = parities(connectN(newTestAllocator(t, WithPolicy(Flat)), 200))
	require.Greater(t, even, 50, "flat")
	require.Greater(t, odd, 50, "flat")

	// A per-call range equal to the allocator's still makes the scan flat.
	even, odd = parities(connectN(newTestAllocator(t), 200, WithConnectRange(DefaultPortRange)))
	require.Greater(t, even, 50, "WithConnectRange")
	require.Greater(t, odd, 50, "WithConnectRange")

	// A narrow per-call range: one flat pass over exactly its ports.
	a := newTestAllocator(t)
	tb := connTable(16)
	sub := WithConnectRange(PortRange{40000, 40009})
	ports := connFill(t, tb, a, connLocal, connDsts[0], sub)
	slices.Sort(ports)
	require.Equal(t, []uint16{40000, 40001, 40002, 40003, 40004, 40005, 40006, 40007, 40008, 40009}, ports)
}

// connSentinels inserts, for every port p of r, a tuple toward another
// destination that hashes to the bucket of (local:p, remote), so that it is
// at the head of that chain, and returns the set of their entry indexes. A
// lookup of (local:p, remote) that does not find its entry in the bucket's
// line then visits exactly one sentinel before the entry it looks for.
// The table must have at least r.Size() buckets.
func connSentinels(t *testing.T, tb *Table[int], local netip.Addr, remote netip.AddrPort, r PortRange) map[uint32]uint16 {
	t.Helper()
	return connBucketMates(t, tb, local, remote, r, netip.AddrPortFrom(netip.MustParseAddr("203.0.113.9"), 9999))
}

// connBucketMates inserts, for every port p of r, a tuple toward other that
// hashes to the bucket of (local:p, remote), and returns the set of their
// entry indexes.
func connBucketMates(t *testing.T, tb *Table[int], local netip.Addr, remote netip.AddrPort, r PortRange, other netip.AddrPort) map[uint32]uint16 {
	t.Helper()
	nb := uint32(len(tb.cur().lines))
	require.GreaterOrEqual(t, int(nb), r.Size())
	h0 := HashTuple(Tuple{netip.AddrPortFrom(local, 0), remote}, tb.hasher, tb.secret)
	s0 := HashTuple(Tuple{netip.AddrPortFrom(local, 0), other}, tb.hasher, tb.secret)
	sentinels := make(map[uint32]uint16)
	for p := uint32(r.Low); p <= uint32(r.High); p++ {
		q := (h0 + p - s0) & (nb - 1)
		if q == 0 {
			q = nb
		}
		tup := Tuple{netip.AddrPortFrom(local, uint16(q)), other}
		require.Equal(t, (h0+p)&(nb-1), HashTuple(tup, tb.hasher, tb.secret)&(nb-1))
		require.NoError(t, tb.Insert(tup, new(int)))
		var k key
		tb.tupleKey(&k, &tup)
		_, b := tb.lockBucket(k.hash())
		e, _, i := tb.findLocked(b, &k)
		b.unlock()
		require.NotNil(t, e)
		sentinels[i] = uint16(p)
	}
	return sentinels
}

// TestConnectExhaustion fills a range toward one destination; the next
// Connect fails with ErrNoPorts (and EADDRNOTAVAIL) after one pass over the
// candidates, changing nothing; deleting one tuple frees exactly its port.
func TestConnectExhaustion(t *testing.T) {
	for _, policy := range []Policy{OddEven, Flat} {
		t.Run(policy.String(), func(t *testing.T) {
			rng := PortRange{40000, 41999}
			reserved := []uint16{40000, 40001, 40500, 41234, 41999, 12345}
			a := newTestAllocator(t, WithPortRange(rng), WithPolicy(policy), WithReservedPorts(reserved...))
			release, err := a.Bind(netip.AddrPortFrom(connLocal, 40100))
			require.NoError(t, err)
			defer release()
			tb := connTable(4096)
			dst := connDsts[0]
			// Fill the home slots of the candidates' buckets first, so
			// that the flows are reached through their chains (below).
			connBucketMates(t, tb, connLocal, dst, rng, netip.AddrPortFrom(netip.MustParseAddr("203.0.113.10"), 9999))

			// Fill by a flat scan of the same range, which costs one
			// lookup per Connect rather than a pass over the even half.
			ports := connFill(t, tb, a, connLocal, dst, WithConnectRange(rng))
			candidates := rng.Size() - 5 - 1 // reserved in range, bound
			require.Len(t, ports, candidates)
			require.NotContains(t, ports, uint16(40100))
			require.NotContains(t, ports, uint16(40500))

			// Count the candidates the failing Connect looks at: each of
			// their chains starts with a sentinel that the lock-free
			// lookup steps over.
			sentinels := connSentinels(t, tb, connLocal, dst, rng)
			n := tb.Len()
			visits := make(map[uint32]int)
			hooksOf(tb).visit = func(i uint32) { visits[i]++ }
			start := time.Now()
			// The scan: the kernel's walk over every candidate.
			_, err = tb.connect(a, connLocal, dst, new(int), connectHashOnce, nil)
			elapsed := time.Since(start)
			hooksOf(tb).visit = nil
			require.ErrorIs(t, err, ErrNoPorts)
			require.ErrorIs(t, err, syscall.EADDRNOTAVAIL)
			require.Equal(t, n, tb.Len())
			total := 0
			for i, c := range visits {
				p, ok := sentinels[i]
				require.True(t, ok, "visited entry %d is no sentinel", i)
				require.Equal(t, 1, c, "candidate port %d looked up %d times", p, c)
				require.NotContains(t, reserved, p)
				require.NotEqual(t, uint16(40100), p)
				total += c
			}
			require.Equal(t, candidates, total, "one pass over the candidates")
			require.Less(t, elapsed, 5*time.Second, "sanity bound only")
			// Connect, indexed since the fill's long scans: it finds no
			// free port in the bitmap and walks no chain.
			visited := 0
			hooksOf(tb).visit = func(uint32) { visited++ }
			_, err = tb.Connect(a, connLocal, dst, new(int))
			hooksOf(tb).visit = nil
			require.ErrorIs(t, err, ErrNoPorts)
			require.Zero(t, visited, "an indexed Connect walks no chain")

			// Freeing one port makes exactly that port available.
			for _, victim := range []uint16{ports[777], ports[0], ports[len(ports)-1]} {
				tup := Tuple{netip.AddrPortFrom(connLocal, victim), dst}
				_, ok := tb.Delete(tup)
				require.True(t, ok)
				v := new(int)
				got, err := tb.Connect(a, connLocal, dst, v)
				require.NoError(t, err)
				require.Equal(t, tup, got)
				gv, _ := tb.Lookup(got)
				require.Same(t, v, gv)
				_, err = tb.Connect(a, connLocal, dst, new(int))
				require.ErrorIs(t, err, ErrNoPorts)
			}
			require.Equal(t, n, tb.Len())

			// The other destinations still have every port.
			tup, err := tb.Connect(a, connLocal, connDsts[1], new(int))
			require.NoError(t, err)
			require.True(t, rng.Low <= tup.Local.Port() && tup.Local.Port() <= rng.High)
		})
	}
}

// TestConnectLosesRace makes the lock-free pre-check see a free port that
// another writer takes before the locked insert: Connect must not return
// that tuple nor overwrite its value, and must take the next candidate.
func TestConnectLosesRace(t *testing.T) {
	for _, strategy := range []connectStrategy{connectHashOnce, connectRehash} {
		rng := PortRange{40000, 40003}
		a := newTestAllocator(t, WithPortRange(rng), WithPolicy(Flat))
		tb := connTable(16)
		dst := connDsts[0]
		// The candidates' lines taken, so that the sentinels go to chains.
		connBucketMates(t, tb, connLocal, dst, rng, netip.AddrPortFrom(netip.MustParseAddr("203.0.113.10"), 9999))
		sentinels := connSentinels(t, tb, connLocal, dst, rng)
		n := tb.Len()
		// While the pre-check of the first candidate stands on its
		// sentinel, another writer inserts that candidate's tuple.
		var raced Tuple
		w := new(int)
		hooksOf(tb).visit = func(i uint32) {
			if raced != (Tuple{}) {
				return
			}
			raced = Tuple{netip.AddrPortFrom(connLocal, sentinels[i]), dst}
			require.NoError(t, tb.Insert(raced, w))
		}
		v := new(int)
		tup, err := tb.connect(a, connLocal, dst, v, strategy, nil)
		hooksOf(tb).visit = nil
		require.NoError(t, err)
		require.NotEqual(t, Tuple{}, raced, "no pre-check ran")
		require.NotEqual(t, raced, tup)
		got, _ := tb.Lookup(raced)
		require.Same(t, w, got)
		got, _ = tb.Lookup(tup)
		require.Same(t, v, got)
		require.Equal(t, n+2, tb.Len())
	}
}

// connConcurrentFill runs goroutines that connect toward one destination
// until the range is exhausted, and checks that together they took every
// candidate exactly once.
func connConcurrentFill(t *testing.T, a *PortAllocator, goroutines, want int) {
	tb := connTable(want)
	type result struct {
		tuples []Tuple
		vals   []*int
		err    error
	}
	results := make([]result, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &results[g]
			for {
				v := new(int)
				tup, err := tb.Connect(a, connLocal, connDsts[0], v)
				if err != nil {
					r.err = err
					return
				}
				r.tuples = append(r.tuples, tup)
				r.vals = append(r.vals, v)
			}
		}()
	}
	wg.Wait()
	seen := make(map[Tuple]bool, want)
	for g, r := range results {
		require.ErrorIs(t, r.err, ErrNoPorts, "goroutine %d", g)
		for i, tup := range r.tuples {
			require.False(t, seen[tup], "%v returned twice", tup)
			seen[tup] = true
			p := tup.Local.Port()
			require.True(t, a.Range().Low <= p && p <= a.Range().High, "%v", tup)
			require.False(t, a.Reserved(p), "%v", tup)
			got, ok := tb.Lookup(tup)
			require.True(t, ok, "%v", tup)
			require.Same(t, r.vals[i], got, "%v", tup)
		}
	}
	require.Len(t, seen, want)
	require.Equal(t, want, tb.Len())
}

// TestConnectConcurrentExhaustion: 8 goroutines connect to one destination
// until no port is left; every candidate port is taken exactly once.
func TestConnectConcurrentExhaustion(t *testing.T) {
	t.Run("2000", func(t *testing.T) {
		a := newTestAllocator(t, WithPortRange(PortRange{40000, 41999}), WithPolicy(Flat),
			WithReservedPorts(40000, 40002, 40003, 41000, 41999, 80))
		connConcurrentFill(t, a, 8, 2000-5)
	})
	// OddEven: once the even ports are gone, each Connect scans all of them
	// first, so a smaller range keeps the run short under -race.
	t.Run("500-odd-even", func(t *testing.T) {
		a := newTestAllocator(t, WithPortRange(PortRange{40000, 40499}),
			WithReservedPorts(40000, 40003, 40250, 40499, 80))
		connConcurrentFill(t, a, 8, 500-4)
	})
	// With OddEven, each Connect of the second half would scan the whole
	// even half first (see TestConnectOddEven): too slow under -race.
	t.Run("default", func(t *testing.T) {
		connConcurrentFill(t, newTestAllocator(t, WithPolicy(Flat)), 8, DefaultPortRange.Size())
	})
}

// TestConnectConcurrentChurn: goroutines connect and delete their own flows
// over a small range shared by two destinations. A tuple Connect returned
// holds the caller's value until the caller deletes it, which fails if two
// goroutines were handed the same tuple.
func TestConnectConcurrentChurn(t *testing.T) {
	a := newTestAllocator(t, WithPortRange(PortRange{50000, 50063}), WithPolicy(Flat))
	tb := connTable(256)
	const goroutines, ops = 8, 3000
	errs := make(chan error, goroutines)
	lives := make([][]Tuple, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewSource(int64(g)))
			var live []Tuple
			vals := make(map[Tuple]*int)
			defer func() { lives[g] = live }()
			for range ops {
				if len(live) > 0 && r.Intn(2) == 0 {
					j := r.Intn(len(live))
					tup := live[j]
					live[j] = live[len(live)-1]
					live = live[:len(live)-1]
					if got, ok := tb.Delete(tup); !ok || got != vals[tup] {
						errs <- fmt.Errorf("goroutine %d: Delete(%v) = %p, %v; want %p", g, tup, got, ok, vals[tup])
						return
					}
					delete(vals, tup)
					continue
				}
				v := new(int)
				tup, err := tb.Connect(a, connLocal, connDsts[r.Intn(2)], v)
				if errors.Is(err, ErrNoPorts) {
					continue
				}
				if err != nil {
					errs <- err
					return
				}
				if got, ok := tb.Lookup(tup); !ok || got != v {
					errs <- fmt.Errorf("goroutine %d: Lookup(%v) = %p, %v; want %p", g, tup, got, ok, v)
					return
				}
				live = append(live, tup)
				vals[tup] = v
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	seen := make(map[Tuple]bool)
	for _, live := range lives {
		for _, tup := range live {
			require.False(t, seen[tup], "%v live twice", tup)
			seen[tup] = true
		}
	}
	require.Equal(t, len(seen), tb.Len())
}

// TestConnectUnpredictable: consecutive Connects to one destination are not
// consecutive candidates (the perturb slot advances by a random amount), the
// start depends on the secret, and the ports chosen toward one destination
// do not depend on the connects toward another.
func TestConnectUnpredictable(t *testing.T) {
	const n = 300
	connectSeq := func(tb *Table[int], a *PortAllocator, dst netip.AddrPort, n int) []uint16 {
		var ports []uint16
		for range n {
			tup, err := tb.Connect(a, connLocal, dst, new(int))
			require.NoError(t, err)
			ports = append(ports, tup.Local.Port())
		}
		return ports
	}
	for _, policy := range []Policy{OddEven, Flat} {
		step := 2
		if policy == Flat {
			step = 1
		}
		ports := connectSeq(connTable(n), newTestAllocator(t, WithPolicy(policy)), connDsts[0], n)
		gaps := make(map[int]int)
		for i := 1; i < n; i++ {
			gaps[int(ports[i])-int(ports[i-1])]++
		}
		require.Less(t, gaps[step], n/2, "%v: mostly sequential: gaps %v", policy, gaps)
		require.GreaterOrEqual(t, len(gaps), 6, "%v: gaps %v", policy, gaps)
	}

	// Another secret, another start.
	first := make(map[uint16]bool)
	for k := range uint64(8) {
		a, err := NewPortAllocator(WithPortSecret(k, k+100))
		require.NoError(t, err)
		tup, err := connTable(16).Connect(a, connLocal, connDsts[0], new(int))
		require.NoError(t, err)
		first[tup.Local.Port()] = true
	}
	require.Greater(t, len(first), 4, "first ports %v", first)

	// Destination B's ports are the same whether or not A was connected
	// to, before or in between.
	dstA, dstB := connDsts[0], connDsts[2]
	probe := newTestAllocator(t)
	require.NotEqual(t, probe.portOffset(connLocal, dstA)&(perturbSize-1), probe.portOffset(connLocal, dstB)&(perturbSize-1),
		"A and B share a perturb slot: pick other destinations")
	want := connectSeq(connTable(64), newTestAllocator(t), dstB, 50)
	for _, nA := range []int{1, 7, 100} {
		tb, a := connTable(256), newTestAllocator(t)
		connectSeq(tb, a, dstA, nA)
		var got []uint16
		for range 10 {
			got = append(got, connectSeq(tb, a, dstB, 5)...)
			connectSeq(tb, a, dstA, nA)
		}
		require.Equal(t, want, got, "after %d connects to A", nA)
	}
}

// TestConnectBadInput: invalid input returns a clear error and changes
// nothing, in the table or in the allocator.
func TestConnectBadInput(t *testing.T) {
	v4, v6 := connLocal, netip.MustParseAddr("2001:db8::1")
	dst4, dst6 := connDsts[0], netip.MustParseAddrPort("[2001:db8::2]:443")
	tests := []struct {
		name   string
		nilA   bool
		local  netip.Addr
		remote netip.AddrPort
		nilV   bool
		is     error
		says   string
	}{
		{"nil allocator", true, v4, dst4, false, ErrNilAllocator, "nil *PortAllocator"},
		{"nil value", false, v4, dst4, true, ErrNilValue, "nil value"},
		{"invalid local", false, netip.Addr{}, dst4, false, ErrInvalidTuple, "invalid address"},
		{"invalid remote", false, v4, netip.AddrPort{}, false, ErrInvalidTuple, "invalid address"},
		{"unspecified local v4", false, netip.IPv4Unspecified(), dst4, false, ErrInvalidTuple, "unspecified"},
		{"unspecified local mapped", false, netip.MustParseAddr("::ffff:0.0.0.0"), dst4, false, ErrInvalidTuple, "unspecified"},
		{"unspecified local v6", false, netip.IPv6Unspecified(), dst6, false, ErrInvalidTuple, "unspecified"},
		{"unspecified remote", false, v4, netip.AddrPortFrom(netip.IPv4Unspecified(), 443), false, ErrInvalidTuple, "unspecified"},
		{"unspecified remote v6", false, v6, netip.AddrPortFrom(netip.IPv6Unspecified(), 443), false, ErrInvalidTuple, "unspecified"},
		{"v4 local, v6 remote", false, v4, dst6, false, ErrInvalidTuple, "families differ"},
		{"v6 local, v4 remote", false, v6, dst4, false, ErrInvalidTuple, "families differ"},
		{"mapped local, v6 remote", false, connMapped, dst6, false, ErrInvalidTuple, "families differ"},
		{"remote port 0", false, v4, netip.AddrPortFrom(dst4.Addr(), 0), false, ErrInvalidTuple, "port 0"},
		{"remote port 0 v6", false, v6, netip.AddrPortFrom(dst6.Addr(), 0), false, ErrInvalidTuple, "port 0"},
	}
	// A twin allocator and table receive only the good calls: the ports
	// they choose afterwards must match.
	a, twinA := newTestAllocator(t), newTestAllocator(t)
	tb, twin := connTable(64), connTable(64)
	for i := range 5 {
		p, err := tb.Connect(a, v4, dst4, new(int))
		require.NoError(t, err)
		q, err := twin.Connect(twinA, v4, dst4, new(int))
		require.NoError(t, err)
		require.Equal(t, p, q, "connect %d", i)
	}
	for _, tt := range tests {
		alloc := a
		if tt.nilA {
			alloc = nil
		}
		var v *int
		if !tt.nilV {
			v = new(int)
		}
		for _, opt := range [][]ConnectOption{nil, {WithConnectRange(PortRange{40000, 40010})}} {
			tup, err := tb.Connect(alloc, tt.local, tt.remote, v, opt...)
			require.ErrorIs(t, err, tt.is, tt.name)
			require.NotErrorIs(t, err, ErrNoPorts, tt.name)
			require.Contains(t, err.Error(), tt.says, tt.name)
			if tt.is == ErrInvalidTuple {
				// One vocabulary, and the flow as the caller gave it:
				// no stand-in local port.
				require.ErrorIs(t, err, ErrInvalidAddr, tt.name)
				require.Contains(t, err.Error(), fmt.Sprintf("from %v to %v:", tt.local, tt.remote), tt.name)
			}
			require.Equal(t, Tuple{}, tup, tt.name)
			require.Equal(t, 5, tb.Len(), tt.name)
		}
	}
	for i := range 20 {
		p, err := tb.Connect(a, v4, dst4, new(int))
		require.NoError(t, err)
		q, err := twin.Connect(twinA, v4, dst4, new(int))
		require.NoError(t, err)
		require.Equal(t, q, p, "connect %d after the bad calls", i)
	}
}

// TestConnectAllocs: a steady-state Connect and Delete allocate nothing.
func TestConnectAllocs(t *testing.T) {
	flows := []struct {
		local  netip.Addr
		remote netip.AddrPort
	}{
		{connLocal, connDsts[0]},
		{connMapped, connDsts[2]},
		{netip.MustParseAddr("2001:db8::1"), netip.MustParseAddrPort("[2001:db8::2]:443")},
	}
	for _, h := range []Hasher{LinuxHasher, XXH3Hasher} {
		for _, f := range flows {
			a := newTestAllocator(t, WithReservedPorts(40000, 50000))
			release, err := a.Bind(netip.AddrPortFrom(connLocal, 40002))
			require.NoError(t, err)
			tb := connTable(4096, WithHasher(h))
			for range 2000 { // partly occupied
				_, err := tb.Connect(a, f.local, f.remote, new(int))
				require.NoError(t, err)
			}
			v := new(int)
			var err2 error
			allocs := testing.AllocsPerRun(1000, func() {
				tup, err := tb.Connect(a, f.local, f.remote, v)
				if err != nil {
					err2 = err
					return
				}
				tb.Delete(tup)
			})
			require.NoError(t, err2)
			require.Zero(t, allocs, "%v %v->%v", h, f.local, f.remote)
			require.Equal(t, 2000, tb.Len())
			release()
		}
	}
	// With options, the config they write is the one allocation.
	a := newTestAllocator(t)
	tb := connTable(64)
	opt := WithConnectRange(PortRange{40000, 40100})
	v := new(int)
	allocs := testing.AllocsPerRun(1000, func() {
		tup, err := tb.Connect(a, connLocal, connDsts[0], v, opt)
		if err == nil {
			tb.Delete(tup)
		}
	})
	require.LessOrEqual(t, allocs, 1.0)
	require.Zero(t, tb.Len())
}

// TestConnectIPv6 connects IPv6 flows, including local addresses that
// differ only outside the 32 bits the Linux hash reads.
func TestConnectIPv6(t *testing.T) {
	a := newTestAllocator(t, WithPortRange(PortRange{40000, 40003}))
	tb := connTable(64)
	dst := netip.MustParseAddrPort("[2001:db8::2]:443")
	locals := []netip.Addr{
		netip.MustParseAddr("2001:db8::1"),
		netip.MustParseAddr("2001:db9::1"), // same last 32 bits
		netip.MustParseAddr("fe80::1"),
	}
	for _, local := range locals {
		ports := connFill(t, tb, a, local, dst)
		slices.Sort(ports)
		require.Equal(t, []uint16{40000, 40001, 40002, 40003}, ports, "%v", local)
	}
	require.Equal(t, 12, tb.Len())
	// A zone is not part of the address: fe80::1%eth0 has no port left.
	_, err := tb.Connect(a, netip.MustParseAddr("fe80::1%eth0"), dst, new(int))
	require.ErrorIs(t, err, ErrNoPorts)
	// A mapped remote is the IPv4 remote, so it needs an IPv4 local.
	_, err = tb.Connect(a, locals[0], netip.MustParseAddrPort("[::ffff:192.0.2.1]:443"), new(int))
	require.ErrorIs(t, err, ErrInvalidTuple)
}

// TestConnectMapped: an IPv4-mapped local address is its IPv4 form: same
// tuples, same binds, same perturb slot.
func TestConnectMapped(t *testing.T) {
	rng := PortRange{40000, 40009}
	a := newTestAllocator(t, WithPortRange(rng))
	release, err := a.Bind(netip.AddrPortFrom(connMapped, 40004))
	require.NoError(t, err)
	defer release()
	tb := connTable(64)
	dst := connDsts[0]
	mappedDst := netip.MustParseAddrPort("[::ffff:192.0.2.1]:443")

	var ports []uint16
	for i := range 9 {
		// Alternate the forms of both addresses.
		local, remote := connLocal, dst
		if i%2 == 0 {
			local = connMapped
		}
		if i%3 == 0 {
			remote = mappedDst
		}
		v := new(int)
		tup, err := tb.Connect(a, local, remote, v)
		require.NoError(t, err, "connect %d", i)
		require.True(t, tup.Local.Addr().Is4(), "%v", tup)
		require.True(t, tup.Remote.Addr().Is4(), "%v", tup)
		for _, form := range []Tuple{tup, {netip.AddrPortFrom(connMapped, tup.Local.Port()), mappedDst}} {
			got, ok := tb.Lookup(form)
			require.True(t, ok, "%v", form)
			require.Same(t, v, got, "%v", form)
		}
		ports = append(ports, tup.Local.Port())
	}
	require.NotContains(t, ports, uint16(40004), "bound through the mapped form")
	slices.Sort(ports)
	require.Len(t, slices.Compact(ports), 9)
	for _, local := range []netip.Addr{connLocal, connMapped} {
		_, err := tb.Connect(a, local, dst, new(int))
		require.ErrorIs(t, err, ErrNoPorts, "%v", local)
	}
	require.Equal(t, 9, tb.Len())

	// Same sequence of ports whichever form is used.
	seq := func(local netip.Addr, remote netip.AddrPort) []uint16 {
		a, tb := newTestAllocator(t), connTable(64)
		var ports []uint16
		for range 20 {
			tup, err := tb.Connect(a, local, remote, new(int))
			require.NoError(t, err)
			ports = append(ports, tup.Local.Port())
		}
		return ports
	}
	require.Equal(t, seq(connLocal, dst), seq(connMapped, mappedDst))
}

// TestConnectZeroAllocator checks that a PortAllocator not made by
// NewPortAllocator is refused rather than yielding local port 0.
func TestConnectZeroAllocator(t *testing.T) {
	tab := New[int]()
	_, err := tab.Connect(&PortAllocator{}, netip.MustParseAddr("10.0.0.1"), netip.MustParseAddrPort("10.0.0.2:80"), new(int))
	require.ErrorIs(t, err, ErrNilAllocator)
	require.NotErrorIs(t, err, ErrInvalidPortRange)
	require.Contains(t, err.Error(), "NewPortAllocator")
	require.Zero(t, tab.Len())
}

// TestTablePresent checks Connect's lock-free pre-check against Lookup, on
// keys at home and deep in chains (a 16-bucket table holding 200 keys),
// present and absent, before and after deletes.
func TestTablePresent(t *testing.T) {
	tab := New[int](WithFixedBuckets(), WithCapacity(16), WithSecret(tblSecret), WithHasher(LinuxHasher))
	check := func(i int, want bool) {
		t.Helper()
		var k key
		tup := tblKey(i, i%2 == 0)
		tab.tupleKey(&k, &tup)
		_, found := tab.Lookup(tblKey(i, i%2 == 0))
		require.Equal(t, want, found, "Lookup of key %d", i)
		require.Equal(t, want, tab.present(&k), "present of key %d", i)
	}
	for i := range 200 {
		require.NoError(t, tab.Insert(tblKey(i, i%2 == 0), valPtr(i)))
	}
	require.Greater(t, tab.Stats().LongestChain, 10)
	for i := range 400 {
		check(i, i < 200)
	}
	for i := 0; i < 200; i += 3 {
		_, ok := tab.Delete(tblKey(i, i%2 == 0))
		require.True(t, ok)
	}
	for i := range 400 {
		check(i, i < 200 && i%3 != 0)
	}
}
