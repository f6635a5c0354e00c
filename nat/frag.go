package nat

import (
	"encoding/binary"
	"net/netip"
	"sync"
)

// Fragments (RFC 4787 REQ-14): the NAT tracks them rather than reassemble.
// The first fragment carries the ports: it is translated as a packet, and
// the datagram's identity (addresses, protocol, identification, the side
// it came from) is remembered with the addresses its fragments take and
// the side they go to (inside, for a hairpinned datagram). The others
// carry none: they take those addresses and go on, in the order they
// came; those that come before the first are held until it does. The
// fragments held and the datagrams known, each counted at
// fragEntryCost, fit in Config.FragmentMemory: past it a new datagram is
// not tracked, and its fragments but the first are dropped. An entry is
// forgotten after Config.FragmentTimeout. The transport checksum, in the
// first fragment, covers the whole datagram, and the first fragment's
// update is the whole datagram's: no fragment but the first needs a
// checksum change beyond IPv4's header.

// fragKey names a datagram.
type fragKey struct {
	src, dst netip.Addr
	id       uint32
	proto    uint8
	from     Side
}

// fragEntry is what the NAT knows of a fragmented datagram.
type fragEntry struct {
	known    bool       // its first fragment came
	src, dst netip.Addr // the addresses its fragments take
	to       Side
	held     [][]byte // fragments come before the first
	bytes    int      // held's
	born     int64
}

// fragEntryCost is what a datagram's entry counts against
// Config.FragmentMemory: its map entry and fragEntry, rounded up.
const fragEntryCost = 256

// fragTable holds the datagrams being fragmented.
type fragTable struct {
	mu    sync.Mutex
	m     map[fragKey]*fragEntry
	bytes int // the fragments held, and fragEntryCost an entry
}

// newEntry adds k's entry, with size bytes of fragments to come, if they
// and the entry fit in limit; ft.mu is held.
func (ft *fragTable) newEntry(k fragKey, size, limit int, now int64) *fragEntry {
	if ft.bytes+fragEntryCost+size > limit {
		return nil
	}
	if ft.m == nil {
		ft.m = map[fragKey]*fragEntry{}
	}
	e := &fragEntry{born: now}
	ft.m[k] = e
	ft.bytes += fragEntryCost
	return e
}

func fragKeyOf(p *packet, from Side) fragKey {
	return fragKey{src: p.src, dst: p.dst, id: p.fragID, proto: p.fragNext, from: from}
}

// fragFirst records the translation of a datagram's first fragment, sent
// from src to dst toward side to, and sends the fragments held for it.
func (n *NAT) fragFirst(k fragKey, src, dst netip.Addr, to Side, emit Emit) {
	ft := &n.frags
	ft.mu.Lock()
	e := ft.m[k]
	if e == nil {
		if e = ft.newEntry(k, 0, n.cfg.FragmentMemory, n.now()); e == nil {
			ft.mu.Unlock()
			return // its other fragments are dropped, and counted, as they come
		}
	}
	e.known, e.src, e.dst, e.to = true, src, dst, to
	held := e.held
	e.held = nil
	ft.bytes -= e.bytes
	e.bytes = 0
	ft.mu.Unlock()
	for _, b := range held {
		var p packet
		if parse(b, &p) == DropNone {
			n.sendFragment(b, &p, src, dst, to, emit)
		}
	}
}

// fragment translates b, a fragment other than the first, parsed as p.
func (n *NAT) fragment(b []byte, p *packet, from Side, emit Emit) Drop {
	k := fragKeyOf(p, from)
	ft := &n.frags
	ft.mu.Lock()
	e := ft.m[k]
	if e != nil && e.known {
		src, dst, to := e.src, e.dst, e.to
		ft.mu.Unlock()
		return n.sendFragment(b, p, src, dst, to, emit)
	}
	size := p.length
	if e == nil {
		e = ft.newEntry(k, size, n.cfg.FragmentMemory, n.now())
	} else if ft.bytes+size > n.cfg.FragmentMemory || e.bytes+size > 1<<16+1<<10 {
		e = nil
	}
	if e == nil {
		ft.mu.Unlock()
		return DropFragment
	}
	e.held = append(e.held, append([]byte(nil), b[:p.length]...))
	e.bytes += size
	ft.bytes += size
	ft.mu.Unlock()
	return DropNone
}

// sendFragment gives the fragment b its datagram's addresses and sends it.
func (n *NAT) sendFragment(b []byte, p *packet, src, dst netip.Addr, to Side, emit Emit) Drop {
	if ttl(b, p) <= 1 {
		return DropTTL
	}
	decTTL(b, p)
	setIPAddr(b, p, false, src)
	setIPAddr(b, p, true, dst)
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
			ft.bytes -= e.bytes + fragEntryCost
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
// fragments of at most mtu bytes (RFC 791; RFC 4787 REQ-13). The options
// go into the first fragment, and those whose copied flag is set into the
// others too (RFC 791 3.1), as Linux's ip_options_fragment leaves them.
func fragmentOut(b []byte, p *packet, mtu int, to Side, emit Emit) Drop {
	if p.v6 {
		return DropTooBig
	}
	ihl := p.l4
	ff := binary.BigEndian.Uint16(b[6:8])
	base, more := int(ff&0x1fff)*8, ff&0x2000 != 0
	hdr := b[:ihl]
	payload := b[ihl:p.length]
	if base+len(payload) > 0xffff {
		return DropMalformed // past an IPv4 datagram's end: no offset names it
	}
	out := make([]byte, mtu)
	for off := 0; off < len(payload); {
		if off > 0 && len(hdr) == ihl && ihl > 20 {
			hdr = append(append([]byte(nil), b[:20]...), copiedOptions(b[20:ihl])...)
			hdr[0] = hdr[0]&0xf0 | byte(len(hdr)/4)
		}
		h := len(hdr)
		end := min(off+(mtu-h)&^7, len(payload))
		copy(out, hdr)
		copy(out[h:], payload[off:end])
		flags := uint16((base + off) / 8)
		if end < len(payload) || more {
			flags |= 0x2000
		}
		binary.BigEndian.PutUint16(out[6:], flags)
		binary.BigEndian.PutUint16(out[2:], uint16(h+end-off))
		out[10], out[11] = 0, 0
		binary.BigEndian.PutUint16(out[10:], checksum(out[:h], 0))
		emit(to, out[:h+end-off])
		off = end
	}
	return DropNone
}

// copiedOptions returns the IPv4 options of o (checked by ipv4Options)
// whose copied flag is set, padded with end-of-list to a multiple of 4
// bytes.
func copiedOptions(o []byte) []byte {
	var c []byte
	for len(o) > 0 && o[0] != 0 {
		l := 1 // no-operation
		if o[0] != 1 {
			if len(o) < 2 || o[1] < 2 || int(o[1]) > len(o) {
				break
			}
			l = int(o[1])
		}
		if o[0]&0x80 != 0 {
			c = append(c, o[:l]...)
		}
		o = o[l:]
	}
	for len(c)%4 != 0 {
		c = append(c, 0)
	}
	return c
}
