package hash4

import (
	"net/netip"
	"slices"
)

// udpModel is a plain model of the Linux UDP tables, written for clarity:
// every socket in bind order, each with its position in its hash2 chain,
// and a linear walk of them as udp4_lib_lookup2 walks a chain. It checks
// UDPTable, and the kernel checks it (kernel_oracle_linux_test.go).
type udpModel struct {
	socks []*mSock // bind order: the kernel's primary chain, reversed
	pos   int64    // chain insertions
	h4    int64    // hash4 insertions
}

// mSock is a socket of the model.
type mSock struct {
	v6, v6only, reusePort, reuseAddr bool
	addr                             netip.Addr // socket form: IPv4, or IPv6 (maybe IPv4-mapped)
	port                             uint16
	moved                            bool
	conn                             bool
	peer                             netip.AddrPort // unmapped
	pos                              int64
	// hashed4: in hash4 since its first connect, under h4peer, at
	// insertion h4; a later connect leaves it there (udp_lib_hash4).
	hashed4 bool
	h4peer  netip.AddrPort
	h4      int64
	group   *mGroup
	val     *int
	s       *UDPSocket[int]
}

type mGroup struct {
	socks    []*mSock
	hasConns bool
}

func (m *mSock) wild() bool { return m.addr.Unmap().IsUnspecified() }

func (m *mSock) sockAddr() sockAddr { return newSockAddr(m.addr, m.v6, m.v6only) }

// bind returns the bound socket, or nil where Linux refuses the bind.
func (u *udpModel) bind(local netip.AddrPort, v6only, reusePort, reuseAddr bool) *mSock {
	a := local.Addr().WithZone("")
	if !a.IsValid() || local.Port() == 0 || (v6only && (a.Is4() || a.Is4In6())) {
		return nil
	}
	// __inet6_bind: a specific IPv6 address makes the socket IPv6-only.
	v6only = v6only || (a.Is6() && !a.Is4In6() && !a.IsUnspecified())
	s := &mSock{v6: a.Is6(), v6only: v6only, reusePort: reusePort, reuseAddr: reuseAddr, addr: a, port: local.Port()}
	for i := len(u.socks) - 1; i >= 0; i-- { // udp_lib_lport_inuse
		o := u.socks[i]
		if o.port != s.port || (o.reuseAddr && s.reuseAddr) || !addrEqual(s.sockAddr(), o.sockAddr(), true) {
			continue
		}
		if !(o.reusePort && s.reusePort) {
			return nil
		}
	}
	if reusePort { // udp_reuseport_add_sock
		for i := len(u.socks) - 1; i >= 0 && s.group == nil; i-- {
			o := u.socks[i]
			if o.port == s.port && o.v6 == s.v6 && o.v6only == s.v6only && o.reusePort && addrEqual(s.sockAddr(), o.sockAddr(), false) {
				if o.group == nil {
					o.group = &mGroup{socks: []*mSock{o}}
				}
				s.group = o.group
				o.group.socks = append(o.group.socks, s)
			}
		}
		if s.group == nil {
			s.group = &mGroup{socks: []*mSock{s}}
		}
	}
	u.pos++
	s.pos = -u.pos
	if s.v6 && s.reusePort {
		s.pos = u.pos
	}
	u.socks = append(u.socks, s)
	return s
}

func (u *udpModel) leave(s *mSock) {
	if g := s.group; g != nil {
		i := slices.Index(g.socks, s)
		g.socks[i] = g.socks[len(g.socks)-1]
		g.socks = g.socks[:len(g.socks)-1]
		s.group = nil
	}
}

