package hash4

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
)

// This file holds the UDP socket demultiplexer: the kernel's tables of UDP
// sockets, hash2 keyed by (local address, local port), hash4 keyed by the
// 4-tuple of connected sockets (Linux 6.13+), the primary table keyed by
// port that bind() checks for conflicts, and the lookup that picks the
// socket owning a received packet (__udp4_lib_lookup / __udp6_lib_lookup).
//
// Invariants.
//
//   - A socket is, at any time, one binding: its local address, family and
//     flags, immutable once published, but for the peer of a binding with
//     a concrete address and its reuseport group. connect() of a socket on
//     a wildcard address replaces its binding by one on the source address
//     (udp_lib_rehash moves the kernel's socket to that address's hash2
//     slot), and a disconnect replaces it by a binding on the wildcard
//     again.
//   - A hash2 slot's chain is an immutable slice of bindings in the order
//     of the kernel's chain: udp_lib_get_port adds a socket at the head,
//     but an AF_INET6 socket with SO_REUSEPORT at the tail, and a rehash
//     adds it at the head. Writers replace the slice under the slot's mu;
//     lookups load it once and walk it without locks, as
//     udp4_lib_lookup2, whose first socket to raise the best score wins
//     and, if its reuseport group has never had a connected member
//     (reuseport_has_conns), answers at once with the group's pick.
//   - A reuseport group (the kernel's sock_reuseport) holds its sockets in
//     the order of the kernel's array: reuseport_add_sock appends,
//     reuseport_detach_sock moves the last socket into the gap. Its
//     record is replaced whole under the lock of the group's port.
//   - The primary slot of a port holds its sockets in bind order; Bind
//     checks conflicts against them newest first, as udp_lib_lport_inuse
//     walks the kernel's primary chain, and all changes to the sockets of
//     a port happen under its primary slot's mu.
//   - hash4 is a bucket array (bucket.go) of hlist_nulls chains (nulls.go)
//     keyed by UDPEhashfn / UDP6Ehashfn. Its nodes are entries (table.go)
//     in a node store (slab.go): each binding with a concrete local
//     address owns one. Its first connect links it at the head of its
//     chain (udp_lib_hash4), where it stays until the binding ends: later
//     connects only rekey it in place and a disconnect makes it match
//     nothing, as the kernel leaves the socket in the chain of its first
//     peer. Readers standing on a node that is rekeyed or recycled
//     validate with the entry's sequence counter and restart on a foreign
//     nulls marker.
//   - Each hash2 slot counts its bindings linked in hash4 (hash4_cnt);
//     Lookup reads hash4 only when that count is not zero.
//
// Lock order: UDPSocket.mu, a primary slot's mu, a hash2 slot's mu, a hash4
// stripe's mu; in a table made WithPortAllocator, also UDPSocket.mu or a
// primary slot's mu, then the allocator's (see portuse.go). Lookups take
// none of them.

// UDPTable finds the UDP socket that owns a received packet, as Linux's UDP
// tables do: the connected socket with the packet's exact 4-tuple, else the
// best-scoring socket bound to the packet's destination address and port,
// else the best one on the wildcard address of that port. Sockets sharing a
// port with [WithReusePort] split packets by flow hash.
//
// [UDPTable.Bind] accepts and refuses binds as Linux's bind() does; a socket
// on a wildcard address takes a concrete one when it connects
// ([UDPSocket.ConnectFrom]); a socket's first connect takes it out of its
// reuseport group, and a socket connected again to another peer is found by
// score, as in Linux 6.13 and later. An IPv4-mapped address (::ffff:a.b.c.d)
// makes an IPv6 socket, which an IPv4 socket on a.b.c.d outranks.
// [UDPTable.Lookup] takes no lock and never allocates; all methods are safe
// for concurrent use. Devices, network namespaces and CPUs are not modelled.
type UDPTable[T any] struct {
	slots []udpSlot[T] // hash2
	ports []udpPort[T] // the primary table, by port
	mask  uint32
	h4    chains // hash4 chains (nulls base 0); stripes guard chains and node caches
	nodes slab[entry[T]]

	secret Secret
	mix    uint32 // net_hash_mix of the port+address hash
	anyMix uint32 // jhash_1word(0, mix): the wildcard part of a wildcard slot's hash

	ids      atomic.Uint64 // bind sequence numbers
	restarts atomic.Uint64 // hash4 walks started again

	// alloc is the allocator of a table made WithPortAllocator, or nil;
	// owner holds the sockets' ports in it.
	alloc *PortAllocator
	owner *bindOwner

	// hash4Off, set only by tests and benchmarks before the table is used,
	// makes Lookup skip step 1 (hash4).
	hash4Off bool
	hooks    *testHooks // nil but in tests: visit is called by hash4 walks
}

