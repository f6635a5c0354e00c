package main

import (
	"encoding/binary"
	"fmt"
	"os"
	"syscall"

	"github.com/hash4/hash4/nat"
	"golang.org/x/sys/unix"
)

// TUN queues with offloads. A device made with IFF_VNET_HDR prefixes each
// packet read or written with a virtio-net header (include/uapi/linux/
// virtio_net.h), and TUNSETOFFLOAD lets the kernel hand it, and take from
// it, what a NIC with those offloads would: TCP and UDP GSO super-packets
// of up to 64 KiB (TSO, USO), and checksums left partial
// (VIRTIO_NET_HDR_F_NEEDS_CSUM: the field holds the pseudo-header's sum,
// completed by whoever segments or delivers the packet). tunnat passes
// them through: a super-packet is translated once, its headers rewritten
// with its partial checksum (nat.Offload), and written back with the same
// header, so the receiving namespace gets it whole, as the kernel's own
// NAT forwards a GRO packet between veth devices. No segment is split,
// copied or checksummed in user space. (wireguard-go's tun package, which
// must hand its users single packets, splits each super-packet into
// segments with full checksums and coalesces them again on write; see
// docs/performance.md for what that cost here.)
//
// Each read is one system call (TUN has no recvmmsg); a batch is what one
// wakeup finds queued: reads go on, without waiting, until the queue is
// empty, the batch full or its buffer short of a 64 KiB packet. Each write
// is one packet (tun_get_user takes one per call): a batch's consecutive
// UDP datagrams of one flow, of one size, are first coalesced into a UDP
// GSO super-packet (GRO, as the kernel's udp_gro_receive does), which the
// receiving namespace takes with one write and one pass through IP, and
// cuts into the datagrams at its socket.

// vnetHdrLen is the size of struct virtio_net_hdr, which TUN devices use
// unless told otherwise (TUNSETVNETHDRSZ).
const vnetHdrLen = 10

// Sizes of a queue's batch: at most batchSize packets, read into a buffer
// of batchBytes (at least four 64 KiB packets), each read given room for
// the largest packet and its header.
const (
	batchSize  = 64
	batchBytes = 512 << 10
	maxRead    = vnetHdrLen + 65535
)

// tunOffloads are the offloads tunnat asks of its devices: checksums,
// TSO over IPv4 and IPv6, and USO (Linux 6.2 and later; without it, UDP
// is not segmented by the kernel and comes as datagrams).
const (
	tunTCPOffloads = unix.TUN_F_CSUM | unix.TUN_F_TSO4 | unix.TUN_F_TSO6
	tunUDPOffloads = unix.TUN_F_USO4 | unix.TUN_F_USO6
)

// tunQueue is one queue of a multi-queue TUN device made with
// IFF_VNET_HDR. Its descriptor is non-blocking: reads park in Go's poller,
// and a read deadline ends them. Writes go straight to the descriptor
// (fd): a TUN write does not block, and it is closed only once the
// gateway's goroutines have ended.
type tunQueue struct {
	f   *os.File
	rc  syscall.RawConn
	fd  int
	uso bool // the device takes UDP GSO super-packets
}

// openQueue attaches a new queue to TUN device name (creating the device
// if it has none) in the calling thread's network namespace.
func openQueue(name string) (*tunQueue, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI | unix.IFF_VNET_HDR | unix.IFF_MULTI_QUEUE)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("TUNSETIFF %s: %w", name, err)
	}
	uso := unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, tunTCPOffloads|tunUDPOffloads) == nil
	if !uso {
		if err := unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, tunTCPOffloads); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("TUNSETOFFLOAD %s: %w", name, err)
		}
	}
	q := &tunQueue{f: os.NewFile(uintptr(fd), "tun:"+name), fd: fd, uso: uso}
	if q.rc, err = q.f.SyscallConn(); err != nil {
		q.f.Close()
		return nil, err
	}
	return q, nil
}

// close detaches the queue; the device goes with its last queue.
func (q *tunQueue) close() error { return q.f.Close() }

// readBatch is the packets of one read of a queue, in one buffer: each
// packet after its virtio-net header.
type readBatch struct {
	// fill is rb.readReady, bound once (a closure given to RawConn.Read
	// would be allocated at each read); used, calls and err are its state.
	fill  func(fd uintptr) bool
	used  int
	calls int
	err   error
	// busy counts the reads in a row that found the queue not empty
	// without waiting: past one, a batch reads on.
	busy int
	buf  []byte
	at   []int         // where each packet's header starts in buf
	pkts [][]byte      // the packets, after their headers
	off  []nat.Offload // what their headers say
	segs int           // segments of the GSO super-packets among them
	gso  int           // GSO super-packets among them
	bad  int           // packets dropped for headers tunnat cannot pass on
}

