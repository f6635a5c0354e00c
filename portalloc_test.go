package hash4

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/quick"

	"github.com/dchest/siphash"
	"github.com/stretchr/testify/require"
)

var (
	paLocal  = netip.MustParseAddr("10.0.0.1")
	paLocal2 = netip.MustParseAddr("10.0.0.2")
	paDstA   = netip.MustParseAddrPort("192.0.2.1:443")
	paDstB   = netip.MustParseAddrPort("198.51.100.7:80")
)

// newTestAllocator returns an allocator with a fixed secret and perturb seed
// (so runs are reproducible), configured further by opts.
func newTestAllocator(t testing.TB, opts ...PortOption) *PortAllocator {
	t.Helper()
	opts = append([]PortOption{WithPortSecret(1, 2), WithPerturbSeed(3)}, opts...)
	a, err := NewPortAllocator(opts...)
	require.NoError(t, err)
	return a
}

// usedPorts simulates the table for one flow (local, remote): the local
// ports in use. Its try takes a free port, as the table's insertion does,
// and counts the calls and the ports it was called with.
type usedPorts struct {
	used  map[uint16]bool
	calls int
	seen  map[uint16]int // calls per port in the current selectPort
}

func newUsedPorts() *usedPorts {
	return &usedPorts{used: make(map[uint16]bool), seen: make(map[uint16]int)}
}

func (u *usedPorts) try(p uint16) bool {
	u.calls++
	u.seen[p]++
	if u.used[p] {
		return false
	}
	u.used[p] = true
	return true
}

// pick runs one selectPort and checks that try was called at most once per
// port during it.
func (u *usedPorts) pick(t testing.TB, a *PortAllocator, local netip.Addr, remote netip.AddrPort, cc *connectConfig) (uint16, bool) {
	t.Helper()
	clear(u.seen)
	p, ok := a.selectPort(local, remote, cc, u.try)
	for port, n := range u.seen {
		if n > 1 {
			require.Failf(t, "try called twice", "port %d tried %d times in one scan", port, n)
		}
	}
	return p, ok
}

func TestPortRangeValidate(t *testing.T) {
	tests := []struct {
		r    PortRange
		ok   bool
		size int
	}{
		{PortRange{}, false, 0},
		{PortRange{0, 100}, false, 0},
		{PortRange{100, 99}, false, 0},
		{PortRange{65535, 1}, false, 0},
		{PortRange{1, 1}, true, 1},
		{PortRange{1, 65535}, true, 65535},
		{PortRange{65535, 65535}, true, 1},
		{DefaultPortRange, true, 28232},
	}
	for _, tt := range tests {
		err := tt.r.Validate()
		if tt.ok {
			require.NoError(t, err, "%v", tt.r)
		} else {
			require.ErrorIs(t, err, ErrInvalidPortRange, "%v", tt.r)
		}
		require.Equal(t, tt.size, tt.r.Size(), "%v", tt.r)
	}
}

func TestParsePortRange(t *testing.T) {
	good := []struct {
		in   string
		want PortRange
	}{
		{"32768-60999", DefaultPortRange},
		{"32768\t60999\n", DefaultPortRange}, // as /proc/sys/net/ipv4/ip_local_port_range reads
		{" 1 - 2 ", PortRange{1, 2}},
		{"1  65535", PortRange{1, 65535}},
		{"80", PortRange{80, 80}},
		{" 80\n", PortRange{80, 80}},
	}
	for _, tt := range good {
		r, err := ParsePortRange(tt.in)
		require.NoError(t, err, "%q", tt.in)
		require.Equal(t, tt.want, r, "%q", tt.in)
	}
	for _, in := range []string{"", " ", "-", "-5", "5-", "0-10", "0", "10-5", "1-65536", "65536", "a-b",
		"1-2-3", "1 2 3", "+1-2", "0x10-0x20", "1_000-2_000", "1,2", "1-2,3"} {
		r, err := ParsePortRange(in)
		require.ErrorIs(t, err, ErrInvalidPortRange, "%q", in)
		require.Zero(t, r, "%q", in)
		if in != "" {
			require.Contains(t, err.Error(), strings.TrimSpace(in), "the error quotes the input")
		}
	}
}

func TestParseReservedPorts(t *testing.T) {
	tests := []struct {
		in   string
		want []uint16
	}{
		{"", nil},
		{" \t\n", nil},
		{"8080", []uint16{8080}},
		{"8080,9000-9002", []uint16{8080, 9000, 9001, 9002}},
		{" 8080 , 9000 - 9002 \n", []uint16{8080, 9000, 9001, 9002}},
		{"5,5,1-3,2", []uint16{1, 2, 3, 5}},
		{"65535", []uint16{65535}},
		{"65534-65535,1-1", []uint16{1, 65534, 65535}},
		{"080", []uint16{80}},
	}
	for _, tt := range tests {
		got, err := ParseReservedPorts(tt.in)
		require.NoError(t, err, "%q", tt.in)
		require.Equal(t, tt.want, got, "%q", tt.in)
	}

	bad := []struct{ in, token string }{
		{"0", `"0"`},
		{"1,0-5", `"0-5"`},
		{"65536", `"65536"`},
		{"70000", `"70000"`},
		{"99999999999999999999", `"99999999999999999999"`},
		{"9010-9000", `"9010-9000"`},
		{"8080,abc", `"abc"`},
		{"1-", `"1-"`},
		{"-5", `"-5"`},
		{"1-2-3", `"1-2-3"`},
		{"+5", `"+5"`},
		{"0x10", `"0x10"`},
		{"1 2", `"1 2"`},
		{"1,,2", `empty item`},
		{"1,", `empty item`},
	}
	for _, tt := range bad {
		got, err := ParseReservedPorts(tt.in)
		require.ErrorIs(t, err, ErrInvalidReservedPorts, "%q", tt.in)
		require.Contains(t, err.Error(), tt.token, "%q", tt.in)
		require.Nil(t, got, "%q", tt.in)
	}
}

