package hash4

import (
	"fmt"
	"math"
	"math/bits"
	"sync/atomic"
)

// growLimit returns the growAt of an array of n buckets under s stripes,
// or never in a table made WithFixedBuckets or of the most buckets it may
// have: twice the buckets of a stripe, m, plus the spread of the fullest of
// s stripes when the table holds two entries per bucket, about
// sqrt(2 ln s) standard deviations of a stripe's count (sqrt(m) for random
// flows), so that the first stripe to pass its limit does so when the table
// passes about two entries per bucket, whether its stripes cover few
// buckets or many. (With the limit at m, a table of 1024 buckets under 64
// stripes grew at 1.2 to 1.3 entries per bucket.)
func (t *Table[T]) growLimit(n, s int) uint64 {
	if t.fixed || n >= t.bucketLimit {
		return math.MaxUint64
	}
	m := float64(2 * n / s)
	return uint64(m + math.Sqrt(2*math.Log(float64(s))*m))
}

// initGrowth sets the growth trigger of a, a new array of the table.
func (t *Table[T]) initGrowth(a *tableArray[T]) {
	a.growAt = t.growLimit(len(a.b.heads), len(a.b.stripes))
	a.checkAt = make([]atomic.Uint64, len(a.b.stripes))
}

// overLimit is called by an insert that left stripe s of a holding n
// entries, more than a's growAt: unless a check of the table decided not
// to grow for s at this count (see postpone), it starts the table's
// growth, which checks the table and grows it if that helps (growBehind),
// unless a growth runs already.
//
// N.B. the growth's decision is on the table as a whole, not the stripe:
// a stripe's keys share the stripe's bits of their hashes in every array,
// so keys chosen for one stripe (with the secret known) stay in one stripe
// whatever the bucket count. Growing for such a stripe alone would double
// the table until its limit passed the stripe's count: 200,000 such keys
// grew a default table to 2^23 buckets, 2.6 KB per entry.
//
// N.B. growing is loaded after the insert's unlock, an atomic
// read-modify-write that orders the count's store before the load on every
// target, as growBehind stores growing before it reads the counts: of the
// two, one sees the other, so a stripe left due (see overfull) is checked.
// An insert that finds growing set returns unchecked, though the running
// check may have counted before it: growBehind tests every trigger again
// (overfull) after each check and after it clears growing, so the insert
// is checked for if it left its stripe past the trigger the check set;
// hence postpone takes that trigger from the counts the check decided on.
func (t *Table[T]) overLimit(a *tableArray[T], s uint32, n uint64) {
	if n <= a.checkAt[s].Load() || t.growing.Load() || !t.growing.CompareAndSwap(false, true) {
		return
	}
	t.growers.Add(1)
	go func() {
		defer t.growers.Done()
		t.growBehind()
	}()
}

// growBehind checks the table, and grows it (growTarget) while that helps,
// until no stripe is due (see overfull), on a goroutine of its own that an
// insert started (see overLimit), as rhashtable's inserts leave its growth
// to a deferred worker (rht_deferred_worker): the insert returns at once,
// and writers move the stripes they come to meanwhile, as in any Grow.
// Where growing does not help, it raises the due stripes' triggers
// instead (postpone). If the node store cannot index a new array
// (ErrTableFull), growing stays set: the table grows no more by itself.
func (t *Table[T]) growBehind() {
	t.growMu.Lock()
	defer t.growMu.Unlock()
	// The stripes' counts at the last check: every array has the table's
	// stripes (see grow).
	counted := make([]uint64, len(t.arr.Load().b.stripes))
	for {
		for a := t.arr.Load(); a.overfull(); a = t.arr.Load() {
			most, total := a.counts(counted)
			n := t.growTarget(a, most, total)
			if h := t.hooks; h != nil && h.checked != nil {
				h.checked(n > 0)
			}
			if n > 0 {
				if t.grow(n) != nil {
					return
				}
				continue
			}
			t.postpone(a, counted, total)
		}
		t.growing.Store(false)
		// N.B. an insert that found growing set before the store above
		// left its count where the check below sees it (see overLimit).
		if !t.arr.Load().overfull() || !t.growing.CompareAndSwap(false, true) {
			return
		}
	}
}

// counts returns the entries of a's fullest stripe, and of all stripes,
// and leaves each stripe's in counted.
func (a *tableArray[T]) counts(counted []uint64) (most, total uint64) {
	for i := range a.b.stripes {
		c := a.b.stripes[i].count.Load()
		counted[i] = c
		most = max(most, c)
		total += c
	}
	return most, total
}