func newReadBatch() *readBatch {
	rb := &readBatch{buf: make([]byte, batchBytes), at: make([]int, 0, batchSize),
		pkts: make([][]byte, 0, batchSize), off: make([]nat.Offload, 0, batchSize)}
	rb.fill = rb.readReady
	return rb
}

// read fills rb with the packets queued on q, waiting for the first.
func (q *tunQueue) read(rb *readBatch) error {
	rb.at, rb.pkts, rb.off = rb.at[:0], rb.pkts[:0], rb.off[:0]
	rb.segs, rb.gso, rb.bad, rb.used, rb.calls, rb.err = 0, 0, 0, 0, 0, nil
	if err := q.rc.Read(rb.fill); err != nil {
		return err
	}
	if rb.err != nil && len(rb.pkts) == 0 {
		return rb.err
	}
	return nil
}

// readReady reads the packets queued on fd into rb; it reports false,
// to wait, if there was none. It reads on, to the end of the queue or of
// the batch, only when the queue was found not empty without waiting twice
// in a row: otherwise the queue was empty a moment before and most likely
// is again, and a read to find out would cost as much as the packet's
// (one-packet reads take two system calls per packet when idle, a read
// and the wait's; this keeps it so). Under load the batches fill.
func (rb *readBatch) readReady(fd uintptr) bool {
	if rb.calls++; rb.calls == 1 {
		rb.busy++
	} else {
		rb.busy = 0
	}
	for len(rb.pkts) < batchSize && len(rb.buf)-rb.used >= maxRead {
		n, err := unix.Read(int(fd), rb.buf[rb.used:rb.used+maxRead])
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return len(rb.pkts) > 0 || rb.bad > 0 // wait only for the first
		case err != nil:
			rb.err = err
			return true
		}
		if rb.add(rb.used, n) {
			rb.used += n
		}
		if rb.busy < 2 {
			return true
		}
	}
	return true
}

// add takes the packet and header read at rb.buf[at:at+n] into the batch,
// or reports false if it cannot be passed on: a partial checksum anywhere
// but a TCP or UDP header's field is completed here (the nat package
// updates only those), and a GSO packet must have one.
func (rb *readBatch) add(at, n int) bool {
	if n < vnetHdrLen {
		rb.bad++
		return false
	}
	h, pkt := rb.buf[at:at+vnetHdrLen], rb.buf[at+vnetHdrLen:at+n]
	flags, gsoType := h[0], h[1]
	gsoSize := binary.NativeEndian.Uint16(h[4:])
	start, field := int(binary.NativeEndian.Uint16(h[6:])), int(binary.NativeEndian.Uint16(h[8:]))
	var o nat.Offload
	if flags&unix.VIRTIO_NET_HDR_F_NEEDS_CSUM != 0 {
		if transportField(pkt, start, field) {
			o.PartialChecksum = true
		} else if gsoType != unix.VIRTIO_NET_HDR_GSO_NONE || start+field+2 > len(pkt) {
			rb.bad++
			return false
		} else {
			// Complete it, as the kernel would for a device without
			// checksum offload, and say so in the header written back.
			initial := uint32(binary.BigEndian.Uint16(pkt[start+field:]))
			pkt[start+field], pkt[start+field+1] = 0, 0
			binary.BigEndian.PutUint16(pkt[start+field:], inetChecksum(pkt[start:], initial))
			h[0] &^= unix.VIRTIO_NET_HDR_F_NEEDS_CSUM
		}
	}
	if gsoType != unix.VIRTIO_NET_HDR_GSO_NONE {
		if !o.PartialChecksum || gsoSize == 0 {
			rb.bad++
			return false
		}
		o.SegmentSize = int(gsoSize)
		rb.gso++
		rb.segs += (len(pkt) - start + int(gsoSize) - 1) / int(gsoSize) // headers counted as payload: about
	}
	rb.at, rb.pkts, rb.off = append(rb.at, at), append(rb.pkts, pkt), append(rb.off, o)
	return true
}

