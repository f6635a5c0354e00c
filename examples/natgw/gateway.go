package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hash4/hash4"
)

// config is what a gateway needs; parseFlags builds it from the command line.
type config struct {
	inside      netip.AddrPort  // address clients send to; port 0 lets the OS choose
	outside     netip.Addr      // address the outside sockets bind to
	upstream    netip.AddrPort  // where every flow is forwarded
	ports       hash4.PortRange // outside source ports
	idle        time.Duration   // a flow with no datagram in either direction for this long expires
	maxFlows    int             // flows allowed at once
	maxDatagram int             // larger datagrams are dropped
}

// maxUDPPayload is the largest UDP payload over IPv4.
const maxUDPPayload = 65507

// connectAttempts bounds the ports one new flow tries when the OS refuses
// the ports ConnectFunc offers.
const connectAttempts = 8

// flow is one NAT mapping: a client address on the inside and the outside
// socket that carries its datagrams to the upstream.
type flow struct {
	client  netip.AddrPort // the client, as seen by the inside socket
	inside  hash4.Tuple    // key in the inside table: inside address -> client
	outside hash4.Tuple    // key in the outside table: outside IP:port -> upstream
	conn    *net.UDPConn   // bound to exactly outside.Local
	last    atomic.Int64   // unix nanoseconds of the last datagram, either way

	// mu orders the inside path's use of the flow against its expiry: the
	// janitor marks a flow dead under mu only if it is still idle, and the
	// inside path refreshes it under mu only if it is not dead. A dead flow
	// leaves the inside table after its outside socket is closed, by the
	// janitor's sweep or by the inside path, whichever comes first.
	mu   sync.Mutex
	dead bool
}

func (f *flow) touch(now time.Time) { f.last.Store(now.UnixNano()) }

// refusal is a port the OS refused to bind, held in the allocator so that
// ConnectFunc skips it until retry.
type refusal struct {
	port    uint16
	release func()
	retry   time.Time
}

// gateway is a user-space UDP NAT. Datagrams from a client to the inside
// socket leave through the client's own outside socket toward the upstream;
// datagrams from the upstream to that socket go back to the client.
//
// Two hash4 tables make the NAT. The inside table maps (inside address,
// client) to the flow. The outside table maps (outside IP:port, upstream) to
// the same flow; Table.ConnectFunc with a PortAllocator picks the outside
// port so that this 4-tuple is unique, as the kernel's connect() does, and
// the flow's outside socket is bound in its function, so that the flow is
// found only once its socket is ready.
type gateway struct {
	cfg        config
	in         *net.UDPConn
	insideAddr netip.AddrPort // the bound inside address (port resolved)
	network    string         // "udp4" or "udp6" for the outside sockets

	alloc   *hash4.PortAllocator
	inside  *hash4.Table[flow]
	outside *hash4.Table[flow]

	nflows  atomic.Int64 // live flows
	started atomic.Bool

	refMu    sync.Mutex
	refusals []refusal

	usedPorts [65536 / 64]atomic.Uint64 // ports that carried a flow at some time

	flowWG sync.WaitGroup // the outside readers

	c counters
}

// counters are the gateway's event counts.
type counters struct {
	flowsCreated, flowsExpired          atomic.Int64
	peakFlows                           atomic.Int64
	toUpstream, toClients               atomic.Int64
	oversizeIn, oversizeOut             atomic.Int64
	flowLimitDrops, noPortDrops         atomic.Int64
	portsRefused, portsReused           atomic.Int64
	unmatched, misrouted                atomic.Int64
	sendErrors, readErrors, socketError atomic.Int64
}

// stats is a snapshot of a gateway's counts.
type stats struct {
	FlowsActive  int   // flows alive now
	FlowsCreated int64 // flows ever created
	FlowsExpired int64 // flows closed for being idle
	PeakFlows    int64 // most flows alive at once
	PortsInUse   int   // outside sockets open (entries of the outside table)
	PortsHeld    int   // ports refused by the OS and held back for now
	PortsRefused int64 // times the OS refused an outside port (EADDRINUSE, EACCES)
	PortsReused  int64 // new flows on a port an earlier, expired flow used

	ToUpstream int64 // datagrams forwarded client -> upstream
	ToClients  int64 // datagrams forwarded upstream -> client

	OversizeIn     int64 // oversize datagrams from clients, dropped
	OversizeOut    int64 // oversize datagrams from the upstream, dropped
	FlowLimitDrops int64 // datagrams of new flows dropped at the flow limit
	NoPortDrops    int64 // datagrams of new flows dropped: no outside port free
	Unmatched      int64 // datagrams on an outside socket from anyone but its flow's upstream
	Misrouted      int64 // outside lookups that found another flow (must stay 0)
	SendErrors     int64 // failed sends
	ReadErrors     int64 // failed reads (other than on close)
	SocketErrors   int64 // outside sockets that could not be opened for other reasons
}

