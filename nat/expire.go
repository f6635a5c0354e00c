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
// a tick with nothing due costs the load of an empty slot, however many
// flows there are; Linux's timer wheel and conntrack's lazy timeouts work
// alike. Deadlines past the wheel's span are filed at its far end and
// looked at again then.

// wheelSlots is the number of slots: the wheel spans wheelSlots ticks.
const wheelSlots = 4096

// timer files a flow in the wheel; a flow has one, and gets another when
// its deadline moves earlier than where it is filed, as a RST's does.
type timer struct {
	f    atomic.Pointer[flow] // nil once the flow ended
	next *timer
	due  atomic.Int64 // the tick it is filed under
}

// wheel is the timing wheel. Goroutines making flows push timers onto a
// slot's list with a CompareAndSwap; Expire, one call at a time (mu), takes
// a slot's list whole with a Swap.
type wheel struct {
	tick  int64 // nanoseconds per tick
	slots [wheelSlots]atomic.Pointer[timer]
	mu    sync.Mutex
	next  atomic.Int64 // the next tick to look at; every timer is filed at or after it
}

func (w *wheel) init(tick time.Duration, now int64) {
	w.tick = int64(tick)
	w.next.Store(now / w.tick)
}

// schedule files t, for flow f, under the tick of deadline (unix
// nanoseconds), rounded up, or the wheel's nearest or farthest tick. The
// nearest is a tick past next, which Expire may be looking at meanwhile
// (a timer filed under a tick already looked at would wait a revolution).
func (w *wheel) schedule(t *timer, f *flow, deadline int64) {
	w.scheduleFrom(t, f, deadline, w.next.Load()+1)
}

// scheduleFrom is schedule with the nearest tick given: Expire, which
// knows which tick it is at, files flows again from the next one.
func (w *wheel) scheduleFrom(t *timer, f *flow, deadline, nearest int64) {
	due := (deadline + w.tick - 1) / w.tick
	due = max(due, nearest)
	due = min(due, nearest+wheelSlots-2)
	t.f.Store(f)
	t.due.Store(due)
	s := &w.slots[due%wheelSlots]
	for {
		head := s.Load()
		t.next = head
		if s.CompareAndSwap(head, t) {
			return
		}
	}
}

// Expire ends the flows whose timeout has passed at now, and sets the
// NAT's clock, by which packets refresh their flows, to now. It looks at
// the flows filed under the ticks up to now, at most Config.ExpireBudget of
// them (the rest wait for the next call), and returns how many flows it
// ended. Call it every Config.Tick (Run does), with a now that does not go
// back; calls are serialized.
func (n *NAT) Expire(now time.Time) int {
	ns := now.UnixNano()
	if ns > n.clock.Load() {
		n.clock.Store(ns)
	}
	n.errBudget.Store(n.errorsPerTick())
	w := &n.wheel
	w.mu.Lock()
	defer w.mu.Unlock()
	n.expireFragments(ns)
	nowTick := ns / w.tick
	budget := n.cfg.ExpireBudget
	ended := 0
	for t := w.next.Load(); t <= nowTick; t++ {
		s := &w.slots[t%wheelSlots]
		list := s.Swap(nil)
		for list != nil {
			if budget == 0 {
				// Put the rest back and come back to this tick.
				for list != nil {
					tm := list
					list = list.next
					w.refile(s, tm)
				}
				return ended
			}
			budget--
			tm := list
			list = list.next
			if tm.due.Load() > t {
				w.refile(s, tm) // filed a revolution ahead
				continue
			}
			f := tm.f.Load()
			if f == nil || f.state.Load() != stateLive {
				continue // ended otherwise, or a spare timer of an ended flow
			}
			deadline := f.last.Load() + int64(n.timeout(f))
			if deadline <= ns {
				if n.deleteFlow(f, ExpiredTimeout) {
					ended++
				}
				continue
			}
			// Still in use: file it again under its deadline.
			w.scheduleFrom(tm, f, deadline, t+1)
		}
		w.next.Store(t + 1)
	}
	return ended
}

// refile pushes tm back onto slot s.
func (w *wheel) refile(s *atomic.Pointer[timer], tm *timer) {
	for {
		head := s.Load()
		tm.next = head
		if s.CompareAndSwap(head, tm) {
			return
		}
	}
}

// reschedule files f again if its deadline moved earlier than where its
// timer is, as a TCP flow's does when it is reset or closed.
func (n *NAT) reschedule(f *flow) {
	deadline := f.last.Load() + int64(n.timeout(f))
	if (deadline+n.wheel.tick-1)/n.wheel.tick < f.timer.due.Load() {
		x := &timer{}
		f.extra.Store(x)
		n.wheel.schedule(x, f, deadline)
	}
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
		for _, f := range n.proto[p].fwd.All() {
			if n.deleteFlow(f, ExpiredFlush) {
				ended++
			}
		}
	}
	return ended
}
