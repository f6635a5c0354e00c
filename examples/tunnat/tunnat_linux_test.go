package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hash4/hash4"
	"github.com/hash4/hash4/nat"
	"golang.org/x/sys/unix"
)

// These tests build real topologies: they need Linux, root, /dev/net/tun
// and ip, and skip, saying why, without them.

// needTopology skips the test if the topology cannot be built here.
func needTopology(t *testing.T, tools ...string) {
	t.Helper()
	if err := checkEnv(tools...); err != nil {
		t.Skip(err)
	}
}

// testTimeouts are short timeouts for the tests.
var testTimeouts = nat.Timeouts{UDP: 30 * time.Second, UDPUnreplied: 30 * time.Second, ICMP: 30 * time.Second,
	TCPSynSent: 30 * time.Second, TCPEstablished: time.Hour, TCPFinWait: 30 * time.Second, TCPTimeWait: 30 * time.Second,
	TCPClose: 30 * time.Second}

// startTestNAT builds a topology and runs a NAT over ports with to; both
// go away when the test ends.
func startTestNAT(t *testing.T, ports hash4.PortRange, to nat.Timeouts) (*topology, *gateway) {
	t.Helper()
	topo, err := newTUNTopology(defaultQueues())
	t.Cleanup(func() {
		if err := topo.close(); err != nil {
			t.Errorf("removing the topology: %v", err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	g, err := startGateway(natConfig{ports: ports, maxFlows: 10000, timeouts: to}, topo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.close)
	return topo, g
}

// peers records the client addresses a test server saw.
type peers struct {
	mu   sync.Mutex
	seen []netip.AddrPort
}

func (p *peers) add(a netip.AddrPort) {
	p.mu.Lock()
	p.seen = append(p.seen, netip.AddrPortFrom(a.Addr().Unmap(), a.Port()))
	p.mu.Unlock()
}

func (p *peers) list() []netip.AddrPort {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]netip.AddrPort(nil), p.seen...)
}

// startEchoes runs a TCP echo and a UDP echo in the server namespace on
// serverAddr4:port, recording their peers, until the test ends.
func startEchoes(t *testing.T, topo *topology, port uint16) (tcpPeers, udpPeers *peers) {
	t.Helper()
	addr := netip.AddrPortFrom(serverAddr4, port).String()
	var ln net.Listener
	var pc net.PacketConn
	if err := inNetns(topo.server, func() error {
		var err error
		if ln, err = net.Listen("tcp4", addr); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp4", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	tcpPeers, udpPeers = &peers{}, &peers{}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tcpPeers.add(c.RemoteAddr().(*net.TCPAddr).AddrPort())
			wg.Go(func() { io.Copy(c, c); c.Close() })
		}
	})
	wg.Go(func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			udpPeers.add(from.(*net.UDPAddr).AddrPort())
			pc.WriteTo(buf[:n], from)
		}
	})
	t.Cleanup(func() { ln.Close(); pc.Close(); wg.Wait() })
	return tcpPeers, udpPeers
}

// dialIn opens a connection of network ("tcp4", "udp4") from the client
// namespace to addr.
func dialIn(topo *topology, network string, addr netip.AddrPort) (net.Conn, error) {
	var c net.Conn
	err := inNetns(topo.client, func() error {
		var err error
		c, err = net.DialTimeout(network, addr.String(), 5*time.Second)
		return err
	})
	return c, err
}