// newGateway checks cfg and binds the inside socket; run does the rest.
func newGateway(cfg config) (*gateway, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	alloc, err := hash4.NewPortAllocator(hash4.WithPortRange(cfg.ports))
	if err != nil {
		return nil, err
	}
	network := udpNetwork(cfg.outside)
	// Probe the outside address: a bind to port 0 fails now, with a clear
	// error, if the address is not one of this host's.
	probe, err := net.ListenUDP(network, net.UDPAddrFromAddrPort(netip.AddrPortFrom(cfg.outside, 0)))
	if err != nil {
		return nil, fmt.Errorf("outside address %v: %w", cfg.outside, err)
	}
	probe.Close()
	in, err := net.ListenUDP(udpNetwork(cfg.inside.Addr()), net.UDPAddrFromAddrPort(cfg.inside))
	if err != nil {
		return nil, fmt.Errorf("inside address %v: %w", cfg.inside, err)
	}
	in.SetReadBuffer(1 << 20) // all clients share it; the OS may cap this
	capacity := min(cfg.maxFlows, cfg.ports.Size())
	return &gateway{
		cfg:        cfg,
		in:         in,
		insideAddr: unmap(in.LocalAddr().(*net.UDPAddr).AddrPort()),
		network:    network,
		alloc:      alloc,
		inside:     hash4.New[flow](hash4.WithCapacity(capacity)),
		outside:    hash4.New[flow](hash4.WithCapacity(capacity)),
	}, nil
}

// check reports the first problem of cfg.
func (c config) check() error {
	switch {
	case !c.inside.IsValid() || c.inside.Addr().Unmap().IsUnspecified():
		return fmt.Errorf("inside address %v: need a concrete IP address", c.inside)
	case !c.outside.IsValid() || c.outside.Unmap().IsUnspecified():
		return fmt.Errorf("outside address %v: need a concrete IP address", c.outside)
	case !c.upstream.IsValid() || c.upstream.Addr().Unmap().IsUnspecified() || c.upstream.Port() == 0:
		return fmt.Errorf("upstream %v: need a concrete IP address and a port", c.upstream)
	case c.outside.Unmap().Is4() != c.upstream.Addr().Unmap().Is4():
		return fmt.Errorf("outside address %v and upstream %v: different address families", c.outside, c.upstream)
	case c.idle <= 0:
		return fmt.Errorf("idle timeout %v: must be positive", c.idle)
	case c.maxFlows < 1:
		return fmt.Errorf("flow limit %d: must be at least 1", c.maxFlows)
	case c.maxDatagram < 1 || c.maxDatagram > maxUDPPayload:
		return fmt.Errorf("datagram limit %d: must be in 1-%d", c.maxDatagram, maxUDPPayload)
	}
	return c.ports.Validate()
}

// addr returns the inside address clients send to.
func (g *gateway) addr() netip.AddrPort { return g.insideAddr }

// run forwards until ctx is done, then closes every socket, waits for every
// goroutine it started and returns. It may be called once.
func (g *gateway) run(ctx context.Context) error {
	if !g.started.CompareAndSwap(false, true) {
		return errors.New("gateway: run called twice")
	}
	insideDone := make(chan struct{})
	go func() {
		defer close(insideDone)
		g.readInside(ctx)
	}()
	janitorDone := make(chan struct{})
	go func() {
		defer close(janitorDone)
		g.janitor(ctx)
	}()

	<-ctx.Done()
	g.in.Close() // stops readInside: no flow is created after it returns
	<-insideDone
	<-janitorDone
	g.inside.DeleteFunc(func(_ hash4.Tuple, f *flow) bool { return g.expire(f, time.Time{}) })
	g.flowWG.Wait()
	g.refMu.Lock()
	for _, r := range g.refusals {
		r.release()
	}
	g.refusals = nil
	g.refMu.Unlock()
	return nil
}

// readInside reads client datagrams until the inside socket is closed.
func (g *gateway) readInside(ctx context.Context) {
	buf := make([]byte, g.cfg.maxDatagram+1)
	for {
		n, client, err := g.in.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) || ctx.Err() != nil {
				return
			}
			g.c.readErrors.Add(1)
			time.Sleep(time.Millisecond) // no busy loop on a persistent error
			continue
		}
		if n > g.cfg.maxDatagram {
			// Linux truncates to the buffer; a full buffer means too big.
			g.c.oversizeIn.Add(1)
			continue
		}
		g.toUpstream(unmap(client), buf[:n])
	}
}

