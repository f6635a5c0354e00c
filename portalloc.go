package hash4

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	mrand "math/rand/v2"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/dchest/siphash"
)

// This file holds the ephemeral source-port allocator: the candidate scan of
// the kernel's __inet_hash_connect (RFC 6056 algorithm 4, "double hash", with
// the odd/even policy and the random perturb increment), the scan of bind(0),
// reserved ports, and ports held by Bind and by the listeners and sockets
// of TCPTables and UDPTables made WithPortAllocator. The table's Connect
// drives a portScan; the allocator itself does not know which 4-tuples are
// in use, only, for the tables made WithPortAllocator, which local
// addresses and ports their flows use (portuse.go).
//
// Addresses. As everywhere in hash4, an address is read through its 16-byte
// form: an IPv4 address and its IPv4-mapped IPv6 form are the same address,
// zones are ignored.

// Policy chooses the order in which Connect tries the ports of the range.
type Policy uint8

const (
	// OddEven, the default, is the kernel's policy: connect tries the ports
	// of Low's parity first and the others after (in a range of odd size,
	// one port of Low's parity comes last, where the kernel never tries
	// it), while BindEphemeral starts with the other parity, so the two
	// rarely compete for a port.
	OddEven Policy = iota
	// Flat tries every port of the range in one pass, as the kernel does
	// for a socket with IP_LOCAL_PORT_RANGE set.
	Flat
)

// String returns "odd-even" or "flat".
func (p Policy) String() string {
	switch p {
	case OddEven:
		return "odd-even"
	case Flat:
		return "flat"
	}
	return "Policy(" + strconv.Itoa(int(p)) + ")"
}

// valid reports whether p names a policy.
func (p Policy) valid() bool { return p <= Flat }

// portConfig collects the PortOptions of NewPortAllocator.
type portConfig struct {
	rng      PortRange
	reserved []uint16
	err      error // first error of an option, reported by NewPortAllocator
	policy   Policy
	secret   *[2]uint64
	seed     *uint64
}

// PortOption configures NewPortAllocator.
type PortOption func(*portConfig)

// WithPortRange sets the range ephemeral ports are drawn from (default
// DefaultPortRange), like the sysctl ip_local_port_range.
func WithPortRange(r PortRange) PortOption {
	return func(c *portConfig) { c.rng = r }
}

// WithReservedPorts adds ports that Connect and BindEphemeral never choose,
// like the sysctl ip_local_reserved_ports. Bind may still hold them. Ports
// outside the range are allowed and have no effect; port 0 is an error.
func WithReservedPorts(ports ...uint16) PortOption {
	ports = slices.Clone(ports)
	return func(c *portConfig) {
		if i := slices.Index(ports, 0); i >= 0 && c.err == nil {
			c.err = fmt.Errorf("%w: port 0 at index %d", ErrInvalidReservedPorts, i)
		}
		c.reserved = append(c.reserved, ports...)
	}
}

// WithReservedPortsText adds the reserved ports of s, written as the sysctl
// ip_local_reserved_ports is (see ParseReservedPorts).
func WithReservedPortsText(s string) PortOption {
	return func(c *portConfig) {
		ports, err := ParseReservedPorts(s)
		if err != nil && c.err == nil {
			c.err = err
		}
		c.reserved = append(c.reserved, ports...)
	}
}

// WithPortSecret sets the SipHash key of the per-destination port offset
// (the kernel's net_secret). By default the key is drawn from crypto/rand.
// Anyone who knows the key can predict the ports chosen for a destination.
func WithPortSecret(k0, k1 uint64) PortOption {
	return func(c *portConfig) { c.secret = &[2]uint64{k0, k1} }
}

// WithPolicy sets the order in which Connect tries ports (default OddEven).
func WithPolicy(p Policy) PortOption {
	return func(c *portConfig) { c.policy = p }
}

