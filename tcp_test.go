package hash4

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestTCPListenErrors(t *testing.T) {
	tbl := NewTCPTable[int](WithSecret(udpTestSecret), nil) // a nil option is ignored
	v := new(int)
	for _, tc := range []struct {
		local netip.AddrPort
		v     *int
		want  error
	}{
		{netip.AddrPort{}, v, ErrInvalidAddr},
		{dmxAP("10.0.0.1:0"), v, ErrInvalidAddr},
		{dmxAP("10.0.0.1:80"), nil, ErrNilValue},
	} {
		_, err := tbl.Listen(tc.local, tc.v)
		require.ErrorIs(t, err, tc.want, "%v", tc.local)
	}
	for _, ipv4 := range []string{"10.0.0.1:80", "[::ffff:10.0.0.1]:80", "0.0.0.0:80"} {
		_, err := tbl.Listen(dmxAP(ipv4), v, WithIPv6Only())
		require.ErrorIs(t, err, ErrInvalidAddr, ipv4)
	}
	rel, err := tbl.Listen(dmxAP("10.0.0.1:80"), v)
	require.NoError(t, err)
	// Overlapping addresses on the port, with or without SO_REUSEADDR.
	for _, dup := range []string{"10.0.0.1:80", "[::ffff:10.0.0.1]:80", "0.0.0.0:80", "[::]:80", "[::ffff:0.0.0.0]:80"} {
		for _, opts := range [][]BindOption{nil, {WithReuseAddr()}, {WithReusePort()}} {
			_, err = tbl.Listen(dmxAP(dup), v, opts...)
			require.ErrorIs(t, err, ErrPortInUse, dup)
			require.ErrorIs(t, err, syscall.EADDRINUSE, dup)
		}
	}
	_, err = tbl.Listen(dmxAP("[::]:80"), v, WithIPv6Only())
	require.NoError(t, err, "an IPv6-only :: overlaps no IPv4 address")
	_, err = tbl.Listen(dmxAP("[2001:db8::1]:80"), v)
	require.ErrorIs(t, err, ErrPortInUse, ":: overlaps every IPv6 address")
	for _, other := range []string{"10.0.0.2:80", "[2001:db8::1]:81", "10.0.0.1:81"} {
		_, err = tbl.Listen(dmxAP(other), v)
		require.NoError(t, err, other)
	}
	syn := dmxPkt("10.0.0.1:80", "192.0.2.1:5555")
	got, ok := tbl.Lookup(syn)
	require.True(t, ok)
	require.Same(t, v, got)

	rel()
	rel() // idempotent
	v2 := new(int)
	rel2, err := tbl.Listen(dmxAP("10.0.0.1:80"), v2)
	require.NoError(t, err, "release frees the address")
	rel() // the old release does not remove the new listener
	got, ok = tbl.Lookup(syn)
	require.True(t, ok)
	require.Same(t, v2, got)
	rel2()
	_, ok = tbl.Lookup(syn)
	require.False(t, ok, "the IPv6-only :: takes no IPv4 segment")
}