func TestNewPortAllocatorErrors(t *testing.T) {
	tests := []struct {
		name string
		opts []PortOption
		err  error // nil: any non-nil error
	}{
		{"zero low", []PortOption{WithPortRange(PortRange{0, 10})}, ErrInvalidPortRange},
		{"inverted", []PortOption{WithPortRange(PortRange{2000, 1000})}, ErrInvalidPortRange},
		{"bad text", []PortOption{WithReservedPortsText("80,x")}, ErrInvalidReservedPorts},
		{"reserved 0", []PortOption{WithReservedPorts(80, 0)}, ErrInvalidReservedPorts},
		{"bad policy", []PortOption{WithPolicy(Policy(2))}, ErrInvalidPolicy},
	}
	for _, tt := range tests {
		a, err := NewPortAllocator(tt.opts...)
		require.Error(t, err, tt.name)
		require.Nil(t, a, tt.name)
		require.True(t, strings.HasPrefix(err.Error(), "hash4: "), "%s: %v", tt.name, err)
		if tt.err != nil {
			require.ErrorIs(t, err, tt.err, tt.name)
		}
	}

	a, err := NewPortAllocator(nil, WithPortRange(PortRange{1000, 1999}), WithPolicy(Flat),
		WithReservedPorts(1000, 5), WithReservedPortsText("1500-1502"))
	require.NoError(t, err)
	require.Equal(t, PortRange{1000, 1999}, a.Range())
	require.Equal(t, Flat, a.Policy())
	for _, p := range []uint16{5, 1000, 1500, 1501, 1502} {
		require.True(t, a.Reserved(p), p)
	}
	for _, p := range []uint16{0, 4, 1001, 1499, 1503, 65535} {
		require.False(t, a.Reserved(p), p)
	}

	a, err = NewPortAllocator()
	require.NoError(t, err)
	require.Equal(t, DefaultPortRange, a.Range())
	require.Equal(t, OddEven, a.Policy())
}

func TestPortErrors(t *testing.T) {
	require.ErrorIs(t, ErrNoPorts, syscall.EADDRNOTAVAIL)
	require.ErrorIs(t, fmt.Errorf("dial: %w", ErrNoPorts), syscall.EADDRNOTAVAIL)
	require.NotErrorIs(t, ErrNoPorts, syscall.EADDRINUSE)
	require.Contains(t, ErrNoPorts.Error(), "EADDRNOTAVAIL")
	require.ErrorIs(t, ErrPortInUse, syscall.EADDRINUSE)
	require.NotErrorIs(t, ErrPortInUse, ErrNoPorts)
	require.NotErrorIs(t, ErrNoPorts, ErrPortInUse)
}

func TestPolicyString(t *testing.T) {
	require.Equal(t, "odd-even", OddEven.String())
	require.Equal(t, "flat", Flat.String())
	require.Equal(t, "Policy(7)", Policy(7).String())
}

// TestPortOffsetMessage checks portOffset against SipHash-2-4 of its
// message built byte by byte: the 16-byte forms of the local and remote
// addresses, then the remote port in network order.
func TestPortOffsetMessage(t *testing.T) {
	a := newTestAllocator(t)
	r := rand.New(rand.NewPCG(5, 6))
	addr := func() netip.Addr {
		var b [16]byte
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		switch r.IntN(3) {
		case 0:
			return netip.AddrFrom4([4]byte(b[:4]))
		case 1:
			return netip.AddrFrom16(b).WithZone("eth0")
		}
		return netip.AddrFrom16(b)
	}
	for range 1000 {
		local, remote := addr(), netip.AddrPortFrom(addr(), uint16(r.Uint32()))
		var msg []byte
		l, rem := local.As16(), remote.Addr().As16()
		msg = append(msg, l[:]...)
		msg = append(msg, rem[:]...)
		msg = append(msg, byte(remote.Port()>>8), byte(remote.Port()))
		require.Equal(t, siphash.Hash(a.k0, a.k1, msg), a.portOffset(local, remote), "%v %v", local, remote)
	}
}

func TestPortOffsetIPv4Mapped(t *testing.T) {
	a := newTestAllocator(t)
	mapped := netip.AddrFrom16(paLocal.As16())
	mappedDst := netip.AddrPortFrom(netip.AddrFrom16(paDstA.Addr().As16()), paDstA.Port())
	require.True(t, mapped.Is4In6())
	require.Equal(t, a.portOffset(paLocal, paDstA), a.portOffset(mapped, mappedDst))
	require.NotEqual(t, a.portOffset(paLocal, paDstA), a.portOffset(paLocal2, paDstA))
	require.NotEqual(t, a.portOffset(paLocal, paDstA),
		a.portOffset(paLocal, netip.AddrPortFrom(paDstA.Addr(), paDstA.Port()+1)))
	b := newTestAllocator(t, WithPortSecret(1, 3))
	require.NotEqual(t, a.portOffset(paLocal, paDstA), b.portOffset(paLocal, paDstA))
}

