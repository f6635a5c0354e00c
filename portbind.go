package hash4

import (
	"fmt"
	"net/netip"
	"sync"
)

// This file holds the allocator's half of the bind table: the ports that
// Bind, BindEphemeral and the listeners and sockets of the tables sharing
// the allocator hold (portuse.go holds the flows' half).

// isWildcard reports whether addr is 0.0.0.0, ::ffff:0.0.0.0 or ::, with
// any zone.
func isWildcard(addr netip.Addr) bool {
	return addr.Unmap().WithZone("").IsUnspecified()
}

// wildcardOf returns the 16-byte form of the wildcard address of addr's
// family.
func wildcardOf(addr netip.Addr) [16]byte {
	if isIPv4(addr) {
		return netip.IPv4Unspecified().As16()
	}
	return [16]byte{}
}

// mayBeHeld reports whether port may be held for some address: false
// unless a Bind, a listener or a socket holds it for one. N.B. it inlines
// into the scan of every Connect candidate, where it is a load and a test
// when nothing is held.
func (a *PortAllocator) mayBeHeld(port uint16) bool {
	return a.nheld.Load() != 0 && a.heldPorts[port/64].Load()&(1<<(port%64)) != 0
}

// heldFor reports whether port is held for local, itself or through the
// wildcard address of its family, by Bind or a table's socket.
func (a *PortAllocator) heldFor(local netip.Addr, port uint16) bool {
	if !a.mayBeHeld(port) {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.heldForLocked(local, port)
}

// heldForLocked is heldFor with a.mu held.
func (a *PortAllocator) heldForLocked(local netip.Addr, port uint16) bool {
	if _, ok := a.held[heldKey{local.As16(), port}]; ok {
		return true
	}
	_, ok := a.held[heldKey{wildcardOf(local), port}]
	return ok
}

// conflictsLocked reports whether a hold of local:port for o (nil for
// Bind) conflicts with a hold of another, with a.mu held: one for local or
// its family's wildcard, or, local being the wildcard, one for any address
// of its family. Bind's holds conflict with every other hold, Bind's too;
// a table's holds leave each other to the table.
func (a *PortAllocator) conflictsLocked(o *bindOwner, local netip.Addr, port uint16) bool {
	if a.heldByOtherLocked(o, heldKey{local.As16(), port}) || a.heldByOtherLocked(o, heldKey{wildcardOf(local), port}) {
		return true
	}
	if !isWildcard(local) {
		return false
	}
	fp := familyPort{!isIPv4(local), port}
	n := a.byPort[fp]
	if o != nil {
		n -= a.byOwner[ownerPort{o, fp}]
	}
	return n > 0
}

// heldByOtherLocked reports whether k is held by Bind or an owner other
// than o, with a.mu held.
func (a *PortAllocator) heldByOtherLocked(o *bindOwner, k heldKey) bool {
	h, ok := a.held[k]
	return ok && (o == nil || h.owner != o)
}

// holdLocked holds port for local on behalf of o (nil for Bind), with a.mu
// held; the caller checked conflictsLocked.
func (a *PortAllocator) holdLocked(o *bindOwner, local netip.Addr, port uint16) {
	k := heldKey{local.As16(), port}
	fp := familyPort{!isIPv4(local), port}
	a.held[k] = heldBy{owner: o, n: a.held[k].n + 1}
	a.byPort[fp]++
	if o != nil {
		a.byOwner[ownerPort{o, fp}]++
	}
	a.heldPorts[port/64].Or(1 << (port % 64))
	a.nheld.Add(1)
}

// unholdLocked undoes one holdLocked of o for local and port, with a.mu
// held.
func (a *PortAllocator) unholdLocked(o *bindOwner, local netip.Addr, port uint16) {
	k := heldKey{local.As16(), port}
	fp := familyPort{!isIPv4(local), port}
	if h := a.held[k]; h.n > 1 {
		a.held[k] = heldBy{owner: o, n: h.n - 1}
	} else {
		delete(a.held, k)
	}
	a.nheld.Add(-1)
	if o != nil {
		op := ownerPort{o, fp}
		if a.byOwner[op]--; a.byOwner[op] == 0 {
			delete(a.byOwner, op)
		}
	}
	if a.byPort[fp]--; a.byPort[fp] == 0 {
		delete(a.byPort, fp)
		if a.byPort[familyPort{!fp.v6, port}] == 0 {
			a.heldPorts[port/64].And(^uint64(1 << (port % 64)))
		}
	}
}

// releaser returns the function that undoes o's holds of port for addrs,
// once however often it is called.
func (a *PortAllocator) releaser(o *bindOwner, addrs []netip.Addr, port uint16) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			a.mu.Lock()
			defer a.mu.Unlock()
			for _, addr := range addrs {
				a.unholdLocked(o, addr, port)
			}
		})
	}
}

