//go:build linux && amd64

package hash4

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// The kernel is the oracle for TCPTimeWaitReuse: real TCP connections are
// ended by the client first, which leaves the client's 4-tuple in
// TIME_WAIT, and a second client then asks connect() for the same tuple
// before and after the reuse delay. The kernel's answer (connected, or
// EADDRNOTAVAIL) must be what the policy predicts, under each setting of
// the sysctls net.ipv4.tcp_tw_reuse, tcp_tw_reuse_delay and tcp_timestamps.
//
// The sysctls are per network namespace: the test makes a namespace of its
// own, on a thread that it locks and never unlocks, so that the thread, the
// only one in the namespace, ends with it, and sets them there; the host's
// values are checked unchanged at the end.
//
// Two ways to a source port are checked. connect() of an unbound socket
// picks an ephemeral port (here the one port its IP_LOCAL_PORT_RANGE
// allows): the kernel's __inet_hash_connect may take a TIME_WAIT socket
// over (tcp_twsk_unique, given where to hand the old socket back) only if
// the old connection used TCP timestamps, its TIME_WAIT is older than
// tcp_tw_reuse_delay, and tcp_tw_reuse is 1, or 2 with a loopback address
// at either end; TCPTimeWaitReuse is that rule. bind() of the port (with
// SO_REUSEADDR on both sockets) and then connect() makes the kernel check
// the tuple without such a place (tcp_twsk_unique called from
// __inet_check_established with none): it takes the TIME_WAIT socket over
// whenever the old connection used timestamps, whatever tcp_tw_reuse and
// the delay say; TCPTimeWaitReuse is stricter there, never looser.

// Probe times, against a delay of twDelay: well before and well after it,
// so that scheduling noise cannot move a probe across it.
const (
	twDelay  = 300 * time.Millisecond
	twBefore = 50 * time.Millisecond
	twAfter  = 600 * time.Millisecond
)

// twAddr is the non-loopback address the test gives lo in its namespace.
var twAddr = netip.MustParseAddr("10.200.0.1")

// twGroup is one setting of the sysctls and the cases checked under it.
type twGroup struct {
	reuse, timestamps int // net.ipv4.tcp_tw_reuse and tcp_timestamps
	cases             []*twCase
}

// twCase is a first connection whose client ends in TIME_WAIT, then the
// probes of its tuple.
type twCase struct {
	addr        netip.Addr // of the client and the listener
	bound       bool       // bind() then connect(); else connect() with a one-port IP_LOCAL_PORT_RANGE
	port, lport uint16     // the client's port and the listener's
	skip        string     // why the case could not run, if it could not
	ln          int        // the listener
	tup         Tuple      // the client's tuple
	since       time.Time  // when the client entered TIME_WAIT
	timestamps  bool       // the first connection used TCP timestamps
	taken       bool       // a probe connected: the TIME_WAIT socket is gone
	log         []string
}

func (c *twCase) String() string {
	how := "connect() picks"
	if c.bound {
		how = "bind()+connect()"
	}
	return fmt.Sprintf("%s %v -> %v", how, c.tup.Local, c.tup.Remote)
}

func TestKernelTimeWaitReuse(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the test makes a network namespace of its own (unshare CLONE_NEWNET) to set TCP sysctls in")
	}
	sysctls := []string{"tcp_tw_reuse", "tcp_tw_reuse_delay", "tcp_timestamps"}
	host := readSysctls(sysctls)
	ns := newTestNetns(t)
	var in map[string]string
	ns.do(func() { in = readSysctls(sysctls) })
	t.Logf("sysctls on the host %v, in the test's namespace at start %v", host, in)
	if in["tcp_tw_reuse"] == "" {
		t.Skip("no net.ipv4.tcp_tw_reuse in a new network namespace on this kernel")
	}
	hasDelay := in["tcp_tw_reuse_delay"] != ""

	lo := netip.MustParseAddr("127.0.0.1")
	groups := []*twGroup{
		{reuse: 0, timestamps: 1, cases: []*twCase{{addr: lo}, {addr: twAddr}, {addr: lo, bound: true}, {addr: twAddr, bound: true}}},
		{reuse: 1, timestamps: 1, cases: []*twCase{{addr: lo}, {addr: twAddr}}},
		{reuse: 2, timestamps: 1, cases: []*twCase{{addr: lo}, {addr: twAddr}}},
		{reuse: 1, timestamps: 0, cases: []*twCase{{addr: lo}, {addr: lo, bound: true}}},
	}
	for gi, g := range groups {
		for ci, c := range g.cases {
			// N.B. the client's port in the namespace's ephemeral range
			// (32768-60999), where IP_LOCAL_PORT_RANGE narrows it; the
			// listener's below it, where nothing autobinds.
			c.port, c.lport = uint16(40000+10*gi+ci), uint16(9000+10*gi+ci)
		}
		name := fmt.Sprintf("tw_reuse=%d,timestamps=%d", g.reuse, g.timestamps)
		t.Run(name, func(t *testing.T) {
			if !hasDelay && g.reuse != 0 && g.timestamps != 0 {
				t.Skip("this kernel has no net.ipv4.tcp_tw_reuse_delay: its delay is fixed, about a second counted in whole seconds, which this test's timing does not model")
			}
			runTWGroup(t, ns, g, hasDelay)
		})
	}

	if after := readSysctls(sysctls); fmt.Sprint(after) != fmt.Sprint(host) {
		t.Errorf("the host's sysctls changed: %v, were %v", after, host)
	}
}

