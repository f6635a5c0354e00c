package hash4

import (
	"cmp"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
)

// This file holds the UDP socket demultiplexer: the kernel's two UDP tables,
// hash2 keyed by (local address, local port) and hash4 keyed by the whole
// 4-tuple of connected sockets (seed "udp: Add 4-tuple hash for connected
// sockets", Linux 6.13), and the lookup that picks the socket owning a
// received packet (__udp4_lib_lookup / __udp6_lib_lookup).
//
// Design.
//
//   - hash2 is an array of slots, one per port+address hash
//     (IPv4PortaddrHash / IPv6PortaddrHash & mask). A slot holds the sockets
//     bound to its (address, port) pairs by reuseport group (a socket
//     without port reuse is a group of its own) as an immutable slice,
//     published with one atomic store and replaced under the slot's mutex
//     by Bind and Close, which copy the slice of groups. Close copies the
//     group it leaves too; Bind appends to its group's array in place
//     while the array has room, past every length published (see Bind).
//     Readers load it once and score the sockets in it without locks. A
//     group's sockets are in the order of the kernel's reuseport array,
//     which breaks ties between them (see udpGroup.without).
//   - hash4 is a bucket array (bucket.go) of hlist_nulls chains (nulls.go),
//     as many as hash2 has slots, keyed by UDPEhashfn / UDP6Ehashfn. Its
//     nodes are entries (table.go) in a node store (slab.go): each socket
//     bound to a concrete local address owns one node from Bind to Close,
//     linked in a chain while the socket is connected. Reconnecting moves the
//     node to another chain at once, and Close recycles it at once, while
//     readers may stand on it: they validate matches with the entry's
//     sequence counter and restart when they end on a foreign nulls marker.
//   - Each hash2 slot counts the sockets of its (address, port) pairs that
//     are in hash4 (hash4_cnt); Lookup reads hash4 only when that count is
//     not zero.
//   - Each reuseport group counts its connected sockets, and each hash2
//     slot their sum. While none of a group's sockets is connected, they
//     all score alike, and Lookup scores the group once rather than each
//     socket, and if it wins indexes its array with the flow hash, as the
//     kernel's udp4_lib_lookup2 returns what inet_lookup_reuseport picks
//     when the group has no connected socket (reuseport_has_conns): a cost
//     independent of the group's size, whatever else shares its slot. A
//     slot whose count is 0 spares the lookup the groups' counts.
//
// Lock order: UDPSocket.mu, then a hash2 slot's mu, then a hash4 stripe's
// mu. Stripe locks never nest. Lookups take none of them.

// BindOption configures one UDPTable.Bind or one TCPTable.Listen.
type BindOption func(*bindConfig)

type bindConfig struct {
	reusePort, v6only bool
}

// WithReusePort lets several sockets bind the same address and port, like
// SO_REUSEPORT: a Bind of an address and port already bound succeeds only if
// every socket on it, the new one included, asked for it. Among such sockets
// that a packet matches equally well, Lookup picks one by the packet's flow
// hash (see UDPTable), so a given 4-tuple keeps reaching the same socket
// while no socket binds to or closes on that address and port; when one of
// them connects or disconnects, only the flows that reached it, or that it
// takes from then on, move (on ::, where an IPv6-only group and a
// dual-stack one tie, the flows of a group too: see UDPTable).
// With TCPTable.Listen, the same for listeners: see TCPTable.
func WithReusePort() BindOption { return func(c *bindConfig) { c.reusePort = true } }

// WithIPv6Only makes a socket bound to an IPv6 address (or a listener, with
// TCPTable.Listen) receive IPv6 packets only, like IPV6_V6ONLY. It matters for
// the wildcard address ::, the only IPv6 address that IPv4 packets reach
// (IPv4-mapped addresses are IPv4 addresses here). It is an error on an IPv4
// address.
func WithIPv6Only() BindOption { return func(c *bindConfig) { c.v6only = true } }

