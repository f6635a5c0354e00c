package hash4

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
)

// This file holds the TCP socket demultiplexer: the established table (a
// Table) and the listener table keyed by (local address, local port), the
// kernel's lhash2, looked up in the kernel's order (__inet_lookup: the
// established table, then __inet_lookup_listener).
//
// Listener nodes are entries of the established Table's node store, so that
// a node can be recycled from an established chain into a listener chain and
// back while lock-free readers stand on it. Listener chains end in nulls
// values offset by 2^29 (the kernel's LISTENING_NULLS_BASE), so a reader of
// either kind that strays into a chain of the other kind ends on a value
// that is not its own and restarts. No false match is possible on the way:
// a listener entry holds remote port 0, which no established key has.
//
// A listener node's key holds no remote address: its first remote word holds
// the listener's listen word (listenReuse, listenV6Only) instead, and
// listener walks match a key on its hash, ports and local address alone
// (entryKey.matchesLocal).
//
// Reuseport groups. A group's listeners are nodes of the chain like any
// other, and the group itself, the kernel's sock_reuseport array, is a
// tcpGroup: an immutable record of its listeners in the array's order,
// which Listen and release replace whole (copy-on-write) under the stripe
// lock of the group's chain, and which readers load with one atomic load.
// Each stripe has the list of the groups whose chains it guards. A lookup
// that meets a listener of a group in the chain picks from the group's
// record, as the kernel's inet_lookup_reuseport picks from the array of the
// first listener it meets, and so costs the same for a group of any size.
// N.B. a record lists only live listeners: Listen publishes it after the
// new listener's node is live, release before the node is freed.

// listenerNullsBase is added to the bucket index of a listener chain to make
// its nulls value, as the kernel's LISTENING_NULLS_BASE.
const listenerNullsBase = 1 << 29

// Bits of a listener's listen word (the first remote word of its key).
const (
	listenReuse  = 1 << 0 // SO_REUSEPORT
	listenV6Only = 1 << 1 // IPV6_V6ONLY
)

// wordsAny4 is the 16-byte form of 0.0.0.0 (::ffff:0.0.0.0) as addrWords
// gives it; that of :: is zero.
var wordsAny4 = addrWords(netip.IPv4Unspecified())

// TCPTable finds the TCP socket that owns a received segment, as the Linux
// TCP tables do: an established connection with the segment's exact
// 4-tuple, else the listener bound to the segment's destination address and
// port, else the listener bound to the wildcard address on that port.
//
// The established connections are a Table (see Established): Insert,
// Delete, Lookup and Connect (with a PortAllocator) work on it as on any
// Table.
// Listeners are added by Listen. Lookup takes no lock and never allocates.
// All methods are safe for concurrent use. A TCPTable must be created with
// NewTCPTable.
//
// Listeners. A listener bound to 0.0.0.0 takes IPv4 segments for its port,
// one bound to :: takes IPv6 segments and, as a dual-stack socket
// (IPV6_V6ONLY off, the Linux and Go default), IPv4 segments too, unless it
// is IPv6-only (WithIPv6Only). 0.0.0.0 and :: on one port may both listen
// (Linux would refuse the second unless the :: one were IPv6-only); an IPv4
// segment then goes to 0.0.0.0, as the kernel's compute_score prefers an
// IPv4 socket. Devices and network namespaces are left out. Addresses are
// read as in Table: IPv4-mapped addresses are IPv4, zones are ignored.
//
// Reuseport groups. Several listeners may share an address and port if all
// of them asked for it (WithReusePort), as with SO_REUSEPORT. Those of them
// that are IPv6-only, or those that are not, form a group, kept in the
// order of the kernel's reuseport array: listen order, but when a listener
// is released, the group's last listener takes its place
// (reuseport_detach_sock). A segment that reaches the group goes to its
// k-th listener, k = reciprocal_scale(hash, n) for a group of n, the hash
// being the segment's established hash (InetEhashfn or Inet6Ehashfn with
// the default hasher), as the kernel's inet_lookup_reuseport; so a given
// 4-tuple keeps reaching one listener while none joins or leaves the
// group. Where both groups on :: take an IPv6 segment, the group of the
// listener that listened first takes it, as in the kernel, whose lhash2
// chains keep IPv6 reuseport listeners in listen order. While listeners
// join or leave a group, a lookup may return any listener of the group
// that was listening during the lookup.
type TCPTable[T any] struct {
	est    *Table[T]
	lb     buckets // listener chains (nulls base 2^29), keyed by the port+address hash
	mix    uint32  // net_hash_mix of the port+address hash
	anyMix uint32  // jhash_1word(0, mix)

	// groups holds, for each stripe of lb, the reuseport groups whose
	// chains it guards; written under the stripe's lock.
	groups []atomic.Pointer[[]*tcpGroup[T]]

	restarts atomic.Uint64 // listener walks started again
	listens  atomic.Uint64 // listen sequence numbers (tcpGroup.first)

	// visit, set only by tests before the table is used, is called by
	// listener walks on each node of a chain before they read its next
	// link (the established walk has Table.visit); matched, on each node
	// whose key matched, before they read its listen word and value.
	visit, matched func(index uint32)
}

