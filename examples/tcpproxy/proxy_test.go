package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hash4/hash4"
	"github.com/hash4/hash4/examples/internal/porttest"
)

var loopback = netip.MustParseAddr("127.0.0.1")

func testConfig(ports hash4.PortRange, upstreams ...netip.AddrPort) config {
	return config{source: loopback, upstreams: upstreams, ports: ports,
		timeWait: time.Minute, drain: 5 * time.Second, dialWait: 5 * time.Second}
}

// listen returns a loopback listener that the test closes at its end.
func listen(t *testing.T) *net.TCPListener {
	t.Helper()
	ln, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(netip.AddrPortFrom(loopback, 0)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

func addrOf(ln *net.TCPListener) netip.AddrPort { return ln.Addr().(*net.TCPAddr).AddrPort() }

// startProxy serves cfg on a loopback listener until the test ends, then
// waits for its connections.
func startProxy(t *testing.T, cfg config) (*proxy, string) {
	t.Helper()
	p, err := newProxy(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln := listen(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.serve(ln)
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		p.wait()
	})
	return p, ln.Addr().String()
}

// roundTrip sends msg through the proxy at addr, ends its data and returns
// what came back.
func roundTrip(t *testing.T, addr string, msg []byte) []byte {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	go func() {
		c.Write(msg)
		c.(*net.TCPConn).CloseWrite()
	}()
	got, _ := io.ReadAll(c)
	return got
}

// eventually fails the test unless cond holds within 5 seconds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The demo passes, and shows what its summary claims.
func TestDemo(t *testing.T) {
	var out bytes.Buffer
	cfg := testConfig(porttest.Ports(4))
	cfg.reuse = 500 * time.Millisecond
	res, err := runDemo(cfg, 64<<10, &out)
	t.Logf("summary:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	if !res.ok(4) || !strings.Contains(out.String(), "PASS") {
		t.Fatalf("demo failed: %+v", res)
	}
	skipWithoutTimestamps(t, out.String())
	if res.clients != 8 || res.livePorts != 4 || res.heldTuples != 8 || res.proxy.Forwarded != 9 {
		t.Errorf("clients %d over %d ports, %d held, %d forwarded; want 8, 4, 8, 9", res.clients, res.livePorts, res.heldTuples, res.proxy.Forwarded)
	}
	if !res.reuseWanted || !res.reused || res.proxy.Reused != 1 || res.proxy.TimeWait != 8 {
		t.Errorf("reuse wanted %v, done %v, 4-tuples taken over %d, held at the end %d; want true, true, 1, 8",
			res.reuseWanted, res.reused, res.proxy.Reused, res.proxy.TimeWait)
	}
	if want := int64(8*64<<10 + len("after the reuse delay")); res.proxy.BytesUp != want || res.proxy.BytesDown != want {
		t.Errorf("bytes up %d, down %d; want %d each", res.proxy.BytesUp, res.proxy.BytesDown, want)
	}
	if res.kernel == "" {
		t.Error("the demo did not ask the kernel about a held tuple")
	}
}

// The command runs the demo on IPv6 loopback: the same counts, with every
// address, 4-tuples included, on ::1.
func TestDemoIPv6(t *testing.T) {
	ln, err := net.ListenTCP("tcp6", net.TCPAddrFromAddrPort(netip.AddrPortFrom(netip.IPv6Loopback(), 0)))
	if err != nil {
		t.Skipf("no IPv6 loopback on this host: %v", err)
	}
	ln.Close()
	ports := porttest.Ports(4)
	var stdout, stderr bytes.Buffer
	code := realMain(context.Background(), []string{"-demo", "-source", "::1", "-size", "4096", "-tw-reuse-delay", "500ms",
		"-ports", fmt.Sprintf("%d-%d", ports.Low, ports.High)}, &stdout, &stderr)
	t.Logf("stdout:\n%s", stdout.String())
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr.String())
	}
	skipWithoutTimestamps(t, stdout.String())
	for _, want := range []string{"PASS", "proxy [::1]:", "source ::1 ", "8 4-tuples over 4 source ports",
		"asked for [::1]:", "client connection 10: forwarded on a held 4-tuple, [::1]:"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("no %q in the summary", want)
		}
	}
}