// UDPTable finds the UDP socket that owns a received packet, as the Linux
// UDP tables do: an exact 4-tuple table (hash4) for connected sockets bound
// to a concrete local address, then the sockets bound to the packet's
// destination address and port, then those bound to the wildcard address on
// that port, each scored by how specifically it matches.
//
// Lookup takes no lock and never allocates; Bind and the methods of
// UDPSocket lock what they change. All methods are safe for concurrent use.
// A UDPTable must be created with NewUDPTable.
//
// Addresses. An IPv4-mapped IPv6 address (::ffff:a.b.c.d) is the IPv4
// address a.b.c.d, for sockets and packets alike, and zones are ignored, as
// in Table. A socket bound to an IPv4 address (0.0.0.0 included) is an IPv4
// socket; one bound to an IPv6 address (:: included) is an IPv6 socket.
//
// Scoring, as the kernel's compute_score: a socket scores -1 (no match)
// unless its port is the packet's destination port, its address is the
// packet's destination address (in the exact step) or the wildcard of a
// compatible family (in the wildcard step: IPv4 sockets take IPv4 packets,
// IPv6 sockets IPv6 packets, and IPv6 sockets that are not IPv6-only IPv4
// packets too), and, if it is connected, its peer is the packet's source
// address and port. A match scores 2, or 1 for an IPv6 socket receiving an
// IPv4 packet, plus 4 for a connected peer address and 4 for a connected
// peer port (always both here). The kernel's udp6 compute_score starts IPv6
// sockets at 1 rather than 2; since only IPv6 sockets receive IPv6 packets
// the order is the same. Left out: network namespaces, the device bonus (+4
// for a socket bound to the packet's device) and the CPU bonus (+1 for a
// socket last used on this CPU); hash4 has no devices and no CPUs.
//
// Lookup order: (1) if the packet's exact hash2 slot counts connected
// sockets, the packet's 4-tuple in hash4; (2) the best-scoring socket bound
// to the packet's destination address; (3) the best-scoring socket bound to
// the wildcard address. The highest score wins. Ties can only be between
// sockets bound to the same address and port, which all asked for port
// reuse. Those of them that are IPv6-only, or those that are not, form a
// reuseport group, in the order of the kernel's reuseport array: bind
// order, but when a socket closes, the group's last socket takes its place
// (reuseport_detach_sock). Where sockets of both kinds on :: tie for an
// IPv6 packet, the group of the one bound first takes it, as in Linux,
// where each kind has a group of its own. The packet's flow hash
// (UDPEhashfn, UDP6Ehashfn) picks the group's k-th socket, k = hash*n>>32
// for a group of n (the kernel's reciprocal_scale), and the answer is the
// first of the tied sockets from there on, wrapping around, as the
// kernel's reuseport_select_sock_by_hash skips the connected sockets of a
// group. So a flow moves only when a socket binds to or closes on that
// address and port, or when the socket it reaches, or one it skipped,
// connects or disconnects; on ::, where the two groups tie, also when the
// tied socket bound first, which picks the group, does. Step 1 returns a
// socket only when the 4-tuple matches exactly one connected socket; it
// falls through to scoring when it matches several (reuseport sockets
// connected to the same peer), so that the tie is broken the same way. Step 1 is a shortcut: the answer is always the
// one scoring would give.
//
// While sockets connect and disconnect, Lookup scores the sockets on the
// packet's address and port again if a score changed between its first
// look at them and its choice among the tied ones, so that it returns a
// socket that takes the packet, with the score that won.
//
// Cost. Lookup scores a reuseport group none of whose sockets is connected
// once rather than socket by socket, so a packet to a group of 64 sockets
// costs what one to a single socket does, whatever other sockets share the
// group's hash2 slot. A group with a connected socket, it scores socket by
// socket, as the kernel does (reuseport_has_conns); and when the socket
// bound first among those tied for the packet is in such a group, every
// socket of the slot again.
type UDPTable[T any] struct {
	slots []udpSlot[T] // hash2
	mask  uint32
	h4    buckets // hash4 chains (nulls base 0); stripes guard chains and node caches
	nodes slab[entry[T]]

	secret Secret
	mix    uint32 // net_hash_mix of the port+address hash
	anyMix uint32 // jhash_1word(0, mix): the wildcard part of a wildcard slot's hash

	ids      atomic.Uint64 // bind sequence numbers
	restarts atomic.Uint64 // hash4 walks started again
	rescores atomic.Uint64 // scorings started again (pickTied)

	// hash4Off, set only by tests and benchmarks before the table is used,
	// makes Lookup skip step 1 (hash4).
	hash4Off bool
	// visit, set only by tests before the table is used, is called by hash4
	// walks on each node of a chain before they read its next link;
	// loaded, by scoreSlot after it loaded a slot's sockets.
	visit  func(index uint32)
	loaded func()
}

