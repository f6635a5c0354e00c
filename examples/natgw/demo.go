package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// The demo's datagrams: magic, client id, sequence number, then filler that
// depends on all three, demoPayload bytes in all (less if -max-datagram is
// smaller). A reply is the client's own only if every byte matches.
const (
	demoMagic   = "NATG"
	demoHeader  = 16
	demoPayload = 64
	// demoWindow is how many datagrams a client may have in flight; at the
	// window it skips a beat rather than flood.
	demoWindow = 4
	// demoGrace bounds the wait for in-flight echoes when a client stops or
	// changes its source port.
	demoGrace = 2 * time.Second
)

// demoConfig sets the demo's load.
type demoConfig struct {
	clients  int
	duration time.Duration
	rate     float64 // datagrams per second per client
}

// demoResult is what the demo saw.
type demoResult struct {
	sent, received int64 // datagrams the clients sent, and their own echoes received
	wrong          int64 // datagrams a client received that were not its own echo
	dup            int64 // echoes received twice
	lost           int64 // datagrams whose echo never came (or that could not be sent)
	throttled      int64 // beats skipped with a full window
	rogueSent      int64 // oversize datagrams sent on purpose
	interrupted    bool
	elapsed        time.Duration
	gw             stats
}

// ok reports whether every datagram came back to the client that sent it.
func (r demoResult) ok() bool {
	return !r.interrupted && r.sent > 0 && r.received == r.sent && r.wrong == 0 && r.lost == 0 && r.gw.Misrouted == 0
}

// demoCounts are the clients' shared counters.
type demoCounts struct {
	sent, received, wrong, dup, lost, throttled atomic.Int64
}

// loopbackOf returns the loopback address of a's family.
func loopbackOf(a netip.Addr) netip.Addr {
	if a.Unmap().Is4() {
		return netip.AddrFrom4([4]byte{127, 0, 0, 1})
	}
	return netip.IPv6Loopback()
}

// listenLoopback returns a UDP socket on the loopback address of gw's
// family, from which to send to gw.
func listenLoopback(gw netip.AddrPort) (*net.UDPConn, error) {
	at := loopbackOf(gw.Addr())
	return net.ListenUDP(udpNetwork(at), net.UDPAddrFromAddrPort(netip.AddrPortFrom(at, 0)))
}

// runDemo starts an echo upstream on the loopback address of cfg.outside's
// family and a gateway, drives dc.clients clients, on the loopback address
// of cfg.inside's family, through the gateway for dc.duration, writes
// progress to progress (in place if it is a terminal) and the summary to out.
func runDemo(ctx context.Context, cfg config, dc demoConfig, out, progress io.Writer) (demoResult, error) {
	var res demoResult
	echoAt := loopbackOf(cfg.outside)
	echo, err := net.ListenUDP(udpNetwork(echoAt), net.UDPAddrFromAddrPort(netip.AddrPortFrom(echoAt, 0)))
	if err != nil {
		return res, fmt.Errorf("echo upstream: %w", err)
	}
	echo.SetReadBuffer(1 << 20)
	var echoWG sync.WaitGroup
	for range 2 {
		echoWG.Go(func() { echoServe(echo) })
	}
	defer func() {
		echo.Close()
		echoWG.Wait()
	}()

	cfg.upstream = echo.LocalAddr().(*net.UDPAddr).AddrPort()
	gw, err := newGateway(cfg)
	if err != nil {
		return res, err
	}
	gctx, stopGW := context.WithCancel(context.Background())
	gwDone := make(chan error, 1)
	go func() { gwDone <- gw.run(gctx) }()
	shutdownGW := sync.OnceFunc(func() {
		stopGW()
		<-gwDone
	})
	defer shutdownGW()

	fmt.Fprintf(out, "natgw demo: %d clients x %g datagrams/s for %v (window %d), gateway %v -> echo upstream %v, outside %v ports %d-%d, idle %v\n",
		dc.clients, dc.rate, dc.duration, demoWindow, gw.addr(), cfg.upstream, cfg.outside, cfg.ports.Low, cfg.ports.High, cfg.idle)

	start := time.Now()
	halfway, stop := start.Add(dc.duration/2), start.Add(dc.duration)
	payload := min(demoPayload, cfg.maxDatagram)
	var counts demoCounts
	var clientWG sync.WaitGroup
	for i := range dc.clients {
		c := &demoClient{id: uint32(i), gw: gw.addr(), size: payload, counts: &counts}
		interval := time.Duration(float64(time.Second) / dc.rate)
		offset := interval * time.Duration(i) / time.Duration(dc.clients)
		clientWG.Go(func() { c.run(ctx, start.Add(offset), interval, halfway, stop) })
	}

	// The rogue: an oversize datagram every half second, which the gateway
	// must count and drop without making a flow for it.
	var rogueSent atomic.Int64
	rogueDone := make(chan struct{})
	rogueStop := make(chan struct{})
	go func() {
		defer close(rogueDone)
		if cfg.maxDatagram >= maxUDPPayload {
			return // nothing larger can be sent
		}
		conn, err := listenLoopback(gw.addr())
		if err != nil {
			return
		}
		defer conn.Close()
		big := make([]byte, cfg.maxDatagram+1)
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-rogueStop:
				return
			case <-tick.C:
				if _, err := conn.WriteToUDPAddrPort(big, gw.addr()); err == nil {
					rogueSent.Add(1)
				}
			}
		}
	}()

	// Progress until the clients are done.
	clientsDone := make(chan struct{})
	go func() { clientWG.Wait(); close(clientsDone) }()
	tty := isTerminal(progress)
	every := time.Second
	if tty {
		every = 250 * time.Millisecond
	}
	tick := time.NewTicker(every)
	lastT, lastFwd := start, int64(0)
	line := func(now time.Time) string {
		s := gw.stats()
		fwd := s.ToUpstream + s.ToClients
		rate := float64(fwd-lastFwd) / now.Sub(lastT).Seconds()
		lastT, lastFwd = now, fwd
		return fmt.Sprintf("%5.1fs  flows %4d (created %d, expired %d)  ports in use %4d  %6.0f pkt/s  sent %d  echoed %d",
			now.Sub(start).Seconds(), s.FlowsActive, s.FlowsCreated, s.FlowsExpired, s.PortsInUse, rate,
			counts.sent.Load(), counts.received.Load())
	}
