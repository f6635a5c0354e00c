package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hash4/hash4"
	"golang.org/x/sys/unix"
)

// capture is a packet socket on a namespace's tun0 (raw: a TUN device has
// no link header; a virtio-net header needs a raw socket) that keeps, with its
// virtio-net header, each packet the device receives: those tunnat writes
// to it.
type capture struct {
	fd   int
	mu   sync.Mutex
	pkts []captured
	done chan struct{}
	stop atomic.Bool
}

// captured is a packet and what its virtio-net header said.
type captured struct {
	gsoType, flags        uint8
	gsoSize               uint16
	csumStart, csumOffset uint16
	pkt                   []byte
}

// startCapture opens a capture on tun0 in namespace ns, until the test
// ends.
func startCapture(t *testing.T, ns string) *capture {
	t.Helper()
	c := &capture{done: make(chan struct{})}
	err := inNetns(ns, func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return err
		}
		c.fd = fd
		ifi, err := net.InterfaceByName("tun0")
		if err != nil {
			return err
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_VNET_HDR, 1); err != nil {
			return err
		}
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 16<<20)
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 50000})
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index})
	})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(c.done)
		buf := make([]byte, 10+65536)
		for !c.stop.Load() {
			n, from, err := unix.Recvfrom(c.fd, buf, 0)
			if err != nil || n < 10 {
				continue
			}
			if ll, ok := from.(*unix.SockaddrLinklayer); !ok || ll.Pkttype == unix.PACKET_OUTGOING {
				continue // what the namespace sends into the device
			}
			c.mu.Lock()
			c.pkts = append(c.pkts, captured{flags: buf[0], gsoType: buf[1], gsoSize: binary.LittleEndian.Uint16(buf[4:]),
				csumStart: binary.LittleEndian.Uint16(buf[6:]), csumOffset: binary.LittleEndian.Uint16(buf[8:]), pkt: bytes.Clone(buf[10:n])})
			c.mu.Unlock()
		}
	}()
	t.Cleanup(func() { c.end(); unix.Close(c.fd) })
	return c
}