// udpSlot is one hash2 slot.
type udpSlot[T any] struct {
	// groups is the slot's sockets by reuseport group; never changed once
	// published. N.B. written only under mu, read without it.
	groups atomic.Pointer[[]udpGroup[T]]
	// hash4Cnt counts the slot's sockets that are linked in hash4. N.B. it
	// is a hint: it is raised before a node is linked and lowered after it
	// is unlinked, and a lookup that reads 0 while a socket is in hash4
	// still finds that socket by scoring.
	hash4Cnt atomic.Int32
	// conns counts the slot's connected sockets, the sum of its groups'
	// counts, under the same rule (see udpGroup.conns): while it reads 0,
	// a lookup scores every group once, without loading their counts.
	conns atomic.Int32
	mu    sync.Mutex
	// Pad to 32 bytes, so that no slot straddles a cache line: a lookup
	// reads groups, hash4Cnt and conns together. The fields take 16 bytes
	// and a pointer.
	_ [16 - ptrSize]byte
}

// udpGroup is a reuseport group of a slot's sockets: those bound to one
// address and port, IPv6-only or not (see inGroupOf), or a socket without
// port reuse alone. It is never changed once published, but for the count
// conns points to.
type udpGroup[T any] struct {
	first   *UDPSocket[T]   // the member bound first
	members []*UDPSocket[T] // in the order of the kernel's reuseport array
	// conns counts the group's connected sockets, shared by every record
	// of the group from its first Bind on. N.B. it is never lower than the
	// number of members of the slot's current record that have a peer:
	// Connect raises it before it sets a socket's first peer, Disconnect
	// lowers it after the peer is cleared, and Close after the socket has
	// left the current record (its peer stays set, so older records still
	// show it connected). So a lookup that reads 0, between two loads of
	// the slot's groups that return the same pointer, saw the members all
	// unconnected at that moment (see scoreSlot).
	conns *atomic.Int32
}

// without returns the slot's groups with s removed from its group, g
// (groups[j]), or g removed if s was its only member: a new slice, for
// readers may hold the old one. The group's last socket takes s's place,
// as the kernel's reuseport_detach_sock, so that after a Close each flow
// reaches the socket it would reach in Linux.
func (g *udpGroup[T]) without(groups []udpGroup[T], j int, s *UDPSocket[T]) []udpGroup[T] {
	if len(g.members) == 1 {
		return slices.Delete(slices.Clone(groups), j, j+1)
	}
	members := slices.Clone(g.members)
	i := slices.Index(members, s)
	members[i] = members[len(members)-1]
	members = members[:len(members)-1]
	first := members[0]
	for _, m := range members[1:] {
		if m.id < first.id {
			first = m
		}
	}
	groups = slices.Clone(groups)
	groups[j] = udpGroup[T]{first: first, members: members, conns: g.conns}
	return groups
}

// UDPSocket is a socket bound in a UDPTable, made by UDPTable.Bind. Its
// methods are safe for concurrent use.
type UDPSocket[T any] struct {
	// Set by Bind before the socket is published, then never changed.
	lw      [2]uint64 // local address, 16-byte form
	port    uint16    // local port
	v6      bool      // bound to an IPv6 address
	wild    bool      // bound to the wildcard address of its family
	v6only  bool
	reuse   bool
	hasNode bool   // owns a hash4 node: bound to a concrete address
	node    uint32 // its hash4 node, if hasNode
	h2      uint32 // hash2 hash of its local address and port
	id      uint64 // bind sequence number
	local   netip.AddrPort
	val     *T
	t       *UDPTable[T]
	conns   *atomic.Int32 // its group's count of connected sockets (udpGroup.conns)

	// peer is the connected peer, or nil. N.B. read by lookups without
	// locks; written under mu.
	peer atomic.Pointer[udpPeer]

	mu      sync.Mutex // serializes Connect, Disconnect and Close
	closed  bool
	hashed4 bool   // its node is linked in hash4
	h4      uint32 // hash4 hash of its node's key while hashed4
}

// udpPeer is the remote end of a connected socket, immutable once published.
type udpPeer struct {
	w    [2]uint64 // address, 16-byte form
	port uint16
	addr netip.AddrPort
}

// NewUDPTable returns an empty table. WithCapacity sets the number of hash2
// slots, which is also the number of hash4 chains (as in Linux), rounded up
// to a power of two (default 1024); WithLockStripes the number of hash4
// writer locks; WithSecret the keys: Secret.Ehash keys udp_ehashfn (the
// kernel's udp_ehash_secret), Secret.Ehash6Addr the hash of remote IPv6
// addresses, and Secret.Seed, folded to 32 bits, stands for net_hash_mix in
// the port+address hash of hash2. It panics, as New does, for bad option
// values, and for WithHasher and WithFixedBuckets, which do not apply: the
// tables of a UDPTable keep the size it is made with, as the kernel's do.
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
	t.h4.init(cfg.capacity, cfg.stripeCount(), 0)
	t.slots = make([]udpSlot[T], len(t.h4.heads))
	t.mask = t.h4.mask
	// Sockets are nodes carved in chunks of a 64th of the buckets, as a
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

