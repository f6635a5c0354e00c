package hash4

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
)

// This file holds the TCP socket demultiplexer: the established table (a
// Table) and the listener table keyed by (local address, local port), the
// kernel's lhash2, looked up in the kernel's order (__inet_lookup: the
// established table, then __inet_lookup_listener).
//
// Invariants.
//
//   - Listener nodes are entries of a node store of their own, recycled
//     between listener chains while lock-free readers stand on them.
//     Listener chains end in nulls values offset by 2^29, as the kernel's
//     (LISTENING_NULLS_BASE). A listener key holds remote port 0, which no
//     established key has.
//   - A listener key's first remote word is its listen word (listenReuse
//     and the other bits below, and its listen sequence number); listener
//     walks match a key on its hash, port and local address alone
//     (entryKey.matchesLocal). IPv4 and IPv4-mapped listeners share their
//     local words and chain, as in the kernel, and differ by listenV6.
//   - Nodes go to the head of their chain (one reused at the tail would
//     lead a reader standing on it past the listeners behind its old
//     place). The kernel's chain order, which decides between listeners of
//     equal score, is computed from the listen words instead.
//   - A reuseport group (sock_reuseport) is a tcpGroup, an immutable record
//     of its listeners in the array's order, replaced whole under the
//     stripe lock of its chain. Each stripe lists the groups of its
//     chains. A record lists only live listeners.
//   - Each port slot lists the listeners of its ports, for bind conflicts;
//     Listen and release hold its mu around their chain work.
//
// Lock order: a port slot's mu, then a stripe's mu; in a table made
// WithPortAllocator, also a port slot's mu, then the allocator's (see
// portuse.go). Lookups take none.

// listenerNullsBase is added to the bucket index of a listener chain to make
// its nulls value, as the kernel's LISTENING_NULLS_BASE.
const listenerNullsBase = 1 << 29

// Bits of a listener's listen word (the first remote word of its key); its
// listen sequence number is above listenSeqShift.
const (
	listenReuse    = 1 << 0 // SO_REUSEPORT
	listenV6Only   = 1 << 1 // IPV6_V6ONLY
	listenV6       = 1 << 2 // an AF_INET6 socket
	listenSeqShift = 8
)

// wordsAny4 is the 16-byte form of 0.0.0.0 (::ffff:0.0.0.0) as addrWords
// gives it; that of :: is zero.
var wordsAny4 = addrWords(netip.IPv4Unspecified())

// TCPTable finds the TCP socket that owns a received segment, as Linux's TCP
// tables do: the established connection with the segment's 4-tuple, else the
// best listener on the segment's destination address and port, else the best
// one on the wildcard address of that port. Where listeners tie, the one
// Linux meets first wins, and one with [WithReusePort] hands the segment to a
// listener of its group by flow hash.
//
// Established connections are a [Table] ([TCPTable.Established]).
// [TCPTable.Listen] accepts and refuses listeners as Linux's bind() and
// listen() do; made [WithPortAllocator](a), its listeners also hold their
// ports in a's bind table. A listener on an IPv4-mapped address
// (::ffff:a.b.c.d) is an IPv6 socket: it takes IPv4 segments to a.b.c.d
// unless an IPv4 listener is there. [TCPTable.Lookup] takes no lock and
// never allocates; all methods are safe for concurrent use; make one with
// [NewTCPTable]. Devices, network namespaces and CPUs are not modelled.
type TCPTable[T any] struct {
	est    *Table[T]
	lb     chains // listener chains (nulls base 2^29), keyed by the port+address hash
	lnodes slab[entry[T]]
	ports  []tcpPort[T]
	mix    uint32 // net_hash_mix of the port+address hash
	anyMix uint32 // jhash_1word(0, mix)

	// groups holds, for each stripe of lb, the reuseport groups whose
	// chains it guards; written under the stripe's lock.
	groups []atomic.Pointer[[]*tcpGroup[T]]

	restarts atomic.Uint64 // listener walks started again
	listens  atomic.Uint64 // listen sequence numbers

	// owner holds the listeners' ports in the allocator of a table made
	// WithPortAllocator, or is nil.
	owner *bindOwner

	hooks *testHooks // nil but in tests: visit and matched
}