// TestSelectPortSkips checks that no returned port is outside the range,
// reserved or held, and that every other port is returned before
// exhaustion.
func TestSelectPortSkips(t *testing.T) {
	for _, pol := range []Policy{OddEven, Flat} {
		a := newTestAllocator(t, WithPortRange(PortRange{5000, 5199}), WithPolicy(pol),
			WithReservedPortsText("5000,5010-5019,5199,6000"))
		var releases []func()
		for _, ap := range []string{"10.0.0.1:5020", "10.0.0.1:5021", "0.0.0.0:5030", "[::ffff:10.0.0.1]:5040",
			"10.0.0.2:5050", "[::]:5060", "10.0.0.1:7000"} {
			rel, err := a.Bind(netip.MustParseAddrPort(ap))
			require.NoError(t, err, ap)
			releases = append(releases, rel)
		}
		// Held for any address: the kernel's connect() skips every port
		// a bind() holds (TestKernelConnectSkipsBoundPorts).
		held := []uint16{5020, 5021, 5030, 5040, 5050, 5060}
		u := newUsedPorts()
		for {
			p, ok := u.pick(t, a, paLocal, paDstA, nil)
			for q := range u.seen {
				require.GreaterOrEqual(t, q, uint16(5000))
				require.LessOrEqual(t, q, uint16(5199))
				require.False(t, a.Reserved(q), q)
				require.NotContains(t, held, q)
			}
			if !ok {
				break
			}
			require.True(t, u.seen[p] == 1)
		}
		// 200 ports, 12 reserved in range, 6 held.
		require.Len(t, u.used, 200-12-6, pol)
		require.Contains(t, u.used, uint16(5100)) // held outside the range only

		// Released ports become candidates; the scan sees them at once.
		for _, rel := range releases {
			rel()
			rel() // idempotent
		}
		got := map[uint16]bool{}
		for {
			p, ok := u.pick(t, a, paLocal, paDstA, nil)
			if !ok {
				break
			}
			got[p] = true
		}
		require.Equal(t, map[uint16]bool{5020: true, 5021: true, 5030: true, 5040: true, 5050: true, 5060: true}, got, pol)
		require.Zero(t, a.nheld.Load())
		require.Empty(t, a.held)
		require.Empty(t, a.byPort)
		for i := range a.heldPorts {
			require.Zero(t, a.heldPorts[i].Load())
		}
	}
}

// TestSelectPortOddEven checks the odd/even policy on the default range:
// the first half of the picks to one destination all have low's parity.
func TestSelectPortOddEven(t *testing.T) {
	a := newTestAllocator(t)
	require.Equal(t, 28232, a.Range().Size())
	u := newUsedPorts()
	for n := range 14116 {
		p, ok := u.pick(t, a, paLocal, paDstA, nil)
		require.True(t, ok)
		if p%2 != 0 {
			require.Failf(t, "odd port in the first pass", "pick %d is port %d", n, p)
		}
	}
	for range 100 {
		p, ok := u.pick(t, a, paLocal, paDstA, nil)
		require.True(t, ok)
		require.Equal(t, uint16(1), p%2, p)
	}
	// Another destination is a separate flow: even ports again.
	v := newUsedPorts()
	p, ok := v.pick(t, a, paLocal, paDstB, nil)
	require.True(t, ok)
	require.Equal(t, uint16(0), p%2, p)

	// With an odd low, odd ports come first.
	b := newTestAllocator(t, WithPortRange(PortRange{1001, 2000}))
	w := newUsedPorts()
	for range 500 {
		p, ok := w.pick(t, b, paLocal, paDstA, nil)
		require.True(t, ok)
		require.Equal(t, uint16(1), p%2, p)
	}
	p, ok = w.pick(t, b, paLocal, paDstA, nil)
	require.True(t, ok)
	require.Equal(t, uint16(0), p%2, p)
}

// TestSelectPortFlat checks that the Flat policy and a per-call range take
// both parities from the start.
func TestSelectPortFlat(t *testing.T) {
	cases := []struct {
		name string
		a    *PortAllocator
		cc   *connectConfig
	}{
		{"flat", newTestAllocator(t, WithPolicy(Flat)), nil},
		{"connect range", newTestAllocator(t), &connectConfig{rng: PortRange{40000, 49999}}},
		{"connect range, unset bounds", newTestAllocator(t), &connectConfig{rng: PortRange{1, 65535}}},
	}
	for _, c := range cases {
		u := newUsedPorts()
		var odd, even int
		for range 100 {
			p, ok := u.pick(t, c.a, paLocal, paDstA, c.cc)
			require.True(t, ok, c.name)
			if p%2 == 0 {
				even++
			} else {
				odd++
			}
		}
		require.Greater(t, odd, 10, c.name)
		require.Greater(t, even, 10, c.name)
	}
}

// TestSelectPortConnectRange checks that each bound of a per-call range
// applies only inside the allocator's range, and that the call then scans
// its range flat: every port of it, each once.
func TestSelectPortConnectRange(t *testing.T) {
	tests := []struct {
		cc   PortRange
		want PortRange
	}{
		{PortRange{1500, 1600}, PortRange{1500, 1600}},
		{PortRange{1500, 1501}, PortRange{1500, 1501}},
		{PortRange{1700, 1700}, PortRange{1700, 1700}},
		{PortRange{500, 1600}, PortRange{1000, 1600}},
		{PortRange{1500, 3000}, PortRange{1500, 1999}},
		{PortRange{500, 3000}, PortRange{1000, 1999}},
		{PortRange{0, 1200}, PortRange{1000, 1200}},
		{PortRange{1900, 0}, PortRange{1900, 1999}},
		{PortRange{1000, 1999}, PortRange{1000, 1999}},
		{PortRange{1999, 1999}, PortRange{1999, 1999}},
		// The high bound must lie above the new low bound.
		{PortRange{1800, 1500}, PortRange{1800, 1999}},
		{PortRange{1800, 900}, PortRange{1800, 1999}},
		{PortRange{2500, 2600}, PortRange{1000, 1999}},
	}
	for _, pol := range []Policy{OddEven, Flat} {
		a := newTestAllocator(t, WithPortRange(PortRange{1000, 1999}), WithPolicy(pol))
		for _, tt := range tests {
			cc := &connectConfig{}
			WithConnectRange(tt.cc)(cc)
			u := newUsedPorts()
			for {
				calls := u.calls
				p, ok := u.pick(t, a, paLocal, paDstA, cc)
				if !ok {
					// One flat pass over the effective range.
					require.Equal(t, tt.want.Size(), u.calls-calls, "%v", tt.cc)
					break
				}
				require.GreaterOrEqual(t, p, tt.want.Low, "%v", tt.cc)
				require.LessOrEqual(t, p, tt.want.High, "%v", tt.cc)
			}
			require.Len(t, u.used, tt.want.Size(), "%v", tt.cc)
		}
	}

	// The zero range is no option: the odd/even policy stays.
	a := newTestAllocator(t, WithPortRange(PortRange{1000, 1999}))
	cc := &connectConfig{}
	WithConnectRange(PortRange{})(cc)
	u := newUsedPorts()
	for range 500 {
		p, ok := u.pick(t, a, paLocal, paDstA, cc)
		require.True(t, ok)
		require.Equal(t, uint16(0), p%2, p)
	}
}

