package hash4

import "sync/atomic"

// Metrics are a table's counters, cheap enough to read on every scrape
// (publish them with expvar or a metrics library): Metrics reads a cache
// line per processor and walks no chain, unlike Stats.
type Metrics struct {
	Entries int    // as Len
	Buckets int    // the bucket count: it doubles at each growth
	Growths uint64 // the growths, by Grow or by the table itself
	// LookupRestarts counts bucket walks started again (see Stats).
	LookupRestarts uint64
	// Connects counts the Connect and ConnectFunc calls past their input
	// checks; ConnectCandidates the ports they tried, ConnectRefused
	// the ports ConnectFunc's functions refused (ErrPortRefused), and
	// ConnectNoPorts the calls that ended with ErrNoPorts.
	Connects, ConnectCandidates, ConnectRefused, ConnectNoPorts uint64
}

// Metrics returns the table's counters. Each is exact on its own, but they
// are read one after another while writers go on, not as a snapshot.
func (t *Table[T]) Metrics() Metrics {
	a := t.array()
	m := Metrics{Entries: int(t.count()), Buckets: len(a.lines), Growths: t.growths.Load(), LookupRestarts: t.restarts.Load()}
	if c := t.clients(); c != nil {
		for i := range c.connect {
			r := &c.connect[i]
			m.Connects += r.connects.Load()
			m.ConnectCandidates += r.candidates.Load()
			m.ConnectRefused += r.refused.Load()
			m.ConnectNoPorts += r.noPorts.Load()
		}
	}
	return m
}

// connectRun holds the counters of Metrics that connects update, one per
// processor (P), each on a cache line of its own, so that connects on
// different cores do not write one line.
type connectRun struct {
	connects, candidates, refused, noPorts atomic.Uint64
	_                                      [cacheLineSize - 4*8]byte
}

// connected counts a connect that tried *tried ports, of which ConnectFunc's
// function refused *refused, and ended with ErrNoPorts if *noPorts;
// deferred by connectFlow, it reads them when the connect returns.
func (c *clients[T]) connected(tried, refused *uint64, noPorts *bool) {
	r := &c.connect[procID()&uint32(len(c.connect)-1)]
	r.connects.Add(1)
	r.candidates.Add(*tried)
	if *refused > 0 {
		r.refused.Add(*refused)
	}
	if *noPorts {
		r.noPorts.Add(1)
	}
}
