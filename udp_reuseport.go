package hash4

import (
	"slices"
	"sync/atomic"
)

// UDP bind conflicts and reuseport groups: udp_lib_lport_inuse,
// udp_reuseport_add_sock and the kernel's sock_reuseport.

// udpReuse is a reuseport group, the kernel's sock_reuseport.
type udpReuse[T any] struct {
	// socks is the group's array; never changed once published, replaced
	// under the group's primary slot lock.
	socks atomic.Pointer[[]*udpBinding[T]]
	// hasConns is set when a member connects and never cleared, as the
	// kernel's reuse->has_conns.
	hasConns atomic.Bool
}

// inUse reports whether binding b conflicts with a socket of primary slot
// ps, as the kernel's udp_lib_lport_inuse: a socket on b's port whose
// address overlaps b's, unless both set SO_REUSEADDR or both SO_REUSEPORT.
func (t *UDPTable[T]) inUse(ps *udpPort[T], b *udpBinding[T]) bool {
	s := b.s
	for i := len(ps.socks) - 1; i >= 0; i-- {
		o := ps.socks[i]
		if o.port != s.port || (o.reuseAd && s.reuseAd) || !addrEqual(b.addr, o.b.addr, true) {
			continue
		}
		if !(o.reusePort && s.reusePort) {
			return true
		}
	}
	return false
}

// joinGroup puts b in the reuseport group of the newest socket on its port
// of its family, IPv6-only if it is, with SO_REUSEPORT, on the same address,
// as the kernel's udp_reuseport_add_sock; in a new group if there is none.
// ps's lock is held.
func (t *UDPTable[T]) joinGroup(ps *udpPort[T], b *udpBinding[T]) {
	s := b.s
	for i := len(ps.socks) - 1; i >= 0; i-- {
		o := ps.socks[i]
		if o == s || o.port != s.port || o.v6 != s.v6 || o.v6only != s.v6only || !o.reusePort || !addrEqual(b.addr, o.b.addr, false) {
			continue
		}
		g := o.b.group.Load()
		if g == nil {
			// reuseport_alloc for the other socket first.
			g = &udpReuse[T]{}
			g.socks.Store(&[]*udpBinding[T]{o.b})
			o.b.group.Store(g)
		}
		socks := append(slices.Clip(*g.socks.Load()), b)
		g.socks.Store(&socks)
		b.group.Store(g)
		return
	}
	g := &udpReuse[T]{}
	g.socks.Store(&[]*udpBinding[T]{b})
	b.group.Store(g)
}

// leaveGroup takes b out of its reuseport group, the group's last socket
// taking its place, as reuseport_detach_sock. The primary slot's lock is
// held.
func leaveGroup[T any](b *udpBinding[T]) {
	g := b.group.Load()
	if g == nil {
		return
	}
	socks := slices.Clone(*g.socks.Load())
	if i := slices.Index(socks, b); i >= 0 {
		socks[i] = socks[len(socks)-1]
		socks = socks[:len(socks)-1]
	}
	g.socks.Store(&socks)
	b.group.Store(nil)
}

// pick returns the socket of g that a packet with flow hash h reaches, as the
// kernel's reuseport_select_sock_by_hash: the first unconnected one from the
// k-th on, cyclically, k = reciprocal_scale(h, n) for a group of n; nil if
// every one is connected.
func (g *udpReuse[T]) pick(h uint32) *udpBinding[T] {
	socks := *g.socks.Load()
	n := len(socks)
	if n == 0 {
		return nil
	}
	for i, j := 0, reciprocalScale(h, n); i < n; i++ {
		if b := socks[j]; b.peer.Load() == nil {
			return b
		}
		if j++; j == n {
			j = 0
		}
	}
	return nil
}
