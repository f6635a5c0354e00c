package hash4

import (
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// This file holds TIME_WAIT reuse: flows the caller marks as in TIME_WAIT
// (Table.TimeWait) stay in the table, and a Connect given a ReusePolicy
// may take one's tuple over, as Linux's connect() takes over a TIME_WAIT
// socket when tcp_twsk_unique allows it (__inet_check_established).
//
// Invariants:
//
//   - A tuple's mark is changed under its bucket's lock only (and a shard
//     lock of the marks' own, taken under it); moves (growth, compaction,
//     promotion) keep keys, so they leave the marks alone.
//   - A mark is of a live entry, or of a claim: a ConnectFunc taking the
//     tuple over holds it while its function runs. The entry stays live
//     meanwhile, so Lookup finds the old value until the new is published;
//     a delete of a claimed entry makes it a reservation (see entry) in
//     place, so that the tuple stays held, as the ConnectFunc's own would.
//   - The reuse bit of an occupancy index (index.go) is set while the
//     tuple is marked and not claimed, under the same rules as its used
//     bit: so once writers quiesce an indexed Connect sees the marks a scan
//     would.
//   - A Connect's scan skips a candidate without its lock if the table has
//     no mark (timeWaitSet.n) and then the tuple is present: so that such a
//     tuple was taken (present and unmarked) at some moment of the two
//     loads, a mark is dropped, from n and from the index's reuse bits,
//     only once the change it goes with is visible to lock-free readers:
//     a deleted entry unlinked, a takeover's new value stored. Indexed
//     Connects load the reuse bits before the used ones likewise.

// ReusePolicy reports whether a Connect may take over the flow tup, in
// TIME_WAIT since since (see [Table.TimeWait]). It is called under a
// writer lock: it must be quick and must not call the table.
type ReusePolicy func(tup Tuple, since time.Time) bool

// TCPTimeWaitReuse returns the rule by which Linux's connect() takes over
// a TIME_WAIT socket for an ephemeral port (tcp_twsk_unique, under the
// sysctl net.ipv4.tcp_tw_reuse): the flow must have been in TIME_WAIT for
// more than delay (net.ipv4.tcp_tw_reuse_delay, 1s by default) and, with
// loopbackOnly (tcp_tw_reuse = 2, Linux's default), one of its addresses
// must be a loopback address. Linux also requires that the old connection
// used TCP timestamps, which keep its segments out of the new one: mark
// only such flows. It panics for a negative delay.
func TCPTimeWaitReuse(loopbackOnly bool, delay time.Duration) ReusePolicy {
	if delay < 0 {
		panic(fmt.Sprintf("hash4: TCPTimeWaitReuse: negative delay %v", delay))
	}
	return func(tup Tuple, since time.Time) bool {
		if loopbackOnly && !tup.Local.Addr().IsLoopback() && !tup.Remote.Addr().IsLoopback() {
			return false
		}
		return time.Since(since) > delay
	}
}

// WithTimeWaitReuse lets a Connect or ConnectFunc take over a flow in
// TIME_WAIT that allow allows, as a free port, in the scan's order: the
// flow's value is replaced by the new one in place, so a concurrent Lookup
// finds the old value or the new, never neither, and the old value is
// stored in *old (nil if the port was free). old may be nil; its type must
// be the table's: WithTimeWaitReuse[T](allow, nil).
func WithTimeWaitReuse[T any](allow ReusePolicy, old **T) ConnectOption {
	return func(c *connectConfig) { c.reuse, c.reuseOld = allow, old }
}

// TimeWait marks the flow tup as in TIME_WAIT since since, or clears its
// mark for the zero time, and reports whether tup is present. A marked flow
// stays in the table as any other, until it is deleted or a Connect given
// [WithTimeWaitReuse] takes its tuple over. It costs a lock of tup's
// bucket; the first mark attaches the marks to the table.
func (t *Table[T]) TimeWait(tup Tuple, since time.Time) bool {
	if validate(tup) != nil {
		t.array() // a nil or zero Table panics here, named
		return false
	}
	var k key
	t.tupleKey(&k, &tup)
	c := t.clients()
	if c == nil || !c.marks.made() {
		if since.IsZero() {
			// N.B. lookup, not Connect's present: a present flow
			// whose entry moves under present's walk may be missed,
			// and this answer must be exact. A reservation is
			// matched by neither, as by the locked path below.
			_, ok := t.lookup(&k)
			return ok
		}
		c = t.attach()
		c.marks.make()
	}
	_, b := t.lockBucket(k.hash())
	defer b.unlock()
	if e, _, _ := t.findLocked(b, &k); e == nil || e.reserved() {
		return false
	}
	m, had := c.marks.get(&k)
	switch {
	case !since.IsZero():
		m.since = since
		c.marks.set(&k, m, !had)
	case !had:
		return true
	case m.claimed: // the claim's end drops the mark (unclaim)
		m.since = time.Time{}
		c.marks.set(&k, m, false)
	default:
		c.marks.drop(&k)
	}
	if !m.claimed {
		c.indexes.noteReuse(&k, !since.IsZero())
	}
	return true
}

// timeWaitSet is a table's TIME_WAIT marks, in shards by hash, each under a
// lock of its own taken under the bucket lock of the tuples it holds.
type timeWaitSet struct {
	shards atomic.Pointer[[timeWaitShards]timeWaitShard] // nil until the first mark
	n      atomic.Int64                                  // marks, for Connect's lock-free pre-check
}

// timeWaitShards is the number of the marks' shards.
const timeWaitShards = 64

// timeWaitShard holds the marks of the tuples whose hash is its index
// modulo timeWaitShards.
type timeWaitShard struct {
	mu    sync.Mutex
	marks map[key]timeWaitMark
	_     [cacheLineSize - 8 - ptrSize]byte // N.B. shards lock apart
}

// timeWaitMark is a tuple's TIME_WAIT mark: since when, and whether a
// ConnectFunc that took the tuple over holds it (since is zero if the mark
// was cleared meanwhile).
type timeWaitMark struct {
	since   time.Time
	claimed bool
}

// made reports whether the set has its shards.
func (s *timeWaitSet) made() bool { return s.shards.Load() != nil }

// make gives the set its shards, unless it has them. The caller holds
// attachMu or has attached the clients.
func (s *timeWaitSet) make() {
	attachMu.Lock()
	defer attachMu.Unlock()
	if s.shards.Load() == nil {
		s.shards.Store(new([timeWaitShards]timeWaitShard))
	}
}

// shard returns the locked shard of k, or nil if the set has none.
func (s *timeWaitSet) shard(k *key) *timeWaitShard {
	ss := s.shards.Load()
	if ss == nil {
		return nil
	}
	sh := &ss[k.hash()%timeWaitShards]
	sh.mu.Lock()
	return sh
}

// get returns k's mark and whether k has one.
func (s *timeWaitSet) get(k *key) (timeWaitMark, bool) {
	sh := s.shard(k)
	if sh == nil {
		return timeWaitMark{}, false
	}
	defer sh.mu.Unlock()
	m, ok := sh.marks[*k]
	return m, ok
}

// set sets k's mark, counting it if it is new. The set has its shards.
func (s *timeWaitSet) set(k *key, m timeWaitMark, isNew bool) {
	sh := s.shard(k)
	if sh.marks == nil {
		sh.marks = make(map[key]timeWaitMark)
	}
	sh.marks[*k] = m
	sh.mu.Unlock()
	if isNew {
		s.n.Add(1)
	}
}

// drop removes k's mark and reports whether it had one.
func (s *timeWaitSet) drop(k *key) bool {
	if s.n.Load() == 0 {
		return false
	}
	sh := s.shard(k)
	if sh == nil {
		return false
	}
	_, ok := sh.marks[*k]
	delete(sh.marks, *k)
	sh.mu.Unlock()
	if ok {
		s.n.Add(-1)
	}
	return ok
}

// claimed reports whether k is marked and claimed by a ConnectFunc.
func (s *timeWaitSet) claimed(k *key) bool {
	if s.n.Load() == 0 {
		return false
	}
	m, ok := s.get(k)
	return ok && m.claimed
}

// reusable reports whether k is marked and not claimed.
func (s *timeWaitSet) reusable(k *key) bool {
	if s.n.Load() == 0 {
		return false
	}
	m, ok := s.get(k)
	return ok && !m.claimed
}

// reusable reports whether a Connect with policy allow may take over the
// live entry e, of tuple tup and key k. The caller holds k's bucket lock.
func (c *clients[T]) reusable(e *entry[T], k *key, tup Tuple, allow ReusePolicy) bool {
	if e.reserved() {
		return false
	}
	m, ok := c.marks.get(k)
	return ok && !m.claimed && allow(tup, m.since)
}

// takeOver is insert for a Connect with policy allow: if k is present,
// marked and allowed, it replaces its value with v, drops its mark and
// returns the old value with insertTakenOver.
func (t *Table[T]) takeOver(k *key, v *T, tup Tuple, allow ReusePolicy) (*T, insertResult) {
	c := t.attach()
	_, b := t.lockBucket(k.hash())
	e, _, _ := t.findLocked(b, k)
	if e == nil {
		res := t.add(b, k, v)
		b.unlock()
		if res == inserted {
			t.counted(1)
		}
		return nil, res
	}
	defer b.unlock()
	if !c.reusable(e, k, tup, allow) {
		return nil, insertExists
	}
	old := e.val.Load()
	// N.B. seq stays live, as in CompareAndSwap: a Lookup finds old or v.
	e.val.Store(v)
	// N.B. the mark goes once v is in (see the invariants).
	c.marks.drop(k)
	c.indexes.noteReuse(k, false)
	return old, insertTakenOver
}

// claim is reserve for a ConnectFunc with policy allow: if k is present,
// marked and allowed, it claims the tuple (see the invariants above) and
// returns insertTakenOver; the entry keeps its value until settle
// publishes the new one.
func (t *Table[T]) claim(k *key, tup Tuple, allow ReusePolicy) insertResult {
	c := t.attach()
	_, b := t.lockBucket(k.hash())
	defer b.unlock()
	e, _, _ := t.findLocked(b, k)
	if e == nil {
		return t.add(b, k, nil)
	}
	if !c.reusable(e, k, tup, allow) {
		return insertExists
	}
	m, _ := c.marks.get(k)
	m.claimed = true
	c.marks.set(k, m, false)
	c.indexes.noteReuse(k, false)
	return insertTakenOver
}

// publishTakeover makes v the value of the entry of k, which a claim
// holds, drops its mark and returns the value it replaced: nil if a delete
// made the entry a reservation meanwhile, which it publishes.
func (t *Table[T]) publishTakeover(k *key, v *T) (old *T) {
	c := t.attach()
	_, b := t.lockBucket(k.hash())
	e, _, _ := t.findLocked(b, k) // N.B. the claim keeps the tuple: e is not nil
	if e.reserved() {
		c.marks.drop(k)
		b.unlock()
		t.publish(k, v)
		return nil
	}
	old = e.val.Load()
	e.val.Store(v) // N.B. seq stays live, as in CompareAndSwap
	// N.B. the mark goes once v is in (see the invariants).
	c.marks.drop(k)
	b.unlock()
	return old
}

// unclaim ends the claim of k: the flow stays marked, unless its mark was
// cleared meanwhile; a reservation that a delete left is dropped.
func (t *Table[T]) unclaim(k *key) {
	c := t.attach()
	_, b := t.lockBucket(k.hash())
	m, _ := c.marks.get(k)
	if e, _, _ := t.findLocked(b, k); e.reserved() {
		c.marks.drop(k)
		b.unlock()
		t.unreserve(k)
		return
	}
	defer b.unlock()
	if m.since.IsZero() {
		c.marks.drop(k)
		return
	}
	m.claimed = false
	c.marks.set(k, m, false)
	c.indexes.noteReuse(k, true)
}

// reuseOut returns the *T of cc's WithTimeWaitReuse, or an error if its
// type is not the table's.
func reuseOut[T any](cc *connectConfig, remote netip.AddrPort) (**T, error) {
	if cc.reuseOld == nil {
		return nil, nil
	}
	out, ok := cc.reuseOld.(**T)
	if !ok {
		var want **T
		return nil, fmt.Errorf("hash4: connect to %v: WithTimeWaitReuse's old is a %T, not the table's %T", remote, cc.reuseOld, want)
	}
	return out, nil
}
