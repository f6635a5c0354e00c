//go:build linux && amd64

package hash4

// The kernel oracle runs on amd64 only, natively: the kernel answers alike
// on every architecture, and under the emulator CI uses for the others it
// would only be slower (and 386 reaches connect() through socketcall).

import (
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// The kernel this test runs on is the oracle: seeded random scenarios of
// real UDP sockets on loopback (127.0.0.0/8 and ::1 only), each bind,
// connect, disconnect and close mirrored in a UDPTable and in udpModel,
// then datagrams from chosen sources; the socket that received each one
// must be what Lookup returns.
//
// Certainty without sleeps: the kernel delivers a loopback datagram within
// sendto (the backlog of the sending CPU is processed before sendto
// returns), so a non-blocking recvfrom on every socket afterwards is
// certain. Each probe checks this: a marker sent to a control socket right
// after it must already be queued.
//
// The CPU never decides: the test's thread is pinned to one CPU and every
// socket's SO_INCOMING_CPU set to it, so compute_score's CPU bonus and the
// reuseport CPU preference are the same for all.

var (
	kernelSeeds = flag.Int("kernel.seeds", 1000, "random kernel-oracle scenarios to run, UDP and TCP each")
	kernelTrace = flag.Bool("kernel.trace", false, "log every operation of the kernel-oracle scenarios")
)

// Socket options missing from package syscall.
const (
	soIncomingCPU = 49
	soReusePort   = 15 // SO_REUSEPORT
)

// oracleAddrs are the local addresses scenarios bind. 127.0.0.6 is left
// out: the kernel gives IPv6 sockets that IPv4 address (LOOPBACK4_IPV6),
// and a datagram to it may reach an IPv6 socket on ::1 whose hash2 slot it
// shares.
var oracleAddrs = []string{"127.0.0.1", "127.0.0.2", "127.0.0.3", "0.0.0.0", "::", "::1", "::ffff:127.0.0.2", "::ffff:0.0.0.0"}

type oracleStats struct {
	binds, bindAgree, connects, connectAgree, probes, unique, tied, skipped int
}

// pinOracleCPU pins the test's thread to one CPU and returns it. The thread
// ends with the test: its affinity stays pinned.
func pinOracleCPU(t *testing.T) int {
	runtime.LockOSThread()
	var set [16]uint64
	if _, _, e := syscall.RawSyscall(syscall.SYS_SCHED_GETAFFINITY, 0, unsafe.Sizeof(set), uintptr(unsafe.Pointer(&set))); e != 0 {
		t.Fatalf("sched_getaffinity: %v", e)
	}
	cpu := 0
	for set[cpu/64]&(1<<(cpu%64)) == 0 {
		cpu++
	}
	var one [16]uint64
	one[cpu/64] = 1 << (cpu % 64)
	if _, _, e := syscall.RawSyscall(syscall.SYS_SCHED_SETAFFINITY, 0, unsafe.Sizeof(one), uintptr(unsafe.Pointer(&one))); e != 0 {
		t.Fatalf("sched_setaffinity: %v", e)
	}
	return cpu
}

// forOracleSeeds pins the test's thread to a CPU and runs scenario for each
// seed: -kernel.seeds of them, or, under the race detector and unless the
// flag is given, a fifth as many. N.B. a scenario runs on one goroutine
// and makes tables of 2^16 slots, which the race detector's instrumented
// writes made ten times slower (73 s for UDP's 1000); the runs without it
// take every seed.
func forOracleSeeds(t *testing.T, scenario func(seed uint64, cpu int)) {
	cpu := pinOracleCPU(t)
	seeds := *kernelSeeds
	if raceEnabled {
		given := false
		flag.Visit(func(f *flag.Flag) { given = given || f.Name == "kernel.seeds" })
		if !given {
			seeds /= 5
		}
	}
	for seed := range seeds {
		scenario(uint64(seed), cpu)
	}
}

func TestKernelOracleUDP(t *testing.T) {
	var st oracleStats
	forOracleSeeds(t, func(seed uint64, cpu int) { runOracleUDP(t, seed, cpu, &st) })
	t.Logf("UDP: binds %d/%d agree, connects %d/%d agree, probes %d (unique answer %d, reuseport tie %d, sockets closed after the stale-peer quirk %d)",
		st.bindAgree, st.binds, st.connectAgree, st.connects, st.probes, st.unique, st.tied, st.skipped)
}

// oracleSock opens a UDP socket of the family of a, with SO_INCOMING_CPU.
func oracleSock(t *testing.T, a netip.Addr, cpu int) int {
	return oracleSocket(t, a, cpu, syscall.SOCK_DGRAM)
}

// oracleSocket opens a socket of type typ and of the family of a, with
// SO_INCOMING_CPU.
func oracleSocket(t *testing.T, a netip.Addr, cpu, typ int) int {
	fam := syscall.AF_INET
	if a.Is6() {
		fam = syscall.AF_INET6
	}
	fd, err := syscall.Socket(fam, typ|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, soIncomingCPU, cpu); err != nil {
		t.Fatal(err)
	}
	return fd
}

func sockaddrOf(ap netip.AddrPort, v6 bool) syscall.Sockaddr {
	if !v6 {
		return &syscall.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().Unmap().As4()}
	}
	return &syscall.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
}