// holdUnusedLocked holds port on behalf of o (nil for Bind) for each of
// addrs, with a.mu held, unless a flow of a table sharing a uses it
// (usedConflicts) from one of them or, if anyOfFamily, from any address of
// their families; it returns the function that releases the holds, or nil.
// N.B. it holds the port before it reads the counts, and undoes the holds
// if they show a flow: a Connect counts its flow before it reads the held
// bit (see Table.boundMeanwhile), so of the two one sees the other.
func (a *PortAllocator) holdUnusedLocked(o *bindOwner, addrs []netip.Addr, anyOfFamily bool, port uint16) func() {
	for _, addr := range addrs {
		a.holdLocked(o, addr, port)
	}
	for _, addr := range addrs {
		if anyOfFamily {
			addr = netip.AddrFrom16(wildcardOf(addr))
		}
		if a.usedConflicts(addr, port) {
			for _, addr := range addrs {
				a.unholdLocked(o, addr, port)
			}
			return nil
		}
	}
	return a.releaser(o, addrs, port)
}

// bindAddrs returns the addresses that Bind or BindEphemeral (caller) of
// local with opts holds its port for (heldAddrs: a dual-stack :: holds
// 0.0.0.0 too), or an error matching ErrInvalidAddr for options it does
// not take. BindEphemeral gives port 0, which the error leaves out.
func bindAddrs(caller string, local netip.AddrPort, opts []BindOption) ([]netip.Addr, error) {
	addr := local.Addr()
	var at any = local
	if local.Port() == 0 {
		at = addr
	}
	var cfg bindConfig
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	switch {
	case cfg.reuseAddr || cfg.reusePort:
		return nil, fmt.Errorf("%w: %s of %v: WithReuseAddr and WithReusePort are for the sockets of tables, not an allocator's holds", ErrInvalidAddr, caller, at)
	case cfg.v6only && isIPv4(addr):
		return nil, fmt.Errorf("%w: %s of %v: IPv6-only option on an IPv4 address", ErrInvalidAddr, caller, at)
	}
	return heldAddrs(addr.WithZone(""), cfg.v6only), nil
}

// share records that a TCPTable or UDPTable (proto "TCP" or "UDP"), made
// by ctor, shares a, and returns the owner of its holds. It panics if a
// serves tables of the other protocol: Linux keeps TCP and UDP ports apart.
func (a *PortAllocator) share(ctor, proto string) *bindOwner {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.proto != "" && a.proto != proto {
		panic(fmt.Sprintf("hash4: %s: WithPortAllocator: the allocator serves %s tables; Linux keeps TCP and UDP ports apart (use an allocator per protocol)", ctor, a.proto))
	}
	a.proto = proto
	return &bindOwner{proto: proto}
}

// holdSocket holds local's port for each of addrs on behalf of o, for a
// listener or socket of o's table bound to local (o nil: for Bind), as the kernel's bind()
// enters the socket in its port's bind bucket (inet_csk_get_port,
// udp_lib_get_port), and returns the function that releases the holds. It
// refuses, holding nothing, with an error matching ErrPortInUse, where a
// hold of Bind or of another table conflicts (conflictsLocked) or, unless
// flowsOK, where a flow of a table sharing a uses the port from a
// conflicting address (usedConflicts). N.B. as holdUnusedLocked, it holds
// before it reads the flows' counts, so that of it and a racing Connect
// one sees the other.
func (a *PortAllocator) holdSocket(o *bindOwner, local netip.AddrPort, addrs []netip.Addr, flowsOK bool) (release func(), err error) {
	port := local.Port()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, addr := range addrs {
		if a.conflictsLocked(o, addr, port) {
			return nil, fmt.Errorf("%w: %v, held in the port allocator", ErrPortInUse, local)
		}
	}
	if flowsOK {
		for _, addr := range addrs {
			a.holdLocked(o, addr, port)
		}
		return a.releaser(o, addrs, port), nil
	}
	if release = a.holdUnusedLocked(o, addrs, false, port); release == nil {
		return nil, fmt.Errorf("%w: %v, by a connected flow", ErrPortInUse, local)
	}
	return release, nil
}