// growTarget returns the bucket count that a, which has a due stripe,
// grows to, or 0 if growing does not help: the least power of two, from
// twice a's, at which no stripe holds more entries than its limit (most is
// the fullest stripe's count), but not beyond the table's bucket limit,
// and doubled only while the table holds more entries (total) than
// buckets. So a table grows itself only past one entry per bucket, to at
// most twice as many buckets as entries, however its keys fall into
// stripes. N.B. inserts go on while a table grows, and one filled fast may
// be past the next size already: sized for its entries, it skips arrays
// whose moves would only be undone.
func (t *Table[T]) growTarget(a *tableArray[T], most, total uint64) int {
	n := len(a.b.heads)
	if total <= uint64(n) || n >= t.bucketLimit {
		return 0
	}
	n *= 2
	for n < t.bucketLimit && total > uint64(n) && t.growLimit(n, len(a.b.stripes)) < most {
		n *= 2
	}
	return n
}

// postpone raises the trigger of each of a's due stripes, for which
// growTarget decided not to grow a table of total entries, the sum of
// counted (see counts), to where a check could decide otherwise: a count
// past it would have the table hold more entries than buckets if every
// insert until then were into that stripe. Inserts into other stripes
// reach their own triggers, or bring the table there sooner. So an insert
// into such a stripe costs a compare, and a stripe is checked again only
// once it holds as many more entries as the table was short of one per
// bucket.
//
// N.B. each trigger is raised from the count the decision summed, not
// from the stripe's count now: inserts go on during the check, and a
// count read after the total was summed holds entries the total lacks,
// which would set the trigger that many entries past the one that takes
// the table past one entry per bucket. (Raised so, a trigger of 1025 in a
// table of 1024 buckets let its 1025th entry go unchecked, and
// TestTableGrowthBoundedByEntries once ended a size short.) A stripe due
// only after the counts is left for the next check, which overfull has
// run. It costs the check a slice of the stripes' counts; inserts none.
func (t *Table[T]) postpone(a *tableArray[T], counted []uint64, total uint64) {
	short := uint64(len(a.b.heads)) - min(total, uint64(len(a.b.heads)))
	for i, c := range counted {
		if c > a.trigger(i) {
			a.checkAt[i].Store(c + short)
		}
	}
}

// trigger returns the entry count past which stripe s of a is due.
func (a *tableArray[T]) trigger(s int) uint64 { return max(a.growAt, a.checkAt[s].Load()) }

// overfull reports whether a stripe holds more entries than its trigger: past
// a's growAt, and past the count where a check last decided not to grow
// for it.
func (a *tableArray[T]) overfull() bool {
	for i := range a.b.stripes {
		if a.b.stripes[i].count.Load() > a.trigger(i) {
			return true
		}
	}
	return false
}

// sizes checks the sizes of c, and returns the most buckets its table may
// have, a power of two (see WithMaxBuckets); it lowers the default
// capacity to that. It panics, as make does, on a size no table can have:
// so a size beyond the index space fails before a byte is allocated.
func (c *tableConfig) sizes() int {
	if c.maxBuckets < 0 {
		panic(fmt.Sprintf("hash4: WithMaxBuckets(%d): negative", c.maxBuckets))
	}
	limit := maxBuckets
	if c.maxBuckets > 0 {
		limit = max(minBuckets, 1<<(bits.Len(uint(min(c.maxBuckets, maxBuckets)))-1))
	}
	switch {
	case !c.capacitySet:
		c.capacity = min(c.capacity, limit)
	case c.capacity > limit && c.maxBuckets > 0:
		panic(fmt.Sprintf("hash4: WithCapacity(%d) beyond WithMaxBuckets(%d), %d buckets", c.capacity, c.maxBuckets, limit))
	case c.capacity > limit:
		panic(capacityBeyond(c.capacity))
	}
	return limit
}

// capacityBeyond returns the message of a panic for a WithCapacity(n)
// beyond the most buckets any table can have.
func capacityBeyond(n int) string {
	return fmt.Sprintf("hash4: WithCapacity(%d) beyond %d buckets, the most a table can have", n, maxBuckets)
}

// Grow sizes the table for about n entries, as WithCapacity sizes a new
// one: if n rounded up to a power of two is more buckets than the table
// has, it replaces the bucket array (60 bytes per bucket); else it does
// nothing. Every method may run meanwhile and finds every entry; a writer
// waits at most for one lock stripe's entries to move. It panics if n is
// negative, and changes nothing and returns an error matching [ErrTooLarge]
// if n is beyond the table's bucket limit (see [WithMaxBuckets]), or
// [ErrTableFull] if the table's index space has no room for the new array.
func (t *Table[T]) Grow(n int) error {
	if n < 0 {
		panic(fmt.Sprintf("hash4: Grow(%d): negative size", n))
	}
	t.array() // a zero Table panics here, naming New
	if n > t.bucketLimit {
		return fmt.Errorf("%w: Grow(%d) beyond %d buckets", ErrTooLarge, n, t.bucketLimit)
	}
	t.growMu.Lock()
	defer t.growMu.Unlock()
	return t.grow(n)
}

