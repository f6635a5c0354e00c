package nat

import (
	"encoding/binary"
	"net/netip"
	"sync"
)

// Fragments (RFC 4787 REQ-14): the NAT tracks them rather than reassemble.
// The first fragment carries the ports: it is translated as a packet, and
// the datagram's identity (addresses, protocol, identification, the side
// it came from) is remembered with the address its fragments take. The
// others carry none: they take that address and go on, in the order they
// came; those that come before the first are held, within
// Config.FragmentMemory, until it does. An entry is forgotten after
// Config.FragmentTimeout. The transport checksum, in the first fragment,
// covers the whole datagram, and the first fragment's update is the whole
// datagram's: no fragment but the first needs a checksum change beyond
// IPv4's header.

// fragKey names a datagram.
type fragKey struct {
	src, dst netip.Addr
	id       uint32
	proto    uint8
	from     Side
}

// fragEntry is what the NAT knows of a fragmented datagram.
type fragEntry struct {
	known bool       // its first fragment came
	addr  netip.Addr // the address its fragments take
	to    Side
	held  [][]byte // fragments come before the first
	bytes int
	born  int64
}

// fragTable holds the datagrams being fragmented.
type fragTable struct {
	mu    sync.Mutex
	m     map[fragKey]*fragEntry
	bytes int
}

func fragKeyOf(p *packet, from Side) fragKey {
	return fragKey{src: p.src, dst: p.dst, id: p.fragID, proto: p.proto, from: from}
}

// fragFirst records the translation of a datagram's first fragment, and
// sends the fragments held for it.
func (n *NAT) fragFirst(k fragKey, addr netip.Addr, to Side, emit Emit) {
	ft := &n.frags
	ft.mu.Lock()
	if ft.m == nil {
		ft.m = map[fragKey]*fragEntry{}
	}
	e := ft.m[k]
	if e == nil {
		e = &fragEntry{born: n.now()}
		ft.m[k] = e
	}
	e.known, e.addr, e.to = true, addr, to
	held := e.held
	e.held = nil
	ft.bytes -= e.bytes
	e.bytes = 0
	ft.mu.Unlock()
	for _, b := range held {
		var p packet
		if parse(b, &p) == DropNone {
			n.sendFragment(b, &p, k.from, addr, to, emit)
		}
	}
}

// fragment translates b, a fragment other than the first, parsed as p.
func (n *NAT) fragment(b []byte, p *packet, from Side, emit Emit) Drop {
	k := fragKeyOf(p, from)
	ft := &n.frags
	ft.mu.Lock()
	if ft.m == nil {
		ft.m = map[fragKey]*fragEntry{}
	}
	e := ft.m[k]
	if e != nil && e.known {
		addr, to := e.addr, e.to
		ft.mu.Unlock()
		return n.sendFragment(b, p, from, addr, to, emit)
	}
	size := p.length
	if ft.bytes+size > n.cfg.FragmentMemory || e != nil && e.bytes+size > 1<<16+1<<10 {
		ft.mu.Unlock()
		return DropFragment
	}
	if e == nil {
		e = &fragEntry{born: n.now()}
		ft.m[k] = e
	}
	e.held = append(e.held, append([]byte(nil), b[:p.length]...))
	e.bytes += size
	ft.bytes += size
	ft.mu.Unlock()
	return DropNone
}

// sendFragment gives the fragment b its datagram's address and sends it.
func (n *NAT) sendFragment(b []byte, p *packet, from Side, addr netip.Addr, to Side, emit Emit) Drop {
	if ttl(b, p) <= 1 {
		return DropTTL
	}
	decTTL(b, p)
	setIPAddr(b, p, from == Outside, addr)
	return n.send(b, p, to, emit)
}

// expireFragments forgets the datagrams older than the fragment timeout;
// fragments still held are counted as DropFragmentTimeout.
func (n *NAT) expireFragments(now int64) {
	ft := &n.frags
	ft.mu.Lock()
	defer ft.mu.Unlock()
	for k, e := range ft.m {
		if now-e.born > int64(n.cfg.FragmentTimeout) {
			n.ctr.drops[DropFragmentTimeout].Add(uint64(len(e.held)))
			ft.bytes -= e.bytes
			delete(ft.m, k)
		}
	}
}

// fragBytes returns the memory of the fragments held.
func (n *NAT) fragBytes() int {
	n.frags.mu.Lock()
	defer n.frags.mu.Unlock()
	return n.frags.bytes
}

// fragmentOut sends the IPv4 packet b, larger than mtu and without DF, in
// fragments of at most mtu bytes (RFC 791; RFC 4787 REQ-13). Options go into
// every fragment.
func fragmentOut(b []byte, p *packet, mtu int, to Side, emit Emit) Drop {
	if p.v6 {
		return DropTooBig
	}
	ihl := p.l4
	ff := binary.BigEndian.Uint16(b[6:8])
	base, more := int(ff&0x1fff)*8, ff&0x2000 != 0
	step := (mtu - ihl) &^ 7
	payload := b[ihl:p.length]
	out := make([]byte, mtu)
	for off := 0; off < len(payload); off += step {
		end := min(off+step, len(payload))
		copy(out, b[:ihl])
		copy(out[ihl:], payload[off:end])
		flags := uint16((base + off) / 8)
		if end < len(payload) || more {
			flags |= 0x2000
		}
		binary.BigEndian.PutUint16(out[6:], flags)
		binary.BigEndian.PutUint16(out[2:], uint16(ihl+end-off))
		out[10], out[11] = 0, 0
		binary.BigEndian.PutUint16(out[10:], checksum(out[:ihl], 0))
		emit(to, out[:ihl+end-off])
	}
	return DropNone
}