// The command runs the demo and exits 0; bad flags exit 2 and name the flag.
func TestCommand(t *testing.T) {
	ports := porttest.Ports(2)
	var stdout, stderr bytes.Buffer
	code := realMain(context.Background(), []string{"-demo", "-size", "1000", "-tw-reuse-delay", "0", "-ports", fmt.Sprintf("%d-%d", ports.Low, ports.High)}, &stdout, &stderr)
	if code != 0 || !strings.Contains(stdout.String(), "PASS") || !strings.Contains(stdout.String(), "no TIME_WAIT reuse: the proxy holds") {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{nil, "-listen is required"},
		{[]string{"-listen", "127.0.0.1:1"}, "-upstream is required"},
		{[]string{"-listen", "nonsense", "-upstream", "127.0.0.1:2"}, "-listen"},
		{[]string{"-listen", "127.0.0.1:1", "-upstream", "127.0.0.1:2,0.0.0.0:3"}, "-upstream"},
		{[]string{"-listen", "127.0.0.1:1", "-upstream", "127.0.0.1:0"}, "-upstream"},
		{[]string{"-listen", "127.0.0.1:1", "-upstream", "[::1]:2"}, "different address families"},
		{[]string{"-listen", "127.0.0.1:1", "-upstream", "192.0.2.1:80"}, "not reachable from the loopback -source"},
		{[]string{"-listen", "127.0.0.1:1", "-upstream", "127.0.0.1:2", "-source", "0.0.0.0"}, "-source"},
		{[]string{"-listen", "127.0.0.1:1", "-upstream", "127.0.0.1:2", "-ports", "5-1"}, "-ports"},
		{[]string{"-listen", "127.0.0.1:1", "-upstream", "127.0.0.1:2", "-timewait", "0s"}, "-timewait"},
		{[]string{"-listen", "127.0.0.1:1", "-upstream", "127.0.0.1:2", "-tw-reuse-delay", "-1s"}, "-tw-reuse-delay -1s"},
		{[]string{"-listen", "127.0.0.1:1", "-upstream", "127.0.0.1:2", "-size", "5"}, "only with -demo"},
		{[]string{"-demo", "-upstream", "127.0.0.1:2"}, "cannot be used with -demo"},
		{[]string{"-demo", "-ports", "20000-20999"}, "at most 64"},
		{[]string{"-demo", "-size", "0"}, "-size"},
		{[]string{"-demo", "-ports", "20000-20063", "-size", "1000000"}, "-size 1000000: must be in 1-524288 with 64 ports"},
		{[]string{"-demo", "-source", "10.0.0.1"}, "loopback"},
		{[]string{"-demo", "-source", "fd00::1"}, "loopback"},
		{[]string{"-demo", "extra"}, "unexpected argument"},
	} {
		stdout.Reset()
		stderr.Reset()
		// One line for the error, one pointing to -h: no usage dump.
		code := realMain(context.Background(), tt.args, &stdout, &stderr)
		if code != 2 || !strings.Contains(stderr.String(), tt.want) || strings.Count(stderr.String(), "\n") != 2 {
			t.Errorf("%q: exit %d, stderr %q; want 2 and %q in two lines", tt.args, code, stderr.String(), tt.want)
		}
	}
	stderr.Reset()
	if code := realMain(context.Background(), []string{"-h"}, &stdout, &stderr); code != 0 || !strings.Contains(stderr.String(), "usage: tcpproxy") {
		t.Errorf("-h: exit %d, output %q", code, stderr.String())
	}
}

// The command forwards until its context ends, then prints its counts.
func TestCommandServes(t *testing.T) {
	up := listen(t)
	go echoServer(up)
	// A free port to listen on: the OS picks one, the command takes it.
	probe := listen(t)
	addr := probe.Addr().String()
	probe.Close()
	ports := porttest.Ports(3) // a port per connection: each is held after it
	ctx, cancel := context.WithCancel(context.Background())
	var stdout, stderr bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- realMain(ctx, []string{"-listen", addr, "-upstream", addrOf(up).String(), "-drain", "300ms",
			"-ports", fmt.Sprintf("%d-%d", ports.Low, ports.High)}, &stdout, &stderr)
	}()
	var got []byte
	eventually(t, "a round trip through the command", func() bool {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return false
		}
		c.Close()
		got = roundTrip(t, addr, []byte("ping"))
		return true
	})
	// A connection left open: shutdown waits -drain for it, then cuts it.
	open, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	open.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := open.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(open, make([]byte, 1)); err != nil {
		t.Fatalf("echo on the open connection: %v", err)
	}
	cancel()
	if code := <-done; code != 0 || string(got) != "ping" {
		t.Fatalf("exit %d, echo %q\nstderr:\n%s", code, got, stderr.String())
	}
	for _, want := range []string{"connections still open after 300ms: 1, left to end with the process", "stopped. accepted 3, forwarded 3"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, stdout.String())
		}
	}
}