// grow is Grow, with growMu held, for n at most the table's bucket limit.
//
// A table grows itself (growBehind); Grow sizes it ahead of a known load
// instead, or grows a table made WithFixedBuckets.
//
// Every method may run while Grow runs, and finds every entry. Grow
// publishes the new array at once and then moves the entries into it one
// lock stripe at a time, under that stripe's lock, as rhashtable moves
// entries a bucket at a time. A writer (or All, or Stats) that comes to a
// stripe whose entries have not moved yet moves them itself first. So an
// Insert, Delete or swap waits at most for the move of one stripe's
// entries: with the default stripes, about a thousand entries in a table
// of a million, as against the whole table. (Connect
// may lock a stripe per port it tries, and All and Stats lock them all, so
// each may move several.) Lookups go on without locks; until Grow returns,
// a lookup that does not find its key in the new array, as one whose
// stripe has not moved does not, walks the key's chain in both arrays.
// Calls of Grow run one at a time, and one after another with the
// table's own growth. The lock stripes stay as New made them (see
// WithLockStripes): a table made small and grown large, by Grow or by
// itself, keeps the small table's stripe count, so its writers meet on
// fewer locks, and wait for the move of more entries, than in a table
// made at the large size; WithLockStripes gives a small table that is to
// grow large the stripes of a large one.
//
// Memory: the new array reserves 60 bytes per bucket, as New does. Once
// every entry has moved, the old array's home slots go back to the heap
// (as soon as no lookup still reads them), and the nodes beyond them that
// the moves free serve the new array's entries beyond its home slots; the
// table keeps those, so a table grown to a size holds about the bytes per
// entry of one made at it.
func (t *Table[T]) grow(n int) error {
	old := t.array()
	nb := bucketCount(n)
	if nb <= len(old.b.heads) {
		return nil
	}
	base, homes, ok := t.nodes.reserve(uint32(nb))
	if !ok {
		return ErrTableFull
	}
	// N.B. the home slots are fresh memory, which the kernel backs only
	// as it is first written, a page at a time: written here, the pages
	// cost Grow, rather than each stripe's move, whose entries lie in
	// pages of their own. (A move into unwritten pages made a writer that
	// waited for one wait up to 10 ms in a table of a million entries.)
	// 64 entries of 56 bytes are less than the smallest page, 4 KiB. On
	// Linux the slots are first advised for huge pages, which take one
	// fault each instead of 512 (hugepage_linux.go).
	if t.groups.hugePages {
		adviseHugePages(homes) // written below, a word per page
	}
	for i := 0; i < len(homes); i += 64 {
		homes[i].seq.Store(0)
	}
	ss := old.b.stripes
	// The node batches of a table made at this size: a table grown from
	// the default 1024 buckets under 64 stripes otherwise moves its free
	// nodes one at a time through the node store's mutex; filling a
	// million entries from the default size took 24% less time with this.
	t.nodes.setBatch(nodeBatch(nb, len(ss)))
	a := &tableArray[T]{homes: homes}
	a.b.initShared(nb, ss, old.b.nullsBase^arrayNullsFlip, t.groups.hugePages)
	a.home.init(nb, len(ss), base, t.groups.grouped(nb))
	t.initGrowth(a)
	// N.B. old is set before the array is published, and cleared only
	// once every stripe's entries are in it: a lookup that finds old nil
	// in the table's array needs no other (see lookup).
	a.old.Store(old)
	t.arr.Store(a)
	t.growths.Add(1)
	for s := range ss {
		if h := t.hooks; h != nil && h.growStep != nil {
			h.growStep(uint32(s))
		}
		st := &ss[s]
		st.mu.Lock()
		if st.flipped != a.flipped() {
			t.migrate(a, st, uint32(s))
		}
		st.mu.Unlock()
	}
	a.old.Store(nil)
	t.releaseOld(a, old)
	return nil
}

// releaseOld gives the memory of old's home slots back, once grow has
// moved every entry out of old into a and no writer can reach them: none
// is in a chain of a, a cache or the depot (see migrate), so the node
// store releases them (slab.release), and lookups that still hold one of
// their indexes end on releasedNullsValue and restart. Only where migrate
// relinked some of them into a's chains (the index space was spent) are
// they kept, and the others left out of use.
func (t *Table[T]) releaseOld(a, old *tableArray[T]) {
	n := uint32(len(old.homes))
	if kept := a.relinkedHomes.Load(); kept > 0 {
		t.nodes.retire(n - kept)
		return
	}
	t.nodes.release(old.home.base, n, markReleased[T])
}

// markReleased makes e a node of the node store's released chunk: free,
// its next link ending on releasedNullsValue (see slab.release).
func markReleased[T any](e *entry[T]) { e.next.initNulls(releasedNullsValue) }