// transportField reports whether a checksum to be completed from start,
// stored at start+field, is the TCP or UDP checksum of pkt, an IP packet
// without IPv6 extension headers: the one the nat package updates.
func transportField(pkt []byte, start, field int) bool {
	var proto uint8
	var l4 int
	switch {
	case len(pkt) >= 20 && pkt[0]>>4 == 4:
		proto, l4 = pkt[9], int(pkt[0]&0xf)*4
	case len(pkt) >= 40 && pkt[0]>>4 == 6:
		proto, l4 = pkt[6], 40
	default:
		return false
	}
	return start == l4 && start+field+2 <= len(pkt) &&
		(proto == unix.IPPROTO_TCP && field == 16 || proto == unix.IPPROTO_UDP && field == 6)
}

// write writes the i-th packet of rb, translated to its first n bytes,
// with its header as read.
func (q *tunQueue) write(rb *readBatch, i, n int) error {
	at := rb.at[i]
	return q.writeRaw(rb.buf[at : at+vnetHdrLen+n])
}

// writePlain writes pkt, which has no offload metadata, from buf, whose
// first vnetHdrLen bytes are room for its header.
func (q *tunQueue) writePlain(buf, pkt []byte) error {
	clear(buf[:vnetHdrLen])
	n := copy(buf[vnetHdrLen:], pkt)
	return q.writeRaw(buf[:vnetHdrLen+n])
}

// writeRaw writes b, a header and a packet, in one system call.
func (q *tunQueue) writeRaw(b []byte) error {
	for {
		_, err := unix.Write(q.fd, b)
		if err != unix.EINTR {
			return err
		}
	}
}

// Coalescing bounds: the segments of a UDP GSO packet (UDP_MAX_SEGMENTS in
// older kernels) and its size.
const (
	groSegments = 64
	groBytes    = 65535
)

// writer writes a pump's translated packets to the devices, coalescing
// runs of UDP datagrams (see above). It is one goroutine's.
type writer struct {
	buf  []byte // the super-packet being built, after its header's room
	q    *tunQueue
	to   nat.Side
	n    int  // datagrams in buf; 0: none
	used int  // bytes in buf after the header's room
	l4   int  // where the UDP header starts
	size int  // the first datagram's payload
	last bool // a shorter datagram came: the run ends
	key  [40]byte
	klen int
	// The run's first datagram, in its batch: a run of one is written
	// from there, as it came.
	rb    *readBatch
	first int
}

func newWriter() *writer { return &writer{buf: make([]byte, vnetHdrLen+groBytes)} }

// write writes the i-th packet of rb, translated to its first n bytes, to
// q, the device of side to, or adds it to the run being coalesced; count
// is told of each packet, and of a write's failure (a super-packet's
// counts once).
func (w *writer) write(q *tunQueue, to nat.Side, rb *readBatch, i, n int, count func(nat.Side, int, error)) {
	at := rb.at[i]
	pkt := rb.buf[at+vnetHdrLen : at+vnetHdrLen+n]
	l4, ok := coalescible(pkt, rb.off[i])
	ok = ok && q.uso
	if ok && w.n > 0 && w.q == q && w.join(pkt, l4) {
		count(to, n, nil)
		return
	}
	w.flush(count)
	if !ok {
		count(to, n, q.write(rb, i, n))
		return
	}
	w.q, w.to, w.n, w.l4, w.size, w.last = q, to, 1, l4, len(pkt)-l4-8, false
	w.rb, w.first = rb, i
	w.klen = runKey(&w.key, pkt, l4)
	w.used = copy(w.buf[vnetHdrLen:], pkt)
	count(to, n, nil)
}

// coalescible returns where the UDP header of pkt starts if pkt may join
// a super-packet: a UDP datagram with a payload, IPv4 without options or
// fragmentation or IPv6 without extension headers, not itself a GSO
// packet, its checksum partial or verified (a super-packet goes with a
// partial one, which the receiver trusts).
func coalescible(pkt []byte, o nat.Offload) (int, bool) {
	var l4 int
	switch {
	case len(pkt) >= 28 && pkt[0] == 0x45 && pkt[9] == unix.IPPROTO_UDP && binary.BigEndian.Uint16(pkt[6:])&0x3fff == 0:
		l4 = 20
	case len(pkt) >= 48 && pkt[0]>>4 == 6 && pkt[6] == unix.IPPROTO_UDP:
		l4 = 40
	default:
		return 0, false
	}
	if o.SegmentSize != 0 || len(pkt) <= l4+8 || int(binary.BigEndian.Uint16(pkt[l4+4:])) != len(pkt)-l4 {
		return 0, false
	}
	if !o.PartialChecksum {
		sum := binary.BigEndian.Uint16(pkt[l4+6:])
		if sum == 0 || inetChecksum(pkt[l4:], pseudoSum(pkt, l4)) != 0 {
			return 0, false
		}
	}
	return l4, true
}