// toUpstream forwards p from client through the client's flow, creating the
// flow if it has none.
func (g *gateway) toUpstream(client netip.AddrPort, p []byte) {
	key := hash4.Tuple{Local: g.insideAddr, Remote: client}
	// A second attempt only if the flow found expired under us.
	for range 2 {
		f, ok := g.inside.Lookup(key)
		if !ok {
			if f = g.newFlow(key); f == nil {
				return // dropped and counted
			}
		}
		now := time.Now()
		f.mu.Lock()
		if f.dead {
			f.mu.Unlock()
			// Expired under us, and perhaps not yet out of the table: a
			// newer flow of the client's, if the janitor's sweep came
			// first, stays.
			g.inside.CompareAndDelete(key, f)
			continue
		}
		f.touch(now)
		f.mu.Unlock()
		if _, err := f.conn.WriteToUDPAddrPort(p, g.cfg.upstream); err != nil {
			g.c.sendErrors.Add(1)
			return
		}
		g.c.toUpstream.Add(1)
		return
	}
}

// flowBindAddr returns the address a flow's outside socket binds: the
// configured outside address itself and the port ConnectFunc chose. N.B.
// the tuple ConnectFunc offers is in key form, without a zone, and a
// link-local address cannot be bound without its zone.
func flowBindAddr(outside netip.Addr, tup hash4.Tuple) netip.AddrPort {
	return netip.AddrPortFrom(outside, tup.Local.Port())
}

// newFlow creates the flow of key, or counts why it cannot and returns nil.
// Only readInside calls it, so flows are created one at a time.
func (g *gateway) newFlow(key hash4.Tuple) *flow {
	if g.nflows.Load() >= int64(g.cfg.maxFlows) {
		g.c.flowLimitDrops.Add(1)
		return nil
	}
	f := &flow{client: key.Remote, inside: key}
	refused := 0
	_, _, err := g.outside.ConnectFunc(g.alloc, g.cfg.outside, g.cfg.upstream, func(tup hash4.Tuple) (*flow, error) {
		// The tuple is held for this flow, and no lookup finds it until
		// this function returns the flow, socket and all.
		conn, err := net.ListenUDP(g.network, net.UDPAddrFromAddrPort(flowBindAddr(g.cfg.outside, tup)))
		if err == nil {
			f.outside, f.conn = tup, conn
			f.touch(time.Now())
			return f, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) && !errors.Is(err, syscall.EACCES) {
			return nil, err
		}
		// Another process has the port (or it is privileged): hold it so
		// that later flows skip it, and let ConnectFunc offer the next.
		g.c.portsRefused.Add(1)
		g.holdRefused(tup.Local)
		if refused++; refused >= connectAttempts {
			return nil, fmt.Errorf("%d ports refused: %w", refused, hash4.ErrNoPorts)
		}
		return nil, fmt.Errorf("%w: %v", hash4.ErrPortRefused, err)
	})
	if errors.Is(err, hash4.ErrNoPorts) {
		g.c.noPortDrops.Add(1)
		return nil
	}
	if err != nil {
		g.c.socketError.Add(1)
		return nil
	}
	if err := g.inside.Insert(key, f); err != nil {
		// Cannot happen: only this goroutine inserts, after a miss, and
		// a dead flow leaves the table before its client's next flow is
		// made.
		f.conn.Close()
		g.outside.Delete(f.outside)
		g.c.socketError.Add(1)
		return nil
	}
	port := f.outside.Local.Port()
	if old := g.usedPorts[port/64].Or(1 << (port % 64)); old&(1<<(port%64)) != 0 {
		g.c.portsReused.Add(1)
	}
	if n := g.nflows.Add(1); n > g.c.peakFlows.Load() {
		g.c.peakFlows.Store(n) // only this goroutine creates flows
	}
	g.c.flowsCreated.Add(1)
	g.flowWG.Add(1)
	go func() {
		defer g.flowWG.Done()
		g.readOutside(f)
	}()
	return f
}

// holdRefused holds local's port in the allocator until the next idle
// timeout, after which it is tried again.
func (g *gateway) holdRefused(local netip.AddrPort) {
	release, err := g.alloc.Bind(local)
	if err != nil {
		return // already held
	}
	g.refMu.Lock()
	g.refusals = append(g.refusals, refusal{port: local.Port(), release: release, retry: time.Now().Add(g.cfg.idle)})
	g.refMu.Unlock()
}