wait:
	for {
		select {
		case <-clientsDone:
			break wait
		case now := <-tick.C:
			if tty {
				fmt.Fprintf(progress, "\r%s\x1b[K", line(now))
			} else {
				fmt.Fprintln(progress, line(now))
			}
		}
	}
	tick.Stop()
	if tty {
		fmt.Fprintln(progress)
	}
	close(rogueStop)
	<-rogueDone
	// Give the rogue's last datagram a moment to be read and counted.
	for deadline := time.Now().Add(time.Second); gw.stats().OversizeIn < rogueSent.Load() && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	res.elapsed = time.Since(start)
	shutdownGW()

	res.sent, res.received = counts.sent.Load(), counts.received.Load()
	res.wrong, res.dup, res.lost = counts.wrong.Load(), counts.dup.Load(), counts.lost.Load()
	res.throttled = counts.throttled.Load()
	res.rogueSent = rogueSent.Load()
	res.interrupted = ctx.Err() != nil
	res.gw = gw.stats()
	printSummary(out, res, cfg)
	return res, nil
}

// printSummary writes the demo's final report.
func printSummary(w io.Writer, r demoResult, cfg config) {
	s := r.gw
	fmt.Fprintf(w, "datagrams  sent %d, echoed back %d, to the wrong client %d, lost %d, duplicated %d (window full %d times)\n",
		r.sent, r.received, r.wrong, r.lost, r.dup, r.throttled)
	fmt.Fprintf(w, "flows      created %d, expired %d after %v idle, peak %d at once\n",
		s.FlowsCreated, s.FlowsExpired, cfg.idle, s.PeakFlows)
	fmt.Fprintf(w, "ports      reused %d, refused by the OS %d\n", s.PortsReused, s.PortsRefused)
	fmt.Fprintf(w, "dropped    oversize %d (of %d sent on purpose), flow limit %d, no free port %d, unmatched replies %d\n",
		s.OversizeIn+s.OversizeOut, r.rogueSent, s.FlowLimitDrops, s.NoPortDrops, s.Unmatched)
	fmt.Fprintf(w, "gateway    forwarded %d to upstream and %d to clients in %.1fs; errors: send %d, read %d, socket %d, misrouted %d\n",
		s.ToUpstream, s.ToClients, r.elapsed.Seconds(), s.SendErrors, s.ReadErrors, s.SocketErrors, s.Misrouted)
	switch {
	case r.ok():
		fmt.Fprintln(w, "PASS: every datagram came back to the client that sent it")
	case r.interrupted:
		fmt.Fprintln(w, "INTERRUPTED")
	default:
		fmt.Fprintln(w, "FAIL: not every datagram came back to the client that sent it")
	}
}

// echoServe sends every datagram on conn back to its sender until conn is
// closed.
func echoServe(conn *net.UDPConn) {
	buf := make([]byte, 64<<10)
	for {
		n, from, err := conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		conn.WriteToUDPAddrPort(buf[:n], from)
	}
}