// A connection the upstream ends first (a passive close for the proxy)
// frees its 4-tuple at once; one the proxy ends first holds it for
// timeWait, then frees it.
func TestTimeWait(t *testing.T) {
	// The upstream sends a greeting and ends its side first.
	greeter := listen(t)
	go func() {
		for {
			c, err := greeter.AcceptTCP()
			if err != nil {
				return
			}
			c.Write([]byte("hello"))
			c.CloseWrite()
			io.Copy(io.Discard, c)
			c.Close()
		}
	}()
	p, addr := startProxy(t, testConfig(porttest.Ports(2), addrOf(greeter)))
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if got, _ := io.ReadAll(c); string(got) != "hello" {
		t.Fatalf("got %q", got)
	}
	c.Close()
	eventually(t, "the passive close's tuple freed", func() bool { return p.stats().Forwarded == 1 && p.flows.Len() == 0 })
	if s := p.stats(); s.TimeWait != 0 {
		t.Errorf("%d tuples held after a passive close", s.TimeWait)
	}

	echo := listen(t)
	go echoServer(echo)
	cfg := testConfig(porttest.Ports(2), addrOf(echo))
	cfg.timeWait = 300 * time.Millisecond
	p, addr = startProxy(t, cfg)
	if got := roundTrip(t, addr, []byte("ping")); string(got) != "ping" {
		t.Fatalf("echo %q", got)
	}
	eventually(t, "the active close's tuple held", func() bool { return p.stats().TimeWait == 1 })
	if n := p.flows.Len(); n != 1 {
		t.Errorf("table holds %d tuples during TIME_WAIT, want 1", n)
	}
	eventually(t, "the held tuple freed", func() bool { return p.stats().TimeWait == 0 && p.flows.Len() == 0 })
}

// With TIME_WAIT reuse, a connection takes over a 4-tuple that an active
// close holds once the reuse delay has passed, as the kernel's connect()
// from the bound port takes over its TIME_WAIT socket: through one upstream
// and four source ports, clients that each end first forward many more
// connections in the same time than without reuse, where every port
// carries one connection per -timewait; and the kernel refuses none.
func TestTimeWaitReuseRate(t *testing.T) {
	if b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_timestamps"); err != nil || strings.TrimSpace(string(b)) == "0" {
		t.Skipf("net.ipv4.tcp_timestamps is %q (%v): without TCP timestamps the kernel takes no TIME_WAIT socket over, nor does the proxy", b, err)
	}
	const (
		ports = 4
		run   = 2 * time.Second
		delay = 100 * time.Millisecond
	)
	echo := listen(t)
	go echoServer(echo)
	if c, err := net.DialTCP("tcp", nil, echo.Addr().(*net.TCPAddr)); err == nil {
		used := usedTimestamps(c)
		c.Close()
		if !used {
			t.Skip("this host's loopback connections negotiate no TCP timestamps now, though net.ipv4.tcp_timestamps is on: the kernel would take no TIME_WAIT socket over, nor does the proxy")
		}
	}
	measure := func(reuse time.Duration) (Stats, int) {
		cfg := testConfig(porttest.Ports(ports), addrOf(echo))
		cfg.reuse = reuse
		p, addr := startProxy(t, cfg)
		var wg sync.WaitGroup
		var failed atomic.Int64
		deadline := time.Now().Add(run)
		for range ports {
			wg.Go(func() {
				for time.Now().Before(deadline) {
					_, ok := demoEcho(addr, []byte("hello"))
					if !ok {
						// Refused: no tuple free yet.
						failed.Add(1)
						time.Sleep(5 * time.Millisecond)
					}
				}
			})
		}
		wg.Wait()
		eventually(t, "every forward done", func() bool { return p.stats().Active == 0 })
		s := p.stats()
		// Each port's last connection ended first: its tuple is held, and
		// counted once.
		if s.TimeWait != ports || p.flows.Len() != ports {
			t.Errorf("reuse %v: %d tuples counted held, %d in the table; want %d", reuse, s.TimeWait, p.flows.Len(), ports)
		}
		if s.Accepted != s.Forwarded+s.NoPorts || s.DialErrors != 0 || failed.Load() != s.NoPorts {
			t.Errorf("reuse %v: accepted %d, forwarded %d, refused %d (clients saw %d), dial errors %d", reuse, s.Accepted, s.Forwarded, s.NoPorts, failed.Load(), s.DialErrors)
		}
		return s, int(s.Forwarded)
	}
	without, n0 := measure(0)
	with, n1 := measure(delay)
	t.Logf("%d ports, %v: without reuse %d connections (%.1f/s), %d refused; with reuse after %v %d connections (%.1f/s), %d taken over, %d refused, %d kernel refusals",
		ports, run, n0, float64(n0)/run.Seconds(), without.NoPorts, delay, n1, float64(n1)/run.Seconds(), with.Reused, with.NoPorts, with.KernelRefused)
	if n0 > ports || without.Reused != 0 {
		t.Errorf("without reuse: %d connections, %d taken over; want at most a connection per port (%d) and none", n0, without.Reused, ports)
	}
	if n1 < 3*max(n0, 1) || n1 <= ports {
		t.Errorf("with reuse: %d connections; want at least 3 times the %d without, and more than %d", n1, n0, ports)
	}
	if with.KernelRefused != 0 || with.Reused < int64(n1-ports) {
		t.Errorf("with reuse: %d kernel refusals, %d taken over of %d connections; want none, and all but the first on each port", with.KernelRefused, with.Reused, n1)
	}
}