// WithPerturbSeed makes the allocator's randomness reproducible: the initial
// perturb table, the random part of its increments, and the start of
// BindEphemeral's scan all derive from seed. By default they derive from
// crypto/rand. For tests; a known seed makes ports predictable.
func WithPerturbSeed(seed uint64) PortOption {
	return func(c *portConfig) { c.seed = &seed }
}

// perturbSize is the number of perturb slots, the kernel's
// INET_TABLE_PERTURB_SIZE (2^16 since the fix for Kol, Klein and Gilad,
// USENIX Security 2023).
const perturbSize = 1 << 16

// A PortAllocator chooses local ports for outgoing flows and holds ports for
// explicit binds, like the kernel's port tables for one network namespace
// and one protocol. Tables made [WithPortAllocator] share its bind table:
// Bind sees the ports of their flows, and those of the listeners of a
// [TCPTable] or the sockets of a [UDPTable]. Create it with
// NewPortAllocator. Its methods are safe for concurrent use.
type PortAllocator struct {
	rng         PortRange
	policy      Policy
	k0, k1      uint64 // SipHash key of port_offset
	inc0        uint64 // SipHash key of the random perturb increment
	inc1        uint64
	reserved    [65536 / 64]uint64        // read-only after NewPortAllocator
	anyReserved bool                      // some bit of reserved is set
	perturb     [perturbSize]uint32       // through sync/atomic once constructed
	nheld       atomic.Int64              // number of holds, of Bind and of tables' sockets
	heldPorts   [65536 / 64]atomic.Uint64 // bit p: port p is held for some address; written under mu

	mu      sync.Mutex
	held    map[heldKey]heldBy
	byPort  map[familyPort]int // holds per family and port, wildcard included
	byOwner map[ownerPort]int  // the holds of byPort that tables' sockets took
	proto   string             // "TCP" or "UDP" once a TCPTable or UDPTable shares the allocator
	rand    *mrand.Rand        // ChaCha8; for BindEphemeral

	used portUse // the flows of the tables made WithPortAllocator(a)
}

// heldKey identifies a port held for one local address (16-byte form).
type heldKey struct {
	addr [16]byte
	port uint16
}

// familyPort identifies a port of one address family.
type familyPort struct {
	v6   bool // an IPv6 address that is not IPv4-mapped
	port uint16
}

// heldBy is who holds a port for an address: Bind (owner nil), or the
// sockets of one table, n of them. N.B. one owner at most: a hold is taken
// only where no other owner's conflicts with it (conflictsLocked), and two
// holds of one address and port always conflict.
type heldBy struct {
	owner *bindOwner
	n     int32
}

// bindOwner stands for a TCPTable or UDPTable made WithPortAllocator: its
// listeners or sockets hold their ports in the allocator, and its own
// holds are left to its own conflict rules.
type bindOwner struct {
	proto string
}

// ownerPort counts one owner's holds of a family and port.
type ownerPort struct {
	owner *bindOwner
	fp    familyPort
}

// NewPortAllocator returns an allocator configured by opts. It returns an
// error, and no allocator, for an invalid range, reserved-port list or
// policy.
//
// Connect and ConnectFunc skip the ports an allocator holds (Bind,
// BindEphemeral) whatever the table. The converse holds only for the tables
// made [WithPortAllocator](a): Bind and BindEphemeral see the ports of
// their flows and of no other table's, even flows that a's Connect placed.
// An allocator that serves Bind or BindEphemeral too should therefore be
// given to its tables with WithPortAllocator, which then also use it for
// a Connect given a nil allocator (see the example of BindEphemeral).
func NewPortAllocator(opts ...PortOption) (*PortAllocator, error) {
	c := portConfig{rng: DefaultPortRange, policy: OddEven}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if c.err != nil {
		return nil, c.err
	}
	if err := c.rng.Validate(); err != nil {
		return nil, err
	}
	if !c.policy.valid() {
		return nil, fmt.Errorf("%w %d", ErrInvalidPolicy, c.policy)
	}
	a := &PortAllocator{
		rng:     c.rng,
		policy:  c.policy,
		held:    make(map[heldKey]heldBy),
		byPort:  make(map[familyPort]int),
		byOwner: make(map[ownerPort]int),
	}
	if c.secret != nil {
		a.k0, a.k1 = c.secret[0], c.secret[1]
	} else {
		var b [16]byte
		rand.Read(b[:]) // never fails since Go 1.24
		a.k0 = binary.LittleEndian.Uint64(b[0:8])
		a.k1 = binary.LittleEndian.Uint64(b[8:16])
	}
	var seed [32]byte
	if c.seed != nil {
		binary.LittleEndian.PutUint64(seed[0:8], *c.seed)
		copy(seed[8:], "hash4 perturb seed")
	} else {
		rand.Read(seed[:])
	}
	src := mrand.NewChaCha8(seed)
	for i := 0; i < perturbSize; i += 2 {
		v := src.Uint64()
		a.perturb[i], a.perturb[i+1] = uint32(v), uint32(v>>32) // not shared yet
	}
	a.inc0, a.inc1 = src.Uint64(), src.Uint64()
	a.rand = mrand.New(src)
	for _, p := range c.reserved {
		a.reserved[p/64] |= 1 << (p % 64)
		a.anyReserved = true
	}
	return a, nil
}