// udpSlot is one hash2 slot.
type udpSlot[T any] struct {
	// chain is the slot's bindings in the kernel's chain order; never
	// changed once published. N.B. written only under mu, read without it.
	chain atomic.Pointer[[]*udpBinding[T]]
	// hash4Cnt counts the slot's bindings that are linked in hash4. N.B.
	// it is a hint: it is raised before a node is linked and lowered after
	// it is unlinked, and a lookup that reads 0 while a socket is in hash4
	// still finds that socket by scoring.
	hash4Cnt atomic.Int32
	mu       sync.Mutex
	// Pad to 32 bytes, so that no slot straddles a cache line.
	_ [32 - ptrSize - 4 - 8]byte
}

// udpPort is one primary slot: the sockets of its ports in bind order.
type udpPort[T any] struct {
	mu    sync.Mutex
	socks []*UDPSocket[T]
}

// UDPSocket is a socket bound in a [UDPTable], made by [UDPTable.Bind]. Its
// methods are safe for concurrent use.
type UDPSocket[T any] struct {
	// Set by Bind, then never changed.
	t                          *UDPTable[T]
	val                        *T
	port                       uint16
	v6                         bool // an AF_INET6 socket
	v6only, reusePort, reuseAd bool
	id                         uint64 // bind sequence number

	mu     sync.Mutex // serializes Connect, Disconnect and Close
	closed bool
	unhold func() // releases the port's hold in the table's allocator, if any
	// b is the socket's binding. N.B. written under mu and the lock of
	// its primary slot, read under either.
	b *udpBinding[T]
}

// udpBinding is what a socket is bound to, as a hash2 chain holds it.
type udpBinding[T any] struct {
	s       *UDPSocket[T]
	val     *T
	lw      [2]uint64 // local address, 16-byte form (IPv4 addresses mapped)
	addr    sockAddr  // for bind conflicts
	port    uint16
	v6      bool // the socket is AF_INET6
	wild    bool // 0.0.0.0, :: or ::ffff:0.0.0.0
	v6only  bool
	reuse   bool   // SO_REUSEPORT
	moved   bool   // its address was fixed by connect
	hasNode bool   // owns a hash4 node: a concrete address
	node    uint32 // its hash4 node, if hasNode
	h2      uint32 // hash2 hash of its address and port
	local   netip.AddrPort

	// peer is the connected peer, or nil. N.B. read by lookups without
	// locks; written under s.mu.
	peer atomic.Pointer[udpPeer]
	// group is its reuseport group, or nil. N.B. read by lookups without
	// locks; written under its primary slot's lock.
	group atomic.Pointer[udpReuse[T]]

	hashed4 bool   // its node is linked in hash4; under s.mu
	live4   bool   // its node is live: it matches its key; under s.mu
	h4      uint32 // hash4 hash of the chain its node is linked in
}

// udpPeer is the remote end of a connected socket, immutable once published.
type udpPeer struct {
	w    [2]uint64 // address, 16-byte form
	port uint16
	addr netip.AddrPort
}