// Bind binds a socket with value v to local, which may be the wildcard
// address of its family (0.0.0.0 or ::), and returns it. It fails with an
// error matching ErrPortInUse (and syscall.EADDRINUSE) if a socket is bound
// to the same address and port, unless all of them and this one asked for
// WithReusePort. Other addresses do not conflict: a socket bound to
// 10.0.0.1:53 and one bound to 0.0.0.0:53 coexist, and a packet to
// 10.0.0.1:53 reaches the first (Linux requires SO_REUSEADDR for that), as
// do 0.0.0.0:53 and [::]:53 (IPv4 packets prefer the IPv4 socket, by score).
// It returns ErrInvalidAddr for an invalid address, port 0, or WithIPv6Only
// on an IPv4 address, and ErrNilValue for a nil v; on error nothing changes.
func (t *UDPTable[T]) Bind(local netip.AddrPort, v *T, opts ...BindOption) (*UDPSocket[T], error) {
	if t.slots == nil {
		panic(zeroUDPTable)
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
		return nil, fmt.Errorf("%w: Bind of an invalid address", ErrInvalidAddr)
	case port == 0:
		return nil, fmt.Errorf("%w: Bind of %v: port 0", ErrInvalidAddr, local)
	case cfg.v6only && addr.Is4():
		return nil, fmt.Errorf("%w: Bind of %v: IPv6-only option on an IPv4 address", ErrInvalidAddr, local)
	case v == nil:
		return nil, fmt.Errorf("%w for Bind of %v", ErrNilValue, local)
	}
	s := &UDPSocket[T]{
		lw:     addrWords(addr),
		port:   port,
		v6:     !addr.Is4(),
		wild:   addr.IsUnspecified(),
		v6only: cfg.v6only,
		reuse:  cfg.reusePort,
		h2:     portaddrHash(addr, port, t.mix),
		local:  netip.AddrPortFrom(addr, port),
		val:    v,
		t:      t,
	}
	s.hasNode = !s.wild
	slot := &t.slots[s.h2&t.mask]
	slot.mu.Lock()
	defer slot.mu.Unlock()
	var old []udpGroup[T]
	if p := slot.groups.Load(); p != nil {
		old = *p
	}
	for _, g := range old {
		// N.B. the members of a group of more than one all asked for
		// port reuse.
		if o := g.first; o.port == s.port && o.lw == s.lw && !(o.reuse && s.reuse) {
			return nil, fmt.Errorf("%w: %v", ErrPortInUse, s.local)
		}
	}
	if s.hasNode {
		i, ok := t.getNode(s.h2)
		if !ok {
			return nil, ErrTableFull
		}
		s.node = i
		// N.B. the node is free (seq even) and in no chain: readers that
		// stand on it from its last life ignore it, so it can be written.
		t.nodes.at(i).val.Store(v)
	}
	s.id = t.ids.Add(1) // under the slot lock: bind order within a slot
	groups := slices.Clone(old)
	if j := slices.IndexFunc(groups, func(g udpGroup[T]) bool { return s.inGroupOf(g.first) }); j >= 0 {
		// N.B. appended in place while the array has room, as the
		// kernel's reuseport_add_sock, so that Binds cost amortized O(1)
		// however large the group: readers read a record's members[:len]
		// only, and the element written lies past every length of this
		// array ever published (without copies the group to a new
		// array), so no reader reads it before the store below
		// publishes it.
		groups[j].members = append(groups[j].members, s)
		s.conns = groups[j].conns
	} else {
		s.conns = new(atomic.Int32)
		groups = append(groups, udpGroup[T]{first: s, members: []*UDPSocket[T]{s}, conns: s.conns})
	}
	// N.B. s is complete before this store publishes it to readers.
	slot.groups.Store(&groups)
	return s, nil
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

// LocalAddr returns the address and port the socket is bound to, with an
// IPv4-mapped address in its IPv4 form and no zone; the zero AddrPort for a
// nil socket (what a failed Bind returns).
func (s *UDPSocket[T]) LocalAddr() netip.AddrPort {
	if s == nil {
		return netip.AddrPort{}
	}
	return s.local
}

// Value returns the value the socket was bound with; nil for a nil socket.
func (s *UDPSocket[T]) Value() *T {
	if s == nil {
		return nil
	}
	return s.val
}

// RemoteAddr returns the peer the socket is connected to, and whether it is
// connected. A closed socket reports the peer it had when it was closed; a
// nil one, none.
func (s *UDPSocket[T]) RemoteAddr() (netip.AddrPort, bool) {
	if s == nil {
		return netip.AddrPort{}, false
	}
	if p := s.peer.Load(); p != nil {
		return p.addr, true
	}
	return netip.AddrPort{}, false
}

// errClosed returns the error of a method called on a closed socket.
func (s *UDPSocket[T]) errClosed(op string) error {
	return fmt.Errorf("hash4: %s on UDP socket %v: %w", op, s.local, net.ErrClosed)
}

// Connect connects the socket to remote, replacing any peer it had, as
// connect() on a UDP socket: from then on it receives only packets from
// remote. A socket bound to a concrete address also enters hash4, and its
// hash2 slot counts it (the kernel's udp_lib_hash4 and, on a reconnect,
// udp_lib_rehash); one bound to the wildcard address does not, and is found
// by scoring. remote must be a concrete address of a family the socket
// receives (IPv6 for IPv6 sockets, except that those bound to :: without
// WithIPv6Only also take IPv4 peers) with a non-zero port; otherwise Connect
// returns an error matching ErrInvalidAddr and changes nothing. On a closed
// socket it returns an error matching net.ErrClosed.
func (s *UDPSocket[T]) Connect(remote netip.AddrPort) error {
	if s == nil || s.t == nil {
		return fmt.Errorf("hash4: Connect on a UDPSocket not made by Bind: %w", net.ErrClosed)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return s.errClosed("Connect")
	}
	addr, port := normAddr(remote.Addr()), remote.Port()
	switch {
	case !addr.IsValid():
		return fmt.Errorf("%w: Connect to an invalid address", ErrInvalidAddr)
	case addr.IsUnspecified():
		return fmt.Errorf("%w: Connect to %v: unspecified address", ErrInvalidAddr, remote)
	case port == 0:
		return fmt.Errorf("%w: Connect to %v: port 0", ErrInvalidAddr, remote)
	case addr.Is4() && s.v6 && !(s.wild && !s.v6only):
		return fmt.Errorf("%w: Connect of IPv6 socket %v to IPv4 peer %v", ErrInvalidAddr, s.local, remote)
	case !addr.Is4() && !s.v6:
		return fmt.Errorf("%w: Connect of IPv4 socket %v to IPv6 peer %v", ErrInvalidAddr, s.local, remote)
	}
	t := s.t
	if s.hashed4 {
		t.unhash4(s)
	}
	if s.peer.Load() == nil {
		// N.B. before the peer is set (see udpGroup.conns).
		s.conns.Add(1)
		t.slots[s.h2&t.mask].conns.Add(1)
	}
	s.peer.Store(&udpPeer{w: addrWords(addr), port: port, addr: netip.AddrPortFrom(addr, port)})
	if s.hasNode {
		t.hash4(s, addr, port)
	}
	return nil
}

// Disconnect undoes Connect, as connect() with AF_UNSPEC: the socket leaves
// hash4 and receives packets from every peer again. Disconnecting a socket
// that is not connected does nothing. On a closed socket it returns an
// error matching net.ErrClosed.
func (s *UDPSocket[T]) Disconnect() error {
	if s == nil || s.t == nil {
		return fmt.Errorf("hash4: Disconnect on a UDPSocket not made by Bind: %w", net.ErrClosed)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return s.errClosed("Disconnect")
	}
	if s.hashed4 {
		s.t.unhash4(s)
	}
	if s.peer.Load() != nil {
		s.peer.Store(nil)
		// N.B. after the peer is cleared.
		s.conns.Add(-1)
		s.t.slots[s.h2&s.t.mask].conns.Add(-1)
	}
	return nil
}

// Close unbinds the socket: it leaves hash4 and hash2, and its hash4 node is
// recycled at once. A second Close returns an error matching net.ErrClosed.
// A lookup racing with Close may still return the socket's value.
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
	t := s.t
	if s.hashed4 {
		t.unhash4(s)
	}
	// The peer stays as it was: a lookup still scoring the socket from an
	// old slice sees it as it was before Close.
	slot := &t.slots[s.h2&t.mask]
	slot.mu.Lock()
	groups := *slot.groups.Load() // s is in it
	j := slices.IndexFunc(groups, func(g udpGroup[T]) bool { return s.inGroupOf(g.first) })
	if groups = groups[j].without(groups, j, s); len(groups) == 0 {
		slot.groups.Store(nil)
	} else {
		slot.groups.Store(&groups)
	}
	if s.peer.Load() != nil {
		// N.B. after s has left groups.
		s.conns.Add(-1)
		slot.conns.Add(-1)
	}
	slot.mu.Unlock()
	if s.hasNode {
		t.putNode(s.h2, s.node)
	}
	return nil
}