// A held 4-tuple marked in TIME_WAIT that the kernel will not let go (here
// a live connection the proxy did not make holds it, as a TIME_WAIT socket
// without timestamps would): the proxy's takeover is refused at connect(),
// the tuple stays held, counted once, and is not offered again.
func TestTimeWaitReuseRefused(t *testing.T) {
	echo := listen(t)
	go echoServer(echo)
	ports := porttest.Ports(1)
	tup := hash4.Tuple{Local: netip.AddrPortFrom(loopback, ports.Low), Remote: addrOf(echo)}
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(tup.Local), Control: reuseAddr}
	held, err := d.Dial("tcp", tup.Remote.String())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	cfg := testConfig(ports, addrOf(echo))
	cfg.reuse = 50 * time.Millisecond
	p, addr := startProxy(t, cfg)
	f := &flow{upstream: tup.Remote, timestamps: true}
	if err := p.flows.Insert(tup, f); err != nil {
		t.Fatal(err)
	}
	p.hold(tup, f, true)
	time.Sleep(2 * cfg.reuse)
	for i := range 2 {
		if got := roundTrip(t, addr, []byte("ping")); len(got) != 0 {
			t.Fatalf("client %d: forwarded %q over a tuple the kernel holds", i, got)
		}
		eventually(t, "the refusal counted", func() bool { return p.stats().NoPorts == int64(i+1) })
	}
	s := p.stats()
	if s.KernelRefused != 1 || s.Reused != 0 || s.TimeWait != 1 || p.flows.Len() != 1 {
		t.Errorf("kernel refusals %d, taken over %d, held %d, table %d; want 1, 0, 1, 1", s.KernelRefused, s.Reused, s.TimeWait, p.flows.Len())
	}
	if v, ok := p.flows.Lookup(tup); !ok || v != f {
		t.Errorf("the held flow is gone or replaced: %v, %v", v, ok)
	}
}