// NewTCPTable returns an empty table. Its options are those of New and
// apply to the established Table; the listener table gets as many buckets
// and lock stripes, and Secret.Seed, folded to 32 bits, stands for
// net_hash_mix in its port+address hash (IPv4PortaddrHash,
// IPv6PortaddrHash).
func NewTCPTable[T any](opts ...Option) *TCPTable[T] {
	var ok []Option
	for _, o := range opts {
		if o != nil {
			ok = append(ok, o)
		}
	}
	t := &TCPTable[T]{est: New[T](ok...)}
	a := t.est.arr.Load()
	t.lb.init(len(a.b.heads), len(a.b.stripes), listenerNullsBase)
	t.est.listenerStripes = t.lb.stripes
	t.groups = make([]atomic.Pointer[[]*tcpGroup[T]], len(t.lb.stripes))
	t.mix = portaddrMix(&t.est.secret)
	t.anyMix = JHash1Word(0, t.mix)
	return t
}

// Established returns the table of established connections. Flows inserted
// into it, directly or by its Connect, are found by Lookup before any
// listener. Connect sees no listener: to keep it off a listener's port, as the
// kernel's bind table does, hold the port with PortAllocator.Bind as well (for
// a listener on :: that is not IPv6-only, which takes IPv4 segments too, bind
// both :: and 0.0.0.0 on its port). Its Stats count the listeners' nodes among
// Nodes, since listeners share its node store.
func (t *TCPTable[T]) Established() *Table[T] {
	if t.est == nil {
		panic(zeroTCPTable)
	}
	return t.est
}

// listenerKey returns the key of a listener on (addr, port), addr in the
// form normAddr gives: hash and local port in meta, the listen word in the
// first remote word.
func (t *TCPTable[T]) listenerKey(addr netip.Addr, port uint16, word uint64) key {
	w := addrWords(addr)
	h := portaddrHashWords(&w, addr.Is4(), port, t.mix)
	return key{meta: uint64(h)<<32 | uint64(port)<<16, local: w, remote: [2]uint64{word, 0}}
}

// tcpGroup is a reuseport group: the listeners on one address and port that
// asked for port reuse and are all IPv6-only or all not, in the order of
// the kernel's reuseport array. It is never changed once published.
type tcpGroup[T any] struct {
	meta    uint64    // the listeners' key meta: port+address hash and port
	local   [2]uint64 // the listeners' address words
	v6only  bool
	first   uint64 // the smallest listen sequence number among its listeners
	members []tcpMember[T]
}

// tcpMember is a listener of a tcpGroup.
type tcpMember[T any] struct {
	val    *T
	node   uint32
	listen uint64 // its listen sequence number
}

// matches reports whether g is the group of listeners with key k.
func (g *tcpGroup[T]) matches(k *key) bool {
	return g.meta == k.meta && g.local == k.local && g.v6only == (k.remote[0]&listenV6Only != 0)
}

// changeGroup publishes the groups of stripe si with the group of key k
// (created if absent) replaced by change's result, or removed if that has
// no members. The caller holds the stripe's lock. A stripe's groups are
// sorted by meta, so that a lookup finds its own by binary search however
// many groups share the stripe.
func (t *TCPTable[T]) changeGroup(si uint32, k *key, change func(members []tcpMember[T]) []tcpMember[T]) {
	var old []*tcpGroup[T]
	if p := t.groups[si].Load(); p != nil {
		old = *p
	}
	groups := make([]*tcpGroup[T], 0, len(old)+1)
	g := &tcpGroup[T]{meta: k.meta, local: k.local, v6only: k.remote[0]&listenV6Only != 0}
	for _, x := range old {
		if x.matches(k) {
			g.members = x.members
		} else {
			groups = append(groups, x)
		}
	}
	if g.members = change(g.members); len(g.members) != 0 {
		g.first = g.members[0].listen
		for _, m := range g.members[1:] {
			g.first = min(g.first, m.listen)
		}
		groups = append(groups, g)
		slices.SortFunc(groups, func(a, b *tcpGroup[T]) int { return cmp.Compare(a.meta, b.meta) })
	}
	t.groups[si].Store(&groups)
}