// tcpPort is a port slot: the listeners of its ports, for bind conflicts,
// and the fast-reuseport state of each of those ports.
type tcpPort[T any] struct {
	mu   sync.Mutex
	ls   []*tcpListener
	fast map[uint16]tcpFast
}

// tcpListener is a listener as bind conflicts read it.
type tcpListener struct {
	addr  sockAddr
	port  uint16
	reuse bool
}

// tcpFast is the SO_REUSEPORT fast path of a port's bind bucket (the
// kernel's tb->fastreuseport and fast_* fields), which lives as long as the
// port has listeners: fastAny while every listener asked for port reuse,
// fastStrict with the address of the last one that did not match it.
type tcpFast struct {
	mode int
	addr sockAddr
}

const (
	fastAny = 1 + iota
	fastStrict
)

// match is sk_reuseport_match: whether l may take the port without a
// conflict check.
func (f tcpFast) match(l *tcpListener) bool {
	switch {
	case f.mode == 0 || !l.reuse:
		return false
	case f.mode == fastAny:
		return true
	}
	return addrMatch(f.addr, l.addr, true, false)
}

// update is inet_csk_update_fastreuse after l took a port that had
// listeners if had.
func (f tcpFast) update(l *tcpListener, had bool) tcpFast {
	switch {
	case !l.reuse:
		return tcpFast{}
	case !had:
		return tcpFast{mode: fastAny, addr: l.addr}
	case !f.match(l):
		return tcpFast{mode: fastStrict, addr: l.addr}
	}
	return f
}

// NewTCPTable returns an empty table. Its options are those of New and
// apply to the established Table, whose hasher is [LinuxHasher] unless
// [WithHasher] says otherwise (its reuseport pick is then not the
// kernel's), but for [WithLockStripes], which sets the listener chains'
// locks. The listener table gets as many buckets, and the advice of
// [WithHugePages]; Secret.Seed, folded to 32 bits, stands for net_hash_mix
// in its port+address hash (IPv4PortaddrHash, IPv6PortaddrHash).
// [WithPortAllocator](a) also makes the listeners hold their ports in a
// (see [TCPTable.Listen]); NewTCPTable panics if a serves a UDPTable, as
// TCP and UDP ports are separate spaces.
func NewTCPTable[T any](opts ...Option) *TCPTable[T] {
	// N.B. LinuxHasher unless an option says otherwise: the reuseport pick
	// (pickListener) uses the established table's hash, which must be the
	// kernel's flow hash for the kernel's pick.
	cfg := tableConfig{capacity: defaultCapacity, hasher: LinuxHasher}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	t := &TCPTable[T]{est: newTable[T](&cfg)}
	n := len(t.est.arr.Load().lines)
	t.lb.init(n, cfg.stripeCount(), listenerNullsBase, cfg.hugePages)
	t.lnodes.setChunk(n / 64)
	t.groups = make([]atomic.Pointer[[]*tcpGroup[T]], len(t.lb.stripes))
	t.ports = make([]tcpPort[T], len(t.lb.heads))
	t.mix = portaddrMix(&t.est.secret)
	t.anyMix = JHash1Word(0, t.mix)
	if a := cfg.alloc; a != nil {
		t.owner = a.share("NewTCPTable", "TCP")
	}
	return t
}

// Established returns the table of established connections. Flows inserted
// into it, directly or by its Connect, are found by Lookup before any
// listener. In a table made [WithPortAllocator](a), the flows and the
// listeners share a's bind table: Connect skips a listener's port, from
// any local address, as the kernel's connect() skips a bound port, and
// Listen refuses the ports flows use (see [TCPTable.Listen]);
// without an allocator, Connect sees no listener.
func (t *TCPTable[T]) Established() *Table[T] {
	if t == nil {
		panic(nilTCPTable)
	}
	if t.est == nil {
		panic(zeroTCPTable)
	}
	return t.est
}

