package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"
)

// demoUpstreams is how many echo servers the demo forwards to.
const demoUpstreams = 2

// maxDemoPorts bounds the demo's port range: it opens a connection per port
// and upstream at once.
const maxDemoPorts = 64

// demoResult is what the demo saw.
type demoResult struct {
	clients      int // client connections made, one per source port and upstream
	echoed       int // of them, those that got every byte back
	liveTuples   int // distinct 4-tuples of upstream connections while all were open
	livePorts    int // distinct source ports among them
	heldTuples   int // 4-tuples held after the clients closed
	extraRefused bool
	kernel       string // what the kernel said to a connect() on a held 4-tuple
	reuseWanted  bool   // TIME_WAIT reuse is on, and the held connections used TCP timestamps
	reused       bool   // a client after the reuse delay was forwarded on a held 4-tuple, taken over
	proxy        Stats
}

// ok reports whether the proxy did what the demo shows: every connection
// forwarded whole, each port carrying a connection to every upstream at
// once, every 4-tuple held after the active closes, one connection more
// refused, and, with TIME_WAIT reuse, one after the reuse delay forwarded
// on a held 4-tuple.
func (r demoResult) ok(ports int) bool {
	reused := int64(0)
	if r.reused {
		reused = 1
	}
	return r.echoed == r.clients && r.liveTuples == r.clients && r.livePorts == ports &&
		r.heldTuples == r.clients && r.extraRefused && r.proxy.NoPorts == 1 &&
		r.reused == r.reuseWanted && r.proxy.Reused == reused
}

// runDemo starts echo servers as upstreams and a proxy in front of them
// with cfg's source address and ports, and connects a client for every
// source port and upstream, all open at once; each sends size bytes and
// checks the echo. Then it checks that the proxy holds every 4-tuple for
// TIME_WAIT and refuses one connection more, and, with TIME_WAIT reuse,
// forwards one on a held 4-tuple after the reuse delay. It writes a
// summary to out.
func runDemo(cfg config, size int, out io.Writer) (demoResult, error) {
	nports := cfg.ports.Size()
	if nports > maxDemoPorts {
		return demoResult{}, fmt.Errorf("demo: %d source ports; use at most %d", nports, maxDemoPorts)
	}
	var (
		servers   sync.WaitGroup
		listeners []*net.TCPListener
	)
	defer func() {
		for _, ln := range listeners {
			ln.Close()
		}
		servers.Wait()
	}()
	cfg.upstreams = nil
	for range demoUpstreams {
		ln, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(netip.AddrPortFrom(cfg.source, 0)))
		if err != nil {
			return demoResult{}, err
		}
		listeners = append(listeners, ln)
		servers.Go(func() { echoServer(ln) })
		cfg.upstreams = append(cfg.upstreams, ln.Addr().(*net.TCPAddr).AddrPort())
	}

	p, err := newProxy(cfg)
	if err != nil {
		return demoResult{}, err
	}
	ln, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(netip.AddrPortFrom(cfg.source, 0)))
	if err != nil {
		return demoResult{}, err
	}
	serving := make(chan struct{})
	go func() {
		defer close(serving)
		p.serve(ln)
	}()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			ln.Close()
			<-serving
			p.wait()
		}
	}
	defer stop()
	addr := ln.Addr().String()
	fmt.Fprintf(out, "tcpproxy demo: proxy %v, upstreams %v (echo servers), source %v ports %d-%d, %v TIME_WAIT, %s\n",
		addr, cfg.upstreams, cfg.source, cfg.ports.Low, cfg.ports.High, cfg.timeWait, reuseText(cfg.reuse))

	// Every client connects and gets its first bytes back, then all wait
	// until every one has (or failed), so that all the upstream
	// connections are open at once when the table is read.
	res := demoResult{clients: nports * demoUpstreams}
	var (
		open, done sync.WaitGroup
		mu         sync.Mutex
		look       = make(chan struct{})
	)
	open.Add(res.clients)
	for id := range res.clients {
		done.Go(func() {
			ok := demoClient(addr, id, size, &open, look)
			mu.Lock()
			defer mu.Unlock()
			if ok {
				res.echoed++
			}
		})
	}
	open.Wait()
	ports := map[uint16]bool{}
	for tup := range p.flows.All() {
		res.liveTuples++
		ports[tup.Local.Port()] = true
	}
	res.livePorts = len(ports)
	close(look)
	done.Wait()
	// Each forward holds its tuple before it closes its client, but may
	// not have got there yet when the client has seen the end.
	waitUntil(func() bool { return p.stats().TimeWait == int64(res.clients) })
	heldBy := time.Now() // N.B. every tuple held is held since before
	var example string
	timestamps := false
	for tup, f := range p.flows.All() {
		res.heldTuples++
		example = fmt.Sprintf("%v -> %v", tup.Local, tup.Remote)
		timestamps = timestamps || f.timestamps
	}
	fmt.Fprintf(out, "%d client connections at once, %d bytes each way: %d echoed in full\n", res.clients, size, res.echoed)
	fmt.Fprintf(out, "while all were open, the upstream connections had %d 4-tuples over %d source ports: each port toward all %d upstreams\n",
		res.liveTuples, res.livePorts, demoUpstreams)
	fmt.Fprintf(out, "after the clients closed, the proxy ended each upstream connection first and holds its 4-tuple for TIME_WAIT: %d held, such as %s\n",
		res.heldTuples, example)

	// One connection more finds every 4-tuple toward its upstream held.
	res.extraRefused = demoRefused(addr)
	if res.extraRefused {
		why := ""
		if cfg.reuse > 0 {
			why = ", nor held for the reuse delay yet"
		}
		fmt.Fprintf(out, "client connection %d: refused, as no 4-tuple toward its upstream is free%s\n", res.clients+1, why)
	} else {
		fmt.Fprintf(out, "client connection %d: not refused, though no 4-tuple toward its upstream should be free\n", res.clients+1)
	}

	// What the kernel says to a connect() on a held 4-tuple.
	for tup := range p.flows.All() {
		res.kernel = kernelSays(tup.Local, tup.Remote)
		fmt.Fprintf(out, "the kernel, asked for %v -> %v: %s\n", tup.Local, tup.Remote, res.kernel)
		break
	}

	// Once the reuse delay has passed, a held 4-tuple may be taken over.
	switch {
	case cfg.reuse == 0:
		fmt.Fprintf(out, "no TIME_WAIT reuse: the proxy holds the 4-tuples for %v\n", cfg.timeWait)
	case !timestamps:
		fmt.Fprintln(out, "the upstream connections did not use TCP timestamps: the kernel would not let a connect() take their TIME_WAIT sockets over, so the proxy does not either")
	default:
		res.reuseWanted = true
		time.Sleep(time.Until(heldBy.Add(cfg.reuse + 10*time.Millisecond)))
		local, echoed := demoEcho(addr, []byte("after the reuse delay"))
		held := "none"
		for tup, f := range p.flows.All() {
			if f.client == local {
				held = fmt.Sprintf("%v -> %v", tup.Local, tup.Remote)
			}
		}
		res.reused = echoed && p.stats().Reused == 1
		if res.reused {
			fmt.Fprintf(out, "after %v, client connection %d: forwarded on a held 4-tuple, %s, taken over (and the kernel's TIME_WAIT socket with it)\n",
				cfg.reuse, res.clients+2, held)
		} else {
			fmt.Fprintf(out, "after %v, client connection %d: echoed %v, 4-tuples taken over %d; want one taken over\n",
				cfg.reuse, res.clients+2, echoed, p.stats().Reused)
		}
	}

	stop()
	res.proxy = p.stats()
	s := res.proxy
	fmt.Fprintf(out, "proxy: accepted %d, forwarded %d, no free 4-tuple %d, dial errors %d, kernel refusals %d, 4-tuples taken over %d; %d bytes up, %d down\n",
		s.Accepted, s.Forwarded, s.NoPorts, s.DialErrors, s.KernelRefused, s.Reused, s.BytesUp, s.BytesDown)
	if res.ok(nports) {
		fmt.Fprintln(out, "PASS")
	} else {
		fmt.Fprintln(out, "FAIL")
	}
	return res, nil
}

