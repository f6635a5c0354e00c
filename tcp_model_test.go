package hash4

import (
	"net/netip"
	"slices"
)

// tcpModel is a plain model of Linux's TCP tables, written for clarity: the
// established flows, every listener in listen order, and a walk of the
// listeners in the order of the kernel's lhash2 chain, as
// inet_lhash2_lookup walks it. It checks TCPTable, and the kernel checks it
// (kernel_oracle_linux_test.go).
type tcpModel struct {
	ls   []*mListener // listen order
	seq  int64
	est  map[Tuple]*int // normalized 4-tuples
	fast map[uint16]*mFast
}

// mFast is the fast-reuseport state of a port's bind bucket
// (inet_csk_update_fastreuse): nil, FASTREUSEPORT_ANY or, if strict,
// FASTREUSEPORT_STRICT.
type mFast struct {
	strict bool
	addr   sockAddr
}

// match is sk_reuseport_match.
func (f *mFast) match(l *mListener) bool {
	return f != nil && l.reusePort && (!f.strict || addrMatch(f.addr, l.sockAddr(), true, false))
}

// mListener is a listener of the model.
type mListener struct {
	addr                  netip.Addr // socket form: IPv4, or IPv6 (maybe IPv4-mapped)
	port                  uint16
	v6, v6only, reusePort bool
	seq                   int64
	group                 *mLGroup
	val                   *int
	release               func()
}

type mLGroup struct{ ls []*mListener }

func (l *mListener) sockAddr() sockAddr { return newSockAddr(l.addr, l.v6, l.v6only) }

// tail reports whether the kernel adds l at the tail of its chain (an IPv6
// reuseport listener) rather than at the head.
func (l *mListener) tail() bool { return l.v6 && l.reusePort }

// listen returns the listener, or nil where Linux's bind() or listen()
// refuses it.
func (m *tcpModel) listen(local netip.AddrPort, v6only, reusePort bool) *mListener {
	a := local.Addr().WithZone("")
	if !a.IsValid() || local.Port() == 0 || (v6only && (a.Is4() || a.Is4In6())) {
		return nil
	}
	l := &mListener{addr: a, port: local.Port(), v6: a.Is6(), reusePort: reusePort}
	// __inet6_bind makes a socket on a specific IPv6 address IPv6-only.
	l.v6only = v6only || (a.Is6() && !a.Is4In6() && !a.IsUnspecified())
	owned := slices.ContainsFunc(m.ls, func(o *mListener) bool { return o.port == l.port })
	f := m.fast[l.port]
	if owned && !f.match(l) { // inet_csk_bind_conflict against listeners
		for _, o := range m.ls {
			if o.port == l.port && addrEqual(l.sockAddr(), o.sockAddr(), true) && !(o.reusePort && l.reusePort) {
				return nil
			}
		}
	}
	if m.fast == nil {
		m.fast = map[uint16]*mFast{}
	}
	switch {
	case !reusePort:
		m.fast[l.port] = nil
	case !owned:
		m.fast[l.port] = &mFast{addr: l.sockAddr()}
	case !f.match(l):
		m.fast[l.port] = &mFast{strict: true, addr: l.sockAddr()}
	}
	if reusePort { // inet_reuseport_add_sock
		for _, o := range m.ls {
			if o.port == l.port && o.v6 == l.v6 && o.v6only == l.v6only && o.reusePort && addrEqual(l.sockAddr(), o.sockAddr(), false) {
				l.group = o.group
				break
			}
		}
		if l.group == nil {
			l.group = &mLGroup{}
		}
		l.group.ls = append(l.group.ls, l)
	}
	m.seq++
	l.seq = m.seq
	m.ls = append(m.ls, l)
	return l
}

func (m *tcpModel) close(l *mListener) {
	if g := l.group; g != nil { // reuseport_detach_sock
		i := slices.Index(g.ls, l)
		g.ls[i] = g.ls[len(g.ls)-1]
		g.ls = g.ls[:len(g.ls)-1]
	}
	m.ls = slices.DeleteFunc(m.ls, func(o *mListener) bool { return o == l })
	if !slices.ContainsFunc(m.ls, func(o *mListener) bool { return o.port == l.port }) {
		delete(m.fast, l.port)
	}
}

// score is the listener compute_score of inet_hashtables.c (IPv4 segments,
// is4) or inet6_hashtables.c to daddr (the segment's, or the wildcard
// address in the second step): -1 if l does not take it, else 2 for an
// IPv4 listener and 1 for an IPv6 one.
func (l *mListener) score(daddr netip.Addr, port uint16, is4 bool) int {
	if l.port != port {
		return -1
	}
	if is4 {
		if l.v6 && l.v6only {
			return -1
		}
		if a := l.sockAddr().v4; a != l4(daddr) {
			return -1
		}
		if l.v6 {
			return 1
		}
		return 2
	}
	if !l.v6 || l.addr != daddr {
		return -1
	}
	return 1
}

// l4 is daddr, an IPv4 address, as sockAddr.v4 holds it.
func l4(daddr netip.Addr) uint32 {
	b := daddr.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

// lookup returns the listeners that may take a segment (no established
// flow): one if the answer does not depend on the flow hash, else those of
// the reuseport group that takes it; with hash set, the one it picks.
func (m *tcpModel) lookup(pkt Tuple, hash func() uint32) []*mListener {
	la, ra := pkt.Local.Addr().Unmap().WithZone(""), pkt.Remote.Addr().Unmap().WithZone("")
	lp := pkt.Local.Port()
	if !la.IsValid() || la.IsUnspecified() || !ra.IsValid() || la.Is4() != ra.Is4() || lp == 0 {
		return nil
	}
	// The kernel's chain order: the listeners added at the head, newest
	// first, then those added at the tail, oldest first.
	chain := slices.Clone(m.ls)
	slices.SortStableFunc(chain, func(a, b *mListener) int {
		switch {
		case a.tail() != b.tail():
			if a.tail() {
				return 1
			}
			return -1
		case a.tail():
			return int(a.seq - b.seq)
		}
		return int(b.seq - a.seq)
	})
	wild := netip.IPv4Unspecified()
	if la.Is6() {
		wild = netip.IPv6Unspecified()
	}
	for _, daddr := range []netip.Addr{la, wild} {
		var result *mListener
		best := 0
		for _, l := range chain {
			sc := l.score(daddr, lp, la.Is4())
			if sc <= best {
				continue
			}
			if g := l.group; g != nil { // inet_lookup_reuseport
				if hash != nil {
					return []*mListener{g.ls[reciprocalScale(hash(), len(g.ls))]}
				}
				return slices.Clone(g.ls)
			}
			result, best = l, sc
		}
		if result != nil {
			return []*mListener{result}
		}
	}
	return nil
}

// lookupAll is lookup with the established flows first: the value of the
// flow, or the values lookup returns.
func (m *tcpModel) lookupAll(pkt Tuple, hash func() uint32) []*int {
	if v, ok := m.est[Tuple{refNorm(pkt.Local), refNorm(pkt.Remote)}]; ok {
		return []*int{v}
	}
	var vs []*int
	for _, l := range m.lookup(pkt, hash) {
		vs = append(vs, l.val)
	}
	return vs
}