// migrateAhead is how many of a stripe's old buckets ahead of the one it
// moves migrate asks for the lines of (touchMigrate).
const migrateAhead = 8

// touchMigrate asks for the lines that migrate reads and writes to move
// old bucket ob of o into a, before it comes to them: ob's head and home
// slot, and the heads and home slots of the two buckets of a that most of
// ob's entries go to, ob and ob+len(o.b.heads) (all of them when a is
// twice o's size). N.B. a stripe's buckets are a stride apart, 64 entries
// of 56 bytes for the default stripe count, a page apart or more in a
// large table, too far apart for the processor's own prefetcher: asked
// for 8 buckets ahead, they made a Grow of a million entries 9.6% faster
// (6 interleaved rounds; 16 ahead measured the same as 8). Only for
// processors with canPrefetchW.
func (t *Table[T]) touchMigrate(a, o *tableArray[T], ob uint32) {
	var h lineHints
	addLineHint(&h, &o.b.heads[ob])
	addLineHint(&h, &o.homeAt(ob).seq)
	for _, b := range [2]uint32{ob, ob + uint32(len(o.b.heads))} {
		addLineHint(&h, &a.b.heads[b])
		addLineHint(&h, &a.homeAt(b).seq)
	}
	h.prefetchW()
}

// migrate moves the entries of stripe s (st) from a.old into a, the
// table's array, which Grow has published. The caller holds st's lock.
//
// N.B. every entry is live in a before the old array stops leading to it,
// so a lookup that misses in the old array finds it in a (lookupGrowing):
// bucket by bucket, each entry of the old chain is copied into a node
// placed as insert places one, the chain left whole; then the chain is
// emptied, and only then are its nodes freed, while their lines are still
// in the cache, and all but the old home slots kept for reuse (releaseOld
// gives those back once every stripe has moved). (Freed as soon as
// copied, a node could take the next copy while its old chain still led
// to it, and send the readers of that chain into a chain of a, to restart
// there. Freed once the whole stripe was copied, each node was read again
// from memory in a table beyond the caches: BenchmarkGrow of a million
// entries took 5.6% longer, and BenchmarkFill 7.4%.) A reader that stood
// on a freed node that a writer reuses goes on into a chain of a, whose
// nulls values differ from the old array's, and restarts. Should the store have no
// node left for a copy (its index space is spent), the entry's own node
// moves into a's chain instead, as rhashtable moves entries: linked there
// before it is unlinked from the old chain, so a reader walking old then
// new finds it in one chain or the other, and one standing on it is led
// into a's chain, ends on a marker not its own and restarts (no move
// count is needed). Last, the stripe counts a move: a lookup in a whose
// walk began before the entries were all in a sees the count change (see
// lookup).
func (t *Table[T]) migrate(a *tableArray[T], st *stripe, s uint32) {
	o := a.old.Load()
	a.home.initStripe(st, s)
	mc := &t.moves[s].n
	step, end := uint32(len(o.b.stripes)), uint32(len(o.b.heads))
	for ob := s; ob < end; ob += step {
		if ahead := ob + migrateAhead*step; canPrefetchW && ahead < end {
			t.touchMigrate(a, o, ahead)
		}
		head := &o.b.heads[ob]
		prev := head
		for l := prev.load(); !l.isNulls(); {
			e := t.nodes.at(l.index())
			next := e.next.load()
			k := e.key.load()
			b := a.b.bucket(uint32(k.meta >> 32))
			if i, ok := t.place(a, st, s, b); ok {
				t.fill(i, &k, e.val.Load(), &a.b.heads[b])
				prev = &e.next
			} else {
				linkAt(&a.b.heads[b], l, &e.next)
				if h := t.hooks; h != nil && h.relinked != nil {
					h.relinked(l.index())
				}
				if _, home := o.home.isHome(l.index()); home {
					a.relinkedHomes.Add(1) // see releaseOld
				}
				prev.store(next)
			}
			l = next
		}
		// The bucket's entries are all live in a: its old chain is
		// emptied, then its nodes are freed, while their lines are
		// still in the cache.
		l := head.load()
		head.initNulls(o.b.nullsBase + ob)
		for !l.isNulls() {
			e := t.nodes.at(l.index())
			next := e.next.load()
			e.seq.Store(e.seq.Load() + 1) // free: N.B. after the chain is emptied
			e.val.Store(nil)
			// The old array's home slots are released with it
			// (releaseOld): only other nodes serve again.
			if _, home := o.home.isHome(l.index()); !home {
				t.nodes.put(&st.cache, l.index(), t.nodes.cacheMax())
			}
			l = next
		}
	}
	st.flipped = a.flipped()
	mc.Store(mc.Load() + 1) // N.B. once all the entries are in a (see lookup)
}