// TestSelectPortExhaustion checks that a scan with no free port ends after
// one bounded pass, and that freeing one port makes exactly it available.
func TestSelectPortExhaustion(t *testing.T) {
	for _, pol := range []Policy{OddEven, Flat} {
		for _, r := range []PortRange{{2000, 2099}, {65436, 65535}, {1, 100}, {7, 7}, {7, 8}} {
			a := newTestAllocator(t, WithPortRange(r), WithPolicy(pol), WithReservedPorts(2050, 65500, 50))
			reservedIn := 0
			for p := int(r.Low); p <= int(r.High); p++ {
				if a.Reserved(uint16(p)) {
					reservedIn++
				}
			}
			u := newUsedPorts()
			for {
				calls := u.calls
				_, ok := u.pick(t, a, paLocal, paDstA, nil)
				require.LessOrEqual(t, u.calls-calls, r.Size(), "%v %v", pol, r)
				if !ok {
					require.Equal(t, r.Size()-reservedIn, u.calls-calls, "%v %v", pol, r)
					break
				}
			}
			require.Len(t, u.used, r.Size()-reservedIn, "%v %v", pol, r)

			free := r.Low + uint16(r.Size()/2)
			if a.Reserved(free) {
				free++
			}
			delete(u.used, free)
			p, ok := u.pick(t, a, paLocal, paDstA, nil)
			require.True(t, ok, "%v %v", pol, r)
			require.Equal(t, free, p, "%v %v", pol, r)
			_, ok = u.pick(t, a, paLocal, paDstA, nil)
			require.False(t, ok, "%v %v", pol, r)
		}
	}

	// All reserved: try is never called.
	a := newTestAllocator(t, WithPortRange(PortRange{100, 109}), WithReservedPortsText("100-109"))
	_, ok := a.selectPort(paLocal, paDstA, nil, func(uint16) bool {
		require.Fail(t, "try called for a reserved port")
		return true
	})
	require.False(t, ok)
}

// TestSelectPortOddRange checks a range of odd size under the odd/even
// policy: the kernel's two passes, of size-1 candidates, leave out the low
// or the high port, which the scan then tries last, so that every port is
// tried once.
func TestSelectPortOddRange(t *testing.T) {
	for _, r := range []PortRange{{3000, 3100}, {5000, 5010}, {5000, 5002}, {65533, 65535}} {
		for seed := range uint64(8) {
			a := newTestAllocator(t, WithPortRange(r), WithPerturbSeed(seed))
			for _, dst := range []netip.AddrPort{paDstA, paDstB} {
				var order []uint16
				_, ok := a.selectPort(paLocal, dst, nil, func(p uint16) bool {
					order = append(order, p)
					return false
				})
				require.False(t, ok)
				slices.Sort(order)
				require.Equal(t, r.Size(), len(slices.Compact(order)), "%v: every port once", r)
				require.Len(t, order, r.Size(), "%v: every port once", r)
				last := order[len(order)-1]
				// The kernel's first pass begins at low, and leaves
				// out high, whenever the range has 3 ports.
				require.Contains(t, []uint16{r.Low, r.High}, last, "%v: tried last", r)
				if r.Size() == 3 {
					require.Equal(t, r.High, last, "%v: tried last", r)
				}
			}
		}
	}
}

// TestConnectOddRangeLastFreePort: under the odd/even policy, Connect in a
// range of odd size finds the one free port whichever it is, including the
// one the kernel's passes leave out (the last port of a 3-port range, up to
// 65535), and the perturb slot advances as for a port found in the passes.
func TestConnectOddRangeLastFreePort(t *testing.T) {
	for _, r := range []PortRange{{5000, 5002}, {65533, 65535}, {5000, 5010}} {
		for free := int(r.Low); free <= int(r.High); free++ {
			for seed := range uint64(4) {
				a := newTestAllocator(t, WithPortRange(r), WithPerturbSeed(seed))
				tb := New[int]()
				dst := netip.AddrPortFrom(paDstA.Addr(), uint16(1000+seed))
				for p := int(r.Low); p <= int(r.High); p++ {
					if p != free {
						require.NoError(t, tb.Insert(Tuple{netip.AddrPortFrom(paLocal, uint16(p)), dst}, new(int)))
					}
				}
				tup, err := tb.Connect(a, paLocal, dst, new(int))
				require.NoError(t, err, "%v, port %d free", r, free)
				require.Equal(t, uint16(free), tup.Local.Port(), "%v", r)
				_, err = tb.Connect(a, paLocal, dst, new(int))
				require.ErrorIs(t, err, ErrNoPorts, "%v: full", r)
			}
		}
	}
}

// TestSelectPortPerturb checks the perturb slot increment: max(i,
// random(8)*step) + step, where i is the index of the port taken in its pass.
func TestSelectPortPerturb(t *testing.T) {
	for _, pol := range []Policy{OddEven, Flat} {
		step := uint32(2)
		if pol == Flat {
			step = 1
		}
		a := newTestAllocator(t, WithPolicy(pol))
		index := a.portOffset(paLocal, paDstA) & (perturbSize - 1)
		incs := map[uint32]int{}
		for range 400 {
			before := atomic.LoadUint32(&a.perturb[index])
			_, ok := a.selectPort(paLocal, paDstA, nil, func(uint16) bool { return true })
			require.True(t, ok)
			inc := atomic.LoadUint32(&a.perturb[index]) - before
			require.GreaterOrEqual(t, inc, step)
			require.LessOrEqual(t, inc, 8*step)
			require.Zero(t, inc%step)
			incs[inc]++
		}
		require.Len(t, incs, 8, "all of random(8) occurs: %v", incs)

		// A long scan: the increment is i + step.
		for _, skip := range []uint32{20, 100} {
			before := atomic.LoadUint32(&a.perturb[index])
			n := uint32(0)
			_, ok := a.selectPort(paLocal, paDstA, nil, func(uint16) bool {
				n++
				return n > skip
			})
			require.True(t, ok)
			require.Equal(t, skip*step+step, atomic.LoadUint32(&a.perturb[index])-before, "%v skip %d", pol, skip)
		}
		// A failed scan leaves the slot alone.
		before := atomic.LoadUint32(&a.perturb[index])
		_, ok := a.selectPort(paLocal, paDstA, nil, func(uint16) bool { return false })
		require.False(t, ok)
		require.Equal(t, before, atomic.LoadUint32(&a.perturb[index]))
	}
}