func addrPortOf(sa syscall.Sockaddr) netip.AddrPort {
	switch sa := sa.(type) {
	case *syscall.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port))
	case *syscall.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), uint16(sa.Port))
	}
	return netip.AddrPort{}
}

// freePorts returns n distinct ports the kernel had free on every address for
// sockets of type typ: the sockets that found them stay bound until all are
// found. N.B. they are drawn from 10000-19999: below the kernel's
// ephemeral range (32768-60999 by default), where no socket of another
// process is autobound by connect() or bind(0) while a scenario runs, and
// below the ports the examples' tests bind (20000 and up), which go test
// may run at the same time: a port taken meanwhile would make the kernel
// refuse binds the scenario's model allows.
func freePorts(t *testing.T, cpu, n, typ int) []uint16 {
	var ports []uint16
	for tries := 0; len(ports) < n; tries++ {
		if tries == 1000 {
			t.Fatalf("no free port below the ephemeral range in %d tries", tries)
		}
		p := uint16(10000 + oraclePortRand.IntN(10000))
		if slices.Contains(ports, p) {
			continue
		}
		fd := oracleSocket(t, netip.IPv6Loopback(), cpu, typ)
		if err := syscall.Bind(fd, &syscall.SockaddrInet6{Port: int(p)}); err != nil {
			syscall.Close(fd)
			continue // in use
		}
		defer syscall.Close(fd)
		ports = append(ports, p)
	}
	return ports
}

// oraclePortRand draws the scenarios' ports; it is not seeded from the
// scenario, so that a port in use does not fail a seed every time.
var oraclePortRand = rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0x9047))

// oracleSlots is the hash2 slot count of the scenarios' tables. N.B. the
// model has no hash collisions, and the table, like the kernel, answers
// otherwise when the hash2 slot of a socket that a connect moved, or of
// two sockets on one 4-tuple, meets the packet's (with 16 slots, 32 seeds
// in 1000 disagree with the model): so many slots make that chance about
// one run in a hundred. The kernel's own collisions are its secret's.
const oracleSlots = 1 << 16

