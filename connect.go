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
	// every candidate is checked under its bucket lock.
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
// (see [PortAllocator]); [WithConnectRange] narrows the range for this call,
// [WithTimeWaitReuse] lets it take over a flow in TIME_WAIT. To a busy
// destination the table keeps bitmaps of its ports (16 KiB, for at most 64
// destinations) and finds the same port a word per 64 ports.
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
// and two locks of the tuple's bucket.
//
// A port f refuses is skipped by this call only: the allocator does not see
// other programs' sockets, so later calls offer it again. To keep them off
// it, hold it with [PortAllocator.Bind] once ConnectFunc has returned (until
// then the flow holds the tuple, and such a Bind fails with
// [ErrPortInUse]), and release the hold when the port may be free again.
// [Metrics] counts the refusals (ConnectRefused).
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

// connectCall is the state of one Connect or ConnectFunc: its input, what
// it found and its counts.
type connectCall[T any] struct {
	a             *PortAllocator
	local         netip.Addr
	remote        netip.AddrPort
	v             *T                      // Connect's value, or nil
	f             func(Tuple) (*T, error) // ConnectFunc's function, or nil
	allow         ReusePolicy             // WithTimeWaitReuse's policy, or nil
	tup           Tuple                   // the tuple taken
	old           *T                      // the value taken over, or nil
	err           error                   // f's error that ends the call
	tried, refuse uint64
	full          bool
}

// connectFlow is Connect, with v, or ConnectFunc, with f.
func (t *Table[T]) connectFlow(a *PortAllocator, local netip.Addr, remote netip.AddrPort, v *T, f func(Tuple) (*T, error), strategy connectStrategy, opts []ConnectOption) (Tuple, *T, error) {
	cc := connectOptions(opts)
	out, err := reuseOut[T](&cc, remote)
	if err != nil {
		return Tuple{}, nil, err
	}
	c := connectCall[T]{v: v, f: f, allow: cc.reuse}
	if out != nil {
		defer func() { *out = c.old }()
	}
	// N.B. errors quote the addresses as given, not in key form.
	why := addrProblem(local, remote.Addr())
	if why == "" && remote.Port() == 0 {
		why = "port 0"
	}
	if why != "" {
		return Tuple{}, nil, fmt.Errorf("%w: flow from %v to %v: %s", ErrInvalidTuple, local, remote, why)
	}
	t.array() // a nil or zero Table panics here, before the scan
	a, err = t.connectAllocator(a)
	if err != nil {
		return Tuple{}, nil, err
	}
	local = local.Unmap().WithZone("")
	remote = netip.AddrPortFrom(remote.Addr().Unmap().WithZone(""), remote.Port())
	c.a, c.local, c.remote = a, local, remote
	var k key
	setWords(&k.remote, remote.Addr())
	setWords(&k.local, local)
	hash0 := t.hashPort0(&k.local, &k.remote, remote.Port())
	noPorts := false
	defer t.attach().connected(&c.tried, &c.refuse, &noPorts)
	scan := a.startScan(local, remote, &cc)
	var dest destKey
	taken := false
	if strategy == connectIndexed {
		dest = destKey{local: k.local, remote: k.remote, rport: remote.Port(), hash0: hash0}
		if p := t.findIndex(&dest); p != nil {
			if p.n.Load() == 0 { // the destination emptied: scan
				t.dropIndex(p)
			} else {
				taken = t.connectIndexed(p, &scan, &k, hash0, &c)
				goto done
			}
		}
	}
scan:
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
			c.tried++
			// N.B. the marks' count before the entry (see timewait.go).
			if strategy != connectLocked && !t.mayReuse(c.allow) && t.present(&k) {
				continue
			}
			if t.tryPort(&c, &k, port) {
				if c.err == nil {
					scan.taken(j)
					taken = true
				}
				break scan
			}
		}
	}
	if strategy == connectIndexed && c.tried > indexAfter {
		t.buildIndex(dest)
	}
done:
	switch {
	case c.err != nil:
		return Tuple{}, nil, c.err
	case taken:
		return c.tup, c.v, nil
	case c.full:
		return Tuple{}, nil, ErrTableFull
	}
	noPorts = true
	if c.refuse > 0 {
		return Tuple{}, nil, fmt.Errorf("%w: %v to %v (ports refused: %d)", ErrNoPorts, local, remote, c.refuse)
	}
	return Tuple{}, nil, fmt.Errorf("%w: %v to %v", ErrNoPorts, local, remote)
}

