package hash4

import (
	"fmt"
	"net/netip"
)

// This file holds Table.Connect: the source-port search of the kernel's
// __inet_hash_connect over a Table, with the port allocator (portalloc.go)
// choosing the order of candidates.

// connectStrategy selects how Connect checks a candidate port. Only
// connectHashOnce is used outside benchmarks; the others are the steps the
// kernel took before it, kept so that each step's gain can be measured.
type connectStrategy uint8

const (
	// connectHashOnce hashes the flow once with local port 0 and derives
	// each candidate's hash with one addition (the port identity), checks
	// the candidate without a lock and locks only a port that looks free.
	connectHashOnce connectStrategy = iota
	// connectRehash is connectHashOnce with a full hash per candidate.
	connectRehash
	// connectLocked is connectHashOnce without the lock-free pre-check:
	// every candidate is checked under its stripe lock.
	connectLocked
)

// Connect picks a local port for the flow from local to remote, inserts v
// under the resulting 4-tuple and returns the tuple, atomically: two
// concurrent Connects never get the same 4-tuple, and Connect never returns
// a tuple it did not insert. The tuple is in key form: IPv4-mapped
// addresses as IPv4, zones dropped. A socket for the flow should bind local
// as given (zone included) with the tuple's local port. The allocator a
// chooses the candidates (its range, reserved and bound ports, policy and
// perturbation; see PortAllocator); a WithConnectRange option narrows the
// range for this call and makes its scan flat.
//
// When every candidate is taken it returns an error matching ErrNoPorts (and
// syscall.EADDRNOTAVAIL) after one bounded scan. Bad input (nil value,
// invalid, unspecified or mixed-family addresses, remote port 0) returns an
// error matching ErrInvalidTuple or ErrNilValue, and a nil PortAllocator or
// one that NewPortAllocator did not make an error matching ErrNilAllocator;
// none changes anything.
// If the table cannot index another entry it returns ErrTableFull.
func (t *Table[T]) Connect(a *PortAllocator, local netip.Addr, remote netip.AddrPort, v *T, opts ...ConnectOption) (Tuple, error) {
	return t.connect(a, local, remote, v, connectHashOnce, opts)
}

func (t *Table[T]) connect(a *PortAllocator, local netip.Addr, remote netip.AddrPort, v *T, strategy connectStrategy, opts []ConnectOption) (Tuple, error) {
	// N.B. errors quote the addresses as given, not in key form.
	why := addrProblem(local, remote.Addr())
	if why == "" && remote.Port() == 0 {
		why = "port 0"
	}
	if why != "" {
		return Tuple{}, fmt.Errorf("%w: flow from %v to %v: %s", ErrInvalidTuple, local, remote, why)
	}
	if v == nil {
		return Tuple{}, fmt.Errorf("%w for a flow to %v", ErrNilValue, remote)
	}
	if err := a.check(); err != nil {
		return Tuple{}, err
	}
	t.array() // a zero Table panics here, before the scan
	local = local.Unmap().WithZone("")
	remote = netip.AddrPortFrom(remote.Addr().Unmap().WithZone(""), remote.Port())
	cc := connectOptions(opts)
	var k key
	setWords(&k.remote, remote.Addr())
	setWords(&k.local, local)
	hash0 := hashPort0(t.hasher, &t.secret, &k.local, &k.remote, remote.Port())
	full := false
	scan := a.startScan(local, remote, &cc)
	for {
		first, n := scan.next()
		if n == 0 {
			break
		}
		for j := range n {
			port := uint16(first + j*scan.step)
			if strategy == connectRehash {
				// Hash the whole tuple anew, as before the port identity.
				t.setKey(&k, local, port, remote)
			} else {
				k.setPort(hash0, port, remote.Port())
			}
			if strategy != connectLocked && t.present(&k) {
				continue
			}
			switch _, res := t.insert(&k, v); res {
			case inserted:
				scan.taken(j)
				return Tuple{Local: netip.AddrPortFrom(local, port), Remote: remote}, nil
			case insertFull:
				full = true
			}
		}
	}
	if full {
		return Tuple{}, ErrTableFull
	}
	return Tuple{}, fmt.Errorf("%w: %v to %v", ErrNoPorts, local, remote)
}

// connectOptions returns the config that opts make. N.B. it fills a config
// of its own and returns a copy: an option is an opaque function, so the
// config whose address it gets moves to the heap, and Connect's own config
// would then cost an allocation on every call, with options or without.
func connectOptions(opts []ConnectOption) connectConfig {
	if len(opts) == 0 {
		return connectConfig{}
	}
	c := new(connectConfig)
	for _, o := range opts {
		if o != nil {
			o(c)
		}
	}
	return *c
}