// Range returns the range ephemeral ports are drawn from; the zero
// PortRange for a nil allocator.
func (a *PortAllocator) Range() PortRange {
	if a == nil {
		return PortRange{}
	}
	return a.rng
}

// Policy returns the order in which Connect tries ports; OddEven for a nil
// allocator.
func (a *PortAllocator) Policy() Policy {
	if a == nil {
		return OddEven
	}
	return a.policy
}

// Reserved reports whether port is reserved, as the kernel's
// inet_is_local_reserved_port; false for a nil allocator.
func (a *PortAllocator) Reserved(port uint16) bool {
	return a != nil && a.isReserved(port)
}

// isReserved is Reserved for an allocator known to be made: the scans call
// it for every candidate.
func (a *PortAllocator) isReserved(port uint16) bool {
	return a.reserved[port/64]&(1<<(port%64)) != 0
}

// connectConfig collects the ConnectOptions of one connect.
type connectConfig struct {
	rng      PortRange   // per-call range; the zero value means none
	reuse    ReusePolicy // WithTimeWaitReuse's, or nil
	reuseOld any         // WithTimeWaitReuse's **T
}

// ConnectOption configures one connect.
type ConnectOption func(*connectConfig)

// WithConnectRange narrows the ports of one connect, like the socket option
// IP_LOCAL_PORT_RANGE: r.Low replaces the allocator's low bound if it lies
// inside the allocator's range, then r.High replaces its high bound if it
// lies between the (new) low bound and the allocator's high bound; a bound
// of 0 is unset. A non-zero r also makes the connect try ports in one flat
// pass, whatever the policy. The zero PortRange is no option at all.
func WithConnectRange(r PortRange) ConnectOption {
	return func(c *connectConfig) { c.rng = r }
}

// scanRange returns the first and one-past-last ports of a connect and its
// step, as the kernel's inet_sk_get_local_port_range.
func (a *PortAllocator) scanRange(cc *connectConfig) (low, high, step uint32) {
	low, high, step = uint32(a.rng.Low), uint32(a.rng.High), 2
	if a.policy == Flat {
		step = 1
	}
	if cc != nil && cc.rng != (PortRange{}) {
		if lo := uint32(cc.rng.Low); low <= lo && lo <= high {
			low = lo
		}
		if hi := uint32(cc.rng.High); low <= hi && hi <= high {
			high = hi
		}
		step = 1
	}
	return low, high + 1, step
}

