package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hash4/hash4"
)

// config is what a proxy needs.
type config struct {
	source    netip.Addr       // the address upstream connections are made from
	upstreams []netip.AddrPort // client connections go to these in turn
	ports     hash4.PortRange  // source ports of upstream connections
	timeWait  time.Duration    // how long a 4-tuple stays taken after an active close
	reuse     time.Duration    // after an active close, how long until a new connection may take the 4-tuple over; 0: never
	drain     time.Duration    // how long one side may go on sending after the other finished
	dialWait  time.Duration    // how long a connect to an upstream may take
}

// maxTries is how many 4-tuples a client connection may try before it is
// refused: each try that the kernel refuses takes the tuple out of use for
// a while, so a few tries pass over stale ones.
const maxTries = 8

// flow is one forwarded connection: the client's, and the upstream
// connection made for it. The flows table holds it under the upstream
// connection's 4-tuple (source address and port, upstream), as the kernel's
// established table holds that socket, from the connect() until the socket
// is gone, including its TIME_WAIT.
type flow struct {
	client, upstream netip.AddrPort
	// timestamps is whether the upstream connection used TCP timestamps:
	// only then does the kernel let a new connection take its TIME_WAIT
	// socket over. Set before the flow enters the table.
	timestamps bool
	// until is when the held tuple is to be freed, in unix nanoseconds,
	// or 0 while its connection lives (see hold).
	until atomic.Int64
}

// proxy forwards TCP connections to upstreams, choosing the source port of
// each upstream connection itself with Table.ConnectFunc, so that one port
// carries a connection to each upstream at once.
type proxy struct {
	cfg   config
	flows *hash4.Table[flow]
	alloc *hash4.PortAllocator
	// reuse lets a connection take over a held tuple marked in TIME_WAIT
	// (see hold); nil if cfg.reuse is 0.
	reuse hash4.ReusePolicy
	next  atomic.Uint64 // client connections accepted: picks the upstream
	conns sync.WaitGroup
	// reaping is set while a sweep of the held tuples is due (see arm).
	reaping atomic.Bool
	c       counts
}

// counts are a proxy's counters; stats returns them as a Stats.
type counts struct {
	accepted, active, forwarded, noPorts, dialErrors, kernelRefused, timeWait, reused, bytesUp, bytesDown atomic.Int64
}

// Stats are a proxy's counts at one moment.
type Stats struct {
	Accepted      int64 // client connections accepted
	Active        int64 // of them, those not done yet
	Forwarded     int64 // of them, connected to an upstream
	NoPorts       int64 // refused: no 4-tuple toward their upstream was free
	DialErrors    int64 // refused: the upstream did not accept (or too many tries)
	KernelRefused int64 // 4-tuples the kernel refused (EADDRNOTAVAIL, EADDRINUSE), held and passed over
	TimeWait      int64 // 4-tuples held now, after an active close or a refused connect()
	Reused        int64 // held 4-tuples that a new connection took over
	BytesUp       int64 // bytes from clients to upstreams
	BytesDown     int64 // bytes from upstreams to clients
}

func (p *proxy) stats() Stats {
	return Stats{
		Accepted: p.c.accepted.Load(), Active: p.c.active.Load(), Forwarded: p.c.forwarded.Load(), NoPorts: p.c.noPorts.Load(),
		DialErrors: p.c.dialErrors.Load(), KernelRefused: p.c.kernelRefused.Load(),
		TimeWait: p.c.timeWait.Load(), Reused: p.c.reused.Load(), BytesUp: p.c.bytesUp.Load(), BytesDown: p.c.bytesDown.Load(),
	}
}

// newProxy returns a proxy for cfg, whose addresses parseFlags checked. It
// fails if the source address is not one this host can bind.
func newProxy(cfg config) (*proxy, error) {
	if len(cfg.upstreams) == 0 {
		return nil, errors.New("no upstream")
	}
	ln, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(netip.AddrPortFrom(cfg.source, 0)))
	if err != nil {
		return nil, fmt.Errorf("source address %v: %w", cfg.source, err)
	}
	ln.Close()
	alloc, err := hash4.NewPortAllocator(hash4.WithPortRange(cfg.ports))
	if err != nil {
		return nil, err
	}
	// At most a 4-tuple per port and upstream, live or held.
	n := cfg.ports.Size() * len(cfg.upstreams)
	p := &proxy{cfg: cfg, flows: hash4.New[flow](hash4.WithCapacity(min(n, 1<<20))), alloc: alloc}
	if cfg.reuse > 0 {
		// N.B. the kernel takes a TIME_WAIT socket over for a connect()
		// from a bound port as soon as its connection used timestamps,
		// on any address (tcp_twsk_unique, called without a place for the
		// old socket); the delay is the proxy's own margin, as the
		// kernel's tcp_tw_reuse_delay is for connect() with an ephemeral
		// port.
		p.reuse = hash4.TCPTimeWaitReuse(false, cfg.reuse)
	}
	return p, nil
}