// TestTCPReusePortGroups: listeners that asked for port reuse share an
// address and port; a segment goes to the listener of the group's array
// that its established hash picks, and after a release the group's last
// listener takes the released one's place, as in the kernel. IPv4-mapped
// listeners form a group of their own, which the IPv4 group outranks. On
// ::, IPv6-only listeners form a group of their own that IPv4 segments
// never reach; IPv6 segments go to the group that listened first.
func TestTCPReusePortGroups(t *testing.T) {
	tbl := NewTCPTable[string](WithSecret(udpTestSecret))
	names := []string{"A", "B", "C", "D"}
	rels := make([]func(), len(names))
	for i := range names {
		var err error
		rels[i], err = tbl.Listen(dmxAP("10.0.0.1:80"), &names[i], WithReusePort())
		require.NoError(t, err)
	}
	_, err := tbl.Listen(dmxAP("10.0.0.1:80"), &names[0])
	require.ErrorIs(t, err, ErrPortInUse, "a listener without reuse on a group's address")
	_, err = tbl.Listen(dmxAP("10.0.0.2:80"), &names[0])
	require.NoError(t, err)
	_, err = tbl.Listen(dmxAP("10.0.0.2:80"), &names[0], WithReusePort())
	require.ErrorIs(t, err, ErrPortInUse, "reuse beside a listener without it")

	spread := func(want []string) {
		t.Helper()
		seen := map[string]bool{}
		for i := range 300 {
			// From port 0 too, which no established flow has: the
			// lookup hashes the segment for the group alone.
			syn := Tuple{Local: dmxAP("10.0.0.1:80"), Remote: netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), uint16(1000+i)*uint16(i%2))}
			v, ok := tbl.Lookup(syn)
			require.True(t, ok)
			h := InetEhashfn(syn.Local.Addr(), 80, syn.Remote.Addr(), syn.Remote.Port(), udpTestSecret.Ehash)
			require.Equal(t, want[reciprocalScale(h, len(want))], *v, "%v", syn)
			seen[*v] = true
		}
		require.Len(t, seen, len(want))
	}
	spread([]string{"A", "B", "C", "D"})
	rels[1]()
	spread([]string{"A", "D", "C"})
	rels[0]()
	spread([]string{"C", "D"})
	v := "E"
	_, err = tbl.Listen(dmxAP("[::ffff:10.0.0.1]:80"), &v, WithReusePort())
	require.NoError(t, err, "the IPv4-mapped form, an IPv6 listener, has a group of its own")
	spread([]string{"C", "D"})
	rels[2]()
	rels[3]()
	spread([]string{"E"})

	// A larger group, some of whose listeners leave.
	big := make([]string, 40)
	bigRels := make([]func(), len(big))
	for i := range big {
		big[i] = fmt.Sprint("L", i)
		var err error
		bigRels[i], err = tbl.Listen(dmxAP("10.0.0.5:80"), &big[i], WithReusePort())
		require.NoError(t, err)
	}
	order := slices.Clone(big)
	for _, gone := range []int{3, 0, 20} {
		bigRels[gone]()
		j := slices.Index(order, big[gone])
		order[j] = order[len(order)-1]
		order = order[:len(order)-1]
	}
	seen := map[string]bool{}
	for i := range 4000 {
		syn := Tuple{Local: dmxAP("10.0.0.5:80"), Remote: netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, byte(i >> 8), byte(i)}), 1000)}
		v, ok := tbl.Lookup(syn)
		require.True(t, ok)
		h := InetEhashfn(syn.Local.Addr(), 80, syn.Remote.Addr(), 1000, udpTestSecret.Ehash)
		require.Equal(t, order[reciprocalScale(h, len(order))], *v, "%v", syn)
		seen[*v] = true
	}
	require.Len(t, seen, len(order))

	// On ::, X (IPv6-only) listens before Y and Z, then W (IPv6-only).
	six := []string{"X", "Y", "Z", "W"}
	sixRels := make([]func(), len(six))
	for i, v6only := range []bool{true, false, false, true} {
		opts := []BindOption{WithReusePort()}
		if v6only {
			opts = append(opts, WithIPv6Only())
		}
		var err error
		sixRels[i], err = tbl.Listen(dmxAP("[::]:443"), &six[i], opts...)
		require.NoError(t, err)
	}
	reached := func() (got4, got6 []string) {
		t.Helper()
		seen4, seen6 := map[string]bool{}, map[string]bool{}
		for i := range 200 {
			v, ok := tbl.Lookup(Tuple{Local: dmxAP("10.0.0.9:443"), Remote: netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), uint16(1000+i))})
			require.True(t, ok)
			seen4[*v] = true
			v, ok = tbl.Lookup(Tuple{Local: dmxAP("[2001:db8::1]:443"),
				Remote: netip.AddrPortFrom(netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: byte(i)}), uint16(1000+i))})
			require.True(t, ok)
			seen6[*v] = true
		}
		return slices.Sorted(maps.Keys(seen4)), slices.Sorted(maps.Keys(seen6))
	}
	got4, got6 := reached()
	require.Equal(t, []string{"Y", "Z"}, got4, "IPv4 segments: the group that is not IPv6-only")
	require.Equal(t, []string{"W", "X"}, got6, "IPv6 segments: the group whose listener listened first")
	sixRels[0]()
	got4, got6 = reached()
	require.Equal(t, []string{"Y", "Z"}, got4)
	require.Equal(t, []string{"Y", "Z"}, got6, "X gone, Y is the first listener on ::")
}