// runTWGroup sets g's sysctls in ns, makes the first connection of each of
// g's cases and probes their tuples at twBefore and twAfter.
func runTWGroup(t *testing.T, ns *testNetns, g *twGroup, hasDelay bool) {
	set := map[string]string{"tcp_tw_reuse": fmt.Sprint(g.reuse), "tcp_timestamps": fmt.Sprint(g.timestamps)}
	if hasDelay {
		set["tcp_tw_reuse_delay"] = fmt.Sprint(twDelay.Milliseconds())
	}
	for name, v := range set {
		var got string
		var err error
		ns.do(func() {
			if err = os.WriteFile("/proc/sys/net/ipv4/"+name, []byte(v), 0); err == nil {
				got = readSysctls([]string{name})[name]
			}
		})
		if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.EROFS) || errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM) {
			t.Skipf("cannot set net.ipv4.%s in the test's namespace here: %v", name, err)
		}
		if err != nil || got != v {
			t.Fatalf("setting net.ipv4.%s to %s in the namespace: %v, read back %q", name, v, err, got)
		}
	}
	// The policy of this setting for connect() with an ephemeral port, and
	// the conservative one for bind()+connect(), which takes the tuple over
	// after the delay on any address.
	var policy ReusePolicy
	policyName := "no policy"
	if g.reuse != 0 {
		policy = TCPTimeWaitReuse(g.reuse == 2, twDelay)
		policyName = fmt.Sprintf("TCPTimeWaitReuse(%v, %v)", g.reuse == 2, twDelay)
	}
	boundPolicy := TCPTimeWaitReuse(false, twDelay)
	boundName := fmt.Sprintf("TCPTimeWaitReuse(false, %v)", twDelay)
	defer func() {
		for _, c := range g.cases {
			if c.ln > 0 {
				syscall.Close(c.ln)
			}
		}
	}()
	run := 0
	for _, c := range g.cases {
		if err := ns.firstConnection(c); err != nil {
			t.Fatalf("%v: %v", c, err)
		}
		if c.skip != "" {
			t.Logf("%v: skipped: %s", c, c.skip)
			continue
		}
		run++
		if c.timestamps != (g.timestamps != 0) {
			t.Errorf("%v: TCP timestamps used %v with tcp_timestamps=%d in the namespace", c, c.timestamps, g.timestamps)
		}
	}
	if run == 0 {
		t.Skip("no case could run here; see the log")
	}
	for _, at := range []time.Duration{twBefore, twAfter} {
		for _, c := range g.cases {
			if c.skip != "" {
				continue
			}
			if c.taken {
				c.log = append(c.log, fmt.Sprintf("at %v: not asked, a probe took the TIME_WAIT socket over", at))
				continue
			}
			allow, name := policy, policyName
			if c.bound {
				allow, name = boundPolicy, boundName
			}
			time.Sleep(time.Until(c.since.Add(at)))
			before := allow != nil && allow(c.tup, c.since)
			ok, err := ns.probe(c)
			after := allow != nil && allow(c.tup, c.since)
			elapsed := time.Since(c.since).Round(time.Millisecond)
			if err != nil {
				t.Fatalf("%v: probe at %v: %v", c, elapsed, err)
			}
			c.taken = ok
			answer := "EADDRNOTAVAIL"
			if ok {
				answer = "connected"
			}
			if before != after {
				t.Errorf("%v: the probe at %v straddled the delay %v: no answer to compare", c, elapsed, twDelay)
				continue
			}
			// What the kernel does: bind()+connect() takes over whenever
			// the old connection used timestamps; connect() with an
			// ephemeral port as the policy says, timestamps given.
			want := c.timestamps && (c.bound || before)
			note := ""
			switch {
			case !c.timestamps && before:
				note = ", but the kernel needs timestamps: mark only flows that used them"
			case ok && !before:
				note = ", stricter than the kernel here"
			}
			c.log = append(c.log, fmt.Sprintf("at %v: %s (%s: %v%s)", elapsed, answer, name, before, note))
			if ok != want {
				t.Errorf("%v, timestamps used %v: at %v the kernel says %s, want %s", c, c.timestamps, elapsed, answer, map[bool]string{false: "EADDRNOTAVAIL", true: "connected"}[want])
			}
		}
	}
	for _, c := range g.cases {
		if c.skip == "" {
			t.Logf("%v, timestamps used %v: %s", c, c.timestamps, strings.Join(c.log, "; "))
		}
	}
}