// connect reports whether Connect (src invalid) or ConnectFrom succeeds.
func (u *udpModel) connect(s *mSock, src netip.Addr, remote netip.AddrPort) bool {
	a := remote.Addr().Unmap().WithZone("")
	mapped := s.v6 && s.addr.Is4In6()
	switch {
	case !a.IsValid() || a.IsUnspecified() || remote.Port() == 0:
		return false
	case a.Is4() && s.v6 && (s.v6only || !(s.wild() || mapped)):
		return false
	case !a.Is4() && (!s.v6 || mapped):
		return false
	}
	if !s.wild() {
		if src.IsValid() && src.Unmap() != s.addr.Unmap() {
			return false
		}
	} else {
		sa := src.Unmap().WithZone("")
		if !src.IsValid() || sa.IsUnspecified() || sa.Is4() != a.Is4() {
			return false
		}
		if s.v6 {
			sa = netip.AddrFrom16(sa.As16())
		}
		u.leave(s)
		s.addr, s.moved = sa, true
		u.pos++
		s.pos = -u.pos
	}
	if s.group != nil {
		s.group.hasConns = true
	}
	s.conn, s.peer = true, netip.AddrPortFrom(a, remote.Port())
	if !s.hashed4 { // udp_lib_hash4: the first connect leaves the group
		u.leave(s)
		u.h4++
		s.hashed4, s.h4peer, s.h4 = true, s.peer, u.h4
	}
	return true
}

func (u *udpModel) disconnect(s *mSock) {
	if !s.conn {
		return
	}
	s.conn = false
	if s.moved {
		u.leave(s)
		s.hashed4 = false
		s.addr, s.moved = netip.IPv4Unspecified(), false
		if s.v6 {
			s.addr = netip.IPv6Unspecified()
		}
		u.pos++
		s.pos = -u.pos
	}
}

func (u *udpModel) close(s *mSock) {
	u.leave(s)
	u.socks = slices.DeleteFunc(u.socks, func(o *mSock) bool { return o == s })
}

// score is compute_score: 2 for an IPv4 socket, 1 for an IPv6 one, +8 if
// connected to the source; -1 if s does not take the packet.
func (s *mSock) score(la netip.Addr, lp uint16, remote netip.AddrPort, wild bool) int {
	if s.port != lp || s.wild() != wild {
		return -1
	}
	switch {
	case !wild:
		if s.addr.Unmap() != la {
			return -1
		}
	case la.Is6():
		if s.addr != netip.IPv6Unspecified() {
			return -1
		}
	case s.addr == netip.IPv6Unspecified() && s.v6only:
		return -1
	}
	sc := 2
	if s.v6 {
		sc = 1
	}
	if s.conn {
		if s.peer != remote {
			return -1
		}
		sc += 8
	}
	return sc
}

// lookup returns the sockets that may receive pkt: one if the answer does
// not depend on the flow hash, else every socket the reuseport pick may
// return; with hash set, the one it picks.
func (u *udpModel) lookup(pkt Tuple, hash func() uint32) []*mSock {
	la, lp := pkt.Local.Addr().Unmap().WithZone(""), pkt.Local.Port()
	ra := pkt.Remote.Addr().Unmap().WithZone("")
	rem := netip.AddrPortFrom(ra, pkt.Remote.Port())
	if !la.IsValid() || la.IsUnspecified() || !ra.IsValid() || la.Is4() != ra.Is4() || lp == 0 {
		return nil
	}
	// hash4: the connected socket on the 4-tuple hashed last, among those
	// hashed under it.
	var h4 *mSock
	for _, s := range u.socks {
		if s.conn && s.hashed4 && s.h4peer == rem && !s.wild() && s.addr.Unmap() == la && s.port == lp && s.peer == rem && (h4 == nil || s.h4 > h4.h4) {
			h4 = s
		}
	}
	if h4 != nil {
		return []*mSock{h4}
	}
	for _, wild := range []bool{false, true} {
		chain := slices.Clone(u.socks)
		slices.SortFunc(chain, func(a, b *mSock) int { return int(a.pos - b.pos) })
		var result []*mSock
		best := 0
	walk:
		for _, s := range chain {
			sc := s.score(la, lp, rem, wild)
			if sc <= best {
				continue
			}
			best, result = sc, []*mSock{s}
			if s.conn || s.group == nil {
				continue
			}
			var picks []*mSock
			g := s.group.socks
			if hash != nil {
				k := reciprocalScale(hash(), len(g))
				for i := range g {
					if o := g[(k+i)%len(g)]; !o.conn {
						picks = []*mSock{o}
						break
					}
				}
			} else {
				for _, o := range g {
					if !o.conn {
						picks = append(picks, o)
					}
				}
			}
			if picks != nil {
				result = picks
				if !s.group.hasConns {
					break walk
				}
			}
		}
		if result != nil {
			return result
		}
	}
	return nil
}
