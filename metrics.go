package hash4

import "sync/atomic"

// Metrics are a table's counters, cheap enough to read on every scrape
// (publish them with expvar or a metrics library): Metrics reads one cache
// line per lock stripe and walks no chain, unlike Stats.
type Metrics struct {
	Entries int    // as Len
	Buckets int    // the bucket count: it goes up at each growth
	Growths uint64 // the growths, by Grow or by the table itself
	// LookupRestarts counts chain walks started again (see Stats).
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
	m := Metrics{Entries: t.Len(), Buckets: len(a.b.heads), Growths: t.growths.Load(), LookupRestarts: t.restarts.Load()}
	for i := range t.metrics {
		s := &t.metrics[i]
		m.Connects += s.connects.Load()
		m.ConnectCandidates += s.candidates.Load()
		m.ConnectRefused += s.refused.Load()
		m.ConnectNoPorts += s.noPorts.Load()
	}
	return m
}

// stripeMetrics are the counters of Metrics that connects update, kept per
// lock stripe, each stripe's on a cache line of its own, so that connects
// on different cores rarely write one line.
type stripeMetrics struct {
	connects, candidates, refused, noPorts atomic.Uint64
	_                                      [cacheLineSize - 4*8]byte
}

// connected counts a connect that tried *tried ports, of which ConnectFunc's
// function refused *refused, and ended with ErrNoPorts if *noPorts;
// deferred by connectFlow, it reads them when the connect returns.
func (m *stripeMetrics) connected(tried, refused *uint64, noPorts *bool) {
	m.connects.Add(1)
	m.candidates.Add(*tried)
	if *refused > 0 {
		m.refused.Add(*refused)
	}
	if *noPorts {
		m.noPorts.Add(1)
	}
}