// TestTCPManyGroups: many reuseport groups in one lock stripe, whose
// records a lookup finds by binary search; each segment reaches the
// listener of its own group that its hash picks, before and after half of
// the groups leave.
func TestTCPManyGroups(t *testing.T) {
	tbl := NewTCPTable[string](WithSecret(udpTestSecret), WithLockStripes(1))
	const groups = 64
	names := make([][]string, groups)
	rels := make([][]func(), groups)
	addr := func(g int) netip.AddrPort {
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, 1}), uint16(1000+g))
	}
	for g := range groups {
		names[g] = make([]string, 2+g%3)
		rels[g] = make([]func(), len(names[g]))
		for i := range names[g] {
			names[g][i] = fmt.Sprint("G", g, "-", i)
			var err error
			rels[g][i], err = tbl.Listen(addr(g), &names[g][i], WithReusePort())
			require.NoError(t, err)
		}
	}
	require.Len(t, *tbl.groups[0].Load(), groups)
	check := func(live func(g int) bool) {
		t.Helper()
		for g := range groups {
			for i := range 20 {
				syn := Tuple{Local: addr(g), Remote: netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), 1000)}
				v, ok := tbl.Lookup(syn)
				if !live(g) {
					require.False(t, ok, "%v", syn)
					continue
				}
				require.True(t, ok, "%v", syn)
				h := InetEhashfn(syn.Local.Addr(), syn.Local.Port(), syn.Remote.Addr(), 1000, udpTestSecret.Ehash)
				require.Equal(t, names[g][reciprocalScale(h, len(names[g]))], *v, "%v", syn)
			}
		}
	}
	check(func(int) bool { return true })
	for g := 0; g < groups; g += 2 {
		for _, rel := range rels[g] {
			rel()
		}
	}
	require.Len(t, *tbl.groups[0].Load(), groups/2)
	check(func(g int) bool { return g%2 == 1 })
}

// TestTCPLookupOrder checks established, then exact listener, then wildcard
// listener, and the families of wildcard listeners.
func TestTCPLookupOrder(t *testing.T) {
	tbl := NewTCPTable[string](WithSecret(udpTestSecret), WithFixedBuckets(), WithCapacity(16))
	// Port reuse lets the exact and wildcard listeners of a port coexist.
	listen := func(addr, name string) func() {
		rel, err := tbl.Listen(dmxAP(addr), &name, WithReusePort())
		require.NoError(t, err)
		return rel
	}
	lookup := func(local, remote string) string {
		v, ok := tbl.Lookup(dmxPkt(local, remote))
		if !ok {
			return ""
		}
		return *v
	}
	relW4 := listen("0.0.0.0:80", "W4")
	listen("[::]:80", "W6")
	listen("10.0.0.1:80", "L")
	listen("[2001:db8::1]:80", "L6")
	listen("[::]:81", "D")
	est := "E"
	flow := dmxPkt("10.0.0.1:80", "192.0.2.1:5555")
	require.NoError(t, tbl.Established().Insert(flow, &est))

	for _, c := range []struct{ local, remote, want string }{
		{"10.0.0.1:80", "192.0.2.1:5555", "E"},
		{"[::ffff:10.0.0.1]:80", "[::ffff:192.0.2.1]:5555", "E"},
		{"10.0.0.1:80", "192.0.2.1:5556", "L"},
		{"10.0.0.2:80", "192.0.2.1:5555", "W4"},
		{"[2001:db8::1]:80", "[2001:db8::9]:5555", "L6"},
		{"[2001:db8::2]:80", "[2001:db8::9]:5555", "W6"},
		{"10.0.0.2:81", "192.0.2.1:5555", "D"}, // dual-stack ::
		{"[2001:db8::2]:81", "[2001:db8::9]:5555", "D"},
		{"10.0.0.2:82", "192.0.2.1:5555", ""},
		// Segments no listener takes.
		{"0.0.0.0:80", "192.0.2.1:5555", ""},
		{"10.0.0.2:80", "[2001:db8::9]:5555", ""},
		{"10.0.0.2:0", "192.0.2.1:5555", ""},
	} {
		require.Equal(t, c.want, lookup(c.local, c.remote), "%s <- %s", c.local, c.remote)
	}
	_, ok := tbl.Lookup(Tuple{})
	require.False(t, ok)

	_, ok = tbl.Established().Delete(flow)
	require.True(t, ok)
	require.Equal(t, "L", lookup("10.0.0.1:80", "192.0.2.1:5555"))
	relW4()
	require.Equal(t, "W6", lookup("10.0.0.2:80", "192.0.2.1:5555"), ":: takes IPv4 once 0.0.0.0 is gone")
}

// tcpStray builds a small table and tuples that land in chosen buckets.
type tcpStray struct {
	tbl *TCPTable[string]
}

func newTCPStray() *tcpStray {
	return &tcpStray{NewTCPTable[string](WithSecret(udpTestSecret), WithFixedBuckets(), WithCapacity(32), WithLockStripes(16))}
}