// demoClient sends numbered datagrams through the gateway and checks that
// each echo is its own.
type demoClient struct {
	id     uint32
	gw     netip.AddrPort
	size   int
	counts *demoCounts
	port   uint16 // the source port of the last phase

	mu          sync.Mutex
	seq         uint64
	outstanding map[uint64]struct{}
}

// run sends from one source port until halfway and from another until stop,
// one datagram per interval from first on, at most demoWindow in flight.
// Changing ports makes the first flow idle, so that it expires.
func (c *demoClient) run(ctx context.Context, first time.Time, interval time.Duration, halfway, stop time.Time) {
	c.outstanding = make(map[uint64]struct{})
	select {
	case <-ctx.Done():
		return
	case <-time.After(time.Until(first)):
	}
	for _, end := range []time.Time{halfway, stop} {
		if ctx.Err() != nil {
			return
		}
		c.phase(ctx, interval, end)
	}
}

// phase runs one source port until end.
func (c *demoClient) phase(ctx context.Context, interval time.Duration, end time.Time) {
	conn, err := c.listen()
	if err != nil {
		return
	}
	conn.SetReadBuffer(256 << 10)
	recvDone := make(chan struct{})
	go func() {
		defer close(recvDone)
		c.receive(conn)
	}()
	buf := make([]byte, c.size)
	tick := time.NewTicker(interval)
	timer := time.NewTimer(time.Until(end))
send:
	for {
		c.mu.Lock()
		if len(c.outstanding) >= demoWindow {
			c.mu.Unlock()
			c.counts.throttled.Add(1)
		} else {
			c.seq++
			seq := c.seq
			c.outstanding[seq] = struct{}{}
			c.mu.Unlock()
			fillDatagram(buf, c.id, seq)
			c.counts.sent.Add(1)
			if _, err := conn.WriteToUDPAddrPort(buf, c.gw); err != nil {
				c.mu.Lock()
				delete(c.outstanding, seq)
				c.mu.Unlock()
				c.counts.lost.Add(1)
			}
		}
		select {
		case <-ctx.Done():
			break send
		case <-timer.C:
			break send
		case <-tick.C:
		}
	}
	tick.Stop()
	timer.Stop()
	// Wait for the echoes in flight, then count the rest as lost.
	for deadline := time.Now().Add(demoGrace); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		c.mu.Lock()
		n := len(c.outstanding)
		c.mu.Unlock()
		if n == 0 {
			break
		}
	}
	conn.Close()
	<-recvDone
	c.mu.Lock()
	c.counts.lost.Add(int64(len(c.outstanding)))
	clear(c.outstanding)
	c.mu.Unlock()
}

// listen binds a source port other than the last phase's: the kernel may
// hand out a port just closed again, and the client's first flow would
// then go on rather than idle out.
func (c *demoClient) listen() (*net.UDPConn, error) {
	conn, err := listenLoopback(c.gw)
	if err != nil {
		return nil, err
	}
	if conn.LocalAddr().(*net.UDPAddr).AddrPort().Port() == c.port {
		// Bind another while this one holds the port.
		other, err := listenLoopback(c.gw)
		conn.Close()
		if err != nil {
			return nil, err
		}
		conn = other
	}
	c.port = conn.LocalAddr().(*net.UDPAddr).AddrPort().Port()
	return conn, nil
}

// receive reads echoes until conn is closed.
func (c *demoClient) receive(conn *net.UDPConn) {
	buf := make([]byte, 64<<10)
	want := make([]byte, c.size)
	for {
		n, from, err := conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		p := buf[:n]
		if unmap(from) != c.gw || n != c.size || string(p[:4]) != demoMagic || binary.BigEndian.Uint32(p[4:8]) != c.id {
			c.counts.wrong.Add(1)
			continue
		}
		seq := binary.BigEndian.Uint64(p[8:16])
		if fillDatagram(want, c.id, seq); string(want) != string(p) {
			c.counts.wrong.Add(1)
			continue
		}
		c.mu.Lock()
		_, ok := c.outstanding[seq]
		delete(c.outstanding, seq)
		c.mu.Unlock()
		if ok {
			c.counts.received.Add(1)
		} else {
			c.counts.dup.Add(1)
		}
	}
}

// fillDatagram writes the datagram seq of client id into buf.
func fillDatagram(buf []byte, id uint32, seq uint64) {
	copy(buf, demoMagic)
	binary.BigEndian.PutUint32(buf[4:8], id)
	binary.BigEndian.PutUint64(buf[8:16], seq)
	for i := demoHeader; i < len(buf); i++ {
		buf[i] = byte(uint64(id)*131 + seq*31 + uint64(i))
	}
}

// isTerminal reports whether w is a character device, such as a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