// hash4 links s's node into hash4 under the key (s.local, peer), as the
// kernel's udp_lib_hash4. s.mu is held and the node is in no chain.
func (t *UDPTable[T]) hash4(s *UDPSocket[T], raddr netip.Addr, rport uint16) {
	rw := addrWords(raddr)
	h := t.udpEhash(&s.lw, !s.v6, s.port, &rw, rport)
	k := key{meta: uint64(h)<<32 | uint64(s.port)<<16 | uint64(rport), remote: rw, local: s.lw}
	e := t.nodes.at(s.node)
	// N.B. the node's seq is even (it is in no chain, see unhash4): readers
	// that still stand on it ignore its key while it is rewritten.
	e.key.store(&k)
	// N.B. counted before it can be found (see udpSlot.hash4Cnt).
	t.slots[s.h2&t.mask].hash4Cnt.Add(1)
	st := t.h4.stripe(h)
	st.mu.Lock()
	linkAt(t.h4.head(h), nodeLink(s.node), &e.next)
	e.seq.Store(e.seq.Load() + 1) // live, with its new key: N.B. after linking (see entry)
	st.count.Store(st.count.Load() + 1)
	st.mu.Unlock()
	s.h4, s.hashed4 = h, true
}

// unhash4 unlinks s's node from its hash4 chain (the unhash half of the
// kernel's udp_lib_rehash). s.mu is held.
func (t *UDPTable[T]) unhash4(s *UDPSocket[T]) {
	st := t.h4.stripe(s.h4)
	st.mu.Lock()
	prev := t.h4.head(s.h4)
	target := nodeLink(s.node)
	for l := prev.load(); !l.isNulls(); l = prev.load() {
		e := t.nodes.at(l.index())
		if l == target {
			// N.B. seq turns even before the node is unlinked (see
			// entry) and before its key may be rewritten, so a reader
			// standing on it stops trusting the key; e.next is left
			// as it is, so such a reader walks on.
			e.seq.Store(e.seq.Load() + 1)
			unlink(prev, &e.next)
			st.count.Store(st.count.Load() - 1)
			break
		}
		prev = &e.next
	}
	st.mu.Unlock()
	t.slots[s.h2&t.mask].hash4Cnt.Add(-1)
	s.hashed4 = false
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
// pkt.Remote to pkt.Local, in the order and with the score described on
// UDPTable; false if no socket takes it. It takes no lock and does not
// allocate. A packet no socket can receive (see Connect and Bind for the
// addresses a socket takes) is not found.
func (t *UDPTable[T]) Lookup(pkt Tuple) (*T, bool) {
	var p udpPacket
	if !p.set(pkt) {
		return nil, false
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
		if v, n := t.lookup4(&k); n == 1 {
			return v, true
		}
	}
	if v, ok := t.scoreSlot(slot, &p, false); ok {
		return v, true
	}
	wild := &t.slots[(t.anyMix^uint32(p.lport))&t.mask]
	return t.scoreSlot(wild, &p, true)
}

// lookup4 walks the hash4 chain of k without locks, as the kernel's
// udp4_lib_lookup4, and returns the value of the first live node holding k
// and the number n of distinct live nodes that hold it. Unlike the kernel
// it walks to the end of the chain so that it can tell a unique match
// (n == 1) from several (reuseport sockets connected to the same peer). A
// match is trusted only if the node's seq was odd and unchanged across the
// read (see entry); a walk is trusted only if it ended on its own chain's
// nulls marker, since a node moved or recycled into another chain while the
// walk stood on it leads into that chain; otherwise the walk restarts.
func (t *UDPTable[T]) lookup4(k *key) (v *T, n int) {
	b := t.h4.bucket(uint32(k.meta >> 32))
	head := &t.h4.heads[b]
begin:
	v, n = nil, 0
	var first link
	l := head.load()
	for !l.isNulls() {
		e := t.nodes.at(l.index())
		if seq := e.seq.Load(); seq&1 == 1 && e.key.matches(k) {
			x := e.val.Load()
			if e.seq.Load() != seq {
				t.restarts.Add(1)
				goto begin
			}
			// A node seen twice (moved to the head of this chain
			// while the walk stood on it) counts once.
			if n == 0 {
				v, first, n = x, l, 1
			} else if l != first {
				n++
			}
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
	return v, n
}

// score is the kernel's compute_score for s and packet p, in the exact step
// (wild false: s must be bound to p's destination address) or the wildcard
// step (wild true: s must be bound to a wildcard address that receives p's
// family); see UDPTable. It returns -1 if s does not take p.
func (s *UDPSocket[T]) score(p *udpPacket, wild bool) int {
	sc := s.addrScore(p, wild)
	if sc < 0 {
		return -1
	}
	if peer := s.peer.Load(); peer != nil {
		if peer.port != p.rport || peer.w != p.rw {
			return -1
		}
		sc += 8 // +4 peer address, +4 peer port
	}
	return sc
}

// addrScore is score without the peer: the score of s for p if s is not
// connected.
func (s *UDPSocket[T]) addrScore(p *udpPacket, wild bool) int {
	if s.port != p.lport {
		return -1
	}
	if !wild {
		if s.lw != p.lw {
			return -1
		}
		return 2
	}
	switch {
	case !s.wild:
		return -1
	case s.v6 && p.is4:
		if s.v6only {
			return -1
		}
		return 1
	case s.v6 != !p.is4:
		return -1
	}
	return 2
}

// scoreSlot returns the value of the best-scoring socket of slot for p, as
// the kernel's udp4_lib_lookup2: the highest score wins, and among n > 1
// sockets tied at it, all bound to one address and port, pickTied chooses.
// pickGroup and scoreGroups give the same answer without scoring each
// socket of a group that has no connected socket, the first while no
// socket of the slot is connected; what they cannot answer, scoreSockets
// does.
func (t *UDPTable[T]) scoreSlot(slot *udpSlot[T], p *udpPacket, wild bool) (*T, bool) {
	gp := slot.groups.Load()
	if gp == nil {
		return nil, false
	}
	if t.loaded != nil {
		t.loaded()
	}
	// N.B. the members of a group of gp were all unconnected when its
	// count, or the slot's, read 0 if gp was still the slot's then (see
	// udpGroup.conns), which the second load proves; if it fails, scoring
	// each socket reads its peer as the record it is in left it.
	if slot.conns.Load() == 0 {
		v, ok := t.pickGroup(*gp, p, wild)
		if slot.groups.Load() == gp {
			return v, ok
		}
	} else if v, ok, sure := t.scoreGroups(*gp, p, wild); sure && slot.groups.Load() == gp {
		return v, ok
	}
	return t.scoreSockets(*gp, p, wild)
}

// pickGroup is scoreSlot for a slot none of whose sockets is connected:
// every socket of a group then scores alike, so pickGroup scores each group
// once; of the groups tied at the best score, the one of the socket bound
// first wins, and the flow hash of p picks its k-th socket, k =
// reciprocal_scale(hash, size of the group), which is what pickTied picks
// when every socket of the group is tied.
func (t *UDPTable[T]) pickGroup(groups []udpGroup[T], p *udpPacket, wild bool) (*T, bool) {
	var best *udpGroup[T]
	bestScore := -1
	for i := range groups {
		g := &groups[i]
		switch sc := g.first.addrScore(p, wild); {
		case sc > bestScore:
			best, bestScore = g, sc
		case sc == bestScore && sc >= 0 && g.first.id < best.first.id:
			best = g
		}
	}
	switch {
	case best == nil:
		return nil, false
	case len(best.members) == 1:
		return best.members[0].val, true
	}
	return best.members[reciprocalScale(t.flowHash(p), len(best.members))].val, true
}

// scoreGroups is pickGroup for a slot with connected sockets: it scores
// once each group whose count of connected sockets reads 0, as pickGroup
// does, and the sockets of the other groups one by one, as scoreSockets.
// It reports sure false, leaving the answer to scoreSockets, only when the
// best score is tied and the socket bound first among the tied is in a
// group it scored socket by socket.
func (t *UDPTable[T]) scoreGroups(groups []udpGroup[T], p *udpPacket, wild bool) (v *T, ok, sure bool) {
	best, n := -1, 0
	var first *UDPSocket[T]
	var whole *udpGroup[T] // first's group, if scored as one
	for gi := range groups {
		g := &groups[gi]
		if g.conns.Load() == 0 {
			switch sc := g.first.addrScore(p, wild); {
			case sc > best:
				best, n, first, whole = sc, len(g.members), g.first, g
			case sc == best && sc >= 0:
				n += len(g.members)
				if g.first.id < first.id {
					first, whole = g.first, g
				}
			}
			continue
		}
		for _, s := range g.members {
			switch sc := s.score(p, wild); {
			case sc > best:
				best, n, first, whole = sc, 1, s, nil
			case sc == best && sc >= 0:
				n++
				if s.id < first.id {
					first, whole = s, nil
				}
			}
		}
	}
	switch {
	case first == nil:
		return nil, false, true
	case n == 1:
		return first.val, true, true
	case whole != nil:
		return whole.members[reciprocalScale(t.flowHash(p), len(whole.members))].val, true, true
	}
	return nil, false, false
}

// scoreSockets is scoreSlot scoring every socket of groups.
func (t *UDPTable[T]) scoreSockets(groups []udpGroup[T], p *udpPacket, wild bool) (*T, bool) {
	for {
		best, n := -1, 0
		var first *UDPSocket[T]
		var firstGroup *udpGroup[T]
		for gi := range groups {
			g := &groups[gi]
			for _, s := range g.members {
				switch sc := s.score(p, wild); {
				case sc > best:
					best, n, first, firstGroup = sc, 1, s, g
				case sc == best && sc >= 0:
					// N.B. first is the tied socket bound first, not
					// the first met: a Close reorders a group
					// (udpGroup.without), and first picks the group
					// when two tie on :: (see UDPTable).
					if s.id < first.id {
						first, firstGroup = s, g
					}
					n++
				}
			}
		}
		if n <= 1 {
			if first == nil {
				return nil, false
			}
			return first.val, true
		}
		if v, ok := t.pickTied(groups, firstGroup, p, wild, best, n); ok {
			return v, true
		}
		t.rescores.Add(1)
	}
}

// pickTied returns the value of the socket that the flow hash of p picks among
// the n sockets of groups that score best for it, first the one of them bound
// first, in group g: the first of those from g's k-th socket on, cyclically,
// k = reciprocal_scale(hash, size of g), as the kernel's
// reuseport_select_sock_by_hash. It reports false if the sockets tied at best
// are no longer n, as a socket connected or disconnected since they were
// counted: the caller scores again.
func (t *UDPTable[T]) pickTied(groups []udpGroup[T], g *udpGroup[T], p *udpPacket, wild bool, best, n int) (*T, bool) {
	// N.B. sockets outside g are scored too: the two groups on :: tie
	// for IPv6 packets, and a count of g alone would never equal n.
	tied := 0
	for gi := range groups {
		if o := &groups[gi]; o != g {
			for _, s := range o.members {
				if s.score(p, wild) == best {
					tied++
				}
			}
		}
	}
	k := reciprocalScale(t.flowHash(p), len(g.members))
	var pick, wrapped *UDPSocket[T]
	for i, s := range g.members {
		if s.score(p, wild) != best {
			continue
		}
		tied++
		if wrapped == nil {
			wrapped = s
		}
		if pick == nil && i >= k {
			pick = s
		}
	}
	if pick == nil {
		pick = wrapped
	}
	if tied != n || pick == nil {
		return nil, false
	}
	return pick.val, true
}

// inGroupOf reports whether s is in the reuseport group of g: bound to the
// same address and port, and IPv6-only if g is, as the kernel's
// udp_reuseport_add_sock groups them. (Two sockets on one address and port
// both asked for port reuse, or the second could not have bound.)
func (s *UDPSocket[T]) inGroupOf(g *UDPSocket[T]) bool {
	return s.port == g.port && s.lw == g.lw && s.v6only == g.v6only
}

// reciprocalScale maps hash to [0, n) as the kernel's reciprocal_scale.
func reciprocalScale(hash uint32, n int) int { return int(uint64(hash) * uint64(n) >> 32) }

// sockets returns the sockets bound in the table, in no particular order
// (for tests).
func (t *UDPTable[T]) sockets() []*UDPSocket[T] {
	var all []*UDPSocket[T]
	for i := range t.slots {
		if p := t.slots[i].groups.Load(); p != nil {
			for _, g := range *p {
				all = append(all, g.members...)
			}
		}
	}
	slices.SortFunc(all, func(a, b *UDPSocket[T]) int { return cmp.Compare(a.id, b.id) })
	return all
}