// listenerIn returns the i-th listener address 10.0.1.x:8080 whose listener
// bucket is b, and its hash.
func (s *tcpStray) listenerIn(b uint32, i int) (netip.AddrPort, uint32) {
	for n := 1; ; n++ {
		a := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 1, byte(n)}), 8080)
		h := portaddrHash(a.Addr(), a.Port(), s.tbl.mix)
		if h&s.tbl.lb.mask == b {
			if i == 0 {
				return a, h
			}
			i--
		}
	}
}

// pauseAt returns a visit hook that blocks the first visit of node target,
// and channels to wait for it and to let it go.
func pauseAt(target uint32) (hook func(uint32), paused <-chan struct{}, resume chan<- struct{}) {
	p, r := make(chan struct{}), make(chan struct{})
	var once sync.Once
	return func(i uint32) {
		if i == target {
			once.Do(func() { close(p); <-r })
		}
	}, p, r
}

// TestTCPRecycleSameChain stops a listener lookup on a node, releases it
// and listens again on the same chain, which reuses the node: the reader
// must still find the listener that was behind the node all along.
func TestTCPRecycleSameChain(t *testing.T) {
	s := newTCPStray()
	tbl := s.tbl
	const b = 9
	p := s.pauseBehind(t, b)
	p.release()
	v3 := "L2 again"
	_, err := tbl.Listen(p.second, &v3)
	require.NoError(t, err)
	require.Equal(t, nodeLink(p.node), tbl.lb.heads[b].load(), "L2's node reused in chain b")
	close(p.resume)
	require.Equal(t, p.want, <-p.done)
}

// TestTCPRecycleAfterMatch stops a listener lookup on a node of a reuseport
// group just after the node's key matched, before the walk reads its listen
// word and value, releases the listener and listens on another address in
// the same chain, which reuses the node: the walk must see the node's seq
// change, restart, and not take the other address's listener for the
// group's. The group's other listener, alone in it now, takes the segment.
func TestTCPRecycleAfterMatch(t *testing.T) {
	s := newTCPStray()
	tbl := s.tbl
	const b = 9
	group, _ := s.listenerIn(b, 0)
	other, _ := s.listenerIn(b, 1)
	v1, v2, vo := "L1", "L2", "other"
	_, err := tbl.Listen(group, &v1, WithReusePort())
	require.NoError(t, err)
	rel2, err := tbl.Listen(group, &v2, WithReusePort())
	require.NoError(t, err)
	i2 := tbl.lb.heads[b].load().index() // chain b: L2 -> L1
	stoppedOn := uint32(0)
	paused, resume := make(chan struct{}), make(chan struct{})
	var once sync.Once
	tbl.hooks = &testHooks{matched: func(i uint32) {
		once.Do(func() {
			stoppedOn = i
			close(paused)
			<-resume
		})
	}}
	done := make(chan *string)
	go func() {
		v, _ := tbl.Lookup(Tuple{Local: group, Remote: dmxAP("192.0.2.200:4444")})
		done <- v
	}()
	<-paused
	require.Equal(t, i2, stoppedOn, "stopped on L2's node")
	rel2()
	_, err = tbl.Listen(other, &vo)
	require.NoError(t, err)
	require.Equal(t, nodeLink(i2), tbl.lb.heads[b].load(), "L2's node reused in chain b")
	close(resume)
	require.Same(t, &v1, <-done)
	require.EqualValues(t, 1, tbl.restarts.Load(), "one restart, on the changed seq")
}

// strayPause is a listener lookup paused by tcpStray.pauseBehind.
type strayPause struct {
	want    *string        // the value of L1, which the lookup must return
	second  netip.AddrPort // L2's address
	release func()         // releases L2
	node    uint32         // L2's node, where the lookup stands
	hash    uint32         // L2's listener hash
	done    <-chan *string // the lookup's answer
	resume  chan<- struct{}
}

// pauseBehind listens L1 then L2 in listener chain b (L2 -> L1), starts a
// lookup of a segment to L1 and pauses it on L2's node.
func (s *tcpStray) pauseBehind(t *testing.T, b uint32) strayPause {
	tbl := s.tbl
	l1, _ := s.listenerIn(b, 0)
	l2, h2 := s.listenerIn(b, 1)
	v1, v2 := "L1", "L2"
	_, err := tbl.Listen(l1, &v1)
	require.NoError(t, err)
	rel2, err := tbl.Listen(l2, &v2)
	require.NoError(t, err)
	i2 := tbl.lb.heads[b].load().index()
	hook, paused, resume := pauseAt(i2)
	tbl.hooks = &testHooks{visit: hook}
	done := make(chan *string)
	go func() {
		v, _ := tbl.Lookup(Tuple{Local: l1, Remote: dmxAP("192.0.2.200:4444")})
		done <- v
	}()
	<-paused
	return strayPause{want: &v1, second: l2, release: rel2, node: i2, hash: h2, done: done, resume: resume}
}