// Listen adds a listener with value v on local, which may be the wildcard
// address of its family (0.0.0.0 or ::), and returns the function that
// removes it; release may be called more than once, and only its first call
// does anything. Its options are WithReusePort and WithIPv6Only (see
// TCPTable). Listen returns an error matching ErrPortInUse (and
// syscall.EADDRINUSE) if a listener is on the same address and port and
// not both asked for port reuse, ErrInvalidAddr for an invalid address,
// port 0, or WithIPv6Only on an IPv4 address, ErrNilValue for a nil v and
// ErrTableFull if the node store is exhausted; on error nothing changes.
func (t *TCPTable[T]) Listen(local netip.AddrPort, v *T, opts ...BindOption) (release func(), err error) {
	if t.est == nil {
		panic(zeroTCPTable)
	}
	var cfg bindConfig
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	addr, port := normAddr(local.Addr()), local.Port()
	switch {
	case !addr.IsValid():
		return nil, fmt.Errorf("%w: Listen on an invalid address", ErrInvalidAddr)
	case port == 0:
		return nil, fmt.Errorf("%w: Listen on %v: port 0", ErrInvalidAddr, local)
	case cfg.v6only && addr.Is4():
		return nil, fmt.Errorf("%w: Listen on %v: IPv6-only option on an IPv4 address", ErrInvalidAddr, local)
	case v == nil:
		return nil, fmt.Errorf("%w for Listen on %v", ErrNilValue, local)
	}
	var word uint64
	if cfg.reusePort {
		word |= listenReuse
	}
	if cfg.v6only {
		word |= listenV6Only
	}
	k := t.listenerKey(addr, port, word)
	h := uint32(k.meta >> 32)
	st := t.lb.stripe(h)
	st.mu.Lock()
	defer st.mu.Unlock()
	// N.B. the node goes to the head of the chain, as
	// hlist_nulls_add_head_rcu: nodes are reused at once, and one released
	// and reused at the tail of the chain a reader stands on would lead the
	// reader to the chain's own marker past the listeners behind the node's
	// old place; at the head it leads the reader over the whole chain
	// again. Listen order, which Linux keeps in the chain for IPv6
	// reuseport listeners, is in the groups' records instead (tcpGroup).
	for l := t.lb.head(h).load(); !l.isNulls(); {
		e := t.est.nodes.at(l.index())
		if e.key.matchesLocal(&k) && e.key.remote[0].Load()&word&listenReuse == 0 {
			return nil, fmt.Errorf("%w: listener on %v", ErrPortInUse, netip.AddrPortFrom(addr, port))
		}
		l = e.next.load()
	}
	i, ok := t.est.nodes.get(&st.cache)
	if !ok {
		return nil, ErrTableFull
	}
	e := t.est.nodes.at(i)
	// N.B. the node is free (seq even) and may have left an established
	// chain a moment ago: readers that stand on it ignore its key while it
	// is rewritten, and those that follow its next link into this chain
	// end on a listener marker and restart.
	e.key.store(&k)
	e.val.Store(v)
	linkAt(t.lb.head(h), nodeLink(i), &e.next)
	e.seq.Store(e.seq.Load() + 1) // live: N.B. after linking (see entry)
	st.count.Store(st.count.Load() + 1)
	if cfg.reusePort {
		m := tcpMember[T]{val: v, node: i, listen: t.listens.Add(1)}
		t.changeGroup(h&t.lb.stripeMask, &k, func(members []tcpMember[T]) []tcpMember[T] {
			return append(slices.Clip(members), m) // a new array: readers may hold the old one
		})
	}
	var once sync.Once
	return func() { once.Do(func() { t.unlisten(h, i) }) }, nil
}

