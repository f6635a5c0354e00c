package hash4

import (
	"errors"
	"fmt"
	"net"
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
// stripe's mu. Lookups take none of them.

// ErrInvalidAddr is returned, wrapped, by [UDPTable.Bind],
// [UDPSocket.Connect], [TCPTable.Listen], [PortAllocator.Bind] and
// [PortAllocator.BindEphemeral] for an address they cannot use: an invalid or
// (where a concrete one is needed) unspecified address, port 0, or an address
// of the wrong family. ([Table.Insert] and [Table.Connect] report bad tuples
// with [ErrInvalidTuple].)
var ErrInvalidAddr = errors.New("hash4: invalid address")

// BindOption configures one [UDPTable.Bind] or one [TCPTable.Listen].
type BindOption func(*bindConfig)

type bindConfig struct {
	reusePort, reuseAddr, v6only bool
}

// WithReusePort sets SO_REUSEPORT: sockets that all asked for it may bind the
// same address and port, and the packets that reach them are shared by flow
// hash, so that a flow keeps reaching one socket while the group does not
// change.
func WithReusePort() BindOption { return func(c *bindConfig) { c.reusePort = true } }

// WithReuseAddr sets SO_REUSEADDR: a UDP socket may bind an address and port
// that overlap those of sockets which all set it too. It does not let a TCP
// listener share a port with another listener.
func WithReuseAddr() BindOption { return func(c *bindConfig) { c.reuseAddr = true } }

// WithIPv6Only sets IPV6_V6ONLY on an IPv6 socket or listener: bound to ::,
// it receives IPv6 packets only. It is an error on an IPv4 or IPv4-mapped
// address.
func WithIPv6Only() BindOption { return func(c *bindConfig) { c.v6only = true } }

// UDPTable finds the UDP socket that owns a received packet, as the Linux UDP
// tables do: the connected socket with the packet's exact 4-tuple, else the
// best-scoring socket bound to the packet's destination address and port,
// else the best one bound to the wildcard address on that port. Sockets
// sharing a port with [WithReusePort] split packets by flow hash.
//
// [UDPTable.Bind] accepts and refuses binds as Linux's bind() does, and a
// socket bound to the wildcard address takes a concrete local address when
// it connects ([UDPSocket.ConnectFrom]), as in Linux. A socket's first
// connect takes it out of its reuseport group, and only that connect puts it
// where an exact 4-tuple finds it first: a socket connected again to another
// peer is found by score, as in Linux 6.13 and later.
//
// Sockets have the family of their address: an IPv4-mapped address
// (::ffff:a.b.c.d) makes an IPv6 socket, which receives the IPv4 packets to
// a.b.c.d but loses them to an IPv4 socket on a.b.c.d.
//
// Lookup takes no lock and never allocates; all methods are safe for
// concurrent use. Devices, network namespaces and CPUs are not modelled.
type UDPTable[T any] struct {
	slots []udpSlot[T] // hash2
	ports []udpPort[T] // the primary table, by port
	mask  uint32
	h4    buckets // hash4 chains (nulls base 0); stripes guard chains and node caches
	nodes slab[entry[T]]

	secret Secret
	mix    uint32 // net_hash_mix of the port+address hash
	anyMix uint32 // jhash_1word(0, mix): the wildcard part of a wildcard slot's hash

	ids      atomic.Uint64 // bind sequence numbers
	restarts atomic.Uint64 // hash4 walks started again

	// hash4Off, set only by tests and benchmarks before the table is used,
	// makes Lookup skip step 1 (hash4).
	hash4Off bool
	// visit, set only by tests before the table is used, is called by hash4
	// walks on each node of a chain before they read its next link.
	visit func(index uint32)
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

// udpReuse is a reuseport group, the kernel's sock_reuseport.
type udpReuse[T any] struct {
	// socks is the group's array; never changed once published, replaced
	// under the group's primary slot lock.
	socks atomic.Pointer[[]*udpBinding[T]]
	// hasConns is set when a member connects and never cleared, as the
	// kernel's reuse->has_conns.
	hasConns atomic.Bool
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
	live4   bool   // its node's seq is odd: it matches its key; under s.mu
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
// [WithSecret] the keys of the hashes. [WithHasher] and [WithFixedBuckets] do
// not apply: the tables keep the size they are made with.
func NewUDPTable[T any](opts ...Option) *UDPTable[T] {
	cfg := tableConfig{capacity: 1024}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	t := &UDPTable[T]{}
	if cfg.secret != nil {
		t.secret = *cfg.secret
	} else {
		t.secret = NewSecret()
	}
	t.mix = portaddrMix(&t.secret)
	t.anyMix = JHash1Word(0, t.mix)
	t.h4.init(cfg.capacity, cfg.stripeCount(), 0)
	t.slots = make([]udpSlot[T], len(t.h4.heads))
	t.ports = make([]udpPort[T], len(t.h4.heads))
	t.mask = t.h4.mask
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

// normAddr returns addr in the form the tables use: IPv4-mapped addresses
// as IPv4, no zone.
func normAddr(addr netip.Addr) netip.Addr { return addr.Unmap().WithZone("") }

// sockAddr is a socket's local address as the kernel's bind conflict checks
// read it (inet_rcv_saddr_equal).
type sockAddr struct {
	v6     bool       // an AF_INET6 socket
	a6     netip.Addr // its IPv6 address (sk_v6_rcv_saddr), if v6
	v4     uint32     // its IPv4 address (inet_rcv_saddr)
	v6only bool
}

// newSockAddr returns the sockAddr of a socket of family v6 on addr: an
// IPv6 socket's IPv4 address is that of an IPv4-mapped address, 0 for ::,
// and the kernel's LOOPBACK4_IPV6 (127.0.0.6) for any other address.
func newSockAddr(addr netip.Addr, v6, v6only bool) sockAddr {
	a := sockAddr{v6: v6, v6only: v6only}
	switch {
	case !v6 || addr.Is4In6():
		b := addr.Unmap().As4()
		a.v4 = uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	case !addr.IsUnspecified():
		a.v4 = 127<<24 | 6
	}
	if v6 {
		a.a6 = netip.AddrFrom16(addr.As16())
	}
	return a
}

// addrEqual reports whether a socket on a conflicts with one on b, b
// already bound, as the kernel's inet_rcv_saddr_equal (a is sk, b is sk2):
// if wild, a wildcard address overlaps every address it receives for.
func addrEqual(a, b sockAddr, wild bool) bool {
	if !a.v6 {
		// N.B. an IPv6 socket on a specific address is IPv6-only unless
		// connect fixed its address (see newSockAddr).
		if b.v6only {
			return false
		}
		return a.v4 == b.v4 || (wild && (a.v4 == 0 || b.v4 == 0))
	}
	const any, mapped, other = 0, 1, 2
	kind := func(x netip.Addr) int {
		switch {
		case x.Is4In6():
			return mapped
		case x.IsUnspecified():
			return any
		}
		return other
	}
	k1, k2 := kind(a.a6), mapped
	if b.v6 {
		k2 = kind(b.a6)
	}
	switch {
	case k1 == mapped && k2 == mapped:
		return !b.v6only && (a.v4 == b.v4 || (wild && (a.v4 == 0 || b.v4 == 0)))
	case k1 == any && k2 == any:
		return true
	case k2 == any && wild && !(b.v6only && k1 == mapped):
		return true
	case k1 == any && wild && !(a.v6only && k2 == mapped):
		return true
	}
	return b.v6 && a.a6 == b.a6
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
func (t *UDPTable[T]) Bind(local netip.AddrPort, v *T, opts ...BindOption) (*UDPSocket[T], error) {
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
		return nil, fmt.Errorf("%w: %v", ErrPortInUse, local)
	}
	if b.hasNode {
		i, ok := t.getNode(b.h2)
		if !ok {
			return nil, ErrTableFull
		}
		b.node = i
		// N.B. the node is free (seq even) and in no chain: readers that
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
	t.nodes.put(&st.cache, i, t.nodes.cacheMax())
}

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

// errClosed returns the error of a method called on a closed socket.
func (s *UDPSocket[T]) errClosed(op string) error {
	return fmt.Errorf("hash4: %s on UDP socket %v: %w", op, s.b.local, net.ErrClosed)
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
	if s == nil || s.t == nil {
		return fmt.Errorf("hash4: Connect on a UDPSocket not made by Bind: %w", net.ErrClosed)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return s.errClosed("Connect")
	}
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
		return fmt.Errorf("%w: ConnectFrom %v to %v", ErrInvalidAddr, src, remote)
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

// Disconnect undoes Connect, as connect() with AF_UNSPEC: the socket leaves
// hash4 and receives packets from every peer again. A socket that took its
// address at connect goes back to the wildcard address of its family (:: for
// an IPv6 socket). Disconnecting a socket that is not connected does nothing.
// On a closed socket it returns an error matching [net.ErrClosed].
func (s *UDPSocket[T]) Disconnect() error {
	if s == nil || s.t == nil {
		return fmt.Errorf("hash4: Disconnect on a UDPSocket not made by Bind: %w", net.ErrClosed)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return s.errClosed("Disconnect")
	}
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
		e.seq.Store(e.seq.Load() + 1)
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
	if s == nil || s.t == nil {
		return fmt.Errorf("hash4: Close on a UDPSocket not made by Bind: %w", net.ErrClosed)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return s.errClosed("Close")
	}
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
			e.seq.Store(e.seq.Load() + 1) // N.B. even while the key is rewritten
		}
		e.key.store(&k)
		e.seq.Store(e.seq.Load() + 1)
		b.live4 = true
		return
	}
	// N.B. the node's seq is even (it is in no chain, see unhash4): readers
	// that still stand on it ignore its key while it is rewritten.
	e.key.store(&k)
	// N.B. counted before it can be found (see udpSlot.hash4Cnt).
	t.slots[b.h2&t.mask].hash4Cnt.Add(1)
	st := t.h4.stripe(h)
	st.mu.Lock()
	linkAt(t.h4.head(h), nodeLink(b.node), &e.next)
	e.seq.Store(e.seq.Load() + 1) // live, with its new key: N.B. after linking (see entry)
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
			// N.B. seq turns even before the node is unlinked (see
			// entry) and before its key may be rewritten, so a reader
			// standing on it stops trusting the key; e.next is left
			// as it is, so such a reader walks on.
			if b.live4 {
				e.seq.Store(e.seq.Load() + 1)
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
	la, ra := pkt.Local.Addr().Unmap(), pkt.Remote.Addr().Unmap()
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
// or nil. A match is trusted only if the node's seq was odd and unchanged
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
		if seq := e.seq.Load(); seq&1 == 1 && e.key.matches(k) {
			v := e.val.Load()
			if e.seq.Load() != seq {
				t.restarts.Add(1)
				goto begin
			}
			return v
		}
		if t.visit != nil {
			t.visit(l.index())
		}
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
// been connected.
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