// portOffset returns the keyed per-destination hash of the flow (local,
// remote), as the kernel's secure_ipv4_port_ephemeral and
// secure_ipv6_port_ephemeral: SipHash-2-4 of the local address, the remote
// address and the remote port.
func (a *PortAllocator) portOffset(local netip.Addr, remote netip.AddrPort) uint64 {
	// The message is the 16-byte forms of the addresses and the port in
	// network order. N.B. it is written in the words setWords reads, not
	// copied from As16, whose copies stall on store-to-load forwarding.
	var l, r [2]uint64
	setWords(&l, local)
	setWords(&r, remote.Addr())
	var b [34]byte
	binary.LittleEndian.PutUint64(b[0:8], l[0])
	binary.LittleEndian.PutUint64(b[8:16], l[1])
	binary.LittleEndian.PutUint64(b[16:24], r[0])
	binary.LittleEndian.PutUint64(b[24:32], r[1])
	binary.BigEndian.PutUint16(b[32:34], remote.Port())
	return siphash.Hash(a.k0, a.k1, b[:])
}

// random8 returns the random number below 8 of a perturb increment of slot
// index, whose value was v. It is a keyed hash of the slot and its value, so
// it is as unpredictable as a fresh draw to whoever lacks the key, yet each
// slot's sequence depends on nothing but that slot.
func (a *PortAllocator) random8(index, v uint32) uint32 {
	var b [8]byte
	binary.LittleEndian.PutUint32(b[0:4], index)
	binary.LittleEndian.PutUint32(b[4:8], v)
	return uint32(siphash.Hash(a.inc0, a.inc1, b[:]) & 7)
}

// selectPort runs the candidate scan of __inet_hash_connect for the flow
// (local, remote) and returns the first port for which try returns true,
// and records it (portScan.taken). try is called at most once per
// candidate, never for reserved ports or ports held (see
// PortAllocator.Bind). Table.connect drives a portScan itself; selectPort
// is the same scan for callers that check candidates through a function.
func (a *PortAllocator) selectPort(local netip.Addr, remote netip.AddrPort, cc *connectConfig, try func(port uint16) bool) (uint16, bool) {
	s := a.startScan(local, remote, cc)
	for {
		first, n := s.next()
		if n == 0 {
			return 0, false
		}
		for j := range n {
			if p := uint16(first + j*s.step); try(p) {
				s.taken(j)
				return p, true
			}
		}
	}
}

// portScanRun is the most candidates portScan.next returns at once: runs
// are short enough that a scan soon sees a Bind made during it, and long
// enough that computing them costs little per candidate.
const portScanRun = 64

// portScan is one run of the candidate scan of __inet_hash_connect for a
// flow: next returns the candidates in order, a run at a time, and taken
// records the one the caller took.
//
// The scan starts at a per-destination offset, the keyed port offset plus
// the destination's perturb slot, and walks the range with step 2 (ports of
// low's parity, then the others) or step 1 (one pass) for the Flat policy
// or a per-call range. With step 2 and a range of odd size, the kernel
// rounds the pass length down to even, so that its first pass leaves out
// one port of low's parity: low, or, when the pass starts at low, the last
// port. The kernel never tries it, and a 3-port range never gives out its
// last port; the scan tries it in a pass of its own after the two, so that
// Connect fails only when no port of the range is free.
//
// N.B. candidates come in runs of ports step apart, which the caller checks
// in a loop of its own: a Connect scan spends a few nanoseconds per
// candidate, and a function call per candidate was a fifth of it. Where no
// port is reserved or held, a run is computed, not scanned.
type portScan struct {
	a     *PortAllocator
	local netip.Addr
	// port is the next port to consider, already wrapped into the range,
	// and i its index in the pass.
	port, i   uint32
	high      uint32 // one past the last port of the range
	remaining uint32 // candidates per pass, all passes together
	step      uint32
	offset    uint32 // of the pass's first port from low
	low       uint32
	runAt     uint32  // the index in its pass of the run next returned last
	slot      *uint32 // the destination's perturb slot
	index     uint32  // of slot
	perturb   uint32  // slot's value when the scan began
	leftOut   bool    // the pass of the port the first left out has begun
}

