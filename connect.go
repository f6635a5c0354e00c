package hash4

import (
	"errors"
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
	// connectIndexed is connectHashOnce, but for a destination with an
	// occupancy index (index.go) it takes the candidates from the index,
	// and it builds one for a destination whose scan was long.
	connectIndexed
)

// Connect picks a local port for the flow from local to remote as Linux's
// connect() does, inserts v under the resulting 4-tuple and returns the
// tuple (IPv4-mapped addresses as IPv4, zones dropped), atomically: two
// Connects never get the same tuple. The allocator a orders the candidates
// (see [PortAllocator]); [WithConnectRange] narrows the range for this call.
// To a busy destination the table keeps a bitmap of its ports (8 KiB, for
// at most 64 destinations) and finds the same port a word per 64 ports.
// Errors: [ErrNoPorts] (and syscall.EADDRNOTAVAIL) when every candidate is
// taken; [ErrInvalidTuple], [ErrNilValue] or [ErrNilAllocator] for bad
// input (a table made [WithPortAllocator] takes its own for a nil a, and
// refuses another); [ErrTableFull]. None changes anything.
func (t *Table[T]) Connect(a *PortAllocator, local netip.Addr, remote netip.AddrPort, v *T, opts ...ConnectOption) (Tuple, error) {
	if v == nil {
		return Tuple{}, fmt.Errorf("%w for a flow to %v", ErrNilValue, remote)
	}
	return t.connect(a, local, remote, v, connectIndexed, opts)
}

// ConnectFunc is [Table.Connect] for a value that needs its tuple: it picks
// a port as Connect does and holds the tuple, so that no other Connect,
// Insert, Store or Compute takes it, calls f with it without any lock, and
// publishes f's value only once f returns: no Lookup, All or AppendLookups
// sees the tuple before. If f's error matches ErrPortRefused it tries the
// next port; any other error, or a nil value, ends it with nothing inserted
// and is returned. Its other errors are Connect's; it costs Connect's scan
// and two locks of the tuple's stripe.
func (t *Table[T]) ConnectFunc(a *PortAllocator, local netip.Addr, remote netip.AddrPort, f func(Tuple) (*T, error), opts ...ConnectOption) (Tuple, *T, error) {
	if f == nil {
		return Tuple{}, nil, fmt.Errorf("%w: ConnectFunc with a nil function, for a flow to %v", ErrNilValue, remote)
	}
	return t.connectFlow(a, local, remote, nil, f, connectIndexed, opts)
}

// connect is Connect with the given strategy.
func (t *Table[T]) connect(a *PortAllocator, local netip.Addr, remote netip.AddrPort, v *T, strategy connectStrategy, opts []ConnectOption) (Tuple, error) {
	tup, _, err := t.connectFlow(a, local, remote, v, nil, strategy, opts)
	return tup, err
}

// connectFlow is Connect, with v, or ConnectFunc, with f.
func (t *Table[T]) connectFlow(a *PortAllocator, local netip.Addr, remote netip.AddrPort, v *T, f func(Tuple) (*T, error), strategy connectStrategy, opts []ConnectOption) (Tuple, *T, error) {
	// N.B. errors quote the addresses as given, not in key form.
	why := addrProblem(local, remote.Addr())
	if why == "" && remote.Port() == 0 {
		why = "port 0"
	}
	if why != "" {
		return Tuple{}, nil, fmt.Errorf("%w: flow from %v to %v: %s", ErrInvalidTuple, local, remote, why)
	}
	a, err := t.connectAllocator(a)
	if err != nil {
		return Tuple{}, nil, err
	}
	t.array() // a zero Table panics here, before the scan
	local = local.Unmap().WithZone("")
	remote = netip.AddrPortFrom(remote.Addr().Unmap().WithZone(""), remote.Port())
	cc := connectOptions(opts)
	var k key
	setWords(&k.remote, remote.Addr())
	setWords(&k.local, local)
	hash0 := t.hashPort0(&k.local, &k.remote, remote.Port())
	full, noPorts := false, false
	var tried, refused uint64
	// N.B. counted on the line of the stripe of the flow's hash with port
	// 0, which flows to other destinations mostly do not share.
	defer t.metrics[hash0&uint32(len(t.metrics)-1)].connected(&tried, &refused, &noPorts)
	scan := a.startScan(local, remote, &cc)
	var dest destKey
	if strategy == connectIndexed {
		dest = destKey{local: k.local, remote: k.remote, rport: remote.Port(), hash0: hash0}
		if p := t.findIndex(&dest); p != nil {
			if p.n.Load() == 0 { // the destination emptied: scan
				t.dropIndex(p)
			} else {
				tup, v, ok, err := t.connectIndexed(p, &scan, &k, hash0, local, remote, v, f, &tried, &refused, &full)
				if ok || err != nil {
					return tup, v, err
				}
				goto failed
			}
		}
	}
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
			tried++
			if strategy != connectLocked && t.present(&k) {
				continue
			}
			var res insertResult
			if f == nil {
				_, res = t.insert(&k, v)
			} else {
				res = t.reserve(&k)
			}
			switch res {
			case inserted:
				if t.alloc != nil && t.boundMeanwhile(a, &k, v, local, port) {
					continue
				}
				tup := Tuple{Local: netip.AddrPortFrom(local, port), Remote: remote}
				if f != nil {
					var err error
					if v, err = t.settle(&k, tup, f); errors.Is(err, ErrPortRefused) {
						refused++
						continue
					} else if err != nil {
						return Tuple{}, nil, err
					}
				}
				scan.taken(j)
				if strategy == connectIndexed && tried > indexAfter {
					t.buildIndex(dest)
				}
				return tup, v, nil
			case insertFull:
				full = true
			}
		}
	}
	if strategy == connectIndexed && tried > indexAfter {
		t.buildIndex(dest)
	}