// NewUDPTable returns an empty table. [WithCapacity] sets the number of hash2
// slots, which is also the number of hash4 chains, rounded up to a power of
// two (default 1024); [WithLockStripes] the number of hash4 writer locks;
// [WithSecret] the keys of the hashes; [WithPortAllocator](a) makes the
// sockets hold their ports in a (see [UDPTable.Bind]); [WithHugePages]
// advises the hash4 chain heads, as New does a Table's. It panics, as [New]
// does, for bad option values, for [WithHasher], [WithFixedBuckets] and
// [WithMaxBuckets], which do not apply: the tables keep the size they are
// made with, as the kernel's do, and for an allocator that serves a
// TCPTable, as TCP and UDP ports are separate spaces.
func NewUDPTable[T any](opts ...Option) *UDPTable[T] {
	cfg := tableConfig{capacity: 1024}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	cfg.only("NewUDPTable")
	t := &UDPTable[T]{}
	if cfg.secret != nil {
		t.secret = *cfg.secret
	} else {
		t.secret = NewSecret()
	}
	t.mix = portaddrMix(&t.secret)
	t.anyMix = JHash1Word(0, t.mix)
	t.h4.init(cfg.capacity, cfg.stripeCount(), 0, cfg.hugePages)
	t.slots = make([]udpSlot[T], len(t.h4.heads))
	t.ports = make([]udpPort[T], len(t.h4.heads))
	t.mask = t.h4.mask
	if cfg.alloc != nil {
		t.alloc, t.owner = cfg.alloc, cfg.alloc.share("NewUDPTable", "UDP")
	}
	// Bindings' nodes are carved in chunks of a 64th of the buckets, as a
	// Table's nodes beyond its home slots (New).
	t.nodes.setChunk(len(t.h4.heads) / 64)
	return t
}

// portaddrMix returns the net_hash_mix of a table's port+address hashes.
func portaddrMix(s *Secret) uint32 { return uint32(s.Seed) ^ uint32(s.Seed>>32) }

// portaddrHash is portaddrHashWords of addr, in normAddr form.
func portaddrHash(addr netip.Addr, port uint16, mix uint32) uint32 {
	w := addrWords(addr)
	return portaddrHashWords(&w, addr.Is4(), port, mix)
}

// udpEhash returns the hash4 hash of a flow, addresses in words, as
// udp_ehashfn (is4: UDPEhashfn) or udp6_ehashfn (UDP6Ehashfn).
func (t *UDPTable[T]) udpEhash(lw *[2]uint64, is4 bool, lport uint16, rw *[2]uint64, rport uint16) uint32 {
	return udpEhashWords(lw, rw, is4, lport, rport, t.secret.Ehash, t.secret.Ehash6Addr)
}

// newBinding returns an unpublished binding of s on addr (the socket's form:
// IPv4 for an AF_INET socket, IPv6 or IPv4-mapped for an AF_INET6 one).
func (t *UDPTable[T]) newBinding(s *UDPSocket[T], addr netip.Addr) *udpBinding[T] {
	b := &udpBinding[T]{
		s: s, val: s.val, lw: addrWords(addr), port: s.port, v6: s.v6,
		v6only: s.v6only, reuse: s.reusePort,
		local: netip.AddrPortFrom(addr, s.port),
	}
	b.wild = addr.Unmap().IsUnspecified()
	b.addr = newSockAddr(addr, s.v6, s.v6only)
	b.h2 = portaddrHashWords(&b.lw, !s.v6, s.port, t.mix)
	b.hasNode = !b.wild
	return b
}