// Bind holds local's port for local's address until release is called, as
// bind() does. Connect then skips the port whatever its own local address,
// as the kernel's connect() passes over every port that a bind() holds, on
// any address (__inet_hash_connect); the listeners and sockets of tables
// made [WithPortAllocator](a) keep Connect off their ports alike. A
// wildcard address (0.0.0.0, ::) holds the port for every address of its
// family, and :: for IPv4 addresses too, as a dual-stack socket does by
// Linux's default, unless opts has [WithIPv6Only], the one option Bind
// takes; [WithReuseAddr] or [WithReusePort] give an error matching
// [ErrInvalidAddr].
//
// Bind returns an error matching [ErrPortInUse] where bind() would
// refuse: the port is held, by Bind or by a listener or socket of a
// [TCPTable] or [UDPTable] made [WithPortAllocator](a), for the same
// address, for its family's wildcard, or (binding the wildcard) for any
// address of the family, or a flow of a table made WithPortAllocator(a)
// uses it from a conflicting address. Of a Bind and a racing Connect of
// such a table, one gets the port. The flows of other tables are not seen,
// even those a's Connect placed (see [NewPortAllocator]). Port 0, an
// invalid address or a nil allocator give errors matching [ErrInvalidAddr]
// or [ErrNilAllocator]; release may be called more than once.
func (a *PortAllocator) Bind(local netip.AddrPort, opts ...BindOption) (release func(), err error) {
	if err := a.check(); err != nil {
		return nil, err
	}
	addr, port := local.Addr(), local.Port()
	if !addr.IsValid() {
		return nil, fmt.Errorf("%w: Bind of an invalid local address", ErrInvalidAddr)
	}
	if port == 0 {
		return nil, fmt.Errorf("%w: Bind of %v: port 0 (use BindEphemeral)", ErrInvalidAddr, local)
	}
	addrs, err := bindAddrs("Bind", local, opts)
	if err != nil {
		return nil, err
	}
	return a.holdSocket(nil, local, addrs, false)
}

// BindEphemeral chooses a free port of the range for local and holds it as
// Bind does, as bind() with port 0 does (inet_csk_find_open_port): it
// starts at a random port of the parity Connect tries last, skips reserved
// ports, ports Bind would refuse and, for a table made
// [WithPortAllocator](a), ports any of its flows of local's family uses
// (of both families for a dual-stack ::). opts are Bind's. It returns
// [ErrNoPorts] if none is left, and Bind's errors for bad input.
//
// The flows of a table not made WithPortAllocator(a) are not seen, even
// those a's Connect placed: BindEphemeral may return a port one of them
// uses. Make the tables that a serves with WithPortAllocator(a), as the
// example does.
func (a *PortAllocator) BindEphemeral(local netip.Addr, opts ...BindOption) (port uint16, release func(), err error) {
	if err := a.check(); err != nil {
		return 0, nil, err
	}
	if !local.IsValid() {
		return 0, nil, fmt.Errorf("%w: BindEphemeral of an invalid local address", ErrInvalidAddr)
	}
	addrs, err := bindAddrs("BindEphemeral", netip.AddrPortFrom(local, 0), opts)
	if err != nil {
		return 0, nil, err
	}
	low, n := int(a.rng.Low), a.rng.Size()
	a.mu.Lock()
	defer a.mu.Unlock()
	// Offsets from low of the other parity, then of low's parity; each pass
	// starts at the same random position and wraps within its parity.
	start := a.rand.IntN(n)
	for _, first := range [2]int{1, 0} {
		count := (n - first + 1) / 2
		for k := range count {
			p := uint16(low + first + 2*((start/2+k)%count))
			if !a.ephemeralFreeLocked(addrs, p) {
				continue
			}
			if release := a.holdUnusedLocked(nil, addrs, true, p); release != nil {
				return p, release, nil
			}
		}
	}
	return 0, nil, fmt.Errorf("%w: BindEphemeral of %v, range %s", ErrNoPorts, local, a.rng.text())
}

// ephemeralFreeLocked reports whether BindEphemeral may take p for addrs,
// with a.mu held: p is not reserved, no hold conflicts, and no flow uses it
// from any address of addrs' families. N.B. the last is wider than Bind's
// check, as the kernel's bind() of port 0 skips the port of a connected
// socket on another address, which bind() of that port would get.
func (a *PortAllocator) ephemeralFreeLocked(addrs []netip.Addr, p uint16) bool {
	if a.isReserved(p) {
		return false
	}
	for _, addr := range addrs {
		if a.conflictsLocked(nil, addr, p) || a.usedConflicts(netip.AddrFrom16(wildcardOf(addr)), p) {
			return false
		}
	}
	return true
}