// TestSelectPortUnpredictable checks that consecutive picks to one
// destination are not consecutive ports. Under the kernel's scheme the next
// port is the previous plus step*(1+random(8)) when the scan is short, so
// +step happens for one pick in 8; +1 never happens with step 2.
func TestSelectPortUnpredictable(t *testing.T) {
	for _, seeded := range []bool{true, false} {
		a := newTestAllocator(t)
		if !seeded {
			var err error
			a, err = NewPortAllocator()
			require.NoError(t, err)
		}
		u := newUsedPorts()
		prev, ok := u.pick(t, a, paLocal, paDstA, nil)
		require.True(t, ok)
		gaps := map[int]int{}
		for range 100 {
			p, ok := u.pick(t, a, paLocal, paDstA, nil)
			require.True(t, ok)
			gaps[int(p)-int(prev)]++
			prev = p
		}
		require.Zero(t, gaps[1], "seeded=%v %v", seeded, gaps)
		require.Less(t, gaps[2], 30, "seeded=%v %v", seeded, gaps)
		require.GreaterOrEqual(t, len(gaps), 6, "seeded=%v %v", seeded, gaps)
	}
}

// TestSelectPortDestinationsIndependent checks that picks to one destination
// do not change the ports chosen for another (whose perturb slot differs),
// and that a seed and a secret make the sequence reproducible.
func TestSelectPortDestinationsIndependent(t *testing.T) {
	probe := newTestAllocator(t)
	require.NotEqual(t, probe.portOffset(paLocal, paDstA)&(perturbSize-1),
		probe.portOffset(paLocal, paDstB)&(perturbSize-1))

	run := func(picksToA int) []uint16 {
		a := newTestAllocator(t)
		ua := newUsedPorts()
		for range picksToA {
			_, ok := ua.pick(t, a, paLocal, paDstA, nil)
			require.True(t, ok)
		}
		ub := newUsedPorts()
		var seq []uint16
		for range 200 {
			p, ok := ub.pick(t, a, paLocal, paDstB, nil)
			require.True(t, ok)
			seq = append(seq, p)
		}
		return seq
	}
	first := run(0)
	require.Equal(t, first, run(500))
	require.Equal(t, first, run(0))

	other, err := NewPortAllocator(WithPortSecret(1, 2), WithPerturbSeed(4))
	require.NoError(t, err)
	u := newUsedPorts()
	var seq []uint16
	for range 200 {
		p, ok := u.pick(t, other, paLocal, paDstB, nil)
		require.True(t, ok)
		seq = append(seq, p)
	}
	require.NotEqual(t, first, seq)
}

func TestPortAllocatorBind(t *testing.T) {
	a := newTestAllocator(t)
	ap := netip.MustParseAddrPort

	_, err := a.Bind(netip.AddrPort{})
	require.ErrorIs(t, err, ErrInvalidAddr)
	require.NotErrorIs(t, err, ErrPortInUse)
	_, err = a.Bind(ap("10.0.0.1:0"))
	require.ErrorIs(t, err, ErrInvalidAddr)
	require.ErrorContains(t, err, "port 0")
	require.Zero(t, a.nheld.Load())

	rel, err := a.Bind(ap("10.0.0.1:8080"))
	require.NoError(t, err)
	// A dual-stack :: covers IPv4 too (TestKernelBindDualStack).
	for _, s := range []string{"10.0.0.1:8080", "[::ffff:10.0.0.1]:8080", "0.0.0.0:8080", "[::ffff:0.0.0.0]:8080", "[::]:8080"} {
		_, err = a.Bind(ap(s))
		require.ErrorIs(t, err, ErrPortInUse, s)
		require.ErrorIs(t, err, syscall.EADDRINUSE, s)
		require.ErrorContains(t, err, "8080", s)
	}
	for _, s := range []string{"10.0.0.2:8080", "10.0.0.1:8081", "[2001:db8::1]:8080"} {
		r, err := a.Bind(ap(s))
		require.NoError(t, err, s)
		r()
	}
	rv6, err := a.Bind(ap("[::]:8080"), WithIPv6Only())
	require.NoError(t, err)
	r4, err := a.Bind(ap("10.0.0.2:8080"))
	require.NoError(t, err, "an IPv6-only :: holds no IPv4 port")
	r4()
	rv6()
	// Options Bind does not take, or that do not fit the address, change
	// nothing.
	for _, c := range []struct {
		addr string
		opt  BindOption
	}{{"[::]:8082", WithReuseAddr()}, {"[::]:8082", WithReusePort()}, {"10.0.0.1:8082", WithIPv6Only()}, {"[::ffff:10.0.0.1]:8082", WithIPv6Only()}} {
		_, err = a.Bind(ap(c.addr), c.opt)
		require.ErrorIs(t, err, ErrInvalidAddr, c.addr)
		_, _, err = a.BindEphemeral(ap(c.addr).Addr(), c.opt)
		require.ErrorIs(t, err, ErrInvalidAddr, c.addr)
	}
	require.False(t, a.heldFor(netip.MustParseAddr("10.0.0.9"), 8082))
	rel()
	rel()
	r2, err := a.Bind(ap("[fe80::1%eth0]:8080"))
	require.NoError(t, err)
	_, err = a.Bind(ap("[fe80::1%eth1]:8080")) // zones are not part of the address
	require.ErrorIs(t, err, ErrPortInUse)
	// Nor of the wildcard: ::%eth0 is ::, which conflicts with fe80::1.
	_, err = a.Bind(ap("[::%eth0]:8080"))
	require.ErrorIs(t, err, ErrPortInUse)
	r2()
	rz, err := a.Bind(ap("[::%eth0]:8080"))
	require.NoError(t, err)
	_, err = a.Bind(ap("[2001:db8::1]:8080"))
	require.ErrorIs(t, err, ErrPortInUse)
	rz()

	// The wildcard holds the port for its family only.
	relW, err := a.Bind(ap("0.0.0.0:9000"))
	require.NoError(t, err)
	_, err = a.Bind(ap("10.0.0.3:9000"))
	require.ErrorIs(t, err, ErrPortInUse)
	require.True(t, a.heldFor(paLocal, 9000))
	require.True(t, a.heldFor(netip.AddrFrom16(paLocal.As16()), 9000))
	require.False(t, a.heldFor(netip.MustParseAddr("2001:db8::1"), 9000))
	require.False(t, a.heldFor(paLocal, 9001))
	relW()
	relW()
	require.False(t, a.heldFor(paLocal, 9000))
	r3, err := a.Bind(ap("10.0.0.3:9000"))
	require.NoError(t, err)
	// The release of a previous hold does not release a new one.
	relW()
	require.True(t, a.heldFor(netip.MustParseAddr("10.0.0.3"), 9000))
	r3()
	require.Zero(t, a.nheld.Load())
}