func runOracleUDP(t *testing.T, seed uint64, cpu int, st *oracleStats) {
	rng := rand.New(rand.NewPCG(seed, 0x0a4c1e))
	ports := freePorts(t, cpu, 3, syscall.SOCK_DGRAM)
	port, peerPort, ctlPort := ports[0], ports[1], ports[2]
	tbl := NewUDPTable[int](WithCapacity(oracleSlots))
	ref := &udpModel{}
	fds := map[*mSock]int{}
	defer func() {
		for _, fd := range fds {
			syscall.Close(fd)
		}
	}()
	// Senders on the peers' addresses, and the control socket.
	peers := []netip.AddrPort{
		netip.AddrPortFrom(netip.MustParseAddr("127.0.0.8"), peerPort),
		netip.AddrPortFrom(netip.MustParseAddr("127.0.0.9"), peerPort),
		netip.AddrPortFrom(netip.IPv6Loopback(), peerPort),
	}
	senders := make([]int, len(peers))
	for i, p := range peers {
		senders[i] = oracleSock(t, p.Addr(), cpu)
		defer syscall.Close(senders[i])
		if p.Addr().Is6() {
			if err := syscall.SetsockoptInt(senders[i], syscall.IPPROTO_IPV6, syscall.IPV6_V6ONLY, 1); err != nil {
				t.Fatal(err)
			}
		}
		if err := syscall.Bind(senders[i], sockaddrOf(p, p.Addr().Is6())); err != nil {
			t.Fatalf("sender %v: %v", p, err)
		}
	}
	ctl := oracleSock(t, netip.MustParseAddr("127.0.0.1"), cpu)
	defer syscall.Close(ctl)
	ctlAddr := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), ctlPort)
	if err := syscall.Bind(ctl, sockaddrOf(ctlAddr, false)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	name := 0
	trace := func(step int, format string, args ...any) {
		if *kernelTrace {
			t.Logf("seed %d step %d: "+format, append([]any{seed, step}, args...)...)
		}
	}
	for step := range 40 {
		switch op := rng.IntN(10); {
		case op < 4 || len(ref.socks) == 0 || len(ref.socks) > 7:
			if len(ref.socks) > 7 {
				s := ref.socks[rng.IntN(len(ref.socks))]
				syscall.Close(fds[s])
				delete(fds, s)
				if err := s.s.Close(); err != nil {
					t.Fatal(err)
				}
				ref.close(s)
				continue
			}
			a, v6only, rp, ra := randomBind(rng)
			fd := oracleSock(t, a, cpu)
			opts := setBindOptions(t, fd, a, v6only, rp, ra)
			local := netip.AddrPortFrom(a, port)
			kerr := syscall.Bind(fd, sockaddrOf(local, a.Is6()))
			if kerr != nil && !errors.Is(kerr, syscall.EADDRINUSE) {
				t.Fatalf("seed %d: bind %v: %v", seed, local, kerr)
			}
			name++
			v := name
			s, err := tbl.Bind(local, &v, opts...)
			ms := ref.bind(local, v6only, rp, ra)
			st.binds++
			if (kerr == nil) == (err == nil) && (ms != nil) == (err == nil) {
				st.bindAgree++
			} else {
				t.Errorf("seed %d step %d: bind %v (v6only %v, reuseport %v, reuseaddr %v): kernel %v, table %v, model ok %v%s", seed, step, local, v6only, rp, ra, kerr, err, ms != nil, describeModel(ref))
			}
			if kerr != nil || err != nil || ms == nil {
				syscall.Close(fd)
				if err == nil {
					s.Close()
				}
				if ms != nil {
					ref.close(ms)
				}
				continue
			}
			ms.s, ms.val = s, &v
			fds[ms] = fd
			trace(step, "bind %d %v v6only %v rp %v ra %v", v, local, v6only, rp, ra)
		case op < 7:
			s := ref.socks[rng.IntN(len(ref.socks))]
			peer := peers[rng.IntN(len(peers))]
			v6 := s.v6
			target := peer
			if v6 && peer.Addr().Is4() {
				target = netip.AddrPortFrom(netip.AddrFrom16(peer.Addr().As16()), peer.Port())
			} else if !v6 && peer.Addr().Is6() {
				continue // an AF_INET socket cannot be given an IPv6 address
			}
			if v6 && peer.Addr().Is4() && !s.wild() && !s.addr.Is4In6() {
				// Not modelled: the kernel refuses it (ENETUNREACH) but
				// accepts it from a socket connected to an IPv6 peer.
				continue
			}
			kerr := syscall.Connect(fds[s], sockaddrOf(target, v6))
			var src netip.Addr
			if kerr == nil {
				sa, err := syscall.Getsockname(fds[s])
				if err != nil {
					t.Fatal(err)
				}
				src = addrPortOf(sa).Addr()
			}
			wasWild := s.wild()
			var err error
			if wasWild && src.IsValid() {
				err = s.s.ConnectFrom(src, peer)
			} else {
				err = s.s.Connect(peer)
			}
			mok := ref.connect(s, src, peer)
			if wasWild && !src.IsValid() {
				mok = ref.connect(s, netip.Addr{}, peer)
			}
			st.connects++
			trace(step, "connect %d to %v: %v", *s.val, target, kerr)
			if (kerr == nil) == (err == nil) && mok == (err == nil) {
				st.connectAgree++
			} else {
				t.Errorf("seed %d step %d: connect %v to %v: kernel %v (source %v), table %v, model ok %v", seed, step, s.addr, target, kerr, src, err, mok)
			}
		case op < 8:
			s := ref.socks[rng.IntN(len(ref.socks))]
			// connect() with AF_UNSPEC, which package syscall cannot spell.
			var unspec syscall.RawSockaddrInet6
			if _, _, e := syscall.Syscall(syscall.SYS_CONNECT, uintptr(fds[s]), uintptr(unsafe.Pointer(&unspec)), unsafe.Sizeof(unspec)); e != 0 {
				t.Fatalf("disconnect: %v", e)
			}
			trace(step, "disconnect %d", *s.val)
			quirk := s.v6 && s.conn
			if err := s.s.Disconnect(); err != nil {
				t.Fatal(err)
			}
			ref.disconnect(s)
			if quirk {
				// Not modelled: __udp_disconnect leaves an IPv6
				// socket's peer address (sk_v6_daddr) set, and it
				// then scores and filters IPv6 packets on it, and
				// takes no IPv4 packet if it was IPv4-mapped. It
				// closes.
				st.skipped++
				syscall.Close(fds[s])
				delete(fds, s)
				if err := s.s.Close(); err != nil {
					t.Fatal(err)
				}
				ref.close(s)
			}
		default:
			s := ref.socks[rng.IntN(len(ref.socks))]
			trace(step, "close %d", *s.val)
			syscall.Close(fds[s])
			delete(fds, s)
			if err := s.s.Close(); err != nil {
				t.Fatal(err)
			}
			ref.close(s)
		}
		// Probes.
		for range 6 {
			pi := rng.IntN(len(peers))
			from := peers[pi]
			var dst netip.AddrPort
			if from.Addr().Is6() {
				dst = netip.AddrPortFrom(netip.IPv6Loopback(), port)
			} else {
				dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, byte(1 + rng.IntN(3))}), port)
			}
			if err := syscall.Sendto(senders[pi], []byte("probe"), 0, sockaddrOf(dst, from.Addr().Is6())); err != nil {
				t.Fatalf("sendto %v: %v", dst, err)
			}
			if err := syscall.Sendto(senders[0], []byte("mark"), 0, sockaddrOf(ctlAddr, false)); err != nil {
				t.Fatal(err)
			}
			if _, _, err := syscall.Recvfrom(ctl, buf, syscall.MSG_DONTWAIT); err != nil {
				t.Fatalf("the marker was not queued when sendto returned: %v", err)
			}
			var got []*mSock
			for s, fd := range fds {
				for {
					if _, _, err := syscall.Recvfrom(fd, buf, syscall.MSG_DONTWAIT); err != nil {
						break
					}
					got = append(got, s)
				}
			}
			st.probes++
			pkt := Tuple{Local: dst, Remote: from}
			want := ref.lookup(pkt, nil)
			tv, tok := tbl.Lookup(pkt)
			var kern *mSock
			if len(got) == 1 {
				kern = got[0]
			}
			describe := func() string { return describeModel(ref) }
			switch {
			case len(got) > 1:
				t.Fatalf("seed %d: %v delivered %d times", seed, pkt, len(got))
			case (kern == nil) != (len(want) == 0) || (kern != nil && !slices.Contains(want, kern)):
				t.Errorf("seed %d step %d: %v: kernel %v, model %v%s", seed, step, pkt, name4(kern), valNames(want, func(m *mSock) *int { return m.val }), describe())
			case tok != (len(want) > 0) || (tok && !slices.ContainsFunc(want, func(m *mSock) bool { return m.val == tv })):
				t.Errorf("seed %d step %d: %v: table %v, model %v%s", seed, step, pkt, tv, valNames(want, func(m *mSock) *int { return m.val }), describe())
			case len(want) > 1:
				st.tied++
			default:
				st.unique++
			}
		}
	}
}