// Bind binds a socket with value v to local and returns it. local may be the
// wildcard address of its family (0.0.0.0 or ::); an IPv4-mapped address
// makes an IPv6 socket, ::ffff:0.0.0.0 one that receives IPv4 packets only.
// Bind fails with an error matching [ErrPortInUse] (and syscall.EADDRINUSE)
// where Linux's bind() does (udp_lib_lport_inuse), ErrInvalidAddr for an
// invalid address, port 0, or [WithIPv6Only] on an IPv4 or IPv4-mapped
// address, and [ErrNilValue] for a nil v; on error nothing changes.
//
// In a table made [WithPortAllocator](a), the socket also holds its port
// in a's bind table until [UDPSocket.Close], for the address Bind was
// given, as [TCPTable.Listen] does, with the same refusals (docs/design.md,
// "The bind table", has the rules). Bind and Close then also take a's lock.
func (t *UDPTable[T]) Bind(local netip.AddrPort, v *T, opts ...BindOption) (*UDPSocket[T], error) {
	if t == nil {
		panic(nilUDPTable)
	}
	if t.slots == nil {
		panic(zeroUDPTable)
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
		return nil, fmt.Errorf("%w: Bind of an invalid address", ErrInvalidAddr)
	case port == 0:
		return nil, fmt.Errorf("%w: Bind of %v: port 0", ErrInvalidAddr, local)
	case cfg.v6only && (addr.Is4() || addr.Is4In6()):
		return nil, fmt.Errorf("%w: Bind of %v: IPv6-only option on an IPv4 address", ErrInvalidAddr, local)
	case v == nil:
		return nil, fmt.Errorf("%w for Bind of %v", ErrNilValue, local)
	}
	s := &UDPSocket[T]{
		t: t, val: v, port: port, v6: addr.Is6(),
		// __inet6_bind makes a socket on a specific IPv6 address IPv6-only.
		v6only:    cfg.v6only || (addr.Is6() && !addr.Is4In6() && !addr.IsUnspecified()),
		reusePort: cfg.reusePort, reuseAd: cfg.reuseAddr,
	}
	b := t.newBinding(s, addr)
	ps := &t.ports[uint32(port)&t.mask]
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if t.inUse(ps, b) {
		return nil, fmt.Errorf("%w: %v, by another socket", ErrPortInUse, local)
	}
	if t.owner != nil {
		var err error
		if s.unhold, err = t.alloc.holdSocket(t.owner, local, heldAddrs(addr, s.v6only), cfg.reuseAddr); err != nil {
			return nil, err
		}
	}
	if b.hasNode {
		i, ok := t.getNode(b.h2)
		if !ok {
			if s.unhold != nil {
				s.unhold()
			}
			return nil, ErrTableFull
		}
		b.node = i
		// N.B. the node is free and in no chain: readers that
		// stand on it from its last life ignore it, so it can be written.
		t.nodes.at(i).val.Store(v)
	}
	s.id = t.ids.Add(1)
	s.b = b
	if s.reusePort {
		t.joinGroup(ps, b)
	}
	ps.socks = append(ps.socks, s)
	t.link(b, s.v6 && s.reusePort)
	return s, nil
}

// link publishes b in its hash2 slot's chain, at the tail if tail, else at
// the head.
func (t *UDPTable[T]) link(b *udpBinding[T], tail bool) {
	slot := &t.slots[b.h2&t.mask]
	slot.mu.Lock()
	defer slot.mu.Unlock()
	var old []*udpBinding[T]
	if p := slot.chain.Load(); p != nil {
		old = *p
	}
	chain := make([]*udpBinding[T], 0, len(old)+1)
	if !tail {
		chain = append(chain, b)
	}
	chain = append(chain, old...)
	if tail {
		chain = append(chain, b)
	}
	// N.B. b is complete before this store publishes it to readers.
	slot.chain.Store(&chain)
}

// unlink removes b from its hash2 slot's chain.
func (t *UDPTable[T]) unlink(b *udpBinding[T]) {
	slot := &t.slots[b.h2&t.mask]
	slot.mu.Lock()
	defer slot.mu.Unlock()
	chain := slices.DeleteFunc(slices.Clone(*slot.chain.Load()), func(x *udpBinding[T]) bool { return x == b })
	if len(chain) == 0 {
		slot.chain.Store(nil)
	} else {
		slot.chain.Store(&chain)
	}
}