// listenerKey returns the key of a listener on (addr, port), addr in any
// form (IPv4-mapped addresses hash and match as IPv4 ones).
func (t *TCPTable[T]) listenerKey(addr netip.Addr, port uint16, word uint64) key {
	w := addrWords(addr)
	h := portaddrHashWords(&w, false, port, t.mix)
	return key{meta: uint64(h)<<32 | uint64(port)<<16, local: w, remote: [2]uint64{word, 0}}
}

// tcpGroup is a reuseport group: the listeners of one family on one address
// and port that asked for port reuse and are all IPv6-only or all not, in the
// order of the kernel's reuseport array. It is never changed once published.
type tcpGroup[T any] struct {
	meta    uint64    // the listeners' key meta: port+address hash and port
	local   [2]uint64 // the listeners' address words
	kind    uint64    // their listen words' listenV6 and listenV6Only bits
	members []tcpMember[T]
}

// tcpMember is a listener of a tcpGroup.
type tcpMember[T any] struct {
	val  *T
	node uint32
}

// groupKind is the part of a listen word that tells its listener's group.
func groupKind(word uint64) uint64 { return word & (listenV6 | listenV6Only) }

// matches reports whether g is the group of the listeners with key k and
// listen word word.
func (g *tcpGroup[T]) matches(k *key, word uint64) bool {
	return g.meta == k.meta && g.local == k.local && g.kind == groupKind(word)
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
	g := &tcpGroup[T]{meta: k.meta, local: k.local, kind: groupKind(k.remote[0])}
	for _, x := range old {
		if x.matches(k, k.remote[0]) {
			g.members = x.members
		} else {
			groups = append(groups, x)
		}
	}
	if g.members = change(g.members); len(g.members) != 0 {
		groups = append(groups, g)
		slices.SortFunc(groups, func(a, b *tcpGroup[T]) int { return cmp.Compare(a.meta, b.meta) })
	}
	t.groups[si].Store(&groups)
}