failed:
	if full {
		return Tuple{}, nil, ErrTableFull
	}
	noPorts = true
	if refused > 0 {
		return Tuple{}, nil, fmt.Errorf("%w: %v to %v (%d ports refused)", ErrNoPorts, local, remote, refused)
	}
	return Tuple{}, nil, fmt.Errorf("%w: %v to %v", ErrNoPorts, local, remote)
}

// reserve links a reservation of k (see entry) into its chain, unless k is
// present or held; it returns inserted if it did. The reservation is not
// counted in the stripe's entries until publish.
func (t *Table[T]) reserve(k *key) insertResult {
	a, st, s, b := t.lockStripe(uint32(k.meta>>32), lockToInsert)
	defer st.mu.Unlock()
	if _, l := t.findLocked(a, k); !l.isNulls() {
		return insertExists
	}
	i, ok := t.place(a, st, s, b)
	if !ok {
		return insertFull
	}
	r := *k
	r.meta &^= lportMask
	t.fill(i, &r, nil, &a.b.heads[b])
	if t.alloc != nil {
		t.alloc.use(&k.local, uint16(k.meta>>16))
	}
	t.noteIndex(k, uint16(k.meta>>16), true)
	return inserted
}

// settle calls f for the tuple tup, whose key k is reserved, and publishes
// its value, or drops the reservation if f fails, returns nil or panics.
// N.B. f runs without any lock, and the reservation it holds cannot go
// meanwhile: every other writer skips it, and a move, an eviction, a
// migration or a compaction carries it to another node as it is, so
// publish and unreserve find it by its key.
func (t *Table[T]) settle(k *key, tup Tuple, f func(Tuple) (*T, error)) (v *T, err error) {
	published := false
	defer func() {
		if !published {
			t.unreserve(k)
		}
	}()
	if v, err = f(tup); err == nil && v == nil {
		err = fmt.Errorf("%w from ConnectFunc's function for %v", ErrNilValue, tup)
	}
	if err != nil {
		return nil, err
	}
	t.publish(k, v)
	published = true
	return v, nil
}

// publish makes k's reservation the live entry of k with value v.
func (t *Table[T]) publish(k *key, v *T) {
	a, st, _, _ := t.lockStripe(uint32(k.meta>>32), lockOnly)
	_, l := t.findLocked(a, k)
	if l.isNulls() {
		st.mu.Unlock()
		panic("hash4: ConnectFunc's reservation lost")
	}
	e := t.nodes.at(l.index())
	e.val.Store(v)
	e.key.meta.Store(k.meta) // live to readers: N.B. after the value (see entry)
	n := st.count.Load() + 1
	st.count.Store(n)
	st.mu.Unlock()
	t.grown(a, uint32(k.meta>>32), n)
}

// unreserve drops k's reservation.
func (t *Table[T]) unreserve(k *key) {
	a, st, _, _ := t.lockStripe(uint32(k.meta>>32), lockToDelete)
	defer st.mu.Unlock()
	prev, l := t.findLocked(a, k)
	if l.isNulls() {
		panic("hash4: ConnectFunc's reservation lost")
	}
	if t.alloc != nil {
		t.alloc.unuse(&k.local, uint16(k.meta>>16))
	}
	t.unlinkLocked(prev, l)
	t.free(a, st, l.index())
	t.noteIndex(k, uint16(k.meta>>16), false)
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