// unlisten removes the listener in node i from the chain of hash h, as the
// kernel's inet_unhash, and recycles the node at once. The last listener
// of its reuseport group takes its place in the group
// (reuseport_detach_sock).
func (t *TCPTable[T]) unlisten(h, i uint32) {
	st := t.lb.stripe(h)
	st.mu.Lock()
	defer st.mu.Unlock()
	gone := t.est.nodes.at(i)
	var at *linkField // the field that links node i
	for prev, l := t.lb.head(h), t.lb.head(h).load(); !l.isNulls(); l = prev.load() {
		if l.index() == i {
			at = prev
			break
		}
		prev = &t.est.nodes.at(l.index()).next
	}
	if at == nil {
		return
	}
	if k := gone.key.load(); k.remote[0]&listenReuse != 0 {
		// N.B. before the node is freed: a record lists only live
		// listeners.
		t.changeGroup(h&t.lb.stripeMask, &k, func(members []tcpMember[T]) []tcpMember[T] {
			j := slices.IndexFunc(members, func(m tcpMember[T]) bool { return m.node == i })
			members = slices.Clone(members)
			members[j] = members[len(members)-1]
			return members[:len(members)-1]
		})
	}
	gone.seq.Store(gone.seq.Load() + 1) // free: N.B. before unlinking and clearing the value (see entry)
	unlink(at, &gone.next)
	gone.val.Store(nil)
	t.est.nodes.put(&st.cache, i, t.est.nodes.cacheMax())
	st.count.Store(st.count.Load() - 1)
}

// Lookup returns the value of the socket that owns pkt, a segment from
// pkt.Remote to pkt.Local: the established flow pkt if there is one, else
// the listener on pkt.Local, else the wildcard listener on pkt.Local's port:
// for an IPv4 segment 0.0.0.0, else :: (dual-stack); for an IPv6 one ::. It
// takes no lock and does not allocate. A segment whose addresses are
// invalid, whose destination is unspecified or port 0, or whose addresses
// are of different families reaches no listener.
func (t *TCPTable[T]) Lookup(pkt Tuple) (*T, bool) {
	// Table.Lookup's body, so that the established path costs what a
	// plain Table lookup does: no second copy of pkt.
	// N.B. a packet from port 0 cannot belong to a flow, and skipping the
	// established walk for it keeps its key from ever equalling a
	// listener node's (remote port 0), should the walk stray into a
	// listener chain.
	if t.est == nil {
		panic(zeroTCPTable)
	}
	var k key
	if pkt.Remote.Port() != 0 {
		t.est.tupleKey(&k, &pkt)
		if v, ok := t.est.lookup(&k, false); ok {
			return v, true
		}
	}
	return t.lookupListener(&pkt, uint32(k.meta>>32), pkt.Remote.Port() != 0)
}

// Kind says which socket of a TCPTable owns a segment.
type Kind uint8

const (
	KindNone        Kind = iota // no socket: the segment would get a RST
	KindEstablished             // the established flow of the segment's 4-tuple
	KindListener                // a listener on the segment's destination
)

// LookupKind is [TCPTable.Lookup] that also says which kind of socket
// answered, as a stack must know to pass a SYN to a listener and anything
// else to a flow. It costs a Lookup, and for a segment that reaches a
// reuseport group the flow hash once more.
func (t *TCPTable[T]) LookupKind(pkt Tuple) (*T, Kind, bool) {
	if v, ok := t.Established().Lookup(pkt); ok {
		return v, KindEstablished, true
	}
	if v, ok := t.lookupListener(&pkt, 0, false); ok {
		return v, KindListener, true
	}
	return nil, KindNone, false
}

// lookupListener is __inet_lookup_listener: the exact lhash2 chain, then
// the wildcard one; in each, the first listener on the segment's address
// and port, and if it is in a reuseport group, the group's listener that
// the segment's established hash picks (see pickListener for hash and
// hashed).
func (t *TCPTable[T]) lookupListener(pkt *Tuple, hash uint32, hashed bool) (*T, bool) {
	la, ra := pkt.Local.Addr().Unmap(), pkt.Remote.Addr().Unmap()
	lp := pkt.Local.Port()
	if !la.IsValid() || la.IsUnspecified() || !ra.IsValid() || la.Is4() != ra.Is4() || lp == 0 {
		return nil, false
	}
	// N.B. keys are filled in place, field by field (see udpPacket.set).
	var k, any4, any6 key
	is4 := la.Is4()
	setWords(&k.local, la)
	k.meta = uint64(portaddrHashWords(&k.local, is4, lp, t.mix))<<32 | uint64(lp)<<16
	if v, word, on := t.walkListeners(&k, nil); v != nil {
		return t.pickListener(on, v, word, false, pkt, hash, hashed), true
	}
	any6.meta = uint64(t.anyMix^uint32(lp))<<32 | uint64(lp)<<16 // :: and 0.0.0.0 hash alike
	var v *T
	var word uint64
	var on *key
	if is4 {
		any4.meta = any6.meta
		any4.local[1] = wordsAny4[1]
		v, word, on = t.walkListeners(&any4, &any6)
	} else {
		v, word, on = t.walkListeners(&any6, nil)
	}
	if v == nil {
		return nil, false
	}
	// An IPv4 segment that reached :: reaches only listeners that are not
	// IPv6-only.
	return t.pickListener(on, v, word, is4 && on == &any6, pkt, hash, hashed), true
}