// udpExchange sends msg on c and waits for its echo, trying tries times
// with timeout each.
func udpExchange(c net.Conn, msg []byte, tries int, timeout time.Duration) error {
	buf := make([]byte, len(msg)+64)
	var stale []byte
	for range tries {
		if _, err := c.Write(msg); err != nil {
			return err
		}
		c.SetReadDeadline(time.Now().Add(timeout))
		for {
			n, err := c.Read(buf)
			if err != nil {
				if !errors.Is(err, context.DeadlineExceeded) && !isTimeout(err) {
					return err
				}
				break // resend
			}
			if bytes.Equal(buf[:n], msg) {
				return nil
			}
			// The echo of an earlier datagram, resent when its echo came
			// late: read on.
			stale = append(stale[:0], buf[:n]...)
		}
	}
	if stale != nil {
		return fmt.Errorf("no echo of %q after %d tries; last read %q", msg, tries, stale)
	}
	return fmt.Errorf("no echo after %d tries", tries)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// The demo, short, passes, and leaves no namespace behind.
func TestDemo(t *testing.T) {
	needTopology(t, demoTools...)
	var out, prog bytes.Buffer
	o := options{duration: time.Second, queues: defaultQueues(), nat: natConfig{ports: hash4.PortRange{Low: 1024, High: 65535}, maxFlows: 1000, timeouts: testTimeouts,
		filtering: nat.AddressDependent}}
	res, err := runDemo(context.Background(), o, &out, &prog)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Logf("demo:\n%s", out.String())
	if !res.ok() || !strings.Contains(out.String(), "PASS") {
		t.Errorf("demo failed")
	}
	if res.nat.FlowsCreated < 10 || res.nat.PktsOut == 0 || res.nat.PktsIn == 0 {
		t.Errorf("NAT counters: %v", res.nat)
	}
	if strings.Count(prog.String(), "\n") < 1 {
		t.Errorf("no progress line:\n%s", prog.String())
	}
	assertNoNamespaces(t)
}

// assertNoNamespaces fails if a namespace of this process is left, but for
// those of tests still running (none run in parallel here).
func assertNoNamespaces(t *testing.T) {
	t.Helper()
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatal(err)
	}
	if mine := fmt.Sprintf("%s%d-", nsPrefix, os.Getpid()); strings.Contains(string(out), mine) {
		t.Errorf("namespaces left behind:\n%s", out)
	}
}