// Listen adds a listener with value v on local and returns the function that
// removes it; release may be called more than once, and only its first call
// does anything. local may be a wildcard address (0.0.0.0, ::, or
// ::ffff:0.0.0.0 for IPv4 segments only). Its options are [WithReusePort],
// [WithIPv6Only] and [WithReuseAddr], which lets no listener share a port.
// Listen returns an error matching [ErrPortInUse] (and syscall.EADDRINUSE)
// where Linux's bind() and listen() refuse (inet_csk_bind_conflict: a
// listener on an overlapping address of the port, unless both asked for port
// reuse), [ErrInvalidAddr] for an invalid address, port 0, or [WithIPv6Only]
// on an IPv4 or IPv4-mapped address, [ErrNilValue] for a nil v and
// [ErrTableFull] if the node store is exhausted; on error nothing changes.
//
// In a table made [WithPortAllocator](a), the listener also holds its
// port in a's bind table until released, as a listening socket does in
// Linux's: Connect skips the port and a.Bind refuses it; and Listen also
// returns ErrPortInUse where a.Bind or another table's listener holds the
// port, or, unless [WithReuseAddr], where a flow of the tables sharing a
// uses it, from a conflicting address (docs/design.md, "The bind table",
// has the rules). Listen and release then also take a's lock.
func (t *TCPTable[T]) Listen(local netip.AddrPort, v *T, opts ...BindOption) (release func(), err error) {
	if t == nil {
		panic(nilTCPTable)
	}
	if t.est == nil {
		panic(zeroTCPTable)
	}
	var cfg bindConfig
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	addr, port := local.Addr().WithZone(""), local.Port()
	switch {
	case !addr.IsValid():
		return nil, fmt.Errorf("%w: Listen on an invalid address", ErrInvalidAddr)
	case port == 0:
		return nil, fmt.Errorf("%w: Listen on %v: port 0", ErrInvalidAddr, local)
	case cfg.v6only && (addr.Is4() || addr.Is4In6()):
		return nil, fmt.Errorf("%w: Listen on %v: IPv6-only option on an IPv4 address", ErrInvalidAddr, local)
	case v == nil:
		return nil, fmt.Errorf("%w for Listen on %v", ErrNilValue, local)
	}
	v6 := addr.Is6()
	// __inet6_bind makes a socket on a specific IPv6 address IPv6-only.
	v6only := cfg.v6only || (v6 && !addr.Is4In6() && !addr.IsUnspecified())
	l := &tcpListener{addr: newSockAddr(addr, v6, v6only), port: port, reuse: cfg.reusePort}
	ps := &t.ports[uint32(port)&t.lb.mask]
	ps.mu.Lock()
	defer ps.mu.Unlock()
	fast, had := ps.fast[port]
	fastOK := fast.match(l)
	if !fastOK {
		for _, o := range ps.ls {
			if o.port == port && addrEqual(l.addr, o.addr, true) && !(l.reuse && o.reuse) {
				return nil, fmt.Errorf("%w: %v, by another listener", ErrPortInUse, local)
			}
		}
	}
	unhold := func() {}
	if t.owner != nil {
		// N.B. the fast path skips the flows as inet_csk_get_port skips
		// inet_csk_bind_conflict, accepted connections included; see
		// Listen for the flows' options.
		if unhold, err = t.est.PortAllocator().holdSocket(t.owner, local, heldAddrs(addr, v6only), fastOK || cfg.reuseAddr); err != nil {
			return nil, err
		}
	}
	word := t.listens.Add(1) << listenSeqShift
	if cfg.reusePort {
		word |= listenReuse
	}
	if v6only {
		word |= listenV6Only
	}
	if v6 {
		word |= listenV6
	}
	k := t.listenerKey(addr, port, word)
	h := uint32(k.meta >> 32)
	st := t.lb.stripe(h)
	st.mu.Lock()
	i, ok := t.lnodes.get(&st.cache)
	if !ok {
		st.mu.Unlock()
		unhold()
		return nil, ErrTableFull
	}
	// N.B. the node is free and may have left another chain a moment
	// ago: readers that stand on it ignore its key while it is rewritten,
	// and those that follow its next link into this chain end on this
	// chain's marker, not their own, and restart.
	t.lnodes.at(i).fill(&k, v, nodeLink(i), t.lb.head(h))
	st.count.Store(st.count.Load() + 1)
	if cfg.reusePort { // inet_reuseport_add_sock
		m := tcpMember[T]{val: v, node: i}
		t.changeGroup(h&t.lb.stripeMask, &k, func(members []tcpMember[T]) []tcpMember[T] {
			return append(slices.Clip(members), m) // a new array: readers may hold the old one
		})
	}
	st.mu.Unlock()
	ps.ls = append(ps.ls, l)
	if ps.fast == nil {
		ps.fast = map[uint16]tcpFast{}
	}
	ps.fast[port] = fast.update(l, had)
	var once sync.Once
	return func() {
		once.Do(func() {
			ps.mu.Lock()
			defer ps.mu.Unlock()
			ps.ls = slices.DeleteFunc(ps.ls, func(o *tcpListener) bool { return o == l })
			if !slices.ContainsFunc(ps.ls, func(o *tcpListener) bool { return o.port == port }) {
				delete(ps.fast, port) // the bind bucket goes with its last owner
			}
			t.unlisten(h, i)
			unhold()
		})
	}, nil
}

// heldAddrs returns the addresses, in the allocator's terms, that a socket
// bound to addr (normalized: IPv4, IPv6 or IPv4-mapped) holds its port for
// in a shared allocator: addr, and for a dual-stack :: also 0.0.0.0, since
// it takes IPv4 packets and conflicts with IPv4 binds.
func heldAddrs(addr netip.Addr, v6only bool) []netip.Addr {
	if addr.Is6() && !addr.Is4In6() && addr.IsUnspecified() && !v6only {
		return []netip.Addr{addr, netip.IPv4Unspecified()}
	}
	return []netip.Addr{addr}
}