// TestPortAllocatorNotMade checks that an allocator NewPortAllocator did not
// make, nil or the zero value, gives errors rather than panics.
func TestPortAllocatorNotMade(t *testing.T) {
	for name, a := range map[string]*PortAllocator{"nil": nil, "zero": {}} {
		_, err := a.Bind(netip.MustParseAddrPort("10.0.0.1:8080"))
		require.ErrorIs(t, err, ErrNilAllocator, name)
		require.NotContains(t, err.Error(), "port range", name)
		_, _, err = a.BindEphemeral(netip.MustParseAddr("10.0.0.1"))
		require.ErrorIs(t, err, ErrNilAllocator, name)
		require.Equal(t, PortRange{}, a.Range(), name)
		require.Equal(t, OddEven, a.Policy(), name)
		require.False(t, a.Reserved(80), name)
	}
}

func TestPortAllocatorBindEphemeral(t *testing.T) {
	_, _, err := newTestAllocator(t).BindEphemeral(netip.Addr{})
	require.ErrorIs(t, err, ErrInvalidAddr)

	// The first port has the other parity than connect's first pass.
	for seed := range uint64(20) {
		for _, r := range []PortRange{DefaultPortRange, {1001, 2000}, {1001, 1002}} {
			a := newTestAllocator(t, WithPortRange(r), WithPerturbSeed(seed))
			p, rel, err := a.BindEphemeral(paLocal)
			require.NoError(t, err)
			require.NotEqual(t, r.Low%2, p%2, "%v: %d", r, p)
			rel()
		}
	}
	// Random start: different seeds start at different ports.
	starts := map[uint16]bool{}
	for seed := range uint64(20) {
		p, _, err := newTestAllocator(t, WithPerturbSeed(seed)).BindEphemeral(paLocal)
		require.NoError(t, err)
		starts[p] = true
	}
	require.Greater(t, len(starts), 10)

	// The IPv6 wildcard with a zone is the wildcard: it avoids ports held
	// for any IPv6 address.
	a6 := newTestAllocator(t, WithPortRange(PortRange{5000, 5001}))
	for _, p := range []uint16{5000, 5001} {
		_, err := a6.Bind(netip.AddrPortFrom(netip.MustParseAddr("2001:db8::1"), p))
		require.NoError(t, err)
	}
	for _, w := range []string{"::", "::%eth0"} {
		_, _, err := a6.BindEphemeral(netip.MustParseAddr(w))
		require.ErrorIs(t, err, ErrNoPorts, w)
	}

	// Exhaustion: the other parity first, then the rest; every free port
	// once; reserved and held ports never.
	for _, r := range []PortRange{{5000, 5099}, {5000, 5100}, {65500, 65535}, {9, 9}} {
		a := newTestAllocator(t, WithPortRange(r), WithReservedPorts(5007, 5008, 65535))
		heldRel, err := a.Bind(netip.AddrPortFrom(paLocal, 5011))
		require.NoError(t, err)
		_, err = a.Bind(netip.AddrPortFrom(paLocal2, 5013)) // another address
		require.NoError(t, err)
		want := 0
		for p := int(r.Low); p <= int(r.High); p++ {
			if !a.Reserved(uint16(p)) && p != 5011 {
				want++
			}
		}
		got := map[uint16]bool{}
		var releases []func()
		lastParity := (r.Low + 1) % 2
		for {
			p, rel, err := a.BindEphemeral(paLocal)
			if err != nil {
				require.ErrorIs(t, err, ErrNoPorts)
				require.ErrorIs(t, err, syscall.EADDRNOTAVAIL)
				break
			}
			require.False(t, got[p], p)
			got[p] = true
			require.GreaterOrEqual(t, p, r.Low)
			require.LessOrEqual(t, p, r.High)
			require.False(t, a.Reserved(p))
			require.NotEqual(t, uint16(5011), p)
			if p%2 != lastParity {
				require.Equal(t, r.Low%2, p%2, "parity back to the first after the second: %d", p)
				lastParity = p % 2
			}
			releases = append(releases, rel)
		}
		require.Len(t, got, want, "%v", r)
		// Held ports conflict with Bind.
		for p := range got {
			_, err := a.Bind(netip.AddrPortFrom(paLocal, p))
			require.ErrorIs(t, err, ErrPortInUse)
		}
		// A wildcard BindEphemeral avoids ports held for any address.
		_, _, err = a.BindEphemeral(netip.IPv4Unspecified())
		require.ErrorIs(t, err, ErrNoPorts)
		_, _, err = a.BindEphemeral(netip.MustParseAddr("::ffff:0.0.0.0"))
		require.ErrorIs(t, err, ErrNoPorts)
		releases[0]()
		heldRel()
		p, _, err := a.BindEphemeral(paLocal)
		require.NoError(t, err)
		require.True(t, got[p] || p == 5011, p)
	}
}

