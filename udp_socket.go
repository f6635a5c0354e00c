package hash4

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
)

// The life of a UDPSocket after Bind: connect, disconnect, close, and its
// hash4 node (see udp.go for the invariants).

// LocalAddr returns the address and port the socket is bound to: after a
// connect of a socket bound to a wildcard address, the source address it took
// (as getsockname). An IPv6 socket's address stays IPv6, IPv4-mapped if it is
// one. A nil socket (what a failed Bind returns) reports the zero AddrPort.
func (s *UDPSocket[T]) LocalAddr() netip.AddrPort {
	if s == nil || s.t == nil {
		return netip.AddrPort{}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.local
}

// Value returns the value the socket was bound with; nil for a nil socket.
func (s *UDPSocket[T]) Value() *T {
	if s == nil {
		return nil
	}
	return s.val
}

// RemoteAddr returns the peer the socket is connected to, IPv4 peers in
// their IPv4 form, and whether it is connected. A closed socket reports the
// peer it had when it was closed; a nil one, none.
func (s *UDPSocket[T]) RemoteAddr() (netip.AddrPort, bool) {
	if s == nil || s.t == nil {
		return netip.AddrPort{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.b.peer.Load(); p != nil {
		return p.addr, true
	}
	return netip.AddrPort{}, false
}

// lock locks s.mu for op, or returns an error matching net.ErrClosed if s
// was not made by Bind or is closed.
func (s *UDPSocket[T]) lock(op string) error {
	if s == nil || s.t == nil {
		return fmt.Errorf("hash4: %s on a UDPSocket not made by Bind: %w", op, net.ErrClosed)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return fmt.Errorf("hash4: %s on UDP socket %v: %w", op, s.b.local, net.ErrClosed)
	}
	return nil
}

// Connect connects the socket to remote, replacing any peer it had, as
// connect(): from then on it receives only packets from remote. A socket
// bound to a wildcard address needs the source address the route chose: use
// [UDPSocket.ConnectFrom]; Connect returns an error matching [ErrInvalidAddr]
// for it, as for a remote the socket cannot reach (unspecified, port 0, or of
// a family it does not receive). On error nothing changes; on a closed
// socket the error matches [net.ErrClosed].
func (s *UDPSocket[T]) Connect(remote netip.AddrPort) error {
	return s.connect(netip.Addr{}, remote)
}

// ConnectFrom is [UDPSocket.Connect] with src, the source address the route
// to remote chose. A socket bound to a wildcard address takes src as its
// local address, as connect() fixes it in Linux, until
// [UDPSocket.Disconnect]; src must then be a concrete address of remote's
// family. On a socket with a concrete address, src must be that address.
func (s *UDPSocket[T]) ConnectFrom(src netip.Addr, remote netip.AddrPort) error {
	if !src.IsValid() {
		return fmt.Errorf("%w: ConnectFrom an invalid source address", ErrInvalidAddr)
	}
	return s.connect(src, remote)
}

// connect is Connect (src invalid) and ConnectFrom.
func (s *UDPSocket[T]) connect(src netip.Addr, remote netip.AddrPort) error {
	if err := s.lock("Connect"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	b := s.b
	addr, port := normAddr(remote.Addr()), remote.Port()
	mapped := s.v6 && !b.wild && wordsAreIPv4(&b.lw)
	mappedAny := s.v6 && b.wild && wordsAreIPv4(&b.lw)
	switch {
	case !addr.IsValid():
		return fmt.Errorf("%w: Connect to an invalid address", ErrInvalidAddr)
	case addr.IsUnspecified():
		return fmt.Errorf("%w: Connect to %v: unspecified address", ErrInvalidAddr, remote)
	case port == 0:
		return fmt.Errorf("%w: Connect to %v: port 0", ErrInvalidAddr, remote)
	case addr.Is4() && s.v6 && (s.v6only || !(b.wild || mapped)):
		return fmt.Errorf("%w: Connect of IPv6 socket %v to IPv4 peer %v", ErrInvalidAddr, b.local, remote)
	case !addr.Is4() && (!s.v6 || mapped || mappedAny):
		return fmt.Errorf("%w: Connect of IPv4 socket %v to IPv6 peer %v", ErrInvalidAddr, b.local, remote)
	}
	peer := &udpPeer{w: addrWords(addr), port: port, addr: netip.AddrPortFrom(addr, port)}
	if !b.wild {
		if src.IsValid() && normAddr(src) != normAddr(b.local.Addr()) {
			return fmt.Errorf("%w: ConnectFrom %v on a socket bound to %v", ErrInvalidAddr, src, b.local)
		}
		t := s.t
		if g := b.group.Load(); g != nil {
			g.hasConns.Store(true) // N.B. before the peer is set
			if !b.hashed4 {
				// udp_lib_hash4: the first connect leaves the group.
				ps := &t.ports[uint32(s.port)&t.mask]
				ps.mu.Lock()
				leaveGroup(b)
				ps.mu.Unlock()
			}
		}
		b.peer.Store(peer)
		t.hash4(b)
		return nil
	}
	sa := normAddr(src)
	switch {
	case !src.IsValid():
		return fmt.Errorf("%w: Connect of %v, bound to a wildcard address, needs the source address (ConnectFrom)", ErrInvalidAddr, b.local)
	case sa.IsUnspecified() || sa.Is4() != addr.Is4():
		return fmt.Errorf("%w: ConnectFrom %v to %v: the source must be a concrete address of the peer's family", ErrInvalidAddr, src, remote)
	case s.v6:
		sa = netip.AddrFrom16(sa.As16())
	}
	return s.t.move(s, sa, peer)
}

// move replaces the binding of s, on a wildcard address, by one on addr
// connected to peer (or not, if peer is nil), as the kernel's udp_lib_rehash
// when connect() fixes the local address or a disconnect resets it: the
// socket leaves its reuseport group and goes to the head of its new hash2
// chain. s.mu is held.
func (t *UDPTable[T]) move(s *UDPSocket[T], addr netip.Addr, peer *udpPeer) error {
	old := s.b
	b := t.newBinding(s, addr)
	b.moved = peer != nil
	if b.hasNode {
		i, ok := t.getNode(b.h2)
		if !ok {
			return ErrTableFull
		}
		b.node = i
		t.nodes.at(i).val.Store(s.val)
	}
	b.peer.Store(peer)
	ps := &t.ports[uint32(s.port)&t.mask]
	ps.mu.Lock()
	leaveGroup(old)
	t.link(b, false)
	t.unlink(old)
	s.b = b
	ps.mu.Unlock()
	if old.hashed4 {
		t.unhash4(old)
	}
	if old.hasNode {
		t.putNode(old.h2, old.node)
	}
	if peer != nil {
		t.hash4(b)
	}
	return nil
}

// Disconnect undoes Connect, as connect() with AF_UNSPEC: the socket
// receives packets from every peer again. (Linux keeps an IPv6 socket's old
// peer address, and the socket then takes only the IPv6 packets from that
// address, and none if it was IPv4-mapped; Disconnect does not copy this.) A socket that took its
// address at connect goes back to the wildcard address of its family (:: for
// an IPv6 socket). Disconnecting a socket that is not connected does nothing.
// On a closed socket it returns an error matching [net.ErrClosed].
func (s *UDPSocket[T]) Disconnect() error {
	if err := s.lock("Disconnect"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	b := s.b
	if b.peer.Load() == nil {
		return nil
	}
	if b.moved {
		wild := netip.IPv4Unspecified()
		if s.v6 {
			wild = netip.IPv6Unspecified()
		}
		return s.t.move(s, wild, nil)
	}
	// The node stays in its chain, matching nothing, as the kernel leaves
	// a socket with a concrete address in hash4 (udp_lib_hash4).
	if b.live4 {
		e := s.t.nodes.at(b.node)
		e.flip()
		b.live4 = false
	}
	b.peer.Store(nil)
	return nil
}

// Close unbinds the socket: it leaves hash4, hash2 and its reuseport group,
// and its hash4 node is recycled at once. A second Close returns an error
// matching [net.ErrClosed]. A lookup racing with Close may still return the
// socket's value.
func (s *UDPSocket[T]) Close() error {
	if err := s.lock("Close"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	s.closed = true
	t, b := s.t, s.b
	if b.hashed4 {
		t.unhash4(b)
	}
	// The peer stays as it was: a lookup still walking an old chain sees
	// the binding as it was before Close.
	ps := &t.ports[uint32(s.port)&t.mask]
	ps.mu.Lock()
	leaveGroup(b)
	t.unlink(b)
	ps.socks = slices.DeleteFunc(ps.socks, func(o *UDPSocket[T]) bool { return o == s })
	ps.mu.Unlock()
	if b.hasNode {
		t.putNode(b.h2, b.node)
	}
	if s.unhold != nil {
		s.unhold()
	}
	return nil
}

// hash4 makes b's node match (b.local, b's peer). The first time, as the
// kernel's udp_lib_hash4, it links the node at the head of its chain; later
// connects leave the kernel's socket in that chain, the chain of its first
// peer, and only change the fields it matches on, so b's node is rekeyed in
// place. b.s.mu is held.
func (t *UDPTable[T]) hash4(b *udpBinding[T]) {
	peer := b.peer.Load()
	h := t.udpEhash(&b.lw, peer.addr.Addr().Is4(), b.port, &peer.w, peer.port)
	k := key{meta: uint64(h)<<32 | uint64(b.port)<<16 | uint64(peer.port), remote: peer.w, local: b.lw}
	e := t.nodes.at(b.node)
	if b.hashed4 {
		if b.live4 {
			e.flip() // N.B. free while the key is rewritten
		}
		e.key.store(&k)
		e.flip()
		b.live4 = true
		return
	}
	// N.B. the node is free (it is in no chain, see unhash4): readers
	// that still stand on it ignore its key while it is rewritten.
	e.key.store(&k)
	// N.B. counted before it can be found (see udpSlot.hash4Cnt).
	t.slots[b.h2&t.mask].hash4Cnt.Add(1)
	st := t.h4.stripe(h)
	st.mu.Lock()
	linkAt(t.h4.head(h), nodeLink(b.node), &e.next)
	e.flip() // live, with its new key: N.B. after linking (see entry)
	st.count.Store(st.count.Load() + 1)
	st.mu.Unlock()
	b.h4, b.hashed4, b.live4 = h, true, true
}

// unhash4 unlinks b's node from its hash4 chain (the unhash half of the
// kernel's udp_lib_rehash). b.s.mu is held.
func (t *UDPTable[T]) unhash4(b *udpBinding[T]) {
	st := t.h4.stripe(b.h4)
	st.mu.Lock()
	prev := t.h4.head(b.h4)
	target := nodeLink(b.node)
	for l := prev.load(); !l.isNulls(); l = prev.load() {
		e := t.nodes.at(l.index())
		if l == target {
			// N.B. the node turns free before it is unlinked (see
			// entry) and before its key may be rewritten, so a reader
			// standing on it stops trusting the key; e.next is left
			// as it is, so such a reader walks on.
			if b.live4 {
				e.flip()
			}
			unlink(prev, &e.next)
			st.count.Store(st.count.Load() - 1)
			break
		}
		prev = &e.next
	}
	st.mu.Unlock()
	t.slots[b.h2&t.mask].hash4Cnt.Add(-1)
	b.hashed4, b.live4 = false, false
}
