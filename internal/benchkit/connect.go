package benchkit

import (
	"net/netip"
	"strconv"
)

// ConnLocal is the local address of every flow of the Connect benchmarks,
// and ConnRemote their one destination.
var (
	ConnLocal  = netip.MustParseAddr("10.1.2.3")
	ConnRemote = netip.MustParseAddrPort("192.0.2.80:443")
)

// ConnK0 and ConnK1 are the port secret of the Connect benchmarks'
// allocators, and ConnSeed their perturb seed.
const (
	ConnK0, ConnK1 = 0x0123456789abcdef, 0xfedcba9876543210
	ConnSeed       = 7
)

// ConnOccupancies are the occupancies of the port range the Connect
// benchmarks run at, in per mille: 0, 50, 90, 99 and 99.9%.
var ConnOccupancies = []int{0, 500, 900, 990, 999}

// ConnOccupancy returns the name of occupancy perMille in a Connect
// benchmark's name, e.g. occupancy=99.9%, and the number of ports of a range
// of size ports that it puts in use (NewConnState's inUse).
func ConnOccupancy(perMille, size int) (name string, inUse int) {
	pct := strconv.Itoa(perMille / 10)
	if perMille%10 != 0 {
		pct += "." + strconv.Itoa(perMille%10)
	}
	return "occupancy=" + pct + "%", size * perMille / 1000
}

// ConnTuple returns the flow from ConnLocal port p to ConnRemote.
func ConnTuple[K Tuple](p uint16) K {
	return K{Local: netip.AddrPortFrom(ConnLocal, p), Remote: ConnRemote}
}

// Rand is xorshift64*, cheap enough not to show in a benchmark's op. Its
// value is its state, which must not be zero.
type Rand uint64

// Next returns the next number of r.
func (r *Rand) Next() uint64 {
	x := uint64(*r)
	x ^= x >> 12
	x ^= x << 25
	x ^= x >> 27
	*r = Rand(x)
	return x * 0x2545f4914f6cdd1d
}

// Conn is one implementation of connect-and-delete, its flows named by
// their local port (see ConnTuple).
type Conn interface {
	// Connect takes a free port and returns it.
	Connect() uint16
	// Delete removes the flow of port p, which is live.
	Delete(p uint16)
	// Prefill inserts the flow of port p, which is free, directly.
	Prefill(p uint16)
}

// ConnState is an implementation with a port range in use to a fraction,
// and the live flows.
type ConnState struct {
	C Conn // the implementation
	R Rand // chose the ports in use, and chooses the flows deleted
	// Live is the local ports of the live flows. (A slice of whole tuples
	// would be 1.8 MB for the default range, and reading a random victim
	// from it would miss the cache on every op.)
	Live []uint16
}

// NewConnState returns the state of c, which holds no flow, with inUse
// random ports of the range low-high in use: taken by c.Connect if
// byConnect is set (as the OddEven policy fills a range), otherwise the
// random ports themselves, through c.Prefill.
func NewConnState(c Conn, low, high uint16, byConnect bool, inUse int) *ConnState {
	size := int(high) - int(low) + 1
	s := &ConnState{C: c, R: 0x9e3779b97f4a7c15, Live: make([]uint16, 0, size+1)}
	ports := make([]uint16, 0, size)
	for p := int(low); p <= int(high); p++ {
		ports = append(ports, uint16(p))
	}
	for i := len(ports) - 1; i > 0; i-- {
		j := int(s.R.Next() % uint64(i+1))
		ports[i], ports[j] = ports[j], ports[i]
	}
	for _, p := range ports[:inUse] {
		if byConnect {
			p = s.C.Connect()
		} else {
			s.C.Prefill(p)
		}
		s.Live = append(s.Live, p)
	}
	return s
}

// Op connects one flow, then deletes a random live one, and returns the
// local port taken.
func (s *ConnState) Op() uint16 {
	p := s.C.Connect()
	s.Live = append(s.Live, p)
	j := int(uint64(uint32(s.R.Next())) * uint64(len(s.Live)) >> 32) // in [0, len)
	s.C.Delete(s.Live[j])
	s.Live[j] = s.Live[len(s.Live)-1]
	s.Live = s.Live[:len(s.Live)-1]
	return p
}
