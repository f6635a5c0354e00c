package nat

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// The timing wheel: a flow is filed under the tick of its deadline, and
// Expire looks only at the slots of the ticks that have passed. A packet
// does not move its flow: it refreshes the flow's clock, and when the slot
// comes up the flow is expired if its deadline (last packet plus the
// timeout of its state) has passed, or filed again under it. So a busy
// flow costs one look per timeout, an idle one a look at its deadline, and
// a tick with nothing due costs the lock of an empty slot, however many
// flows there are; Linux's timer wheel and conntrack's lazy timeouts work
// alike. Deadlines past the wheel's span are filed at its far end and
// looked at again then.

// wheelSlots is the number of slots: the wheel spans wheelSlots ticks.
const wheelSlots = 4096

// timer files its flow in the wheel: a link in the list of the slot of one
// tick. It is part of the flow, so that filing allocates nothing and a flow
// that ends early (early drop, Flush, a RST) leaves the wheel at once: the
// wheel holds the live flows and no more, whatever the churn.
//
//  1. slot, due, prev and next change only under the lock of the slot the
//     timer is filed in (slot > 0), or is being filed in.
//  2. Whoever files or unfiles it holds mu, and files only a live flow;
//     deleteFlow makes the flow dead before it takes mu to unfile it, so
//     a flow is never left filed once it has ended.
//  3. Expire alone takes a timer off without mu (under its slot's lock,
//     to look at it), and takes mu before it files it again: with mu
//     held, slot changes only from a slot to 0. Only the one who took a
//     timer off files it again (unfile reports whether it did).
//  4. Expire stores next past a tick under that tick's slot lock, when it
//     finds nothing left due there: a flow filed under a tick is either
//     seen by Expire's last look at it or, seeing next past it, filed
//     later (file).
//
// Lock order: mu, then a slot's lock.
type timer struct {
	mu         sync.Mutex
	slot       atomic.Int32 // 1 + the index of the slot it is filed in; 0: none
	due        int64        // the tick it is filed under
	prev, next *flow
}

// Test hooks, nil but in tests: each stops a goroutine at a point where
// the order of the wheel's writes matters (invariants 3 and 4 above), so
// that a test can run another goroutine's step there (expire_test.go).
var (
	// hookReschedule: reschedule found f filed, before it takes it off.
	hookReschedule func(f *flow)
	// hookFile: file chose tick due for f, before it locks the slot.
	hookFile func(f *flow, due int64)
	// hookPassed: Expire is done with tick t and has let its slot go.
	hookPassed func(t int64)
)

// slot is one tick's list of flows, a doubly linked list so that a flow
// leaves it in O(1).
type slot struct {
	mu   sync.Mutex
	head *flow
}

// wheel is the timing wheel.
type wheel struct {
	tick  int64 // nanoseconds per tick
	slots [wheelSlots]slot
	mu    sync.Mutex   // one Expire at a time
	next  atomic.Int64 // the next tick to look at; no timer is filed before it (4)
	// picked is the flows Expire takes off a slot at a time.
	picked [64]*flow
}

func (w *wheel) init(tick time.Duration, now int64) {
	w.tick = int64(tick)
	w.next.Store(now / w.tick)
}

// schedule files f, just made live, under the tick of its
// deadline, rounded up, or the wheel's nearest or farthest tick. The
// nearest is a tick past next, which Expire may be looking at meanwhile
// (a timer filed under a tick already looked at would wait a revolution).
// Its timeout is read under f.t.mu: a TCP segment that shortened it
// before (whose reschedule found f not yet filed) is seen here.
func (n *NAT) schedule(f *flow) {
	f.t.mu.Lock()
	if f.state.Load() == stateLive {
		n.wheel.file(f, n.deadline(f), n.wheel.next.Load()+1)
	}
	f.t.mu.Unlock()
}

// file links f, not filed, into the slot of deadline's tick, nearest at
// the earliest; f.t.mu is held.
func (w *wheel) file(f *flow, deadline, nearest int64) {
	for {
		due := (deadline + w.tick - 1) / w.tick
		due = min(max(due, nearest), nearest+wheelSlots-2)
		i := int32(due % wheelSlots)
		s := &w.slots[i]
		if hookFile != nil {
			hookFile(f, due)
		}
		s.mu.Lock()
		if next := w.next.Load(); due < next {
			// Expire is past this tick for good (4), as it can be
			// when it catches up on many: a tick past the one it is
			// at, as schedule's nearest (filed under the tick Expire
			// is looking at, a flow due at once could keep it there).
			s.mu.Unlock()
			nearest = next + 1
			continue
		}
		f.t.due, f.t.prev, f.t.next = due, nil, s.head
		if s.head != nil {
			s.head.t.prev = f
		}
		s.head = f
		f.t.slot.Store(i + 1)
		s.mu.Unlock()
		return
	}
}

