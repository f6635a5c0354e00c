package main

import (
	"encoding/binary"
	"errors"
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
// empty, the batch full or its buffer short of a 64 KiB packet. Each
// packet is written with one write (tun_get_user takes one per call).

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
// and a read deadline ends them.
type tunQueue struct {
	f  *os.File
	rc syscall.RawConn
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
	if unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, tunTCPOffloads|tunUDPOffloads) != nil {
		if err := unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, tunTCPOffloads); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("TUNSETOFFLOAD %s: %w", name, err)
		}
	}
	q := &tunQueue{f: os.NewFile(uintptr(fd), "tun:"+name)}
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
	buf  []byte
	at   []int         // where each packet's header starts in buf
	pkts [][]byte      // the packets, after their headers
	off  []nat.Offload // what their headers say
	segs int           // segments of the GSO super-packets among them
	gso  int           // GSO super-packets among them
	bad  int           // packets dropped for headers tunnat cannot pass on
}

func newReadBatch() *readBatch {
	return &readBatch{buf: make([]byte, batchBytes), at: make([]int, 0, batchSize),
		pkts: make([][]byte, 0, batchSize), off: make([]nat.Offload, 0, batchSize)}
}

// read fills rb with the packets queued on q, waiting for the first.
func (q *tunQueue) read(rb *readBatch) error {
	rb.at, rb.pkts, rb.off = rb.at[:0], rb.pkts[:0], rb.off[:0]
	rb.segs, rb.gso, rb.bad = 0, 0, 0
	used := 0
	var rerr error
	err := q.rc.Read(func(fd uintptr) bool {
		for len(rb.pkts) < batchSize && len(rb.buf)-used >= maxRead {
			n, err := unix.Read(int(fd), rb.buf[used:used+maxRead])
			switch {
			case err == unix.EINTR:
				continue
			case err == unix.EAGAIN:
				return len(rb.pkts) > 0 || rb.bad > 0 // wait only for the first
			case err != nil:
				rerr = err
				return true
			}
			if rb.add(used, n) {
				used += n
			}
		}
		return true
	})
	if err != nil {
		return err
	}
	if rerr != nil && len(rb.pkts) == 0 {
		return rerr
	}
	return nil
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
	var werr error
	err := q.rc.Write(func(fd uintptr) bool {
		for {
			_, werr = unix.Write(int(fd), b)
			if werr != unix.EINTR {
				return werr != unix.EAGAIN
			}
		}
	})
	if err != nil {
		return err
	}
	if errors.Is(werr, unix.EBADFD) {
		return os.ErrClosed
	}
	return werr
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