// startScan returns the scan of candidate ports for the flow (local,
// remote) under cc's options.
func (a *PortAllocator) startScan(local netip.Addr, remote netip.AddrPort, cc *connectConfig) portScan {
	low, high, step := a.scanRange(cc)
	remaining := high - low
	if step == 2 && remaining > 1 {
		remaining &^= 1 // even, so that both passes take turns evenly
	}
	portOffset := a.portOffset(local, remote)
	index := uint32(portOffset & (perturbSize - 1))
	slot := &a.perturb[index]
	perturb := atomic.LoadUint32(slot)
	offset := (perturb + uint32(portOffset>>32)) % remaining
	if step == 2 {
		offset &^= 1 // first pass: ports of low's parity
	}
	return portScan{
		a: a, local: local,
		port: low + offset, high: high, remaining: remaining, step: step,
		offset: offset, low: low,
		slot: slot, index: index, perturb: perturb,
	}
}

// next returns the next run of candidates, n ports step apart from first,
// in scan order: ports that are not reserved and not held (see
// PortAllocator.Bind). It returns n == 0 when the scan is over.
func (s *portScan) next() (first uint32, n uint32) {
	// N.B. whether any port is held is read once per run: a Bind that
	// races with a Connect may or may not be seen by it either way.
	held := s.a.nheld.Load() != 0
	for {
		if s.i >= s.remaining && !s.nextPass() {
			return 0, 0
		}
		// The run ends at the end of the pass, where it wraps, or after
		// portScanRun ports. N.B. step is 1 or 2: a division by it is a
		// shift by step/2.
		limit := min((s.remaining-s.i+s.step-1)>>(s.step/2), (s.high-s.port+s.step-1)>>(s.step/2), portScanRun)
		first, s.runAt = s.port, s.i
		if !s.a.anyReserved && !held {
			n = limit
		} else {
			for n < limit && !s.a.isReserved(uint16(s.port+n*s.step)) &&
				!(held && s.a.mayBeHeld(uint16(s.port+n*s.step))) {
				n++
			}
		}
		// Skip the run and, if it ended early, the port that ended it.
		skip := n
		if n < limit {
			skip++
		}
		s.i += skip * s.step
		if s.port += skip * s.step; s.port >= s.high {
			s.port -= s.remaining
		}
		if n > 0 {
			return first, n
		}
	}
}

// nextPass starts the next pass under step 2 and reports whether there was
// one to start: the second, of the other parity, then in a range of odd
// size the pass of the one port the first left out (see portScan).
func (s *portScan) nextPass() bool {
	switch {
	case s.step != 2 || s.remaining <= 1:
		return false
	case s.offset&1 == 0:
		s.offset++
		s.port, s.i = s.low+s.offset, 0
		return true
	case s.leftOut || (s.high-s.low)&1 == 0:
		return false
	}
	s.leftOut = true
	s.port = s.low
	if s.offset == 1 { // the first pass began at low
		s.port = s.high - 1
	}
	// N.B. the last index of a pass makes the pass one port long (see
	// next) and makes taken count the whole first pass as tried.
	s.i = s.remaining - 1
	return true
}

// taken records that the caller took port j of the run next returned
// last: it advances the perturb slot by max(i, random(8)*step) + step, as
// in RFC 6056 section 5 and the kernel, where i is the port's index in its
// pass. The random amount, when the scan was short, keeps an observer from
// counting a slot's connects.
func (s *portScan) taken(j uint32) {
	i := s.runAt + j*s.step
	if r := s.a.random8(s.index, s.perturb) * s.step; r > i {
		i = r
	}
	atomic.AddUint32(s.slot, i+s.step)
}

// check returns an error matching ErrNilAllocator if a is nil or was not
// made by NewPortAllocator.
func (a *PortAllocator) check() error {
	if why := a.unusable(); why != "" {
		return fmt.Errorf("%w: %s", ErrNilAllocator, why)
	}
	return nil
}

// unusable says why a cannot serve, or returns "": it is nil, or was not
// made by NewPortAllocator (its zero value has no range).
func (a *PortAllocator) unusable() string {
	switch {
	case a == nil:
		return "nil *PortAllocator"
	case a.rng.Low == 0:
		return "zero PortAllocator, not made by NewPortAllocator"
	}
	return ""
}