func TestTCPLookupNoAllocs(t *testing.T) {
	tbl := NewTCPTable[int](WithSecret(udpTestSecret))
	v := new(int)
	require.NoError(t, tbl.Established().Insert(dmxPkt("10.0.0.1:80", "192.0.2.1:5555"), v))
	for _, a := range []string{"10.0.0.1:80", "0.0.0.0:81", "[::]:82", "[2001:db8::1]:80"} {
		_, err := tbl.Listen(dmxAP(a), v)
		require.NoError(t, err)
	}
	for range 3 { // a reuseport group
		_, err := tbl.Listen(dmxAP("10.0.0.3:80"), v, WithReusePort())
		require.NoError(t, err)
	}
	for _, p := range []Tuple{
		dmxPkt("10.0.0.3:80", "192.0.2.2:5555"),
		dmxPkt("10.0.0.1:80", "192.0.2.1:5555"),
		dmxPkt("10.0.0.1:80", "192.0.2.2:5555"),
		dmxPkt("10.0.0.2:81", "192.0.2.2:5555"),
		dmxPkt("10.0.0.2:82", "192.0.2.2:5555"),
		dmxPkt("[2001:db8::1]:80", "[2001:db8::9]:5555"),
		dmxPkt("10.0.0.2:83", "192.0.2.2:5555"),
		{},
	} {
		require.Zero(t, testing.AllocsPerRun(100, func() { tbl.Lookup(p) }), "%v", p)
	}
}

// TestTCPLookupMatchesReference applies random Listen, release, Insert and
// Delete to a table and the reference and compares lookups.
func TestTCPLookupMatchesReference(t *testing.T) {
	for seed := range 40 {
		runTCPScenario(t, &opSource{rng: rand.New(rand.NewPCG(uint64(seed), 7))}, 150)
	}
}

// FuzzTCPLookup drives a scenario with the fuzzer's bytes.
func FuzzTCPLookup(f *testing.F) {
	f.Add([]byte{0, 0, 1, 2, 2, 0, 1, 3, 0, 4, 5, 6})
	f.Add([]byte("listen insert delete release wildcard mapped"))
	f.Fuzz(func(t *testing.T, data []byte) {
		runTCPScenario(t, &opSource{data: data}, 64)
	})
}

// runTCPScenario applies up to steps operations chosen by src (Listen,
// release, Insert into the established table, Delete) to a table and the
// reference, checks that they agree on each result, and after each step
// compares eight lookups.
func runTCPScenario(t testing.TB, src *opSource, steps int) {
	locals := []string{"10.0.0.1", "10.0.0.2", "::ffff:10.0.0.1", "0.0.0.0", "::", "2001:db8::1", "fe80::1%eth0"}
	ports := []uint16{80, 81}
	remotes := []string{"192.0.2.1:1000", "192.0.2.2:1000", "[2001:db8::9]:1000", "[::ffff:192.0.2.1]:1000", "0.0.0.0:7", "192.0.2.3:0"}
	tbl := NewTCPTable[int](WithSecret(udpTestSecret), WithFixedBuckets(), WithCapacity(16), WithLockStripes(2))
	ref := &tcpModel{est: map[Tuple]*int{}}
	// Flows in the order they came, so that a scenario is the same on
	// every run.
	var flows []Tuple
	pick := func(s []string) string { return s[src.pick(len(s))] }
	randLocal := func() netip.AddrPort {
		return netip.AddrPortFrom(netip.MustParseAddr(pick(locals)), ports[src.pick(len(ports))])
	}
	for step := 0; step < steps && !src.done; step++ {
		v := valPtr(step)
		switch src.pick(4) {
		case 0:
			l := randLocal()
			v6only, reuse, opts := refBindOptions(src.next())
			rel, err := tbl.Listen(l, v, opts...)
			ml := ref.listen(l, v6only, reuse)
			require.Equal(t, ml != nil, err == nil, "Listen(%v, v6only %v, reuse %v): %v", l, v6only, reuse, err)
			if err == nil {
				ml.val, ml.release = v, rel
			}
		case 1:
			if len(ref.ls) > 0 {
				l := ref.ls[src.pick(len(ref.ls))]
				l.release()
				ref.close(l)
			}
		case 2:
			tup := Tuple{randLocal(), dmxAP(pick(remotes))}
			err := tbl.Established().Insert(tup, v)
			norm := Tuple{refNorm(tup.Local), refNorm(tup.Remote)}
			_, dup := ref.est[norm]
			if validate(tup) != nil || dup {
				require.Error(t, err)
			} else {
				require.NoError(t, err)
				ref.est[norm] = v
				flows = append(flows, norm)
			}
		case 3:
			if len(flows) > 0 {
				i := src.pick(len(flows))
				got, ok := tbl.Established().Delete(flows[i])
				require.True(t, ok)
				require.Same(t, ref.est[flows[i]], got)
				delete(ref.est, flows[i])
				flows = slices.Delete(flows, i, i+1)
			}
		}
		for range 8 {
			pkt := Tuple{randLocal(), dmxAP(pick(remotes))}
			got, ok := tbl.Lookup(pkt)
			want := ref.lookupAll(pkt, func() uint32 { return tcpTestHash(pkt) })
			require.Equal(t, len(want) == 1, ok, "step %d: Lookup(%v)", step, pkt)
			if ok {
				require.Same(t, want[0], got, "step %d: Lookup(%v)", step, pkt)
			}
		}
	}
}

