package hash4

import "sync"

// This file holds what attaches to a Table beyond the hash table itself, as
// its watcher (write.go's tupleWatcher): the bind table of the allocator it
// was made with (portuse.go), Connect's occupancy indexes (index.go) and
// counters (metrics.go), and the TIME_WAIT marks (timewait.go). A table that
// uses none of them has none, and its writes pay a load and a branch.

// clients is a table's watcher: every client's state, and the glue that
// tells each of the tuples its writers add and remove.
type clients[T any] struct {
	t *Table[T]
	// alloc is the allocator whose bind table counts the table's flows
	// (WithPortAllocator), or nil; set before the table is shared.
	alloc   *PortAllocator
	indexes indexSet     // Connect's occupancy indexes
	marks   timeWaitSet  // TIME_WAIT marks
	connect []connectRun // Connect's counters, per P (metrics.go)
}

// attachMu serializes the attaching of tables' clients: it happens once per
// table, so one lock serves all of them.
var attachMu sync.Mutex

// attach returns the table's clients, attaching them first if the table has
// none.
//
// N.B. a writer loads the watcher under its bucket lock; a client that reads
// the table does so under bucket locks after it attached (index.go's
// buildIndex), so of a writer and that read one sees the other.
func (t *Table[T]) attach() *clients[T] {
	if c := t.clients(); c != nil {
		return c
	}
	attachMu.Lock()
	defer attachMu.Unlock()
	if c := t.clients(); c != nil {
		return c
	}
	c := &clients[T]{t: t, connect: make([]connectRun, len(t.shards))}
	t.watch.Store(&watchSlot{c})
	return c
}

// clients returns the table's clients, or nil.
func (t *Table[T]) clients() *clients[T] {
	if w := t.watch.Load(); w != nil {
		return w.tupleWatcher.(*clients[T])
	}
	return nil
}

// added counts k in the bind table and the index of its destination. The
// caller holds k's bucket lock.
func (c *clients[T]) added(k key) {
	if c.alloc != nil {
		c.alloc.use(&k.local, k.port())
	}
	c.indexes.note(&k, k.port(), true)
}

// removing is the marks' say first: a tuple a ConnectFunc took over stays
// held, as a reservation, and keeps its counts; any other leaves the bind
// table and its index. The caller holds k's bucket lock.
func (c *clients[T]) removing(k key) (hold bool) {
	if c.marks.claimed(&k) {
		return true
	}
	if c.alloc != nil {
		c.alloc.unuse(&k.local, k.port())
	}
	c.indexes.note(&k, k.port(), false)
	return false
}

// removed drops k's mark, once k is out of its chain (timewait.go's
// invariants). The caller holds k's bucket lock.
func (c *clients[T]) removed(k key) {
	if c.marks.drop(&k) {
		c.indexes.noteReuse(&k, false)
	}
}

// PortAllocator returns the allocator the table was made with
// ([WithPortAllocator]), or nil.
func (t *Table[T]) PortAllocator() *PortAllocator {
	t.array() // a nil or zero Table panics here, named
	if c := t.clients(); c != nil {
		return c.alloc
	}
	return nil
}