// readOutside reads f's outside socket until it is closed and sends what
// the upstream says back to f's client.
func (g *gateway) readOutside(f *flow) {
	buf := make([]byte, g.cfg.maxDatagram+1)
	for {
		n, from, err := f.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			g.c.readErrors.Add(1)
			time.Sleep(time.Millisecond)
			continue
		}
		// The table is the demultiplexer: only (this port, upstream) is a
		// flow; anyone else writing to the port finds nothing.
		owner, ok := g.outside.Lookup(hash4.Tuple{Local: f.outside.Local, Remote: unmap(from)})
		if !ok {
			g.c.unmatched.Add(1)
			continue
		}
		if owner != f {
			g.c.misrouted.Add(1)
			continue
		}
		if n > g.cfg.maxDatagram {
			g.c.oversizeOut.Add(1)
			continue
		}
		owner.touch(time.Now())
		if _, err := g.in.WriteToUDPAddrPort(buf[:n], owner.client); err != nil {
			g.c.sendErrors.Add(1)
			continue
		}
		g.c.toClients.Add(1)
	}
}

// janitor expires idle flows and retries refused ports until ctx is done.
func (g *gateway) janitor(ctx context.Context) {
	tick := time.NewTicker(max(g.cfg.idle/4, time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			// The sweep: DeleteFunc removes from the inside table each
			// flow that expire closed, unless the inside path did first.
			g.inside.DeleteFunc(func(_ hash4.Tuple, f *flow) bool {
				if !g.expire(f, now) {
					return false
				}
				g.c.flowsExpired.Add(1)
				return true
			})
			g.refMu.Lock()
			keep := g.refusals[:0]
			for _, r := range g.refusals {
				if now.Before(r.retry) {
					keep = append(keep, r)
				} else {
					r.release()
				}
			}
			clear(g.refusals[len(keep):])
			g.refusals = keep
			g.refMu.Unlock()
		}
	}
}

// expire closes f if it has been idle for the timeout at now, or
// unconditionally if now is zero, and reports whether it did: it marks f
// dead, closes its outside socket and removes its outside entry. The
// caller removes its inside entry (see flow.mu).
func (g *gateway) expire(f *flow, now time.Time) bool {
	f.mu.Lock()
	if f.dead || (!now.IsZero() && now.UnixNano()-f.last.Load() < int64(g.cfg.idle)) {
		f.mu.Unlock()
		return false
	}
	f.dead = true
	f.mu.Unlock()
	// Close before freeing the port, so that a new flow given this port
	// can bind it. Only f's own outside entry is removed, never a newer
	// flow's on the same 4-tuple.
	f.conn.Close()
	g.outside.CompareAndDelete(f.outside, f)
	g.nflows.Add(-1)
	return true
}

// stats returns the gateway's counts.
func (g *gateway) stats() stats {
	g.refMu.Lock()
	held := len(g.refusals)
	g.refMu.Unlock()
	return stats{
		FlowsActive:    int(g.nflows.Load()),
		FlowsCreated:   g.c.flowsCreated.Load(),
		FlowsExpired:   g.c.flowsExpired.Load(),
		PeakFlows:      g.c.peakFlows.Load(),
		PortsInUse:     g.outside.Len(),
		PortsHeld:      held,
		PortsRefused:   g.c.portsRefused.Load(),
		PortsReused:    g.c.portsReused.Load(),
		ToUpstream:     g.c.toUpstream.Load(),
		ToClients:      g.c.toClients.Load(),
		OversizeIn:     g.c.oversizeIn.Load(),
		OversizeOut:    g.c.oversizeOut.Load(),
		FlowLimitDrops: g.c.flowLimitDrops.Load(),
		NoPortDrops:    g.c.noPortDrops.Load(),
		Unmatched:      g.c.unmatched.Load(),
		Misrouted:      g.c.misrouted.Load(),
		SendErrors:     g.c.sendErrors.Load(),
		ReadErrors:     g.c.readErrors.Load(),
		SocketErrors:   g.c.socketError.Load(),
	}
}

// flows returns the live flows' clients and outside ports.
func (g *gateway) flows() map[netip.AddrPort]uint16 {
	m := make(map[netip.AddrPort]uint16)
	for _, f := range g.inside.All() {
		m[f.client] = f.outside.Local.Port()
	}
	return m
}

// udpNetwork returns "udp4" for an IPv4 or IPv4-mapped address, "udp6"
// for any other: a mapped address is bound as the IPv4 address it maps.
func udpNetwork(a netip.Addr) string {
	if a.Unmap().Is4() {
		return "udp4"
	}
	return "udp6"
}

// unmap returns a with an IPv4-mapped address in its IPv4 form.
func unmap(a netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
}