// TestTCPLookupRace recycles nodes of the established and the listener
// chains (bursts large enough to spill the free caches into the depot)
// while lookups run for flows and listeners that stay: every lookup must
// find the right one (run it under -race).
func TestTCPLookupRace(t *testing.T) {
	tbl := NewTCPTable[int](WithSecret(udpTestSecret), WithFixedBuckets(), WithCapacity(32), WithLockStripes(1))
	type probe struct {
		pkt Tuple
		val *int
	}
	var probes []probe
	for i := range 24 {
		v := valPtr(i)
		tup := Tuple{Local: dmxAP("10.0.0.1:80"), Remote: netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(i + 1)}), 1000)}
		require.NoError(t, tbl.Established().Insert(tup, v))
		probes = append(probes, probe{tup, v})
	}
	for i := range 24 {
		v := valPtr(100 + i)
		a := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 2, byte(i + 1)}), 80)
		_, err := tbl.Listen(a, v, WithReusePort())
		require.NoError(t, err)
		probes = append(probes, probe{Tuple{Local: a, Remote: dmxAP("192.0.2.250:999")}, v})
	}
	vw := valPtr(-1)
	_, err := tbl.Listen(dmxAP("0.0.0.0:80"), vw, WithReusePort())
	require.NoError(t, err)
	probes = append(probes, probe{dmxPkt("10.0.0.3:80", "192.0.2.250:999"), vw})

	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // churn: bursts of listeners, then of flows, on the same port
		defer wg.Done()
		v := valPtr(0)
		rels := make([]func(), 0, 300)
		for round := 0; !stop.Load(); round++ {
			for i := range 300 {
				a := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), 80)
				rel, err := tbl.Listen(a, v, WithReusePort())
				if err != nil {
					t.Error(err)
					return
				}
				rels = append(rels, rel)
			}
			for _, rel := range rels {
				rel()
			}
			rels = rels[:0]
			for i := range 300 {
				tup := Tuple{Local: dmxAP("10.0.0.1:80"), Remote: netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, byte(i >> 8), byte(i)}), uint16(2000+round%7))}
				if err := tbl.Established().Insert(tup, v); err != nil {
					t.Error(err)
					return
				}
			}
			for i := range 300 {
				tup := Tuple{Local: dmxAP("10.0.0.1:80"), Remote: netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, byte(i >> 8), byte(i)}), uint16(2000+round%7))}
				tbl.Established().Delete(tup)
			}
		}
	}()
	lookups := raceLookups(t, &stop, &wg, 2, 3, func(rng *rand.Rand) string {
		p := probes[rng.IntN(len(probes))]
		if v, ok := tbl.Lookup(p.pkt); !ok || v != p.val {
			return fmt.Sprintf("Lookup(%v) = %v, %v", p.pkt, v, ok)
		}
		return ""
	})
	t.Logf("%d lookups, %d established and %d listener restarts", lookups, tbl.est.restarts.Load(), tbl.restarts.Load())
	require.Positive(t, lookups)
}

