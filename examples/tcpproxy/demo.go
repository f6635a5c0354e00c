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
	proxy        Stats
}

// ok reports whether the proxy did what the demo shows: every connection
// forwarded whole, each port carrying a connection to every upstream at
// once, every 4-tuple held after the active closes, and one connection
// more refused.
func (r demoResult) ok(ports int) bool {
	return r.echoed == r.clients && r.liveTuples == r.clients && r.livePorts == ports &&
		r.heldTuples == r.clients && r.extraRefused && r.proxy.NoPorts == 1
}

// runDemo starts echo servers as upstreams and a proxy in front of them
// with cfg's source address and ports, and connects a client for every
// source port and upstream, all open at once; each sends size bytes and
// checks the echo. Then it checks that the proxy holds every 4-tuple for
// TIME_WAIT and refuses one connection more. It writes a summary to out.
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
	fmt.Fprintf(out, "tcpproxy demo: proxy %v, upstreams %v (echo servers), source %v ports %d-%d, %v TIME_WAIT\n",
		addr, cfg.upstreams, cfg.source, cfg.ports.Low, cfg.ports.High, cfg.timeWait)

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
	var example string
	for tup := range p.flows.All() {
		res.heldTuples++
		example = fmt.Sprintf("%v -> %v", tup.Local, tup.Remote)
	}
	fmt.Fprintf(out, "%d client connections at once, %d bytes each way: %d echoed in full\n", res.clients, size, res.echoed)
	fmt.Fprintf(out, "while all were open, the upstream connections had %d 4-tuples over %d source ports: each port toward all %d upstreams\n",
		res.liveTuples, res.livePorts, demoUpstreams)
	fmt.Fprintf(out, "after the clients closed, the proxy ended each upstream connection first and holds its 4-tuple for TIME_WAIT: %d held, such as %s\n",
		res.heldTuples, example)

	// One connection more finds every 4-tuple toward its upstream held.
	res.extraRefused = demoRefused(addr)
	if res.extraRefused {
		fmt.Fprintf(out, "client connection %d: refused, as no 4-tuple toward its upstream is free\n", res.clients+1)
	} else {
		fmt.Fprintf(out, "client connection %d: not refused, though no 4-tuple toward its upstream should be free\n", res.clients+1)
	}

	// What the kernel says to a connect() on a held 4-tuple.
	for tup := range p.flows.All() {
		res.kernel = kernelSays(tup.Local, tup.Remote)
		fmt.Fprintf(out, "the kernel, asked for %v -> %v: %s\n", tup.Local, tup.Remote, res.kernel)
		break
	}

	stop()
	res.proxy = p.stats()
	s := res.proxy
	fmt.Fprintf(out, "proxy: accepted %d, forwarded %d, no free 4-tuple %d, dial errors %d, kernel refusals %d; %d bytes up, %d down\n",
		s.Accepted, s.Forwarded, s.NoPorts, s.DialErrors, s.KernelRefused, s.BytesUp, s.BytesDown)
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

// kernelSays tries connect() from local to remote, as the proxy would, and
// describes the result.
func kernelSays(local, remote netip.AddrPort) string {
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(local), Control: reuseAddr, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", remote.String())
	switch {
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		return "EADDRNOTAVAIL: the kernel holds the 4-tuple too"
	case err != nil:
		return err.Error()
	}
	c.Close()
	return "connected: this kernel lets a connect() take over a TIME_WAIT socket here (net.ipv4.tcp_tw_reuse); without that, EADDRNOTAVAIL"
}

// isTimeout reports whether err is a deadline's.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