// serve accepts client connections on ln and forwards each, until ln is
// closed; then it returns, with the connections it accepted still being
// forwarded (wait waits for them).
func (p *proxy) serve(ln *net.TCPListener) {
	backoff := time.Millisecond
	for {
		c, err := ln.AcceptTCP()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			// Out of file descriptors and the like: wait, as net/http does.
			time.Sleep(backoff)
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = time.Millisecond
		p.c.accepted.Add(1)
		p.c.active.Add(1)
		p.conns.Add(1)
		go func() {
			defer p.conns.Done()
			defer p.c.active.Add(-1)
			p.forward(c)
		}()
	}
}

// wait waits until the connections serve accepted are done. N.B. only
// after serve has returned: a WaitGroup's Wait must not run while an Add
// may start from zero.
func (p *proxy) wait() { p.conns.Wait() }

// waitFor waits as wait does, for d at most, and reports whether every
// connection was done.
func (p *proxy) waitFor(d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		p.wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// forward connects client to the next upstream and copies both ways until
// both are done.
func (p *proxy) forward(client *net.TCPConn) {
	defer client.Close()
	up := p.cfg.upstreams[(p.next.Add(1)-1)%uint64(len(p.cfg.upstreams))]
	f := &flow{client: client.RemoteAddr().(*net.TCPAddr).AddrPort(), upstream: up}
	conn, tup, err := p.dial(f)
	if err != nil {
		if errors.Is(err, hash4.ErrNoPorts) {
			p.c.noPorts.Add(1)
		} else {
			p.c.dialErrors.Add(1)
		}
		return
	}
	p.c.forwarded.Add(1)
	active := p.pipe(client, conn)
	conn.Close()
	if active {
		p.hold(tup, f, f.timestamps)
	} else {
		p.flows.Delete(tup)
	}
}

// dial connects to f's upstream from a 4-tuple that Table.ConnectFunc picks
// and records for f: in ConnectFunc's function, it binds the tuple's source
// address and port, with SO_REUSEADDR so that the port may carry
// connections to other upstreams, and connects; the flow is in the table,
// to Lookup and All, only once its connection is made. With p.reuse,
// ConnectFunc may offer a held tuple marked in TIME_WAIT, whose kernel
// socket the connect() takes over; the flow then replaces the held one,
// which no longer counts as held.
//
// The kernel may still refuse the tuple: a socket that this proxy's last
// run, or another program, left on it (connect: EADDRNOTAVAIL), or a
// listener on the port (bind: EADDRINUSE). The proxy then keeps the tuple,
// or the port, out of use for cfg.timeWait and has ConnectFunc offer
// another (ErrPortRefused); a held tuple the kernel would not let go loses
// its mark, and stays held until its time is up. Any other error ends the
// try, as does EADDRNOTAVAIL from bind (the source address is not this
// host's), which no other tuple would cure.
func (p *proxy) dial(f *flow) (*net.TCPConn, hash4.Tuple, error) {
	var conn *net.TCPConn
	var stale []hash4.Tuple // tuples a socket elsewhere still holds
	tries := 0
	var old *flow // the held flow taken over, if any
	var opts []hash4.ConnectOption
	if p.reuse != nil {
		opts = append(opts, hash4.WithTimeWaitReuse(p.reuse, &old))
	}
	tup, _, err := p.flows.ConnectFunc(p.alloc, p.cfg.source, f.upstream, func(tup hash4.Tuple) (*flow, error) {
		tries++
		d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(tup.Local), Control: reuseAddr, Timeout: p.cfg.dialWait}
		c, err := d.Dial("tcp", f.upstream.String())
		switch {
		case err == nil:
			conn = c.(*net.TCPConn)
			f.timestamps = usedTimestamps(conn)
			return f, nil
		case errors.Is(err, syscall.EADDRNOTAVAIL) && failedIn(err, "connect"):
			p.c.kernelRefused.Add(1)
			stale = append(stale, tup)
		case errors.Is(err, syscall.EADDRINUSE) && failedIn(err, "bind"):
			p.c.kernelRefused.Add(1)
			if release, err := p.alloc.Bind(tup.Local); err == nil {
				time.AfterFunc(p.cfg.timeWait, release)
			}
		default:
			return nil, err
		}
		if tries >= maxTries {
			return nil, fmt.Errorf("no usable 4-tuple toward %v in %d tries", f.upstream, maxTries)
		}
		return nil, fmt.Errorf("%w: %v", hash4.ErrPortRefused, err)
	}, opts...)
	// A stale tuple goes into the table as if a flow had left it in
	// TIME_WAIT, so that no flow is given it until the kernel lets it go;
	// one the table holds already was a takeover the kernel refused (the
	// old connection did not use timestamps after all): it is no longer
	// offered, and stays held.
	for _, t := range stale {
		held := &flow{client: f.client, upstream: f.upstream}
		if p.flows.Insert(t, held) == nil {
			p.hold(t, held, false)
		} else {
			p.flows.TimeWait(t, time.Time{})
		}
	}
	if err != nil {
		return nil, hash4.Tuple{}, err
	}
	if old != nil {
		// N.B. the reaper deletes a flow it finds held, and so counts it
		// itself; a flow it deleted while ConnectFunc took it over comes
		// back as nil, so each held flow is uncounted once.
		p.c.timeWait.Add(-1)
		p.c.reused.Add(1)
	}
	return conn, tup, nil
}