// A 4-tuple the kernel holds (here a connection the proxy did not make) is
// refused at connect(); the proxy holds it and takes another, or refuses
// the client when none is left. A port with a listener on it fails at
// bind(); the proxy holds the port in its allocator.
func TestKernelRefusals(t *testing.T) {
	echo := listen(t)
	go echoServer(echo)
	ports := porttest.Ports(2)
	outsider := netip.AddrPortFrom(loopback, ports.Low)
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(outsider), Control: reuseAddr}
	held, err := d.Dial("tcp", addrOf(echo).String())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()

	// One port, held by the outsider's connection: refused.
	p, addr := startProxy(t, testConfig(hash4.PortRange{Low: ports.Low, High: ports.Low}, addrOf(echo)))
	if got := roundTrip(t, addr, []byte("ping")); len(got) != 0 {
		t.Errorf("forwarded %q with no usable tuple", got)
	}
	eventually(t, "the refusal counted", func() bool { return p.stats().NoPorts == 1 })
	if s := p.stats(); s.KernelRefused != 1 || s.TimeWait != 1 || s.Forwarded != 0 {
		t.Errorf("kernel refusals %d, held %d, forwarded %d; want 1, 1, 0", s.KernelRefused, s.TimeWait, s.Forwarded)
	}
	if _, ok := p.flows.Lookup(hash4.Tuple{Local: outsider, Remote: addrOf(echo)}); !ok {
		t.Error("the refused tuple is not held")
	}

	// Two ports: the proxy passes over the refused one, if Connect offers
	// it first.
	p, addr = startProxy(t, testConfig(ports, addrOf(echo)))
	if got := roundTrip(t, addr, []byte("ping")); string(got) != "ping" {
		t.Fatalf("round trip: %q", got)
	}
	eventually(t, "the active close's tuple held", func() bool { return p.stats().TimeWait == 1+p.stats().KernelRefused })
	if s := p.stats(); s.Forwarded != 1 || s.KernelRefused > 1 {
		t.Errorf("forwarded %d, kernel refusals %d; want 1 and at most 1", s.Forwarded, s.KernelRefused)
	}
	if _, ok := p.flows.Lookup(hash4.Tuple{Local: netip.AddrPortFrom(loopback, ports.High), Remote: addrOf(echo)}); !ok {
		t.Error("the forwarded connection did not use the free port")
	}

	// A listener on the only port: bind() fails; the port is held.
	lport := porttest.Ports(1)
	ln, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(netip.AddrPortFrom(loopback, lport.Low)))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	p, addr = startProxy(t, testConfig(lport, addrOf(echo)))
	if got := roundTrip(t, addr, []byte("ping")); len(got) != 0 {
		t.Errorf("forwarded %q through a port with a listener on it", got)
	}
	eventually(t, "the refusal counted", func() bool { return p.stats().NoPorts == 1 })
	if s := p.stats(); s.KernelRefused != 1 || p.flows.Len() != 0 {
		t.Errorf("kernel refusals %d, table %d; want 1 and 0", s.KernelRefused, p.flows.Len())
	}
	if _, err := p.alloc.Bind(netip.AddrPortFrom(loopback, lport.Low)); err == nil {
		t.Error("the port with a listener is not held in the allocator")
	}
}

// An upstream that refuses connections: the client is refused and the
// tuple freed.
func TestUpstreamDown(t *testing.T) {
	down := listen(t)
	upAddr := addrOf(down)
	down.Close()
	p, addr := startProxy(t, testConfig(porttest.Ports(2), upAddr))
	if got := roundTrip(t, addr, []byte("ping")); len(got) != 0 {
		t.Errorf("got %q from a closed upstream", got)
	}
	eventually(t, "the dial error counted", func() bool { return p.stats().DialErrors == 1 })
	if n := p.flows.Len(); n != 0 {
		t.Errorf("table holds %d tuples after a failed dial", n)
	}
}