// unfile takes f out of the wheel if it is filed, and reports whether it
// did; f.t.mu is held.
func (w *wheel) unfile(f *flow) bool {
	for i := f.t.slot.Load(); i > 0; i = f.t.slot.Load() {
		s := &w.slots[i-1]
		s.mu.Lock()
		if f.t.slot.Load() == i { // else Expire took it off meanwhile (3)
			unlink(s, f)
			s.mu.Unlock()
			return true
		}
		s.mu.Unlock()
	}
	return false
}

// unlink takes f off slot s, whose lock is held.
func unlink(s *slot, f *flow) {
	if f.t.prev != nil {
		f.t.prev.t.next = f.t.next
	} else {
		s.head = f.t.next
	}
	if f.t.next != nil {
		f.t.next.t.prev = f.t.prev
	}
	f.t.prev, f.t.next = nil, nil
	f.t.slot.Store(0)
}

// Expire ends the flows whose timeout has passed at now, and sets the
// NAT's clock, by which packets refresh their flows, to now. It looks at
// the flows filed under the ticks up to now, at most Config.ExpireBudget of
// them (the rest wait for the next call), and returns how many flows it
// ended. Call it every Config.Tick (Run does), with a now that does not go
// back; calls are serialized.
func (n *NAT) Expire(now time.Time) int {
	ns := now.UnixNano()
	for c := n.clock.Load(); ns > c && !n.clock.CompareAndSwap(c, ns); c = n.clock.Load() {
		// Another Expire moved it meanwhile: never back.
	}
	w := &n.wheel
	w.mu.Lock()
	defer w.mu.Unlock()
	n.refillErrors(ns)
	n.expireFragments(ns)
	nowTick := ns / w.tick
	budget := n.cfg.ExpireBudget
	ended := 0
	// After a pause of more than the wheel's span, the last span's ticks
	// visit every slot: each flow filed is looked at, and a flow filed
	// meanwhile under a tick skipped either goes into a slot still to
	// come or, finding next past it, files again (4).
	for t := max(w.next.Load(), nowTick-wheelSlots+1); t <= nowTick; t++ {
		s := &w.slots[t%wheelSlots]
		for {
			// Take up to a handful of the slot's flows off it (every
			// flow in slot t is due at t: none is filed more than a
			// span past next), then look at each without its lock.
			s.mu.Lock()
			if budget == 0 {
				s.mu.Unlock()
				return ended // this tick again at the next call
			}
			k := 0
			for ; k < len(w.picked) && k < budget && s.head != nil; k++ {
				w.picked[k] = s.head
				unlink(s, s.head)
			}
			if k == 0 {
				w.next.Store(t + 1) // under the slot's lock (4)
				s.mu.Unlock()
				if hookPassed != nil {
					hookPassed(t)
				}
				break
			}
			s.mu.Unlock()
			budget -= k
			for i, f := range w.picked[:k] {
				w.picked[i] = nil
				ended += n.expireOne(f, ns, t+1)
			}
		}
	}
	return ended
}

// deadline returns when f may end: its timeout past its last packet, and
// a tick more, as its clock (the NAT's, set by Expire) may be up to a tick
// behind the packet: a flow never ends before its timeout (RFC 4787
// REQ-5's minimum is one).
func (n *NAT) deadline(f *flow) int64 {
	return f.last.Load() + int64(n.timeout(f)) + n.wheel.tick
}

// expireOne ends f, taken off its slot by Expire, if its deadline has
// passed at ns, or files it again under its deadline, from tick nearest on.
func (n *NAT) expireOne(f *flow, ns, nearest int64) int {
	f.t.mu.Lock()
	if f.state.Load() != stateLive {
		f.t.mu.Unlock()
		return 0 // ended meanwhile
	}
	deadline := n.deadline(f)
	if deadline > ns {
		n.wheel.file(f, deadline, nearest) // still in use
		f.t.mu.Unlock()
		return 0
	}
	f.t.mu.Unlock()
	if n.deleteFlow(f, ExpiredTimeout) {
		return 1
	}
	return 0
}

// reschedule files f again if its deadline moved earlier than where it is
// filed, as a TCP flow's does when it is reset or closed. A flow Expire
// has taken off its slot, even while this looks, is left to Expire, and
// one not yet filed to schedule: each reads its timeout under f.t.mu,
// after this one's change (3).
func (n *NAT) reschedule(f *flow) {
	w := &n.wheel
	deadline := n.deadline(f)
	f.t.mu.Lock()
	if f.t.slot.Load() > 0 && (deadline+w.tick-1)/w.tick < f.t.due {
		if hookReschedule != nil {
			hookReschedule(f)
		}
		if w.unfile(f) {
			w.file(f, deadline, w.next.Load()+1)
		}
	}
	f.t.mu.Unlock()
}

// Run calls Expire every Config.Tick until ctx is done.
func (n *NAT) Run(ctx context.Context) {
	t := time.NewTicker(n.cfg.Tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			n.Expire(now)
		}
	}
}

// Flush ends every flow, as if each had expired (counted as
// ExpiredFlush), and returns how many it ended.
func (n *NAT) Flush() int {
	ended := 0
	for p := range n.proto {
		for f := range n.proto[p].flows() {
			if n.deleteFlow(f, ExpiredFlush) {
				ended++
			}
		}
	}
	return ended
}
