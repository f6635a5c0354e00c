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
	"github.com/hash4/hash4/nat"
	"golang.org/x/sys/unix"
)

// capture is a packet socket on a namespace's tun0 (raw: a TUN device has
// no link header; a virtio-net header needs a raw socket) that keeps, with its
// virtio-net header, each packet the device receives: those tunnat writes
// to it.
type capture struct {
	fd, ifindex int
	mu          sync.Mutex
	pkts        []captured
	done        chan struct{}
	stop        atomic.Bool
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
		// Protocol 0: the socket receives nothing until bound to tun0 (one
		// opened with ETH_P_ALL sees every device in the namespace first).
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		c.fd = fd
		ifi, err := net.InterfaceByName("tun0")
		if err != nil {
			return err
		}
		c.ifindex = ifi.Index
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
			if ll, ok := from.(*unix.SockaddrLinklayer); !ok || ll.Ifindex != c.ifindex || ll.Pkttype == unix.PACKET_OUTGOING {
				continue // another device's, or what the namespace sends into tun0
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
// back whole, a UDP GSO send of 32 datagrams arrives as 32 intact
// datagrams, and so does a burst of 200 datagrams, whose runs read together
// are coalesced.
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
	// A burst of datagrams, sent faster than the NAT wakes: the runs it
	// reads together go out coalesced (how many is up to the scheduler),
	// and every datagram arrives intact.
	const burstLen = 200
	for i := range burstLen {
		if _, err := u.Write(fmt.Appendf(nil, "datagram %03d of the burst", i)); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]bool{}
	for range burstLen {
		pc.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, _, err := pc.ReadFrom(buf)
		if err != nil {
			t.Fatalf("the burst: %d of %d datagrams arrived: %v", len(seen), burstLen, err)
		}
		seen[string(buf[:n])] = true
	}
	for i := range burstLen {
		if d := fmt.Sprintf("datagram %03d of the burst", i); !seen[d] {
			t.Errorf("the burst: %q did not arrive intact", d)
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

// udpDatagram builds an IPv4 UDP datagram of payload from src to dst,
// with a virtio-net header before it: its checksum partial if partial,
// full otherwise.
func udpDatagram(src, dst netip.AddrPort, payload []byte, partial bool) []byte {
	pkt := ipv4Packet(unix.IPPROTO_UDP, src, dst, append(make([]byte, 8), payload...), nil)
	h := make([]byte, vnetHdrLen)
	if partial {
		h[0] = unix.VIRTIO_NET_HDR_F_NEEDS_CSUM
		binary.NativeEndian.PutUint16(h[6:], 20)
		binary.NativeEndian.PutUint16(h[8:], 6)
		binary.BigEndian.PutUint16(pkt[26:], ^inetChecksum(nil, pseudoSum(pkt, 20)))
	}
	return append(h, pkt...)
}

// Runs of datagrams of one flow and one size are written as UDP GSO
// super-packets: their segments, cut from scratch as the receiver cuts
// them, are the datagrams, with checksums that verify once the partial one
// is completed; other packets, and a datagram whose checksum is wrong,
// are written as they came, in order.
func TestCoalesce(t *testing.T) {
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(sp[0])
	defer unix.Close(sp[1])
	unix.SetsockoptInt(sp[0], unix.SOL_SOCKET, unix.SO_SNDBUF, 1<<20)
	unix.SetsockoptInt(sp[1], unix.SOL_SOCKET, unix.SO_RCVBUF, 1<<20)
	a, b := netip.AddrPortFrom(clientAddr4, 40000), netip.AddrPortFrom(serverAddr4, 9000)
	var in [][]byte
	var want [][]byte // the datagrams each write must carry
	for i := range 10 {
		in = append(in, udpDatagram(a, b, bytes.Repeat([]byte{byte(i)}, 100), i%2 == 0))
	}
	in = append(in, udpDatagram(b, a, []byte("another flow"), true))
	for i := range 3 {
		in = append(in, udpDatagram(a, b, bytes.Repeat([]byte{byte(i)}, 100-20*(i/2)), true))
	}
	bad := udpDatagram(a, b, bytes.Repeat([]byte{9}, 100), false)
	bad[len(bad)-1] ^= 1 // its full checksum no longer verifies
	in = append(in, bad, udpDatagram(a, b, bytes.Repeat([]byte{8}, 100), true))
	// The batch, as a read leaves it.
	rb := newReadBatch()
	used := 0
	for _, p := range in {
		copy(rb.buf[used:], p)
		if !rb.add(used, len(p)) {
			t.Fatal("a test packet refused")
		}
		used += len(p)
	}
	q := &tunQueue{fd: sp[0], uso: true}
	w := newWriter()
	count := func(nat.Side, int, error) {}
	for i, p := range rb.pkts {
		w.write(q, nat.Outside, rb, i, len(p), count)
	}
	w.flush(count)
	runs := []int{10, 1, 3, 1, 1} // datagrams per write
	buf := make([]byte, 1<<17)
	k := 0
	for r, n := range runs {
		m, _, err := unix.Recvfrom(sp[1], buf, unix.MSG_DONTWAIT)
		if err != nil {
			t.Fatalf("write %d: %v", r, err)
		}
		h, pkt := buf[:vnetHdrLen], buf[vnetHdrLen:m]
		want = in[k : k+n]
		k += n
		if n == 1 {
			if !bytes.Equal(buf[:m], want[0]) {
				t.Errorf("write %d: not the datagram as it came", r)
			}
			continue
		}
		size := int(binary.NativeEndian.Uint16(h[4:]))
		if h[0] != unix.VIRTIO_NET_HDR_F_NEEDS_CSUM || h[1] != unix.VIRTIO_NET_HDR_GSO_UDP_L4 || size != 100 ||
			binary.NativeEndian.Uint16(h[6:]) != 20 || binary.NativeEndian.Uint16(h[8:]) != 6 {
			t.Fatalf("write %d: header %x", r, h)
		}
		if _, _, err := (captured{flags: h[0], csumStart: 20, csumOffset: 6, pkt: pkt}).check(); err != nil {
			t.Errorf("write %d: %v", r, err)
		}
		// Cut it as the receiver does: each segment the headers and
		// size bytes of payload, lengths and checksums its own.
		for j, d := range want {
			payload := pkt[28+j*size : min(28+(j+1)*size, len(pkt))]
			seg := ipv4Packet(unix.IPPROTO_UDP, a, b, append(make([]byte, 8), payload...), nil)
			if orig := d[vnetHdrLen:]; !bytes.Equal(seg[20:], completeOf(orig)[20:]) {
				t.Errorf("write %d segment %d: %x, want %x", r, j, seg[20:], completeOf(orig)[20:])
			}
		}
	}
	if _, _, err := unix.Recvfrom(sp[1], buf, unix.MSG_DONTWAIT); err == nil {
		t.Error("more writes than runs")
	}
}

// completeOf returns the IPv4 UDP packet pkt with its checksum complete.
func completeOf(pkt []byte) []byte {
	pkt = bytes.Clone(pkt)
	if sum := binary.BigEndian.Uint16(pkt[26:]); sum == ^inetChecksum(nil, pseudoSum(pkt, 20)) {
		pkt[26], pkt[27] = 0, 0
		binary.BigEndian.PutUint16(pkt[26:], inetChecksum(pkt[20:], pseudoSum(pkt, 20)))
	}
	return pkt
}