// testNetns runs functions on a thread in a network namespace of its own.
type testNetns struct {
	calls chan func()
}

// newTestNetns makes a network namespace with lo up, holding 127.0.0.1 and
// twAddr. It ends with the test.
func newTestNetns(t *testing.T) *testNetns {
	ns := &testNetns{calls: make(chan func())}
	ready := make(chan error)
	go func() {
		if err := unshareNetns(); err != nil {
			ready <- err
			return
		}
		ready <- nil
		for f := range ns.calls {
			f()
		}
	}()
	if err := <-ready; errors.Is(err, syscall.EPERM) {
		t.Skipf("no network namespace of its own here: %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { close(ns.calls) })
	return ns
}

// inOwnNetns moves the test's goroutine, for the rest of the test, onto a
// thread in a network namespace of its own with lo up, where only the
// test's sockets hold ports: in the host's, another process's connection
// may share the port connect() gave the test (a connected port is shared
// by sockets to different remotes) and the kernel refuses a bind() the
// test's table allows. Without the privilege it stays where it is.
func inOwnNetns(t *testing.T) {
	t.Helper()
	if err := unshareNetns(); errors.Is(err, syscall.EPERM) {
		t.Logf("in the host's network namespace, where another process's socket may share a port: %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
}

// unshareNetns locks the calling goroutine to its thread, never to be
// unlocked (the thread exits with the goroutine, and no other goroutine
// runs in the namespace), and moves the thread to a new network namespace
// with lo up.
func unshareNetns() error {
	runtime.LockOSThread()
	if err := syscall.Unshare(syscall.CLONE_NEWNET); err != nil {
		return fmt.Errorf("unshare(CLONE_NEWNET): %w", err)
	}
	return setUpLoopback()
}

// do runs f on the namespace's thread.
func (ns *testNetns) do(f func()) {
	done := make(chan struct{})
	ns.calls <- func() {
		defer close(done)
		f()
	}
	<-done
}

// socket opens a TCP socket in the namespace, of a's family, that times
// out reads after 5 seconds.
func (ns *testNetns) socket(a netip.Addr) (int, error) {
	fam := syscall.AF_INET
	if a.Is6() {
		fam = syscall.AF_INET6
	}
	var fd int
	var err error
	ns.do(func() { fd, err = syscall.Socket(fam, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0) })
	if err != nil {
		return -1, err
	}
	tv := syscall.Timeval{Sec: 5}
	if err := syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv); err != nil {
		syscall.Close(fd)
		return -1, err
	}
	return fd, nil
}

// client opens c's client socket: bound to c's port with SO_REUSEADDR, or
// with c's port the only one of its IP_LOCAL_PORT_RANGE. It sets c.skip if
// the kernel lacks that option.
func (ns *testNetns) client(c *twCase) (int, error) {
	fd, err := ns.socket(c.addr)
	if err != nil {
		return -1, err
	}
	if c.bound {
		err = syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
		if err == nil {
			err = syscall.Bind(fd, sockaddrOf(netip.AddrPortFrom(c.addr, c.port), c.addr.Is6()))
		}
	} else {
		err = syscall.SetsockoptInt(fd, syscall.IPPROTO_IP, ipLocalPortRange, int(c.port)<<16|int(c.port))
		if errors.Is(err, syscall.ENOPROTOOPT) {
			c.skip = "no socket option IP_LOCAL_PORT_RANGE (Linux 6.3 and later) to give connect() one port"
		}
	}
	if err != nil {
		syscall.Close(fd)
		return -1, err
	}
	return fd, nil
}

// firstConnection opens c's listener and makes c's first connection: the
// client ends its data, the server closes on reading the end, and once the
// client reads the server's end its socket is in TIME_WAIT; then it closes.
func (ns *testNetns) firstConnection(c *twCase) error {
	ln, err := ns.socket(c.addr)
	if err != nil {
		return err
	}
	c.ln = ln
	server := netip.AddrPortFrom(c.addr, c.lport)
	if err := syscall.Bind(ln, sockaddrOf(server, c.addr.Is6())); err != nil {
		return fmt.Errorf("listener: %w", err)
	}
	if err := syscall.Listen(ln, 8); err != nil {
		return err
	}
	fd, err := ns.client(c)
	if c.skip != "" {
		return nil
	} else if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	defer syscall.Close(fd)
	if err := syscall.Connect(fd, sockaddrOf(server, c.addr.Is6())); err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		return err
	}
	c.tup = Tuple{Local: addrPortOf(sa), Remote: server}
	if c.tup.Local.Port() != c.port {
		return fmt.Errorf("connect() chose port %d, not %d", c.tup.Local.Port(), c.port)
	}
	var info syscall.TCPInfo
	size := uint32(unsafe.Sizeof(info))
	if _, _, e := syscall.Syscall6(syscall.SYS_GETSOCKOPT, uintptr(fd), syscall.IPPROTO_TCP, syscall.TCP_INFO,
		uintptr(unsafe.Pointer(&info)), uintptr(unsafe.Pointer(&size)), 0); e != 0 {
		return fmt.Errorf("TCP_INFO: %w", e)
	}
	c.timestamps = info.Options&1 != 0 // TCPI_OPT_TIMESTAMPS
	conn, _, err := syscall.Accept(ln)
	if err != nil {
		return fmt.Errorf("accept: %w", err)
	}
	if err := syscall.Shutdown(fd, syscall.SHUT_WR); err != nil {
		syscall.Close(conn)
		return err
	}
	var buf [16]byte
	n, err := syscall.Read(conn, buf[:])
	syscall.Close(conn)
	if n != 0 || err != nil {
		return fmt.Errorf("server: read %d bytes, %v; want the client's end", n, err)
	}
	if n, err := syscall.Read(fd, buf[:]); n != 0 || err != nil {
		return fmt.Errorf("client: read %d bytes, %v; want the server's end", n, err)
	}
	c.since = time.Now()
	return nil
}

// probe asks the kernel for c's tuple again, as c's first client got it,
// and reports whether it connected (and then closes with a reset, leaving
// no TIME_WAIT) or refused the tuple with EADDRNOTAVAIL.
func (ns *testNetns) probe(c *twCase) (bool, error) {
	fd, err := ns.client(c)
	if err != nil {
		return false, err
	}
	err = syscall.Connect(fd, sockaddrOf(c.tup.Remote, c.addr.Is6()))
	if errors.Is(err, syscall.EADDRNOTAVAIL) {
		syscall.Close(fd)
		return false, nil
	}
	defer closeRST(fd)
	if err != nil {
		return false, fmt.Errorf("connect: %w", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		return false, err
	}
	if got := addrPortOf(sa); got != c.tup.Local {
		return false, fmt.Errorf("connected from %v, not %v", got, c.tup.Local)
	}
	return true, nil
}

// setUpLoopback brings lo up and gives it twAddr as well (label lo:1), on
// the calling thread, in its network namespace.
func setUpLoopback() error {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	// ifreq: a name, then a union of 24 bytes (the flags, or an address).
	type ifreq struct {
		name [syscall.IFNAMSIZ]byte
		data [24]byte
	}
	var r ifreq
	copy(r.name[:], "lo")
	if err := ioctl(fd, syscall.SIOCGIFFLAGS, unsafe.Pointer(&r)); err != nil {
		return fmt.Errorf("SIOCGIFFLAGS lo: %w", err)
	}
	*(*uint16)(unsafe.Pointer(&r.data[0])) |= syscall.IFF_UP
	if err := ioctl(fd, syscall.SIOCSIFFLAGS, unsafe.Pointer(&r)); err != nil {
		return fmt.Errorf("SIOCSIFFLAGS lo: %w", err)
	}
	r = ifreq{}
	copy(r.name[:], "lo:1")
	sa := (*syscall.RawSockaddrInet4)(unsafe.Pointer(&r.data[0]))
	sa.Family = syscall.AF_INET
	sa.Addr = twAddr.As4()
	if err := ioctl(fd, syscall.SIOCSIFADDR, unsafe.Pointer(&r)); err != nil {
		return fmt.Errorf("SIOCSIFADDR lo:1 %v: %w", twAddr, err)
	}
	return nil
}

func ioctl(fd int, req uintptr, arg unsafe.Pointer) error {
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), req, uintptr(arg)); e != 0 {
		return e
	}
	return nil
}

// readSysctls returns the values of the net.ipv4 sysctls named, in the
// calling thread's network namespace; "" for one that is missing.
func readSysctls(names []string) map[string]string {
	m := map[string]string{}
	for _, name := range names {
		b, _ := os.ReadFile("/proc/sys/net/ipv4/" + name)
		m[name] = strings.TrimSpace(string(b))
	}
	return m
}