// TestTCPReusePortRace: while listeners join and leave a reuseport group,
// and established flows recycle nodes through the listener chains, every
// lookup of a segment to the group's address must return a listener of
// the group, never nothing and never another listener; one to another
// address of the chain, its own listener (run it under -race).
func TestTCPReusePortRace(t *testing.T) {
	tbl := NewTCPTable[string](WithSecret(udpTestSecret), WithFixedBuckets(), WithCapacity(16), WithLockStripes(2))
	group, other := dmxAP("10.0.0.1:80"), dmxAP("10.0.0.2:80")
	names := []string{"G0", "G1", "G2", "U"}
	for i := range 3 {
		_, err := tbl.Listen(group, &names[i], WithReusePort())
		require.NoError(t, err)
	}
	_, err := tbl.Listen(other, &names[3])
	require.NoError(t, err)

	var stop atomic.Bool
	var wg sync.WaitGroup
	for m := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("G-mover%d", m)
			for !stop.Load() {
				rel, err := tbl.Listen(group, &name, WithReusePort())
				if err != nil {
					t.Error(err)
					return
				}
				rel()
			}
		}()
	}
	wg.Add(1)
	go func() { // recycles nodes between established and listener chains
		defer wg.Done()
		v := "flow"
		for i := 0; !stop.Load(); i++ {
			tup := Tuple{Local: dmxAP("10.0.0.1:80"), Remote: netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, 100, byte(i % 32)}), 9)}
			if err := tbl.Established().Insert(tup, &v); err != nil {
				t.Error(err)
				return
			}
			tbl.Established().Delete(tup)
		}
	}()
	lookups := raceLookups(t, &stop, &wg, 2, 3, groupProbe(tbl.Lookup, group, other, "U"))
	t.Logf("%d lookups, %d listener walks started again", lookups, tbl.restarts.Load())
	// Quiet again, the group is its three listeners, in their places.
	for i := range 100 {
		syn := Tuple{Local: group, Remote: netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), 1000)}
		v, ok := tbl.Lookup(syn)
		require.True(t, ok)
		h := InetEhashfn(group.Addr(), 80, syn.Remote.Addr(), 1000, udpTestSecret.Ehash)
		require.Equal(t, names[reciprocalScale(h, 3)], *v)
	}
}

// refBindOptions decodes a scenario's byte into the options of a Bind or
// Listen: IPv6-only one time in two, port reuse three times in four.
func refBindOptions(f byte) (v6only, reuse bool, opts []BindOption) {
	v6only, reuse = f&1 != 0, f&6 != 0
	if v6only {
		opts = append(opts, WithIPv6Only())
	}
	if reuse {
		opts = append(opts, WithReusePort())
	}
	return v6only, reuse, opts
}

func refNorm(a netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(a.Addr().Unmap().WithZone(""), a.Port())
}

// tcpTestHash is the reuseport hash of segment pkt in a table made with
// udpTestSecret: its established hash.
func tcpTestHash(pkt Tuple) uint32 {
	la, ra := pkt.Local.Addr().Unmap(), pkt.Remote.Addr().Unmap()
	if la.Is4() {
		return InetEhashfn(la, pkt.Local.Port(), ra, pkt.Remote.Port(), udpTestSecret.Ehash)
	}
	return Inet6Ehashfn(la, pkt.Local.Port(), ra, pkt.Remote.Port(), udpTestSecret.Ehash, udpTestSecret.Ehash6Addr)
}

// TestTCPListenReusePortFastPath: a port whose bind bucket remembers the
// address of the last SO_REUSEPORT listener that did not match it
// (FASTREUSEPORT_STRICT) lets a reuseport listener on a matching address
// listen without a conflict check (sk_reuseport_match), even beside a
// listener without port reuse that it overlaps; the same listener is
// refused once that memory is gone. The bucket goes with the port's last
// listener.
func TestTCPListenReusePortFastPath(t *testing.T) {
	for _, second := range []bool{true, false} {
		tbl := NewTCPTable[int](WithSecret(udpTestSecret))
		ref := &tcpModel{}
		v := new(int)
		listen := func(addr string, ok bool, opts ...BindOption) func() {
			t.Helper()
			rel, err := tbl.Listen(dmxAP(addr), v, opts...)
			cfg := bindConfig{}
			for _, o := range opts {
				o(&cfg)
			}
			ml := ref.listen(dmxAP(addr), cfg.v6only, cfg.reusePort)
			require.Equal(t, ok, err == nil, "%s: %v", addr, err)
			require.Equal(t, ok, ml != nil, "model: %s", addr)
			return func() {
				rel()
				ref.close(ml)
			}
		}
		relA := listen("0.0.0.0:80", true, WithReusePort())
		relB := listen("[::]:80", true, WithIPv6Only()) // the fast path is off
		if second {
			listen("0.0.0.0:80", true, WithReusePort()) // strict, on 0.0.0.0
		}
		listen("[::]:80", second, WithReusePort())
		if second {
			continue
		}
		relA()
		relB()
		// The port has no listener left: a new bucket.
		listen("[::]:80", true, WithIPv6Only())
		listen("[::]:81", true, WithReusePort())
		listen("[::]:81", false)
	}
}