// waitUntil waits until cond holds, for 10 seconds at most.
func waitUntil(cond func() bool) {
	for deadline := time.Now().Add(10 * time.Second); !cond() && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
}

// echoServer echoes every connection on ln until ln is closed, and ends a
// connection when its client has: a passive close, as most servers make.
func echoServer(ln *net.TCPListener) {
	var conns sync.WaitGroup
	defer conns.Wait()
	for {
		c, err := ln.AcceptTCP()
		if err != nil {
			return
		}
		conns.Go(func() {
			defer c.Close()
			io.Copy(c, c)
		})
	}
}

// demoClient connects to the proxy at addr, sends size bytes of a pattern
// of its own and checks that they all come back. After its first bytes
// return (or it fails) it marks open and waits for look, so that every
// client's connection is open at once. It reports whether every byte came
// back.
func demoClient(addr string, id, size int, open *sync.WaitGroup, look <-chan struct{}) bool {
	opened := false
	markOpen := func() {
		if !opened {
			opened = true
			open.Done()
			<-look
		}
	}
	defer markOpen()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	msg := make([]byte, size)
	for i := range msg {
		msg[i] = byte(id*131 + i*7 + i>>8)
	}
	sent := make(chan error, 1)
	go func() {
		_, err := c.Write(msg)
		if err == nil {
			err = c.(*net.TCPConn).CloseWrite()
		}
		sent <- err
	}()
	got := make([]byte, 0, size)
	buf := make([]byte, 32<<10)
	for {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if n > 0 {
			markOpen()
		}
		if err != nil {
			break
		}
	}
	return <-sent == nil && bytes.Equal(got, msg)
}

// demoRefused connects to the proxy at addr and reports whether the proxy
// closed the connection without forwarding it: a read gets no bytes.
func demoRefused(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte("hello")); err != nil {
		return true
	}
	n, err := c.Read(make([]byte, 16))
	return n == 0 && err != nil && !isTimeout(err)
}

// demoEcho connects to the proxy at addr, sends msg, ends its data, and
// returns its own address and whether msg came back whole.
func demoEcho(addr string, msg []byte) (netip.AddrPort, bool) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return netip.AddrPort{}, false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(msg); err != nil {
		return netip.AddrPort{}, false
	}
	c.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(c)
	return c.LocalAddr().(*net.TCPAddr).AddrPort(), err == nil && bytes.Equal(got, msg)
}

// kernelSays tries connect() from local to remote, as the proxy would, and
// describes the result.
func kernelSays(local, remote netip.AddrPort) string {
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(local), Control: reuseAddr, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", remote.String())
	switch {
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		return "EADDRNOTAVAIL: the kernel holds the 4-tuple too (its connection did not use TCP timestamps)"
	case err != nil:
		return err.Error()
	}
	c.Close()
	return "connected: the kernel took its TIME_WAIT socket over, as it does for a connect() from a bound port when the old connection used TCP timestamps (whatever net.ipv4.tcp_tw_reuse says); without them, EADDRNOTAVAIL"
}

// isTimeout reports whether err is a deadline's.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