// walkListeners walks the listener chain of k1 without locks and returns the
// value and listen word of the first live listener on k1's address and port,
// else of the first on k2's (if k2 is not nil and hashes like k1) that is not
// IPv6-only, else nil; and the key it matched, k1 or k2. A match is trusted
// only if the node's seq was odd and unchanged across the read (see entry); a
// miss only if the walk ended on this chain's own nulls marker: a node
// recycled into another listener chain, or into an established chain, while
// the walk stood on it leads to another marker, and the walk restarts.
func (t *TCPTable[T]) walkListeners(k1, k2 *key) (*T, uint64, *key) {
	b := t.lb.bucket(uint32(k1.meta >> 32))
	head := &t.lb.heads[b]
begin:
	var second *T
	var secondWord uint64
	l := head.load()
	for !l.isNulls() {
		e := t.est.nodes.at(l.index())
		if seq := e.seq.Load(); seq&1 == 1 {
			m1 := e.key.matchesLocal(k1)
			if m1 || (k2 != nil && second == nil && e.key.matchesLocal(k2)) {
				if t.matched != nil {
					t.matched(l.index())
				}
				word := e.key.remote[0].Load()
				v := e.val.Load()
				if e.seq.Load() != seq {
					t.restarts.Add(1)
					goto begin
				}
				if m1 {
					return v, word, k1
				}
				if word&listenV6Only == 0 {
					second, secondWord = v, word
				}
			}
		}
		if t.visit != nil {
			t.visit(l.index())
		}
		l = e.next.load()
	}
	if !t.endedHome(l, b) {
		goto begin
	}
	if second == nil {
		return nil, 0, nil
	}
	return second, secondWord, k2
}

// endedHome reports whether a listener walk of bucket b, ended on nulls
// marker l, ended on b's own; if not, the walk strayed into another chain
// and must start again, and endedHome counts the restart.
func (t *TCPTable[T]) endedHome(l link, b uint32) bool {
	if l.nullsValue() == t.lb.nullsBase+b {
		return true
	}
	t.restarts.Add(1)
	return false
}

// pickListener returns the listener that segment pkt reaches, given the
// value v and listen word of a listener on its address and port k that
// walkListeners found: v itself if it is alone there, else a listener of
// the reuseport group on k, the one at place reciprocal_scale(hash, n) of
// a group of n, as the kernel's inet_lookup_reuseport and
// reuseport_select_sock_by_hash. Of two groups on k, IPv6-only and not,
// the one with the listener that listened first takes the segment, or if
// dualOnly, the one that is not IPv6-only. hash is pkt's established hash
// if hashed, else pickListener computes it. N.B. the group's record may be
// newer than the listener the walk met: the answer is a listener of the
// record, each live when the record was loaded, or v if the group has
// left meanwhile.
func (t *TCPTable[T]) pickListener(k *key, v *T, word uint64, dualOnly bool, pkt *Tuple, hash uint32, hashed bool) *T {
	if word&listenReuse == 0 {
		return v
	}
	var g *tcpGroup[T]
	if p := t.groups[uint32(k.meta>>32)&t.lb.stripeMask].Load(); p != nil {
		groups := *p
		lo, hi := 0, len(groups) // the first group whose meta is not below k's
		for lo < hi {
			if m := int(uint(lo+hi) >> 1); groups[m].meta < k.meta {
				lo = m + 1
			} else {
				hi = m
			}
		}
		for _, x := range groups[lo:] {
			if x.meta != k.meta {
				break
			}
			if x.local == k.local && !(dualOnly && x.v6only) && (g == nil || x.first < g.first) {
				g = x
			}
		}
	}
	switch {
	case g == nil:
		return v
	case len(g.members) == 1:
		return g.members[0].val
	}
	if !hashed {
		var ek key
		t.est.tupleKey(&ek, pkt)
		hash = uint32(ek.meta >> 32)
	}
	return g.members[reciprocalScale(hash, len(g.members))].val
}