// TestTCPSpecificIPv6AddressIsIPv6Only: bind() to a specific IPv6 address
// makes a listener IPv6-only (__inet6_bind), so on ::1 the listeners that
// asked for IPV6_V6ONLY and those that did not form one reuseport group.
func TestTCPSpecificIPv6AddressIsIPv6Only(t *testing.T) {
	tbl := NewTCPTable[string](WithSecret(udpTestSecret))
	names := []string{"A", "B"}
	_, err := tbl.Listen(dmxAP("[::1]:80"), &names[0], WithReusePort())
	require.NoError(t, err)
	_, err = tbl.Listen(dmxAP("[::1]:80"), &names[1], WithReusePort(), WithIPv6Only())
	require.NoError(t, err)
	seen := map[string]bool{}
	for i := range 100 {
		syn := Tuple{Local: dmxAP("[::1]:80"), Remote: netip.AddrPortFrom(netip.IPv6Loopback(), uint16(1000+i))}
		v, ok := tbl.Lookup(syn)
		require.True(t, ok)
		require.Equal(t, names[reciprocalScale(tcpTestHash(syn), 2)], *v)
		seen[*v] = true
	}
	require.Len(t, seen, 2)
}

// TestTCPIPv4MappedListener: a listener on ::ffff:a.b.c.d or ::ffff:0.0.0.0
// is an IPv6 socket. It conflicts with an IPv4 listener on the same address
// unless both set SO_REUSEPORT, and then the IPv4 listener, which the
// kernel scores 2 against its 1 and meets first, takes every IPv4 segment.
func TestTCPIPv4MappedListener(t *testing.T) {
	for _, addrs := range [][2]string{{"127.0.0.2", "::ffff:127.0.0.2"}, {"0.0.0.0", "::ffff:0.0.0.0"}} {
		for _, mappedFirst := range []bool{false, true} {
			tbl := NewTCPTable[string](WithSecret(udpTestSecret))
			v4, v6 := "IPv4", "mapped"
			listen := func(addr string, v *string, opts ...BindOption) (func(), error) {
				return tbl.Listen(netip.AddrPortFrom(netip.MustParseAddr(addr), 80), v, opts...)
			}
			first, second := addrs[0], addrs[1]
			fv, sv := &v4, &v6
			if mappedFirst {
				first, second, fv, sv = second, first, sv, fv
			}
			rel1, err := listen(first, fv)
			require.NoError(t, err)
			_, err = listen(second, sv)
			require.ErrorIs(t, err, ErrPortInUse, "%s beside %s", second, first)
			rel1()
			rel1, err = listen(first, fv, WithReusePort())
			require.NoError(t, err)
			rel2, err := listen(second, sv, WithReusePort())
			require.NoError(t, err)
			syn := dmxPkt("127.0.0.2:80", "127.0.0.9:5000")
			require.Equal(t, "IPv4", tcpName(tbl, syn))
			if mappedFirst {
				rel2()
			} else {
				rel1()
			}
			require.Equal(t, "mapped", tcpName(tbl, syn), "the IPv6 listener alone")
			_, ok := tbl.Lookup(dmxPkt("[::1]:80", "[::1]:5000"))
			require.False(t, ok, "an IPv4-mapped listener takes no IPv6 segment")
		}
	}
}

// tcpName is the value Lookup returns for pkt, or "".
func tcpName(tbl *TCPTable[string], pkt Tuple) string {
	if v, ok := tbl.Lookup(pkt); ok {
		return *v
	}
	return ""
}

// TestKindString: each Kind has a name, as Hasher and Policy have, and a
// value that names none says so with its number.
func TestKindString(t *testing.T) {
	require.Equal(t, "none", KindNone.String())
	require.Equal(t, "established", KindEstablished.String())
	require.Equal(t, "listener", KindListener.String())
	require.Equal(t, "Kind(7)", Kind(7).String())
	require.Equal(t, "listener", fmt.Sprint(KindListener), "fmt uses String")
}