// end stops the capture and returns what it kept.
func (c *capture) end() []captured {
	if c.stop.CompareAndSwap(false, true) {
		<-c.done
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pkts
}

// check verifies a captured TCP or UDP packet's transport checksum from
// scratch: a partial one (NEEDS_CSUM) must hold the folded pseudo-header
// sum of the packet's addresses and transport length, which the receiver
// completes over the segment (or each segment of a GSO packet); a full one
// must verify over the whole segment. It returns the packet's source
// address and transport protocol.
func (c captured) check() (src netip.Addr, proto uint8, err error) {
	b := c.pkt
	var dst netip.Addr
	var l4 []byte
	switch {
	case len(b) >= 20 && b[0]>>4 == 4:
		ihl := int(b[0]&0xf) * 4
		if inetChecksum(b[:ihl], 0) != 0 {
			return src, 0, fmt.Errorf("IPv4 header checksum")
		}
		src, dst, proto = netip.AddrFrom4([4]byte(b[12:16])), netip.AddrFrom4([4]byte(b[16:20])), b[9]
		l4 = b[ihl:binary.BigEndian.Uint16(b[2:])]
	case len(b) >= 40 && b[0]>>4 == 6:
		src, dst, proto = netip.AddrFrom16([16]byte(b[8:24])), netip.AddrFrom16([16]byte(b[24:40])), b[6]
		l4 = b[40 : 40+int(binary.BigEndian.Uint16(b[4:]))]
	default:
		return src, 0, fmt.Errorf("not an IP packet")
	}
	off := 16
	if proto == unix.IPPROTO_UDP {
		off = 6
	} else if proto != unix.IPPROTO_TCP {
		return src, proto, nil
	}
	var pseudo uint32
	for _, a := range []netip.Addr{src, dst} {
		s := a.AsSlice()
		for i := 0; i < len(s); i += 2 {
			pseudo += uint32(binary.BigEndian.Uint16(s[i:]))
		}
	}
	pseudo += uint32(proto) + uint32(len(l4))
	if c.flags&unix.VIRTIO_NET_HDR_F_NEEDS_CSUM == 0 {
		if s := inetChecksum(l4, pseudo); s != 0 {
			return src, proto, fmt.Errorf("protocol %d: the checksum does not verify (%#04x)", proto, s)
		}
		return src, proto, nil
	}
	if int(c.csumStart)+int(c.csumOffset) != len(b)-len(l4)+off {
		return src, proto, fmt.Errorf("checksum at %d+%d, the field is at %d", c.csumStart, c.csumOffset, len(b)-len(l4)+off)
	}
	if got, want := binary.BigEndian.Uint16(l4[off:]), ^inetChecksum(nil, pseudo); got != want {
		return src, proto, fmt.Errorf("protocol %d: partial checksum %#04x, the pseudo-header's is %#04x", proto, got, want)
	}
	return src, proto, nil
}

// GSO super-packets read from either device are translated, and what
// tunnat writes, segments coalesced (GRO) or not, carries checksums the
// receiver can trust: captured with their virtio-net headers on the
// devices, partial checksums hold the translated pseudo-header's sum and
// full ones (raw datagrams) verify from scratch; a TCP echo of 8 MiB comes
// back whole, and a UDP GSO send of 32 datagrams arrives as 32 intact
// datagrams.
func TestOffloadChecksums(t *testing.T) {
	needTopology(t)
	topo, g := startTestNAT(t, hash4.PortRange{Low: 20000, High: 29999}, testTimeouts)
	_, udpPeers := startEchoes(t, topo, 9000)
	server := startCapture(t, topo.server)
	client := startCapture(t, topo.client)

	// TCP both ways: the upload's segments are read from the inside device
	// and written to the outside one, the echo's the other way.
	c, err := dialIn(topo, "tcp4", netip.AddrPortFrom(serverAddr4, 9000))
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 8<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	go c.Write(data)
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	got := make([]byte, len(data))
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, data) {
		t.Errorf("TCP echo: %v, intact %v", err, bytes.Equal(got, data))
	}
	c.Close()

	// UDP with segmentation offload: one send of 32 datagrams of 1000
	// bytes, one GSO super-packet on the inside device.
	var pc net.PacketConn
	if err := inNetns(topo.server, func() error {
		var err error
		pc, err = net.ListenPacket("udp4", netip.AddrPortFrom(serverAddr4, 9500).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	u, err := dialIn(topo, "udp4", netip.AddrPortFrom(serverAddr4, 9500))
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	raw, _ := u.(*net.UDPConn).SyscallConn()
	raw.Control(func(fd uintptr) { err = unix.SetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_SEGMENT, 1000) })
	if err != nil {
		t.Fatal(err)
	}
	const datagrams = 32
	burst := make([]byte, datagrams*1000)
	for i := range burst {
		burst[i] = byte(i / 1000)
	}
	if _, err := u.Write(burst); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2000)
	for i := range datagrams {
		pc.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, _, err := pc.ReadFrom(buf)
		if err != nil || !bytes.Equal(buf[:n], burst[i*1000:(i+1)*1000]) {
			t.Fatalf("UDP datagram %d: %v, %d bytes, intact %v", i, err, n, err == nil && bytes.Equal(buf[:n], burst[i*1000:(i+1)*1000]))
		}
	}

	// The local stacks leave every checksum partial: a datagram with a
	// full one each way, sent raw into the devices, has its checksum
	// updated in full.
	cfd, cif := packetSocket(t, topo.client)
	sfd, sif := packetSocket(t, topo.server)
	udp := []byte{0, 0, 0, 0, 0, 0, 0, 0, 'f', 'u', 'l', 'l'}
	send := func(fd, ifindex int, b []byte) {
		if err := unix.Sendto(fd, b, 0, &unix.SockaddrLinklayer{Ifindex: ifindex, Protocol: htons(unix.ETH_P_IP)}); err != nil {
			t.Fatal(err)
		}
	}
	send(cfd, cif, ipv4Packet(unix.IPPROTO_UDP, netip.AddrPortFrom(clientAddr4, 41000), netip.AddrPortFrom(serverAddr4, 9000), udp, nil))
	for deadline := time.Now().Add(5 * time.Second); len(udpPeers.list()) == 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if len(udpPeers.list()) == 0 {
		t.Fatal("the raw datagram did not arrive")
	}
	send(sfd, sif, ipv4Packet(unix.IPPROTO_UDP, netip.AddrPortFrom(serverAddr4, 9000), udpPeers.list()[0], udp, nil))
	time.Sleep(100 * time.Millisecond) // the captures' last reads

	for _, side := range []struct {
		name string
		c    *capture
		src  netip.Addr
	}{{"written to the server's device", server, extAddr4}, {"written to the client's device", client, serverAddr4}} {
		var tcpGSO, udpGSO, full, partial int
		for _, p := range side.c.end() {
			src, proto, err := p.check()
			if err != nil {
				t.Errorf("%s: %v: %x", side.name, err, p.pkt[:min(len(p.pkt), 64)])
				continue
			}
			if proto != unix.IPPROTO_TCP && proto != unix.IPPROTO_UDP {
				continue
			}
			if src != side.src {
				t.Errorf("%s: a packet from %v", side.name, src)
			}
			switch {
			case p.gsoType == unix.VIRTIO_NET_HDR_GSO_TCPV4:
				tcpGSO++
			case p.gsoType == unix.VIRTIO_NET_HDR_GSO_UDP_L4:
				udpGSO++
			}
			if p.flags&unix.VIRTIO_NET_HDR_F_NEEDS_CSUM != 0 {
				partial++
			} else {
				full++
			}
		}
		t.Logf("%s: TCP GSO %d, UDP GSO %d; checksums partial %d, full %d", side.name, tcpGSO, udpGSO, partial, full)
		if tcpGSO == 0 || partial == 0 || full == 0 {
			t.Errorf("%s: no TCP GSO write, or no partial or full checksum to check", side.name)
		}
		if side.c == server && udpGSO == 0 {
			t.Errorf("%s: no UDP GSO write", side.name)
		}
	}
	if s := g.stats(); s.GSOReads == 0 {
		t.Errorf("no GSO super-packet read: %v", s)
	}
}