// failedIn reports whether err came from the system call named.
func failedIn(err error, syscall string) bool {
	var se *os.SyscallError
	return errors.As(err, &se) && se.Syscall == syscall
}

// hold keeps f's tuple tup in the flows table for cfg.timeWait, so that
// ConnectFunc does not give it out while the kernel still holds it; the
// reaper frees it then. With p.reuse and mark, it marks the tuple in
// TIME_WAIT, so that a new connection may take it over (see dial): mark
// only a tuple whose connection used TCP timestamps, as the kernel
// takes over only such a TIME_WAIT socket.
func (p *proxy) hold(tup hash4.Tuple, f *flow, mark bool) {
	now := time.Now()
	f.until.Store(now.Add(p.cfg.timeWait).UnixNano())
	p.c.timeWait.Add(1) // N.B. before arm: see reap; before the mark: see dial
	p.arm()
	if mark && p.reuse != nil {
		p.flows.TimeWait(tup, now)
	}
}

// arm schedules a sweep of the held tuples, unless one is due already. A
// tuple is freed between cfg.timeWait and 1.25 times that after its hold.
func (p *proxy) arm() {
	if p.reaping.CompareAndSwap(false, true) {
		time.AfterFunc(max(p.cfg.timeWait/4, time.Millisecond), p.reap)
	}
}

// reap is the reaper: one sweep of the table that deletes the held tuples
// whose time is up, and another scheduled while any tuple is held.
func (p *proxy) reap() {
	now := time.Now().UnixNano()
	n := p.flows.DeleteFunc(func(_ hash4.Tuple, f *flow) bool {
		u := f.until.Load()
		return u != 0 && u <= now
	})
	p.c.timeWait.Add(-int64(n))
	p.reaping.Store(false)
	// N.B. a hold that came too late for this sweep counted itself before
	// its arm, which found reaping set: the count, loaded after reaping
	// is cleared, sees it, or its own arm schedules the next sweep.
	if p.c.timeWait.Load() > 0 {
		p.arm()
	}
}

// pipe copies client to up and up to client until both directions are done,
// passing each side's end of data on to the other (a half-close). It
// reports whether the proxy may have ended the upstream connection first,
// its FIN sent before the upstream's came: then the upstream socket is in
// TIME_WAIT, and its 4-tuple taken, for the kernel's 60 seconds.
//
// Once one direction has ended, the other has cfg.drain to finish, its
// reads and writes alike, so that a peer that stops reading cannot keep the
// forward and its tuple forever. A direction that fails (a reset, or the
// drain deadline) aborts both connections with a reset, so that neither
// peer takes the cut for a clean end of data.
//
// N.B. the answer errs on the safe side: it is false only if the upstream's
// end of data had arrived before the proxy passed on the client's.
func (p *proxy) pipe(client, up *net.TCPConn) (activeClose bool) {
	var upstreamDone atomic.Bool
	var aborted sync.Once
	abort := func() {
		aborted.Do(func() {
			client.SetLinger(0) // a reset on Close, not a FIN
			up.SetLinger(0)
			client.Close()
			up.Close()
		})
	}
	drain := func() {
		t := time.Now().Add(p.cfg.drain)
		client.SetDeadline(t)
		up.SetDeadline(t)
	}
	down := make(chan struct{})
	go func() {
		defer close(down)
		n, err := io.Copy(client, up)
		p.c.bytesDown.Add(n)
		if err != nil {
			abort()
			return
		}
		upstreamDone.Store(true)
		client.CloseWrite()
		drain()
	}()
	n, err := io.Copy(up, client)
	p.c.bytesUp.Add(n)
	activeClose = !upstreamDone.Load()
	if err != nil {
		abort()
	} else {
		up.CloseWrite()
		drain()
	}
	<-down
	return activeClose
}