// mayReuse reports whether a candidate that looks taken may yet be one a
// Connect with policy allow takes over: whether the table has a flow in
// TIME_WAIT. The scan asks it before it looks the candidate up (see
// timewait.go). N.B. without a policy, one branch.
func (t *Table[T]) mayReuse(allow ReusePolicy) bool {
	if allow == nil {
		return false
	}
	c := t.clients()
	return c != nil && c.marks.n.Load() > 0
}

// tryPort tries candidate k, of local port port, for c under the bucket
// lock, as the kernel's __inet_check_established: it inserts c.v or
// reserves the tuple for c.f, or takes over a flow in TIME_WAIT that
// c.allow allows; then, for a port inserted, it backs out if a Bind took
// the port meanwhile (boundMeanwhile), and for ConnectFunc it calls f and
// publishes its value. It reports whether c is done: it took the port, or
// f failed (c.err).
func (t *Table[T]) tryPort(c *connectCall[T], k *key, port uint16) bool {
	tup := Tuple{Local: netip.AddrPortFrom(c.local, port), Remote: c.remote}
	var res insertResult
	switch {
	case c.allow == nil && c.f == nil:
		_, res = t.insert(k, c.v)
	case c.allow == nil:
		res = t.reserve(k)
	case c.f == nil:
		c.old, res = t.takeOver(k, c.v, tup, c.allow)
	default:
		res = t.claim(k, tup, c.allow)
	}
	switch res {
	case insertFull:
		c.full = true
		return false
	case inserted:
		if t.boundMeanwhile(c.a, k, c.v, c.local, port) {
			return false
		}
	case insertTakenOver:
	default:
		return false
	}
	if c.f != nil {
		v, old, err := t.settle(k, tup, c.f, res == insertTakenOver)
		if errors.Is(err, ErrPortRefused) {
			c.refuse++
			return false
		} else if err != nil {
			c.err = err
			return true
		}
		c.v, c.old = v, old
	}
	c.tup = tup
	return true
}

// reserve links a reservation of k (see entry) into its bucket, unless k is
// present or held; it returns inserted if it did. The reservation is not
// counted in the table's entries until publish.
func (t *Table[T]) reserve(k *key) insertResult {
	_, b := t.lockBucket(k.hash())
	defer b.unlock()
	if e, _, _ := t.findLocked(b, k); e != nil {
		return insertExists
	}
	return t.add(b, k, nil)
}

// settle calls f for the tuple tup, whose key k is reserved, or claimed
// for a takeover (timewait.go), and publishes its value, returning the
// value taken over; if f fails, returns nil or panics, it drops the
// reservation, or ends the claim and the flow stays in TIME_WAIT.
// N.B. f runs without any lock, and the reservation it holds cannot go
// meanwhile: every other writer skips it, and a move, an eviction, a
// migration or a compaction carries it to another node as it is, so
// publish and unreserve find it by its key.
func (t *Table[T]) settle(k *key, tup Tuple, f func(Tuple) (*T, error), claimed bool) (v, old *T, err error) {
	published := false
	defer func() {
		switch {
		case published:
		case claimed:
			t.unclaim(k)
		default:
			t.unreserve(k)
		}
	}()
	if v, err = f(tup); err == nil && v == nil {
		err = fmt.Errorf("%w from ConnectFunc's function for %v", ErrNilValue, tup)
	}
	if err != nil {
		return nil, nil, err
	}
	if claimed {
		old = t.publishTakeover(k, v)
	} else {
		t.publish(k, v)
	}
	published = true
	return v, old, nil
}

// publish makes k's reservation the live entry of k with value v.
func (t *Table[T]) publish(k *key, v *T) {
	_, b := t.lockBucket(k.hash())
	e, _, _ := t.findLocked(b, k)
	if e == nil {
		b.unlock()
		panic("hash4: ConnectFunc's reservation lost")
	}
	e.val.Store(v)
	e.key.meta.Store(k.meta) // live to readers: N.B. after the value (entry's rule 5)
	b.unlock()
	t.counted(1)
}

// unreserve drops k's reservation.
func (t *Table[T]) unreserve(k *key) {
	_, b := t.lockBucket(k.hash())
	defer b.unlock()
	e, prev, i := t.findLocked(b, k)
	if e == nil {
		panic("hash4: ConnectFunc's reservation lost")
	}
	t.remove(b, e, prev, i, k)
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