// Many TCP and UDP flows at once: every byte comes back, the server sees
// each flow from its own external port, and the NAT made one flow each.
func TestManyFlows(t *testing.T) {
	needTopology(t)
	topo, g := startTestNAT(t, hash4.PortRange{Low: 20000, High: 29999}, testTimeouts)
	tcpPeers, udpPeers := startEchoes(t, topo, 9000)
	server := netip.AddrPortFrom(serverAddr4, 9000)
	const flows = 48
	var wg sync.WaitGroup
	errs := make(chan error, 2*flows)
	for i := range flows {
		wg.Go(func() {
			c, err := dialIn(topo, "tcp4", server)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			data := bytes.Repeat([]byte{byte(i)}, 64<<10)
			go c.Write(data)
			c.SetReadDeadline(time.Now().Add(20 * time.Second))
			got := make([]byte, len(data))
			if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, data) {
				errs <- fmt.Errorf("TCP flow %d: %v, data intact %v", i, err, bytes.Equal(got, data))
			}
		})
		wg.Go(func() {
			c, err := dialIn(topo, "udp4", server)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			for j := range 10 {
				if err := udpExchange(c, fmt.Appendf(nil, "flow %d datagram %d", i, j), 5, time.Second); err != nil {
					errs <- fmt.Errorf("UDP flow %d: %v", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for name, p := range map[string]*peers{"TCP": tcpPeers, "UDP": udpPeers} {
		ports := map[uint16]bool{}
		for _, a := range p.list() {
			if a.Addr() != extAddr4 || a.Port() < 20000 || a.Port() > 29999 {
				t.Errorf("%s server saw %v", name, a)
			}
			ports[a.Port()] = true
		}
		if len(ports) != flows {
			t.Errorf("%s server saw %d external ports, want %d", name, len(ports), flows)
		}
	}
	if s := g.stats(); s.FlowsCreated != 2*flows || s.Drops[nat.DropNoPort] != 0 {
		t.Errorf("NAT: %v; want %d flows", s, 2*flows)
	}
}

// With four external ports, a fifth UDP flow is dropped and counted, and
// the four go on.
func TestPortExhaustion(t *testing.T) {
	needTopology(t)
	topo, g := startTestNAT(t, hash4.PortRange{Low: 30000, High: 30003}, testTimeouts)
	_, udpPeers := startEchoes(t, topo, 9000)
	server := netip.AddrPortFrom(serverAddr4, 9000)
	var conns []net.Conn
	for i := range 4 {
		c, err := dialIn(topo, "udp4", server)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := udpExchange(c, fmt.Appendf(nil, "flow %d", i), 5, time.Second); err != nil {
			t.Fatalf("flow %d: %v", i, err)
		}
		conns = append(conns, c)
	}
	extra, err := dialIn(topo, "udp4", server)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	if err := udpExchange(extra, []byte("one too many"), 2, 200*time.Millisecond); err == nil {
		t.Error("a fifth flow got through four ports")
	}
	// The NAT answers the refused flow with "administratively prohibited"
	// (RFC 5508 REQ-8), which ends the client's tries at the first.
	// The error can reach the client before the pump counts the drop.
	for deadline := time.Now().Add(5 * time.Second); g.stats().Drops[nat.DropNoPort] < 1 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if s := g.stats(); s.Drops[nat.DropNoPort] < 1 || s.Flows != 4 {
		t.Errorf("NAT: %v; want no-port drops and 4 flows", s)
	}
	for i, c := range conns {
		if err := udpExchange(c, fmt.Appendf(nil, "flow %d again", i), 5, time.Second); err != nil {
			t.Errorf("existing flow %d after exhaustion: %v", i, err)
		}
	}
	for _, a := range udpPeers.list() {
		if a.Port() < 30000 || a.Port() > 30003 {
			t.Errorf("server saw %v", a)
		}
	}
}

// With one external port, a UDP flow and a reset TCP flow expire after
// their timeouts, and new flows take the port again.
func TestExpiryAndReuse(t *testing.T) {
	needTopology(t)
	to := testTimeouts
	to.UDP, to.UDPUnreplied, to.TCPClose = 200*time.Millisecond, 200*time.Millisecond, 200*time.Millisecond
	topo, g := startTestNAT(t, hash4.PortRange{Low: 30000, High: 30000}, to)
	tcpPeers, udpPeers := startEchoes(t, topo, 9000)
	server := netip.AddrPortFrom(serverAddr4, 9000)

	waitExpired := func(n int64) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); g.stats().Expired[nat.ExpiredTimeout] < uint64(n); {
			if time.Now().After(deadline) {
				t.Fatalf("flows not expired: %v", g.stats())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for i := range 3 {
		c, err := dialIn(topo, "udp4", server)
		if err != nil {
			t.Fatal(err)
		}
		err = udpExchange(c, fmt.Appendf(nil, "round %d", i), 5, time.Second)
		c.Close()
		if err != nil {
			t.Fatalf("UDP round %d: %v", i, err)
		}
		waitExpired(int64(i + 1))
	}
	for i := range 2 {
		c, err := dialIn(topo, "tcp4", server)
		if err != nil {
			t.Fatalf("TCP round %d: %v", i, err)
		}
		msg := fmt.Appendf(nil, "tcp %d", i)
		c.Write(msg)
		got := make([]byte, len(msg))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(c, got); err != nil {
			t.Fatalf("TCP round %d: %v", i, err)
		}
		c.(*net.TCPConn).SetLinger(0) // close with RST
		c.Close()
		waitExpired(int64(3 + i + 1))
	}
	for _, p := range append(udpPeers.list(), tcpPeers.list()...) {
		if p != netip.AddrPortFrom(extAddr4, 30000) {
			t.Errorf("server saw %v, want every flow from %v:30000", p, extAddr4)
		}
	}
	if len(udpPeers.list()) != 3 || len(tcpPeers.list()) != 2 {
		t.Errorf("server saw %d UDP and %d TCP flows, want 3 and 2", len(udpPeers.list()), len(tcpPeers.list()))
	}
	if s := g.stats(); s.FlowsCreated != 5 || s.Expired[nat.ExpiredTimeout] != 5 || s.Flows != 0 {
		t.Errorf("NAT: %v", s)
	}
}

// Malformed and truncated packets, packets a router refuses (a bad header
// checksum, a source route, TCP data offsets of 2 and 15) and unknown
// protocols sent into the client's device are counted and dropped, and
// the NAT goes on.
func TestBadPackets(t *testing.T) {
	needTopology(t)
	topo, g := startTestNAT(t, hash4.PortRange{Low: 30000, High: 30099}, testTimeouts)
	startEchoes(t, topo, 9000)
	server := netip.AddrPortFrom(serverAddr4, 9000)

	src := netip.AddrPortFrom(clientAddr4, 40000)
	udp := ipv4Packet(17, src, server, []byte{0, 0, 0, 0, 0, 0, 0, 0, 'x'}, nil)
	gre := ipv4Packet(47, src, server, []byte("xxxxxxxx"), nil)
	short := ipv4Packet(17, src, server, []byte{1, 2, 3, 4}, nil)
	badSum := bytes.Clone(udp)
	badSum[10] ^= 0xff
	lsrr := ipv4Packet(17, src, server, []byte{0, 0, 0, 0, 0, 0, 0, 0, 'x'}, []byte{0x83, 7, 4, 10, 48, 1, 1, 0})
	tcpOff2 := ipv4Packet(6, src, server, append([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2 << 4, 2}, make([]byte, 6)...), nil)
	tcpOff15 := ipv4Packet(6, src, server, append([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15 << 4, 2}, make([]byte, 6)...), nil)
	sends := []struct {
		b     []byte
		count nat.Drop
	}{
		{udp[:len(udp)-3], nat.DropMalformed},            // cut short of its length
		{[]byte{0x45, 0, 0}, nat.DropMalformed},          // a header's start
		{[]byte{0x95, 1, 2, 3, 4, 5}, nat.DropMalformed}, // no IP version at all
		{short, nat.DropMalformed},                       // a UDP header cut short
		{badSum, nat.DropChecksum},
		{lsrr, nat.DropOptions},
		{tcpOff2, nat.DropBadTCP},
		{tcpOff15, nat.DropBadTCP},
		{gre, nat.DropUnsupported},
	}
	fd, ifindex := packetSocket(t, topo.client)
	want := map[nat.Drop]uint64{}
	for _, s := range sends {
		sa := &unix.SockaddrLinklayer{Ifindex: ifindex, Protocol: htons(unix.ETH_P_IP)}
		if err := unix.Sendto(fd, s.b, 0, sa); err != nil {
			t.Fatalf("send %x: %v", s.b, err)
		}
		want[s.count]++
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		s := g.stats()
		ok := true
		for r, n := range want {
			ok = ok && s.Drops[r] == n
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("drops %v, want %v", s, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	c, err := dialIn(topo, "udp4", server)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := udpExchange(c, []byte("still working"), 5, time.Second); err != nil {
		t.Errorf("after the bad packets: %v", err)
	}
	if s := g.stats(); s.FlowsCreated != 1 {
		t.Errorf("NAT: %v; want 1 flow, the good one", s)
	}
}

// packetSocket returns a packet socket in namespace ns and the index of
// its TUN device, to send raw IP packets into the device.
func packetSocket(t *testing.T, ns string) (fd, ifindex int) {
	t.Helper()
	err := inNetns(ns, func() error {
		var err error
		if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0); err != nil {
			return err
		}
		ifi, err := net.InterfaceByName("tun0")
		if err != nil {
			return err
		}
		ifindex = ifi.Index
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd, ifindex
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// ipv4Packet builds an IPv4 packet of protocol proto from src to dst with
// transport header and payload l4 (its ports and, for UDP and TCP, its
// checksum filled in) and IP options opts, checksums computed in full.
func ipv4Packet(proto uint8, src, dst netip.AddrPort, l4, opts []byte) []byte {
	l4 = bytes.Clone(l4)
	ihl := 20 + len(opts)
	b := make([]byte, ihl+len(l4))
	b[0] = 0x40 | byte(ihl/4)
	binary.BigEndian.PutUint16(b[2:], uint16(len(b)))
	b[8], b[9] = 64, proto
	s4, d4 := src.Addr().As4(), dst.Addr().As4()
	copy(b[12:], s4[:])
	copy(b[16:], d4[:])
	copy(b[20:], opts)
	binary.BigEndian.PutUint16(b[10:], inetChecksum(b[:ihl], 0))
	if len(l4) >= 8 {
		binary.BigEndian.PutUint16(l4[0:], src.Port())
		binary.BigEndian.PutUint16(l4[2:], dst.Port())
	}
	off := -1
	switch {
	case proto == 17 && len(l4) >= 8:
		binary.BigEndian.PutUint16(l4[4:], uint16(len(l4)))
		off = 6
	case proto == 6 && len(l4) >= 18:
		off = 16
	}
	if off >= 0 {
		pseudo := uint32(binary.BigEndian.Uint16(s4[:2])) + uint32(binary.BigEndian.Uint16(s4[2:])) +
			uint32(binary.BigEndian.Uint16(d4[:2])) + uint32(binary.BigEndian.Uint16(d4[2:])) + uint32(proto) + uint32(len(l4))
		binary.BigEndian.PutUint16(l4[off:], inetChecksum(l4, pseudo))
	}
	copy(b[ihl:], l4)
	return b
}
