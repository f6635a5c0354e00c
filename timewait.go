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
//   - A tuple's mark lives in the map of its stripe, changed under the
//     stripe's lock only; the stripe of a hash is the same in every array,
//     and moves (Grow, compaction, home slot refills) keep keys, so they
//     leave the marks alone.
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
//     no mark (timeWaits.n) and then the tuple is present: so that such a
//     tuple was taken (present and unmarked) at some moment of the two
//     loads, a mark is dropped, from n and from the index's reuse bits,
//     only after the change it goes with is visible to lock-free readers:
//     after a deleted entry is unlinked, after a takeover's new value is
//     stored. (A mark dropped before its entry is unlinked would let a
//     Connect that loaded the entry before and n after skip a tuple that
//     was reusable, then free, and fail with ErrNoPorts.) Indexed Connects
//     load the reuse bits before the used ones likewise.

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
// stripe; the first mark makes a map per stripe.
func (t *Table[T]) TimeWait(tup Tuple, since time.Time) bool {
	if validate(tup) != nil {
		return false
	}
	var k key
	t.tupleKey(&k, &tup)
	tw := t.timeWaits.Load()
	if tw == nil {
		if since.IsZero() {
			// N.B. lookup, not Connect's present: a present flow
			// whose entry moved under present's walk may be missed,
			// and this answer must be exact. A reservation is
			// matched by neither, as by the locked path below.
			_, ok := t.lookup(&k, false)
			return ok
		}
		tw = t.makeTimeWaits()
	}
	a, st, s, _ := t.lockStripe(uint32(k.meta>>32), lockOnly)
	defer st.mu.Unlock()
	_, l := t.findLocked(a, &k)
	if l.isNulls() || t.nodes.at(l.index()).reserved() {
		return false
	}
	ms := &tw.stripes[s]
	m, had := ms.marks[k]
	switch {
	case !since.IsZero():
		if ms.marks == nil {
			ms.marks = make(map[key]timeWaitMark)
		}
		m.since = since
		ms.marks[k] = m
		if !had {
			tw.n.Add(1)
		}
	case !had:
		return true
	case m.claimed: // the claim's end drops the mark (unclaim)
		m.since = time.Time{}
		ms.marks[k] = m
	default:
		tw.drop(ms, &k)
	}
	if !m.claimed {
		t.noteReuse(&k, !since.IsZero())
	}
	return true
}

// timeWaits are a table's TIME_WAIT marks, made at the first mark.
type timeWaits struct {
	stripes []timeWaitStripe // by lock stripe, each under its lock
	n       atomic.Int64     // marks, for Connect's lock-free pre-check
}

// timeWaitStripe holds the marks of the tuples of one lock stripe.
type timeWaitStripe struct {
	marks map[key]timeWaitMark
	_     [cacheLineSize - ptrSize]byte // N.B. stripes lock apart
}

// timeWaitMark is a tuple's TIME_WAIT mark: since when, and whether a
// ConnectFunc that took the tuple over holds it (since is zero if the mark
// was cleared meanwhile).
type timeWaitMark struct {
	since   time.Time
	claimed bool
}

// drop removes k's mark from ms, the marks of k's stripe.
func (tw *timeWaits) drop(ms *timeWaitStripe, k *key) {
	delete(ms.marks, *k)
	tw.n.Add(-1)
}

// timeWaitMu serializes the making of tables' timeWaits: it happens once
// per table, so one lock serves all of them.
var timeWaitMu sync.Mutex

// makeTimeWaits publishes the table's timeWaits, unless it has them.
func (t *Table[T]) makeTimeWaits() *timeWaits {
	timeWaitMu.Lock()
	defer timeWaitMu.Unlock()
	if tw := t.timeWaits.Load(); tw != nil {
		return tw
	}
	tw := &timeWaits{stripes: make([]timeWaitStripe, len(t.array().b.stripes))}
	t.timeWaits.Store(tw)
	return tw
}

// reusable reports whether a Connect with policy allow may take over the
// live entry e, of tuple tup and key k in stripe s, and returns its mark's
// stripe. The caller holds the stripe's lock.
func (t *Table[T]) reusable(e *entry[T], k *key, s uint32, tup Tuple, allow ReusePolicy) (*timeWaitStripe, bool) {
	tw := t.timeWaits.Load()
	if tw == nil || e.reserved() {
		return nil, false
	}
	ms := &tw.stripes[s]
	m, ok := ms.marks[*k]
	if !ok || m.claimed || !allow(tup, m.since) {
		return nil, false
	}
	return ms, true
}