// TestSelectPortProperties checks, over random ranges, reservations, binds,
// policies and per-call ranges, that the picks until exhaustion are
// distinct, inside the effective range, never reserved nor held, each scan
// bounded, and that they cover every other port of the effective range.
func TestSelectPortProperties(t *testing.T) {
	prop := func(seed uint64) bool {
		r := rand.New(rand.NewPCG(seed, 0))
		var low int
		switch r.IntN(4) {
		case 0:
			low = 1
		case 1:
			low = 65536 - 1 - r.IntN(300)
		default:
			low = 1 + r.IntN(65535)
		}
		high := min(low+r.IntN(300), 65535)
		if r.IntN(2) == 0 {
			high = 65535
			low = max(low, 65535-r.IntN(400))
		}
		pr := PortRange{uint16(low), uint16(high)}
		var reserved []uint16
		for range r.IntN(40) {
			reserved = append(reserved, uint16(min(65535, max(1, low-5+r.IntN(high-low+11)))))
		}
		pol := Policy(r.IntN(2))
		a, err := NewPortAllocator(WithPortRange(pr), WithReservedPorts(reserved...), WithPolicy(pol),
			WithPortSecret(r.Uint64(), r.Uint64()), WithPerturbSeed(r.Uint64()))
		require.NoError(t, err)

		local := paLocal
		if r.IntN(3) == 0 {
			local = netip.MustParseAddr("2001:db8::1")
		}
		held := map[uint16]bool{} // for any address
		for range r.IntN(20) {
			port := uint16(min(65535, max(1, low-2+r.IntN(high-low+5))))
			var addr netip.Addr
			switch r.IntN(5) {
			case 0:
				addr = netip.IPv4Unspecified()
			case 1:
				addr = netip.IPv6Unspecified()
			case 2:
				addr = paLocal2
			case 3:
				addr = local
			default:
				addr = netip.AddrFrom16(local.As16()) // mapped if IPv4
			}
			if _, err := a.Bind(netip.AddrPortFrom(addr, port)); err == nil {
				held[port] = true
			}
		}

		var cc *connectConfig
		effLow, effHigh := low, high
		if r.IntN(3) == 0 {
			cr := PortRange{uint16(r.IntN(65536)), uint16(r.IntN(65536))}
			if r.IntN(2) == 0 {
				cr = PortRange{uint16(low + r.IntN(high-low+1)), uint16(low + r.IntN(high-low+1))}
			}
			cc = &connectConfig{}
			WithConnectRange(cr)(cc)
			if cr != (PortRange{}) {
				if int(cr.Low) >= effLow && int(cr.Low) <= effHigh {
					effLow = int(cr.Low)
				}
				if int(cr.High) >= effLow && int(cr.High) <= effHigh {
					effHigh = int(cr.High)
				}
			}
		}
		size := effHigh - effLow + 1

		u := newUsedPorts()
		dst := netip.AddrPortFrom(netip.MustParseAddr("203.0.113.9"), uint16(r.IntN(65536)))
		for {
			calls := u.calls
			p, ok := u.pick(t, a, local, dst, cc)
			require.LessOrEqual(t, u.calls-calls, size)
			for q := range u.seen {
				if a.Reserved(q) || held[q] || int(q) < effLow || int(q) > effHigh {
					t.Fatalf("%v %v %v: tried port %d: reserved %v, held %v, effective range %d-%d",
						pr, pol, cc, q, a.Reserved(q), held[q], effLow, effHigh)
				}
			}
			if !ok {
				break
			}
			require.Equal(t, 1, u.seen[p])
		}
		var missing []int
		for p := effLow; p <= effHigh; p++ {
			if !u.used[uint16(p)] && !a.Reserved(uint16(p)) && !held[uint16(p)] {
				missing = append(missing, p)
			}
		}
		require.Empty(t, missing, "%v %v %v %v", pr, pol, cc, held)
		return true
	}
	require.NoError(t, quick.Check(prop, &quick.Config{MaxCount: 300}))
}

// TestSelectPortConcurrent runs eight goroutines picking ports for one
// destination until exhaustion.
func TestSelectPortConcurrent(t *testing.T) {
	for _, pol := range []Policy{OddEven, Flat} {
		a := newTestAllocator(t, WithPortRange(PortRange{20000, 21999}), WithPolicy(pol),
			WithReservedPortsText("20000-20009,21999,30000"))
		var mu sync.Mutex
		used := map[uint16]int{}
		try := func(p uint16) bool {
			mu.Lock()
			defer mu.Unlock()
			if used[p] > 0 {
				return false
			}
			used[p]++
			return true
		}
		picked := make([][]uint16, 8)
		var wg sync.WaitGroup
		for g := range picked {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					p, ok := a.selectPort(paLocal, paDstA, nil, try)
					if !ok {
						return
					}
					picked[g] = append(picked[g], p)
				}
			}()
		}
		wg.Wait()
		all := slices.Concat(picked...)
		slices.Sort(all)
		require.Len(t, all, 2000-11, pol)
		require.Equal(t, len(all), len(slices.Compact(all)), pol)
		for _, p := range all {
			require.False(t, a.Reserved(p))
			require.Equal(t, 1, used[p])
		}
	}
}