// unlisten removes the listener in node i from the chain of hash h, as the
// kernel's inet_unhash, and recycles the node at once. The last listener
// of its reuseport group takes its place in the group
// (reuseport_detach_sock).
func (t *TCPTable[T]) unlisten(h, i uint32) {
	st := t.lb.stripe(h)
	st.mu.Lock()
	defer st.mu.Unlock()
	gone := t.lnodes.at(i)
	var at *linkField // the field that links node i
	for prev, l := t.lb.head(h), t.lb.head(h).load(); !l.isNulls(); l = prev.load() {
		if l.index() == i {
			at = prev
			break
		}
		prev = &t.lnodes.at(l.index()).next
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
	gone.empty(at) // N.B. free, then unlinked (entry's rule 2)
	t.lnodes.put(&st.cache, i, slabCacheMax)
	st.count.Store(st.count.Load() - 1)
}

// Lookup returns the value of the socket that owns pkt, a segment from
// pkt.Remote to pkt.Local: the established flow pkt if there is one, else a
// listener (see [TCPTable]). It takes no lock and does not allocate. A
// segment whose addresses are invalid, whose destination is unspecified or
// port 0, or whose addresses are of different families reaches no listener.
func (t *TCPTable[T]) Lookup(pkt Tuple) (*T, bool) {
	// Table.Lookup's body, so that the established path costs what a
	// plain Table lookup does: no second copy of pkt.
	// N.B. a packet from port 0 cannot belong to a flow, and skipping the
	// established walk for it keeps its key from ever equalling a
	// listener node's (remote port 0), should the walk stray into a
	// listener chain.
	if t == nil {
		panic(nilTCPTable)
	}
	if t.est == nil {
		panic(zeroTCPTable)
	}
	var k key
	if pkt.Remote.Port() != 0 {
		t.est.tupleKey(&k, &pkt)
		if v, ok := t.est.lookup(&k); ok {
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

// String returns "none", "established" or "listener".
func (k Kind) String() string {
	switch k {
	case KindNone:
		return "none"
	case KindEstablished:
		return "established"
	case KindListener:
		return "listener"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

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
// the wildcard one (see pickListener for hash and hashed).
func (t *TCPTable[T]) lookupListener(pkt *Tuple, hash uint32, hashed bool) (*T, bool) {
	// N.B. the zone goes, as keys drop it: ::%eth0 is unspecified too.
	la, ra := pkt.Local.Addr().Unmap().WithZone(""), pkt.Remote.Addr().Unmap()
	lp := pkt.Local.Port()
	if !la.IsValid() || la.IsUnspecified() || !ra.IsValid() || la.Is4() != ra.Is4() || lp == 0 {
		return nil, false
	}
	// N.B. keys are filled in place, field by field (see udpPacket.set).
	var k, any4, any6 key
	is4 := la.Is4()
	setWords(&k.local, la)
	k.meta = uint64(portaddrHashWords(&k.local, is4, lp, t.mix))<<32 | uint64(lp)<<16
	on := &k
	x := t.walkListeners(&k, nil, is4)
	if x.v == nil {
		any6.meta = uint64(t.anyMix^uint32(lp))<<32 | uint64(lp)<<16 // :: and 0.0.0.0 hash alike
		if is4 {
			any4.meta = any6.meta
			any4.local[1] = wordsAny4[1]
			on = &any4
			x = t.walkListeners(&any4, &any6, true)
		} else {
			on = &any6
			x = t.walkListeners(&any6, nil, false)
		}
		if x.v == nil {
			return nil, false
		}
		if x.second {
			on = &any6
		}
	}
	if x.word&listenReuse == 0 {
		return x.v, true
	}
	return t.pickListener(on, x.v, x.word, pkt, hash, hashed), true
}

// listenerHit is a listener that a walk found: its value, listen word and
// whether it matched the walk's second key.
type listenerHit[T any] struct {
	v      *T
	word   uint64
	second bool
}

// before reports whether a listener with listen word a comes before one with
// word b in the kernel's chain order: IPv6 reuseport listeners at the tail in
// listen order, the others at the head, newest first.
func before(a, b uint64) bool {
	const tail = listenV6 | listenReuse
	at, bt := a&tail == tail, b&tail == tail
	if at != bt {
		return bt
	}
	return at == (a < b) // N.B. the sequence numbers are the words' top bits
}

// walkListeners walks the listener chain of k1 without locks for the
// listeners on k1's address and port, and if k2 is not nil (it hashes like
// k1), on k2's, and returns the first of them in the kernel's chain order;
// for an IPv4 segment (is4) IPv6-only listeners take no part. That one wins,
// as in inet_lhash2_lookup: listeners a segment reaches in one chain share
// its address, and bind conflicts let two of them share it only if both set
// SO_REUSEPORT, so the first one's group takes the segment. A miss is
// trusted only if the walk ended on this chain's own marker: a node recycled
// into another chain while the walk stood on it leads to another marker, and
// the walk restarts.
func (t *TCPTable[T]) walkListeners(k1, k2 *key, is4 bool) listenerHit[T] {
	b := t.lb.bucket(uint32(k1.meta >> 32))
	head := &t.lb.heads[b]
begin:
	var first listenerHit[T]
	l := head.load()
	for !l.isNulls() {
		i := l.index()
		e := t.lnodes.at(i)
		var hit listenerHit[T]
		hit.v, hit.word = e.readListener(k1, t.hooks, i)
		if hit.word == 0 && k2 != nil {
			hit.second = true
			hit.v, hit.word = e.readListener(k2, t.hooks, i)
		}
		if hit.word == wordChanged {
			t.restarts.Add(1)
			goto begin
		}
		if hit.v != nil && !(is4 && hit.word&listenV6Only != 0) {
			if first.v == nil || before(hit.word, first.word) {
				first = hit
			}
			// The chain holds the listeners the kernel adds at the
			// head in its order, newest first, and those come first.
			if first.word&(listenV6|listenReuse) != listenV6|listenReuse {
				return first
			}
		}
		t.hooks.onVisit(i)
		l = e.next.load()
	}
	if l.nullsValue() != t.lb.nullsBase+b {
		t.restarts.Add(1)
		goto begin
	}
	return first
}

// readListener is entry.read for a listener walk: it returns e's value and
// listen word if e is live and holds k's hash, port and local address
// (entryKey.matchesLocal), unchanged across the read; nil and 0 if e does
// not hold k, and nil and wordChanged if the second load of seq contradicts
// a match. h's matched hook runs between the match and the reads.
func (e *entry[T]) readListener(k *key, h *testHooks, i uint32) (v *T, word uint64) {
	seq := e.seq.Load()
	if seq&seqLive == 0 || !e.key.matchesLocal(k) {
		return nil, 0
	}
	h.onMatched(i)
	word, v = e.key.remote[0].Load(), e.val.Load()
	if e.seq.Load() != seq {
		return nil, wordChanged
	}
	return v, word
}

// wordChanged is what readListener returns for a match that the entry's
// seq contradicts: no listen word is all ones.
const wordChanged = ^uint64(0)

// onMatched calls h's matched hook, if h has one.
func (h *testHooks) onMatched(i uint32) {
	if h != nil && h.matched != nil {
		h.matched(i)
	}
}

// pickListener returns the listener of the reuseport group of listener v,
// with key k and listen word word, that segment pkt reaches, the one at place reciprocal_scale(hash, n) of a
// group of n, as inet_lookup_reuseport and reuseport_select_sock_by_hash.
// hash is pkt's established hash if hashed, else pickListener computes it.
// N.B. the group's record may be newer than the listener the walk met: the
// answer is a listener of the record, each live when the record was
// loaded, or v itself if the group has left meanwhile.
func (t *TCPTable[T]) pickListener(k *key, v *T, word uint64, pkt *Tuple, hash uint32, hashed bool) *T {
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
		for _, y := range groups[lo:] {
			if y.meta != k.meta {
				break
			}
			if y.matches(k, word) {
				g = y
				break
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
