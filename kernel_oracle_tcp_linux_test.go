//go:build linux && amd64

package hash4

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"syscall"
	"testing"
)

// The TCP half of the kernel oracle (see kernel_oracle_linux_test.go):
// seeded scenarios of real listeners on loopback (bind and listen with
// random SO_REUSEPORT, SO_REUSEADDR and IPV6_V6ONLY, and closes), mirrored
// in a TCPTable and in tcpModel, then connections from chosen sources; the
// listener whose accept queue got each one must be what Lookup returns for
// its SYN, and once accepted, its 4-tuple in the established table must win
// over every listener, as the kernel hands the connection's data to the
// accepted socket.
//
// Certainty without sleeps: on loopback the handshake completes within a
// non-blocking connect (the pinned CPU processes the SYN, the SYN-ACK and
// the ACK before connect returns), so a non-blocking accept on every
// listener afterwards is certain; each probe checks that the client is
// connected (or refused, by the RST) when connect returns and that exactly
// one listener accepts. Both ends close with SO_LINGER 0: no TIME_WAIT is
// left behind.

type tcpOracleStats struct {
	listens, listenAgree, syns, unique, tied, refused, est, estAgree int
}

func TestKernelOracleTCP(t *testing.T) {
	var st tcpOracleStats
	forOracleSeeds(t, func(seed uint64, cpu int) { runOracleTCP(t, seed, cpu, &st) })
	t.Logf("TCP: listens %d/%d agree, SYNs %d (unique answer %d, reuseport tie %d, refused %d), established %d/%d agree",
		st.listenAgree, st.listens, st.syns, st.unique, st.tied, st.refused, st.estAgree, st.est)
}

// closeRST closes fd with SO_LINGER 0.
func closeRST(fd int) {
	syscall.SetsockoptLinger(fd, syscall.SOL_SOCKET, syscall.SO_LINGER, &syscall.Linger{Onoff: 1})
	syscall.Close(fd)
}

func runOracleTCP(t *testing.T, seed uint64, cpu int, st *tcpOracleStats) {
	rng := rand.New(rand.NewPCG(seed, 0x7c9))
	port := freePorts(t, cpu, 1, syscall.SOCK_STREAM)[0]
	tbl := NewTCPTable[int]()
	ref := &tcpModel{est: map[Tuple]*int{}}
	fds := map[*mListener]int{}
	defer func() {
		for _, fd := range fds {
			syscall.Close(fd)
		}
	}()
	sources := []netip.Addr{netip.MustParseAddr("127.0.0.8"), netip.MustParseAddr("127.0.0.9"), netip.IPv6Loopback()}
	name := 0
	trace := func(step int, format string, args ...any) {
		if *kernelTrace {
			t.Logf("seed %d step %d: "+format, append([]any{seed, step}, args...)...)
		}
	}
	closeListener := func(l *mListener) {
		syscall.Close(fds[l])
		delete(fds, l)
		l.release()
		ref.close(l)
	}
	for step := range 30 {
		switch op := rng.IntN(10); {
		case op < 5 || len(ref.ls) == 0:
			if len(ref.ls) > 7 {
				closeListener(ref.ls[rng.IntN(len(ref.ls))])
				continue
			}
			a, v6only, rp, ra := randomBind(rng)
			fd := oracleSocket(t, a, cpu, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK)
			opts := setBindOptions(t, fd, a, v6only, rp, ra)
			local := netip.AddrPortFrom(a, port)
			kerr := syscall.Bind(fd, sockaddrOf(local, a.Is6()))
			if kerr == nil {
				kerr = syscall.Listen(fd, 128)
			}
			if kerr != nil && !errors.Is(kerr, syscall.EADDRINUSE) {
				t.Fatalf("seed %d: bind and listen %v: %v", seed, local, kerr)
			}
			name++
			v := name
			rel, err := tbl.Listen(local, &v, opts...)
			ml := ref.listen(local, v6only, rp)
			st.listens++
			trace(step, "listen %d %v v6only %v rp %v ra %v: %v", v, local, v6only, rp, ra, kerr)
			if (kerr == nil) == (err == nil) && (ml != nil) == (err == nil) {
				st.listenAgree++
			} else {
				t.Errorf("seed %d step %d: listen %v (v6only %v, reuseport %v, reuseaddr %v): kernel %v, table %v, model ok %v%s", seed, step, local, v6only, rp, ra, kerr, err, ml != nil, describeListeners(ref))
			}
			if kerr != nil || err != nil || ml == nil {
				syscall.Close(fd)
				if err == nil {
					rel()
				}
				if ml != nil {
					ref.close(ml)
				}
				continue
			}
			ml.val, ml.release = &v, rel
			fds[ml] = fd
		case op < 7:
			l := ref.ls[rng.IntN(len(ref.ls))]
			trace(step, "close %d", *l.val)
			closeListener(l)
		}
		for range 4 {
			src := sources[rng.IntN(len(sources))]
			dst := netip.AddrPortFrom(netip.IPv6Loopback(), port)
			if src.Is4() {
				dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, byte(1 + rng.IntN(3))}), port)
			}
			probeTCP(t, seed, step, tbl, ref, fds, src, dst, rng.IntN(2) == 0, cpu, st)
		}
	}
}