// takeOver is insert for a Connect with policy allow: if k is present,
// marked and allowed, it replaces its value with v, drops its mark and
// returns the old value with insertTakenOver.
func (t *Table[T]) takeOver(k *key, v *T, tup Tuple, allow ReusePolicy) (*T, insertResult) {
	a, st, s, b := t.lockStripe(uint32(k.meta>>32), lockToInsert)
	_, l := t.findLocked(a, k)
	if l.isNulls() {
		n, res := t.add(a, st, s, b, k, v)
		st.mu.Unlock()
		t.grown(a, s, n)
		return nil, res
	}
	defer st.mu.Unlock()
	e := t.nodes.at(l.index())
	ms, ok := t.reusable(e, k, s, tup, allow)
	if !ok {
		return nil, insertExists
	}
	old := e.val.Load()
	// N.B. seq stays odd, as in CompareAndSwap: a Lookup finds old or v.
	e.val.Store(v)
	// N.B. the mark goes once v is in (see the invariants).
	t.timeWaits.Load().drop(ms, k)
	t.noteReuse(k, false)
	return old, insertTakenOver
}

// claim is reserve for a ConnectFunc with policy allow: if k is present,
// marked and allowed, it claims the tuple (see the invariants above) and
// returns insertTakenOver; the entry keeps its value until settle publishes the new one.
func (t *Table[T]) claim(k *key, tup Tuple, allow ReusePolicy) insertResult {
	a, st, s, b := t.lockStripe(uint32(k.meta>>32), lockToInsert)
	defer st.mu.Unlock()
	_, l := t.findLocked(a, k)
	if l.isNulls() {
		return t.reserveLocked(a, st, s, b, k)
	}
	ms, ok := t.reusable(t.nodes.at(l.index()), k, s, tup, allow)
	if !ok {
		return insertExists
	}
	m := ms.marks[*k]
	m.claimed = true
	ms.marks[*k] = m
	t.noteReuse(k, false)
	return insertTakenOver
}

// publishTakeover makes v the value of the entry of k, which a claim
// holds, drops its mark and returns the value it replaced: nil if a delete
// made the entry a reservation meanwhile, which it publishes.
func (t *Table[T]) publishTakeover(k *key, v *T) (old *T) {
	a, st, s, _ := t.lockStripe(uint32(k.meta>>32), lockOnly)
	_, l := t.findLocked(a, k)
	e := t.nodes.at(l.index()) // N.B. the claim keeps the tuple: l is not nulls
	tw := t.timeWaits.Load()
	if e.reserved() {
		tw.drop(&tw.stripes[s], k)
		st.mu.Unlock()
		t.publish(k, v)
		return nil
	}
	old = e.val.Load()
	e.val.Store(v) // N.B. seq stays odd, as in CompareAndSwap
	// N.B. the mark goes once v is in (see the invariants).
	tw.drop(&tw.stripes[s], k)
	st.mu.Unlock()
	return old
}

// unclaim ends the claim of k: the flow stays marked, unless its mark was
// cleared meanwhile; a reservation that a delete left is dropped.
func (t *Table[T]) unclaim(k *key) {
	a, st, s, _ := t.lockStripe(uint32(k.meta>>32), lockOnly)
	tw := t.timeWaits.Load()
	ms := &tw.stripes[s]
	m := ms.marks[*k]
	_, l := t.findLocked(a, k)
	if t.nodes.at(l.index()).reserved() {
		tw.drop(ms, k)
		st.mu.Unlock()
		t.unreserve(k)
		return
	}
	defer st.mu.Unlock()
	if m.since.IsZero() {
		tw.drop(ms, k)
		return
	}
	m.claimed = false
	ms.marks[*k] = m
	t.noteReuse(k, true)
}

// forgetTimeWait is remove's part for the marks: if e, a live entry of
// stripe s about to be removed, is marked, it returns the stripe of its
// mark, with its key in *k, for remove to drop once e is unlinked (see the
// invariants); if a claim holds the mark, it makes e a reservation in
// place, with the stripe's count as a remove leaves it, and returns its
// value and held = true for the remove to return. The caller holds the
// stripe's lock.
func (t *Table[T]) forgetTimeWait(tw *timeWaits, st *stripe, s uint32, e *entry[T], k *key) (ms *timeWaitStripe, v *T, held bool) {
	ms = &tw.stripes[s]
	if len(ms.marks) == 0 {
		return nil, nil, false
	}
	*k = e.key.load()
	m, ok := ms.marks[*k]
	if !ok {
		return nil, nil, false
	}
	if !m.claimed {
		return ms, nil, false
	}
	// N.B. as a recycling: seq even (readers restart), the reservation's
	// key and nil value, then odd again; the chain is the same, and so
	// are the bind table's count and the index's used bit.
	seq := e.seq.Load()
	e.seq.Store(seq + 1)
	e.key.meta.Store(k.meta &^ lportMask)
	v = e.val.Load()
	e.val.Store(nil)
	e.seq.Store(seq + 2)
	st.count.Store(st.count.Load() - 1)
	return nil, v, true
}

// dropRemoved drops the mark of a removed entry, of key k, from ms (see
// forgetTimeWait).
func (t *Table[T]) dropRemoved(ms *timeWaitStripe, k *key) {
	t.timeWaits.Load().drop(ms, k)
	t.noteReuse(k, false)
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