// randomBind draws the address and options of a bind.
func randomBind(rng *rand.Rand) (a netip.Addr, v6only, rp, ra bool) {
	a = netip.MustParseAddr(oracleAddrs[rng.IntN(len(oracleAddrs))])
	v6only = a.Is6() && !a.Is4In6() && rng.IntN(3) == 0
	return a, v6only, rng.IntN(2) == 0, rng.IntN(3) == 0
}

// setBindOptions sets IPV6_V6ONLY (on an IPv6 socket, on or off),
// SO_REUSEPORT and SO_REUSEADDR on fd, and returns the same as BindOptions.
func setBindOptions(t *testing.T, fd int, a netip.Addr, v6only, rp, ra bool) []BindOption {
	var opts []BindOption
	set := func(level, opt int, on bool) {
		v := 0
		if on {
			v = 1
		}
		if err := syscall.SetsockoptInt(fd, level, opt, v); err != nil {
			t.Fatal(err)
		}
	}
	if a.Is6() {
		set(syscall.IPPROTO_IPV6, syscall.IPV6_V6ONLY, v6only)
	}
	if v6only {
		opts = append(opts, WithIPv6Only())
	}
	if rp {
		set(syscall.SOL_SOCKET, soReusePort, true)
		opts = append(opts, WithReusePort())
	}
	if ra {
		set(syscall.SOL_SOCKET, syscall.SO_REUSEADDR, true)
		opts = append(opts, WithReuseAddr())
	}
	return opts
}

func name4(m *mSock) string {
	if m == nil {
		return "none"
	}
	return fmt.Sprint(*m.val)
}

// valNames names sockets by their values.
func valNames[S any](ss []S, val func(S) *int) []string {
	var s []string
	for _, x := range ss {
		s = append(s, fmt.Sprint(*val(x)))
	}
	return s
}

func describeModel(ref *udpModel) string {
	s := ""
	for _, m := range ref.socks {
		if m.val == nil {
			continue
		}
		s += fmt.Sprintf("\n  %d: %v:%d v6 %v v6only %v rp %v ra %v conn %v %v", *m.val, m.addr, m.port, m.v6, m.v6only, m.reusePort, m.reuseAddr, m.conn, m.peer)
	}
	return s
}