// probeTCP connects from src to dst and checks which listener took the
// connection against the table and the model; if est, it then checks the
// established flow.
func probeTCP(t *testing.T, seed uint64, step int, tbl *TCPTable[int], ref *tcpModel, fds map[*mListener]int, src netip.Addr, dst netip.AddrPort, est bool, cpu int, st *tcpOracleStats) {
	c := tcpClient(t, src, dst.Port(), cpu)
	defer closeRST(c)
	kerr := syscall.Connect(c, sockaddrOf(dst, src.Is6()))
	if kerr == nil || errors.Is(kerr, syscall.EINPROGRESS) {
		kerr = nil
		if e, err := syscall.GetsockoptInt(c, syscall.SOL_SOCKET, syscall.SO_ERROR); err != nil {
			t.Fatal(err)
		} else if e != 0 {
			kerr = syscall.Errno(e)
		} else if _, err := syscall.Getpeername(c); err != nil {
			t.Fatalf("seed %d: connect %v: not connected when connect returned: %v", seed, dst, err)
		}
	}
	if kerr != nil && !errors.Is(kerr, syscall.ECONNREFUSED) {
		t.Fatalf("seed %d: connect %v: %v", seed, dst, kerr)
	}
	sa, err := syscall.Getsockname(c)
	if err != nil {
		t.Fatal(err)
	}
	syn := Tuple{Local: dst, Remote: addrPortOf(sa)}
	var kern *mListener
	child := -1
	for l, fd := range fds {
		nfd, _, err := syscall.Accept4(fd, syscall.SOCK_CLOEXEC)
		if err != nil {
			continue
		}
		if child >= 0 {
			t.Fatalf("seed %d: %v accepted twice", seed, syn)
		}
		kern, child = l, nfd
	}
	if child >= 0 {
		defer closeRST(child)
	}
	if (kerr == nil) != (kern != nil) {
		t.Fatalf("seed %d: %v: connect %v, but accepted by %v: the handshake did not complete within connect", seed, syn, kerr, kern != nil)
	}
	st.syns++
	want := ref.lookup(syn, nil)
	tv, tok := tbl.Lookup(syn)
	describe := func() string { return describeListeners(ref) }
	switch {
	case (kern == nil) != (len(want) == 0) || (kern != nil && !slices.Contains(want, kern)):
		t.Errorf("seed %d step %d: SYN %v: kernel %v, model %v%s", seed, step, syn, lname(kern), valNames(want, func(l *mListener) *int { return l.val }), describe())
	case tok != (len(want) > 0) || (tok && !slices.ContainsFunc(want, func(l *mListener) bool { return l.val == tv })):
		t.Errorf("seed %d step %d: SYN %v: table %v, model %v%s", seed, step, syn, tv, valNames(want, func(l *mListener) *int { return l.val }), describe())
	case kern == nil:
		st.refused++
	case len(want) > 1:
		st.tied++
	default:
		st.unique++
	}
	if kern == nil || !est {
		return
	}
	// The flow's data reaches the accepted socket, not a listener, and the
	// table's established entry wins too.
	st.est++
	flow := new(int)
	if err := tbl.Established().Insert(syn, flow); err != nil {
		t.Fatal(err)
	}
	defer tbl.Established().Delete(syn)
	if _, err := syscall.Write(c, []byte("x")); err != nil {
		t.Fatal(err)
	}
	var buf [4]byte
	_, _, rerr := syscall.Recvfrom(child, buf[:], syscall.MSG_DONTWAIT)
	others := 0
	for _, fd := range fds {
		if nfd, _, err := syscall.Accept4(fd, syscall.SOCK_CLOEXEC); err == nil {
			closeRST(nfd)
			others++
		}
	}
	v, ok := tbl.Lookup(syn)
	if rerr == nil && others == 0 && ok && v == flow {
		st.estAgree++
	} else {
		t.Errorf("seed %d step %d: established %v: kernel read %v and %d new connections, table %v, %v (want the flow)", seed, step, syn, rerr, others, v, ok)
	}
}

// tcpClient opens a TCP socket bound to src and a port other than not: a
// connect from port not to itself would open a connection to itself.
func tcpClient(t *testing.T, src netip.Addr, not uint16, cpu int) int {
	for {
		c := oracleSocket(t, src, cpu, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK)
		if err := syscall.Bind(c, sockaddrOf(netip.AddrPortFrom(src, 0), src.Is6())); err != nil {
			t.Fatal(err)
		}
		sa, err := syscall.Getsockname(c)
		if err != nil {
			t.Fatal(err)
		}
		if addrPortOf(sa).Port() != not {
			return c
		}
		syscall.Close(c)
	}
}

func lname(l *mListener) string {
	if l == nil {
		return "none"
	}
	return fmt.Sprint(*l.val)
}

func describeListeners(ref *tcpModel) string {
	s := ""
	for _, l := range ref.ls {
		if l.val == nil {
			continue
		}
		s += fmt.Sprintf("\n  %d: %v:%d v6 %v v6only %v rp %v", *l.val, l.addr, l.port, l.v6, l.v6only, l.reusePort)
	}
	return s
}