// getNode takes a free hash4 node from the cache of the stripe that covers
// hash h.
func (t *UDPTable[T]) getNode(h uint32) (uint32, bool) {
	st := t.h4.stripe(h)
	st.mu.Lock()
	defer st.mu.Unlock()
	return t.nodes.get(&st.cache)
}

// putNode returns node i, unlinked and free, to the cache of the stripe that
// covers hash h. It may be reused at once while readers still stand on it.
func (t *UDPTable[T]) putNode(h uint32, i uint32) {
	st := t.h4.stripe(h)
	st.mu.Lock()
	defer st.mu.Unlock()
	t.nodes.at(i).val.Store(nil)
	t.nodes.put(&st.cache, i, slabCacheMax)
}

// udpPacket is a received packet in the form the lookup reads.
type udpPacket struct {
	lw, rw       [2]uint64 // addresses, IPv4-mapped for IPv4 (addrWords)
	lport, rport uint16
	is4          bool
	hashed       bool   // hash is set (flowHash)
	hash         uint32 // the flow hash, once computed
}

// set fills p from pkt and reports whether a socket can receive it: false
// if the destination address is invalid or unspecified, the destination
// port is 0, or the source address is invalid or of the other family. The
// source may be unspecified and its port 0 (a DHCP client sends from
// 0.0.0.0:68). N.B. p is filled in place, field by field, and never copied
// whole: on a hot path a copy of a struct just written in 8-byte stores
// defeats store-to-load forwarding.
func (p *udpPacket) set(pkt Tuple) bool {
	// N.B. the zone goes, as keys drop it: ::%eth0 is unspecified too.
	la, ra := pkt.Local.Addr().Unmap().WithZone(""), pkt.Remote.Addr().Unmap()
	if !la.IsValid() || la.IsUnspecified() || !ra.IsValid() || la.Is4() != ra.Is4() || pkt.Local.Port() == 0 {
		return false
	}
	p.lport, p.rport, p.is4 = pkt.Local.Port(), pkt.Remote.Port(), la.Is4()
	setWords(&p.lw, la)
	setWords(&p.rw, ra)
	return true
}

// flowHash returns the hash4 hash of p, which is also its reuseport hash:
// a packet that reaches a reuseport group after a hash4 miss is hashed once.
func (t *UDPTable[T]) flowHash(p *udpPacket) uint32 {
	if !p.hashed {
		p.hash, p.hashed = t.udpEhash(&p.lw, p.is4, p.lport, &p.rw, p.rport), true
	}
	return p.hash
}

// Lookup returns the value of the socket that receives pkt, a packet from
// pkt.Remote to pkt.Local, and whether one does; see [UDPTable]. It takes no
// lock and does not allocate. A packet no socket can receive (an invalid or
// unspecified destination, destination port 0, addresses of two families) is
// not found.
func (t *UDPTable[T]) Lookup(pkt Tuple) (*T, bool) {
	var p udpPacket
	if !p.set(pkt) {
		return nil, false
	}
	if t == nil {
		panic(nilUDPTable)
	}
	if t.slots == nil {
		panic(zeroUDPTable)
	}
	slot := &t.slots[portaddrHashWords(&p.lw, p.is4, p.lport, t.mix)&t.mask]
	if !t.hash4Off && slot.hash4Cnt.Load() > 0 {
		var k key
		k.meta = uint64(t.flowHash(&p))<<32 | uint64(p.lport)<<16 | uint64(p.rport)
		k.remote[0], k.remote[1] = p.rw[0], p.rw[1]
		k.local[0], k.local[1] = p.lw[0], p.lw[1]
		if v := t.lookup4(&k); v != nil {
			return v, true
		}
	}
	if v := t.walk(slot, &p, false); v != nil {
		return v, true
	}
	v := t.walk(&t.slots[(t.anyMix^uint32(p.lport))&t.mask], &p, true)
	return v, v != nil
}