// TestPortAllocatorBindConcurrent races Bind, release, BindEphemeral and
// selectPort: no port is ever held twice for one address, and all holds end
// released.
func TestPortAllocatorBindConcurrent(t *testing.T) {
	a := newTestAllocator(t, WithPortRange(PortRange{20000, 20199}))
	var wg sync.WaitGroup
	var mu sync.Mutex
	holds := map[uint16]int{}
	var doubles, badErrs, binds, outside atomic.Int64
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				port := uint16(20000 + (g*37+i)%200)
				rel, err := a.Bind(netip.AddrPortFrom(paLocal, port))
				if err != nil {
					if !errors.Is(err, ErrPortInUse) {
						badErrs.Add(1)
					}
					continue
				}
				binds.Add(1)
				mu.Lock()
				if holds[port]++; holds[port] != 1 {
					doubles.Add(1)
				}
				mu.Unlock()
				mu.Lock()
				holds[port]--
				mu.Unlock()
				rel()
			}
		}()
	}
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 300 {
				a.selectPort(paLocal, paDstA, nil, func(uint16) bool { return false })
				p, rel, err := a.BindEphemeral(paLocal2)
				if err != nil {
					badErrs.Add(1)
					continue
				}
				if p < 20000 || p > 20199 {
					outside.Add(1)
				}
				rel()
			}
		}()
	}
	wg.Wait()
	require.Zero(t, doubles.Load())
	require.Zero(t, badErrs.Load())
	require.Zero(t, outside.Load())
	require.Positive(t, binds.Load())
	require.Zero(t, a.nheld.Load())
	require.Empty(t, a.held)
	require.Empty(t, a.byPort)
}

// heldByAnyReference reports whether Bind or a table's socket holds port
// for some address, read from the holds themselves: the ports a Connect
// skips whatever its local address.
func (a *PortAllocator) heldByAnyReference(port uint16) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for k := range a.held {
		if k.port == port {
			return true
		}
	}
	return false
}

// selectPortReference is the candidate scan of __inet_hash_connect written
// as one plain loop, port by port, as RFC 6056 algorithm 4 states it, from
// the start that startScan computes, then, in a range of odd size under
// step 2, the one port that loop never reaches, found by looking for it:
// the reference that portScan's runs are checked against.
func (a *PortAllocator) selectPortReference(local netip.Addr, remote netip.AddrPort, cc *connectConfig, try func(port uint16) bool) (uint16, bool) {
	s := a.startScan(local, remote, cc)
	low, high, step, remaining, offset := s.low, s.high, s.step, s.remaining, s.offset
	visited := map[uint32]bool{}
	for {
		port := low + offset
		for i := uint32(0); i < remaining; i, port = i+step, port+step {
			if port >= high {
				port -= remaining
			}
			visited[port] = true
			p := uint16(port)
			if a.Reserved(p) || a.heldByAnyReference(p) {
				continue
			}
			if !try(p) {
				continue
			}
			if r := a.random8(s.index, s.perturb) * step; r > i {
				i = r
			}
			atomic.AddUint32(s.slot, i+step)
			return p, true
		}
		if step != 2 {
			break
		}
		offset++
		if offset&1 == 0 || remaining <= 1 {
			break
		}
	}
	if step != 2 || remaining <= 1 || (high-low)%2 == 0 {
		return 0, false
	}
	// The port of low's parity that the first pass left out.
	for p := low; p < high; p += 2 {
		if visited[p] {
			continue
		}
		if a.Reserved(uint16(p)) || a.heldByAnyReference(uint16(p)) || !try(uint16(p)) {
			return 0, false
		}
		i := remaining - 1
		if r := a.random8(s.index, s.perturb) * step; r > i {
			i = r
		}
		atomic.AddUint32(s.slot, i+step)
		return uint16(p), true
	}
	return 0, false
}

// TestPortScanMatchesReference checks that selectPort, which walks a
// portScan run by run, tries the same ports in the same order as the
// port-by-port reference, picks the same port and advances the perturb slot
// by the same amount: over random ranges of both parities, reserved and
// held ports, per-call ranges, policies and ports in use.
func TestPortScanMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(42, 0))
	for iter := range 500 {
		low := 1 + r.IntN(65535)
		if r.IntN(4) == 0 {
			low = 65535 - r.IntN(200)
		}
		high := min(65535, low+r.IntN([]int{8, 40, 400}[r.IntN(3)]))
		var reserved []uint16
		for range r.IntN(3) * r.IntN(30) {
			reserved = append(reserved, uint16(max(1, min(65535, low-3+r.IntN(high-low+7)))))
		}
		newAlloc := func() *PortAllocator {
			a, err := NewPortAllocator(WithPortRange(PortRange{uint16(low), uint16(high)}),
				WithReservedPorts(reserved...), WithPolicy(Policy(iter%2)),
				WithPortSecret(uint64(iter), 7), WithPerturbSeed(uint64(iter)))
			require.NoError(t, err)
			return a
		}
		a, ref := newAlloc(), newAlloc()
		for range r.IntN(3) * r.IntN(10) {
			p := uint16(max(1, min(65535, low+r.IntN(high-low+1))))
			_, err1 := a.Bind(netip.AddrPortFrom(paLocal, p))
			_, err2 := ref.Bind(netip.AddrPortFrom(paLocal, p))
			require.Equal(t, err1 == nil, err2 == nil)
		}
		var cc *connectConfig
		if r.IntN(3) == 0 {
			cc = &connectConfig{}
			WithConnectRange(PortRange{uint16(low + r.IntN(high-low+1)), uint16(low + r.IntN(high-low+1))})(cc)
		}
		inUse := map[uint16]bool{}
		for range r.IntN(high - low + 2) {
			inUse[uint16(low+r.IntN(high-low+1))] = true
		}
		for pick := range 5 {
			var got, want []uint16
			p1, ok1 := a.selectPort(paLocal, paDstA, cc, func(p uint16) bool {
				got = append(got, p)
				return !inUse[p]
			})
			p2, ok2 := ref.selectPortReference(paLocal, paDstA, cc, func(p uint16) bool {
				want = append(want, p)
				return !inUse[p]
			})
			require.Equal(t, want, got, "iteration %d, pick %d: ports tried", iter, pick)
			require.Equal(t, ok2, ok1)
			require.Equal(t, p2, p1)
			slot := a.portOffset(paLocal, paDstA) & (perturbSize - 1)
			require.Equal(t, ref.perturb[slot], a.perturb[slot], "iteration %d, pick %d: perturb slot", iter, pick)
			if ok1 {
				inUse[p1] = true
			}
		}
	}
}