// Many clients at once, over as many 4-tuples as there are ports and
// upstreams: every byte comes back, the connections the upstream ended
// first leave nothing behind, and those the proxy ended first stay held.
// Each client picks who ends first with its first byte: 0 for the client
// (the upstream echoes until the end of data), 1 for the upstream (it
// echoes the length-prefixed message, then ends).
func TestManyClients(t *testing.T) {
	serve := func(c *net.TCPConn) {
		defer c.Close()
		var hdr [5]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		c.Write(hdr[:])
		if hdr[0] == 0 {
			io.Copy(c, c)
			return
		}
		io.CopyN(c, c, int64(binary.BigEndian.Uint32(hdr[1:])))
		c.CloseWrite()
		io.Copy(io.Discard, c)
	}
	var upstreams []netip.AddrPort
	for range 2 {
		ln := listen(t)
		upstreams = append(upstreams, addrOf(ln))
		go func() {
			for {
				c, err := ln.AcceptTCP()
				if err != nil {
					return
				}
				go serve(c)
			}
		}()
	}
	const ports = 16
	p, addr := startProxy(t, testConfig(porttest.Ports(ports), upstreams...))

	const clients = ports * 2
	var wg sync.WaitGroup
	var clientFirst atomic.Int64
	errs := make(chan error, clients)
	for id := range clients {
		wg.Go(func() {
			mode := byte(id % 2)
			if mode == 0 {
				clientFirst.Add(1)
			}
			msg := make([]byte, 5+1000*(id+1))
			msg[0] = mode
			binary.BigEndian.PutUint32(msg[1:5], uint32(len(msg)-5))
			for i := range msg[5:] {
				msg[5+i] = byte(id + i)
			}
			c, err := net.Dial("tcp", addr)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			go c.Write(msg)
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, msg) {
				errs <- fmt.Errorf("client %d: echo differs (%v)", id, err)
				return
			}
			if mode == 1 {
				// The upstream ends first: wait for its end here.
				if n, err := c.Read(make([]byte, 1)); n != 0 || err != io.EOF {
					errs <- fmt.Errorf("client %d: want the upstream's end, got %d bytes, %v", id, n, err)
					return
				}
			}
			c.(*net.TCPConn).CloseWrite()
			if rest, err := io.ReadAll(c); len(rest) != 0 || err != nil {
				errs <- fmt.Errorf("client %d: after the echo, %d bytes, %v", id, len(rest), err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	eventually(t, "every forward done", func() bool { return p.stats().Active == 0 })
	s := p.stats()
	if s.Forwarded != clients || s.NoPorts != 0 || s.KernelRefused != 0 {
		t.Errorf("forwarded %d, no ports %d, kernel refusals %d; want %d, 0, 0", s.Forwarded, s.NoPorts, s.KernelRefused, clients)
	}
	if want := clientFirst.Load(); s.TimeWait != want || int64(p.flows.Len()) != want {
		t.Errorf("held %d, table %d; want the %d the proxy ended first", s.TimeWait, p.flows.Len(), want)
	}
}

// A source address that is not this host's is refused at start.
func TestSourceNotLocal(t *testing.T) {
	cfg := testConfig(porttest.Ports(1), netip.MustParseAddrPort("192.0.2.2:80"))
	cfg.source = netip.MustParseAddr("192.0.2.1") // TEST-NET-1: on no interface here
	if _, err := newProxy(cfg); err == nil || !strings.Contains(err.Error(), "source address 192.0.2.1") {
		t.Errorf("newProxy with a foreign source: %v", err)
	}
}

// Once the client has ended its data, the upstream has -drain to finish:
// an upstream that goes on too slowly is cut, and the client sees a reset,
// not a clean end; a client that stops reading is cut too. Either way the
// forward ends.
func TestDrain(t *testing.T) {
	// The upstream reads to the end of the client's data, then sends size
	// bytes in chunks, pausing between them.
	slow := func(size, chunk int, pause time.Duration) netip.AddrPort {
		ln := listen(t)
		go func() {
			for {
				c, err := ln.AcceptTCP()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					io.Copy(io.Discard, c)
					for sent := 0; sent < size; sent += chunk {
						if _, err := c.Write(make([]byte, chunk)); err != nil {
							return
						}
						time.Sleep(pause)
					}
				}()
			}
		}()
		return addrOf(ln)
	}
	cfg := testConfig(porttest.Ports(2), slow(20, 1, 100*time.Millisecond))
	cfg.drain = 300 * time.Millisecond
	p, addr := startProxy(t, cfg)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	c.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(c)
	if len(got) >= 20 || err == nil {
		t.Errorf("read %d of 20 bytes, err %v; want the cut to show as an error", len(got), err)
	}
	eventually(t, "the slow forward ended", func() bool { return p.stats().Active == 0 })

	// A client that ends its data, then reads nothing while the upstream
	// sends far more than the socket buffers hold.
	cfg = testConfig(porttest.Ports(2), slow(64<<20, 64<<10, 0))
	cfg.drain = 300 * time.Millisecond
	p, addr = startProxy(t, cfg)
	c, err = net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.(*net.TCPConn).CloseWrite()
	eventually(t, "the forward to a client that does not read ended", func() bool { return p.stats().Active == 0 })
	if s := p.stats(); s.BytesDown >= 64<<20 {
		t.Errorf("forwarded %d bytes to a client that read none", s.BytesDown)
	}
}

// skipWithoutTimestamps skips a demo test whose summary says that the
// upstream connections negotiated no TCP timestamps (seen once while other
// packages' tests ran beside these): the demo then rightly takes no
// TIME_WAIT socket over, and the counts its test wants do not apply.
func skipWithoutTimestamps(t *testing.T, summary string) {
	t.Helper()
	if strings.Contains(summary, "did not use TCP timestamps") {
		t.Skipf("the upstream connections negotiated no TCP timestamps: no takeover to check")
	}
}