// lookup4 walks the hash4 chain of k without locks, as the kernel's
// udp4_lib_lookup4, and returns the value of the first live node holding k,
// or nil. A match is trusted only if the node was live and its seq unchanged
// across the read (see entry); a miss only if the walk ended on its own
// chain's nulls marker, since a node moved or recycled into another chain
// while the walk stood on it leads into that chain; otherwise the walk
// restarts.
func (t *UDPTable[T]) lookup4(k *key) *T {
	b := t.h4.bucket(uint32(k.meta >> 32))
	head := &t.h4.heads[b]
begin:
	l := head.load()
	for !l.isNulls() {
		e := t.nodes.at(l.index())
		v, ok, changed := e.read(k)
		if ok {
			return v
		}
		if changed {
			t.restarts.Add(1)
			goto begin
		}
		t.hooks.onVisit(l.index())
		l = e.next.load()
	}
	if l.nullsValue() != t.h4.nullsBase+b {
		t.restarts.Add(1)
		goto begin
	}
	return nil
}

// walk returns the value of the socket of slot that takes p, or nil, as the
// kernel's udp4_lib_lookup2 in the exact step (wild false) or the wildcard
// step: in chain order, the first socket to score above the best so far
// becomes the answer; if it is unconnected and in a reuseport group, the
// group's pick does, and ends the walk if no member of the group has ever
// been connected. (The pick, unconnected, on b's address and of b's family,
// scores as b does: the kernel's rescore of it changes nothing.)
func (t *UDPTable[T]) walk(slot *udpSlot[T], p *udpPacket, wild bool) *T {
	cp := slot.chain.Load()
	if cp == nil {
		return nil
	}
	var result *T
	best := 0
	for _, b := range *cp {
		sc, conn := b.score(p, wild)
		if sc <= best {
			continue
		}
		best, result = sc, b.val
		if conn {
			continue
		}
		g := b.group.Load()
		if g == nil {
			continue
		}
		if r := g.pick(t.flowHash(p)); r != nil {
			result = r.val
			if !g.hasConns.Load() {
				return result
			}
		}
	}
	return result
}

// score is the kernel's compute_score for b and packet p, in the exact step
// (wild false: b must be bound to p's destination address) or the wildcard
// step, and whether b is connected: 2 for an IPv4 socket, 1 for an IPv6 one,
// plus 8 if it is connected to p's source; -1 if b does not take p.
func (b *udpBinding[T]) score(p *udpPacket, wild bool) (int, bool) {
	if b.port != p.lport || b.wild != wild {
		return -1, false
	}
	sc := 2
	switch {
	case !wild:
		if b.lw != p.lw {
			return -1, false
		}
	case !p.is4: // an IPv6 packet reaches ::
		if b.lw[0]|b.lw[1] != 0 {
			return -1, false
		}
	case b.lw[0]|b.lw[1] == 0: // an IPv4 packet reaches :: if dual-stack
		if b.v6only {
			return -1, false
		}
	}
	if b.v6 {
		sc = 1
	}
	if peer := b.peer.Load(); peer != nil {
		if peer.port != p.rport || peer.w != p.rw {
			return -1, false
		}
		return sc + 8, true
	}
	return sc, false
}

// reciprocalScale maps hash to [0, n) as the kernel's reciprocal_scale.
func reciprocalScale(hash uint32, n int) int { return int(uint64(hash) * uint64(n) >> 32) }

// sockets returns the open sockets of the table in bind order (for tests).
func (t *UDPTable[T]) sockets() []*UDPSocket[T] {
	var all []*UDPSocket[T]
	for i := range t.ports {
		ps := &t.ports[i]
		ps.mu.Lock()
		all = append(all, ps.socks...)
		ps.mu.Unlock()
	}
	slices.SortFunc(all, func(a, b *UDPSocket[T]) int { return int(a.id - b.id) })
	return all
}