// pseudoSum returns the one's complement sum of the UDP pseudo-header of
// pkt, its transport header at l4.
func pseudoSum(pkt []byte, l4 int) uint32 {
	var acc uint32
	addrs := pkt[12:20]
	if l4 == 40 {
		addrs = pkt[8:40]
	}
	for i := 0; i < len(addrs); i += 2 {
		acc += uint32(binary.BigEndian.Uint16(addrs[i:]))
	}
	return acc + unix.IPPROTO_UDP + uint32(len(pkt)-l4)
}

// runKey copies into key what the datagrams of a run share, and returns
// its length: addresses and ports, and the TOS (traffic class) and TTL
// (hop limit), which the segments of a super-packet take from its header.
func runKey(key *[40]byte, pkt []byte, l4 int) int {
	if l4 == 20 {
		key[0], key[1] = pkt[1], pkt[8]
		copy(key[2:], pkt[12:20])
		copy(key[10:], pkt[20:24])
		return 14
	}
	copy(key[:], pkt[:2]) // version, traffic class, flow label's top
	key[2] = pkt[7]
	copy(key[3:], pkt[8:40])
	copy(key[35:], pkt[40:44])
	return 39
}

// join adds pkt to the run if it belongs: same flow, TTL and TOS, a
// payload of the first's size (or a last, shorter one), room left.
func (w *writer) join(pkt []byte, l4 int) bool {
	var key [40]byte
	size := len(pkt) - l4 - 8
	if w.last || l4 != w.l4 || size > w.size || w.n == groSegments || vnetHdrLen+w.used+size > len(w.buf) ||
		runKey(&key, pkt, l4) != w.klen || key != w.key {
		return false
	}
	w.used += copy(w.buf[vnetHdrLen+w.used:], pkt[l4+8:])
	w.n++
	w.last = size < w.size
	return true
}

// flush writes the run, if any: one datagram as it came, several as a UDP
// GSO super-packet, its lengths and IPv4 header checksum set again and its
// UDP checksum made partial (the pseudo-header's sum; the datagrams' own
// were partial or verified).
func (w *writer) flush(count func(nat.Side, int, error)) {
	if w.n == 0 {
		return
	}
	n, l4, total := w.n, w.l4, w.used
	w.n = 0
	if n == 1 {
		if err := w.q.write(w.rb, w.first, total); err != nil {
			count(w.to, 0, err)
		}
		return
	}
	pkt := w.buf[vnetHdrLen : vnetHdrLen+total]
	h := w.buf[:vnetHdrLen]
	clear(h)
	h[0] = unix.VIRTIO_NET_HDR_F_NEEDS_CSUM
	binary.NativeEndian.PutUint16(h[2:], uint16(l4+8))
	binary.NativeEndian.PutUint16(h[6:], uint16(l4))
	binary.NativeEndian.PutUint16(h[8:], 6)
	if l4 == 20 {
		binary.BigEndian.PutUint16(pkt[2:], uint16(total))
		pkt[10], pkt[11] = 0, 0
		binary.BigEndian.PutUint16(pkt[10:], inetChecksum(pkt[:20], 0))
	} else {
		binary.BigEndian.PutUint16(pkt[4:], uint16(total-40))
	}
	binary.BigEndian.PutUint16(pkt[l4+4:], uint16(total-l4))
	h[1] = unix.VIRTIO_NET_HDR_GSO_UDP_L4
	binary.NativeEndian.PutUint16(h[4:], uint16(w.size))
	binary.BigEndian.PutUint16(pkt[l4+6:], ^inetChecksum(nil, pseudoSum(pkt, l4)))
	if err := w.q.writeRaw(w.buf[:vnetHdrLen+total]); err != nil {
		count(w.to, 0, err)
	}
}

// inetChecksum returns the Internet checksum (RFC 1071) of b with initial
// one's complement sum initial.
func inetChecksum(b []byte, initial uint32) uint16 {
	acc := uint64(initial)
	for ; len(b) >= 8; b = b[8:] {
		acc += uint64(binary.BigEndian.Uint32(b)) + uint64(binary.BigEndian.Uint32(b[4:]))
	}
	for ; len(b) >= 2; b = b[2:] {
		acc += uint64(binary.BigEndian.Uint16(b))
	}
	if len(b) == 1 {
		acc += uint64(b[0]) << 8
	}
	for acc>>16 != 0 {
		acc = acc&0xffff + acc>>16
	}
	return ^uint16(acc)
}
