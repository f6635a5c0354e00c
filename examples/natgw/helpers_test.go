package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/hash4/hash4"
)

var loopback = netip.MustParseAddr("127.0.0.1")

// testConfig returns a gateway config on loopback toward upstream.
func testConfig(upstream netip.AddrPort, ports hash4.PortRange) config {
	return config{
		inside:      netip.AddrPortFrom(loopback, 0),
		outside:     loopback,
		upstream:    upstream,
		ports:       ports,
		idle:        10 * time.Second,
		maxFlows:    1000,
		maxDatagram: 1472,
	}
}

// startGateway runs a gateway until the returned stop is called (or the
// test ends); stop returns once run has returned.
func startGateway(t *testing.T, cfg config) (*gateway, func()) {
	t.Helper()
	gw, err := newGateway(cfg)
	if err != nil {
		t.Fatalf("newGateway: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gw.run(ctx) }()
	stop := sync.OnceFunc(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("run did not return within 5s of cancel")
		}
	})
	t.Cleanup(stop)
	return gw, stop
}

// upstream is a UDP server on loopback that answers with reply(p), after
// delay(p) if that is positive, and records who sent what.
type upstream struct {
	conn  *net.UDPConn
	reply func(p []byte) []byte
	delay func(p []byte) time.Duration
	wg    sync.WaitGroup

	mu      sync.Mutex
	sources map[netip.AddrPort]int
}

// startUpstream starts an echo upstream.
func startUpstream(t *testing.T) *upstream { return startUpstreamWith(t, nil, nil) }

// startUpstreamWith starts an upstream on 127.0.0.1 that answers with
// reply(p) (p if reply is nil), after delay(p) if delay is not nil.
func startUpstreamWith(t *testing.T, reply func(p []byte) []byte, delay func(p []byte) time.Duration) *upstream {
	return startUpstreamOn(t, loopback, reply, delay)
}

// startUpstreamOn is startUpstreamWith on the address at.
func startUpstreamOn(t *testing.T, at netip.Addr, reply func(p []byte) []byte, delay func(p []byte) time.Duration) *upstream {
	t.Helper()
	conn, err := net.ListenUDP(udpNetwork(at), net.UDPAddrFromAddrPort(netip.AddrPortFrom(at, 0)))
	if err != nil {
		t.Fatal(err)
	}
	conn.SetReadBuffer(1 << 20)
	u := &upstream{conn: conn, reply: reply, delay: delay, sources: map[netip.AddrPort]int{}}
	u.wg.Go(func() {
		buf := make([]byte, 64<<10)
		for {
			n, from, err := conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue
			}
			p := bytes.Clone(buf[:n])
			u.mu.Lock()
			u.sources[from]++
			u.mu.Unlock()
			out := p
			if u.reply != nil {
				out = u.reply(p)
			}
			if u.delay != nil {
				if d := u.delay(p); d > 0 {
					u.wg.Go(func() {
						time.Sleep(d)
						conn.WriteToUDPAddrPort(out, from)
					})
					continue
				}
			}
			conn.WriteToUDPAddrPort(out, from)
		}
	})
	t.Cleanup(u.close)
	return u
}

func (u *upstream) addr() netip.AddrPort { return u.conn.LocalAddr().(*net.UDPAddr).AddrPort() }

func (u *upstream) close() {
	u.conn.Close()
	u.wg.Wait()
}

func (u *upstream) sourcePorts() map[uint16]bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	m := map[uint16]bool{}
	for a := range u.sources {
		m[a.Port()] = true
	}
	return m
}

// client is a UDP socket on loopback talking to a gateway.
type client struct {
	t    testing.TB
	conn *net.UDPConn
	gw   netip.AddrPort
}

// newClient returns a client of gw on the loopback address of gw's family.
func newClient(t testing.TB, gw netip.AddrPort) *client {
	t.Helper()
	conn, err := listenLoopback(gw)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &client{t: t, conn: conn, gw: gw}
}

func (c *client) addr() netip.AddrPort { return c.conn.LocalAddr().(*net.UDPAddr).AddrPort() }

func (c *client) send(p []byte) error {
	_, err := c.conn.WriteToUDPAddrPort(p, c.gw)
	return err
}

// recv returns the next datagram, or false after timeout.
func (c *client) recv(timeout time.Duration) ([]byte, bool) {
	buf := make([]byte, 64<<10)
	c.conn.SetReadDeadline(time.Now().Add(timeout))
	n, from, err := c.conn.ReadFromUDPAddrPort(buf)
	if err != nil {
		return nil, false
	}
	if unmap(from) != c.gw {
		return []byte(fmt.Sprintf("datagram from %v, not the gateway", from)), true
	}
	return buf[:n], true
}

// roundTrip sends p and checks that exactly p comes back within timeout.
func (c *client) roundTrip(p []byte, timeout time.Duration) error {
	if err := c.send(p); err != nil {
		return err
	}
	got, ok := c.recv(timeout)
	if !ok {
		return fmt.Errorf("client %v: no reply to %q within %v", c.addr(), p, timeout)
	}
	if !bytes.Equal(got, p) {
		return fmt.Errorf("client %v: sent %q, got %q", c.addr(), p, got)
	}
	return nil
}

// waitFor polls cond every 5ms until it holds or timeout passes.
func waitFor(timeout time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(timeout); ; time.Sleep(5 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// portsOf returns the outside ports of the gateway's live flows.
func portsOf(gw *gateway) map[uint16]bool {
	m := map[uint16]bool{}
	for _, p := range gw.flows() {
		m[p] = true
	}
	return m
}

func inRange(r hash4.PortRange, p uint16) bool { return r.Low <= p && p <= r.High }

// canBind reports whether a UDP socket can bind local now.
func canBind(local netip.AddrPort) bool {
	c, err := net.ListenUDP(udpNetwork(local.Addr()), net.UDPAddrFromAddrPort(local))
	if err != nil {
		return false
	}
	c.Close()
	return true
}
