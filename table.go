package hash4

import (
	"errors"
	"fmt"
	"iter"
	"math"
	"math/bits"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
)

// Errors returned by Table. Match them with errors.Is: the errors returned
// wrap them with the offending tuple, except ErrTableFull, which is returned
// as it is.
var (
	// ErrExists: the 4-tuple is already in the table.
	ErrExists = errors.New("hash4: 4-tuple already in table")
	// ErrInvalidTuple: an address is invalid or unspecified (0.0.0.0, ::),
	// a port is 0, or the local and remote addresses are of different
	// families.
	ErrInvalidTuple = errors.New("hash4: invalid tuple")
	// ErrNilValue: the value to insert is nil.
	ErrNilValue = errors.New("hash4: nil value")
	// ErrTableFull: the table holds 2^31-1 entries, as many as it can index.
	ErrTableFull = errors.New("hash4: table full")
)

// Table is a concurrent hash table from 4-tuples to *T, built as the Linux
// established-socket table (inet_ehash): a power-of-two array of
// hlist_nulls chains read without locks, written under striped locks, with
// entries recycled without allocation.
//
// Lookup takes no lock and never allocates; it reads shared memory with
// atomic loads only, and writes it only to count a restart
// (Stats.LookupRestarts) on the rare paths where its walk met an entry
// recycled under it or missed while an entry of its stripe moved. Insert,
// Delete, CompareAndSwap and CompareAndDelete lock one stripe;
// LookupOrInsert looks up first, and locks one only to insert. All methods
// are safe for concurrent use. A Table must be created with New.
//
// Keys. An IPv4 address and its IPv4-mapped IPv6 form (::ffff:a.b.c.d) are
// the same address, as for a dual-stack Linux socket talking to an IPv4
// peer; tuples come back from All in the IPv4 form. Zones are not part of
// the key: fe80::1%eth0 and fe80::1%eth1 are one address, as a Linux socket
// that is not bound to a device matches packets from every interface; keep
// one Table per interface where flows on link-local addresses must be told
// apart by interface.
//
// Placement. Each bucket owns one entry slot, its home slot, and an entry
// goes there when it can: Lookup reads the home slot in parallel with the
// chain head, so a key held there costs one memory access. In tables of
// 2^16 buckets or more (with at most a quarter as many lock stripes as
// buckets, which the default always gives), Lookup reads the home slots of
// a group of four buckets, and an entry goes to any free one of them (see
// home.go): at one entry per bucket, 80.5% of the entries of a table of
// random flows are in a home slot of their group after inserts, and 76 to
// 77% after churn.
//
// Memory: a table reserves, when it is made, 60 bytes and 1 bit per bucket:
// a 4-byte chain head and a 56-byte entry slot. Up to one entry per bucket
// lives in those slots (an entry may use the free home slot of another
// bucket under the same lock stripe); beyond that, an entry takes 56
// bytes, allocated in chunks of a 64th of the buckets. All of it is beyond
// the caller's T. Nodes, once allocated, are kept for reuse until Compact
// gives back those beyond the entries' needs: on the heap, a
// table of 2^15 random flows or more, at one entry per bucket, holds 61 to
// 64 bytes per entry, after inserts and after long churn alike; smaller
// ones hold more (69 bytes at 2^12 and 83 at 2^10 after churn), as each
// lock stripe costs two cache lines and keeps nodes of its own, unless
// they have fewer stripes (see WithLockStripes). On Linux, the arrays a
// table writes whole as it makes them, its chain heads and the home slots
// of a Grow, are advised for transparent huge pages (madvise
// MADV_HUGEPAGE), as the kernel maps its own large hash tables, unless
// GODEBUG=disablethp=1 is in the environment; the home slots of New are
// left to small pages, so that a table made for more flows than it holds
// backs only the pages its entries touch.
//
// Growth. New sets the bucket count (WithCapacity), and the table grows
// itself past about two entries per bucket: an insert that leaves its lock
// stripe holding more entries than its limit (twice the stripe's buckets,
// plus the spread that random flows give the fullest stripe at that load)
// starts a goroutine that grows the bucket count, as Grow does, to the
// least power of two at which no stripe is over its limit (twice it, when
// the growth keeps up with the inserts), and returns without waiting, as
// rhashtable's inserts leave growth to a deferred worker. With random
// flows, tables of 2^16 buckets or more grew at 1.97 to 2.02 entries per
// bucket, of 1024 buckets (the default) at 2.1 to 2.4, and of one bucket
// per stripe from 1.2. Lookups and writes go on while the table grows (see
// Grow), and the goroutine ends when it has grown. A table never shrinks
// its bucket array.
// WithFixedBuckets keeps the bucket count New set, as Linux keeps its
// established table's.
type Table[T any] struct {
	// N.B. the pads keep the fields that every lookup reads off the cache
	// lines of the objects the heap puts before and after the table (see
	// slabDir).
	_        [cacheLineSize]byte
	arr      atomic.Pointer[tableArray[T]] // the bucket array (see tableArray)
	nodes    slab[entry[T]]
	moves    []moveCount // per stripe (see move)
	secret   Secret
	hasher   Hasher
	restarts atomic.Uint64

	// growMu serializes Grow; groups is the config's home groups rule,
	// which Grow applies to each new array. growing is set while a growth
	// that an insert started (see insert) runs, and for good if one
	// failed; growers counts those growths' goroutines, for tests to wait
	// on; fixed is WithFixedBuckets.
	growMu  sync.Mutex
	groups  tableConfig
	growing atomic.Bool
	growers sync.WaitGroup
	fixed   bool
	// listenerStripes are the lock stripes of a TCPTable's listener
	// chains, whose caches hold nodes of this table's store (set by
	// NewTCPTable before the table is shared), for compactNodes.
	listenerStripes []stripe

	// visit, when set (by tests only), is called by lookups on each entry
	// of a chain before they read its next link, by lookup with
	// visitWalkEnd when its walk ends on its own chain's marker, and by
	// lookupGrowing with visitGrowing when it has loaded the array;
	// growStep, when set (by tests only), by Grow before it moves the
	// entries of each stripe; relinked by migrate between linking a node
	// into a chain of the new array and unlinking it from the old.
	visit    func(index uint32)
	growStep func(stripe uint32)
	relinked func(index uint32)
	_        [cacheLineSize]byte
}

// The values Table.visit takes besides node indexes, which are from 1 to
// maxNullsValue.
const (
	visitWalkEnd = 0
	visitGrowing = ^uint32(0)
)

// tableArray is a table's bucket array and all that its bucket count lays
// out: the chain heads, the home slots and their bitmap. The stripes are
// the table's, shared by every array it has had. Grow replaces the array
// (see Grow); nothing in it changes once published but through the heads,
// the home slots' entries and the bitmap, which writers change under
// stripe locks, and old.
//
// N.B. the pads keep the fields that every lookup reads off the lines of
// the heap's neighbouring objects, as Table's do. old shares a line with
// the end of homes, which lookups read.
type tableArray[T any] struct {
	_     [cacheLineSize]byte
	b     buckets
	home  homeSlots
	homes []entry[T] // home slots: bucket b's is homes[b], node home.slot(b)
	// old is the array this one replaced while Grow moves the entries
	// out of it, stripe by stripe, and nil before and after.
	old atomic.Pointer[tableArray[T]]
	// relinkedHomes counts the home slots of old that migrate linked
	// into this array's chains, for want of nodes (see releaseOld).
	relinkedHomes atomic.Uint32
	// growAt is the entry count of a stripe past which an insert grows
	// the table (see insert and growLimit), or never.
	growAt uint64
	_      [cacheLineSize]byte
}

// flipped reports whether the array's nulls values have bit 30 set
// (arrayNullsFlip): arrays alternate, and a stripe whose flipped differs
// from the table's array has its entries in the old one (see Grow).
func (a *tableArray[T]) flipped() bool { return a.b.nullsBase&arrayNullsFlip != 0 }

// entry is one flow. Its fields are shared by lock-free readers and by
// writers under the stripe lock of the chain it is in: readers load them
// atomically, writers store them with release stores (release.go).
//
// N.B. seq is odd while the entry is live (in the table with its key and
// value) and even while it is free. A writer fills a free entry, links it
// and then makes seq odd; deleting makes seq even, then unlinks the entry
// and clears the value. A live entry is therefore always linked in the
// chain of its key, so a reader may trust an entry it reaches without the
// chain (a home slot). A reader that matches a key reads seq before the key
// and again after the value, and trusts the match only if seq was odd and
// did not change: otherwise the entry was deleted or recycled under it. A
// live entry's value may change without seq (CompareAndSwap): the reader
// returns the value it loaded, which the flow held at that moment.
// seq returns to a value only after 2^31 reuses of the entry: to be fooled,
// a reader would have to stall between its two loads through minutes of
// churn on that one entry. Chain walkers skip entries whose seq is even.
// Recycling never waits for readers.
type entry[T any] struct {
	seq  relUint32
	next linkField
	key  entryKey
	val  relPointer[T]
}

// key is a tuple in the form entries store: the full hash and ports in one
// word, addresses as the two words of their 16-byte form (IPv4 as
// IPv4-mapped, zone dropped).
type key struct {
	meta          uint64
	remote, local [2]uint64
}

// Option configures New.
type Option func(*tableConfig)

type tableConfig struct {
	capacity, stripes int
	stripesSet        bool // by WithLockStripes
	secret            *Secret
	hasher            Hasher
	// homeGroups is whether to form home groups (home.go): set by New
	// from the bucket count, or by tests through withHomeGroups.
	homeGroups    bool
	homeGroupsSet bool
	fixed         bool // by WithFixedBuckets
}

// withHomeGroups forces home groups on or off, whatever the bucket count,
// so that tests can reach grouped placement in small tables.
func withHomeGroups(on bool) Option {
	return func(c *tableConfig) { c.homeGroups, c.homeGroupsSet = on, true }
}

// stripeCount returns the stripe count asked for: the one given to
// WithLockStripes, else the default for the table's bucket count.
func (c *tableConfig) stripeCount() int {
	if c.stripesSet {
		return c.stripes
	}
	return defaultStripes(bucketCount(c.capacity))
}

// WithCapacity sizes the table for about n entries: the bucket count is n
// rounded up to a power of two (at least 16, at most 2^29), so that a full
// table holds one entry per bucket on average, as Linux sizes its
// established table. The default is 1024. New reserves 60 bytes per bucket
// at once (see Table), as make(map[K]V, n) reserves room for n entries.
// Past about twice as many entries as buckets the table grows (see Table,
// Growth), unless made WithFixedBuckets.
func WithCapacity(n int) Option { return func(c *tableConfig) { c.capacity = n } }

// WithFixedBuckets keeps the bucket count that New sets: the table grows
// only when Grow is called, as Linux sizes its established table once, at
// boot, and starts no goroutine. Chains then lengthen as entries pass the
// bucket count.
func WithFixedBuckets() Option { return func(c *tableConfig) { c.fixed = true } }

// WithLockStripes sets the number of writer locks, rounded up to a power of
// two and limited to the bucket count (at least 1). The default is 16 per
// GOMAXPROCS, at least 64, and at least one per 1024 buckets, but at most
// one per 16 buckets.
//
// Fewer stripes make a small table smaller: an entry may take the free
// home slot of any bucket under its own stripe only, so many stripes of few
// buckets each need nodes beyond the home slots. At one entry per bucket,
// one stripe keeps a table of 2^10 entries at 61 bytes per entry instead of
// 83, and two stripes one of 2^12 at 63 instead of 69; writers then meet on
// fewer locks (README, Memory). More stripes than a quarter of the buckets
// turn home groups off (see Table, Placement).
func WithLockStripes(n int) Option {
	return func(c *tableConfig) { c.stripes, c.stripesSet = n, true }
}

// WithSecret sets the keys of the table's hash function. The default is a
// fresh NewSecret; see Secret.
func WithSecret(s Secret) Option { return func(c *tableConfig) { c.secret = &s } }

// WithHasher chooses the tuple hasher; the default is LinuxHasher. A value
// that names no hasher leaves the default in place.
func WithHasher(h Hasher) Option {
	return func(c *tableConfig) {
		if h.valid() {
			c.hasher = h
		}
	}
}

// New returns an empty table.
func New[T any](opts ...Option) *Table[T] {
	cfg := tableConfig{capacity: 1024, hasher: LinuxHasher}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	t := &Table[T]{hasher: cfg.hasher}
	if cfg.secret != nil {
		t.secret = *cfg.secret
	} else {
		t.secret = NewSecret()
	}
	a := new(tableArray[T])
	a.b.init(cfg.capacity, cfg.stripeCount(), 0)
	n := len(a.b.heads)
	// The home slots are reserved nodes, from index 1; nodes beyond them
	// come in chunks of a 64th of the buckets, 64 to 1024 (see
	// slab.setChunk). N.B. an empty store always has room for them.
	t.nodes.setChunk(n / 64)
	base, homes, _ := t.nodes.reserve(uint32(n))
	a.homes = homes
	t.nodes.setBatch(nodeBatch(n, len(a.b.stripes)))
	t.groups = tableConfig{homeGroups: cfg.homeGroups, homeGroupsSet: cfg.homeGroupsSet}
	a.home.init(n, len(a.b.stripes), base, t.groups.grouped(n))
	for s := range a.b.stripes {
		a.home.initStripe(&a.b.stripes[s], uint32(s))
	}
	t.moves = make([]moveCount, len(a.b.stripes))
	t.fixed = cfg.fixed
	a.growAt = t.growLimit(n, len(a.b.stripes))
	t.arr.Store(a)
	return t
}

// nodeBatch returns the node batch (see slab.setBatch) of a table of the
// given bucket and stripe counts: 1/64 of a stripe's buckets, so 16 nodes
// from 1024 buckets per stripe, the default in large tables; setBatch
// holds it between 1 and 16.
func nodeBatch(buckets, stripes int) int { return buckets / stripes / 64 }

// growLimit returns the growAt of an array of n buckets under s stripes,
// or never in a table made WithFixedBuckets or of the most buckets a table
// can have: twice the buckets of a stripe, m, plus the spread of the
// fullest of s stripes when the table holds two entries per bucket, about
// sqrt(2 ln s) standard deviations of a stripe's count (sqrt(m) for random
// flows), so that the first stripe to pass its limit does so when the table
// passes about two entries per bucket, whether its stripes cover few
// buckets or many. (With the limit at m, a table of 1024 buckets under 64
// stripes grew at 1.2 to 1.3 entries per bucket.)
func (t *Table[T]) growLimit(n, s int) uint64 {
	if t.fixed || n >= maxBuckets {
		return math.MaxUint64
	}
	m := float64(2 * n / s)
	return uint64(m + math.Sqrt(2*math.Log(float64(s))*m))
}

// grouped reports whether a table of n buckets has home groups: as forced
// by withHomeGroups, else from n buckets up to homeGroupMinBuckets.
func (c *tableConfig) grouped(n int) bool {
	if c.homeGroupsSet {
		return c.homeGroups
	}
	return n >= homeGroupMinBuckets
}

// moveCount counts the moves (see Table.move) in the chains of one stripe.
// It fills a cache line of its own: readers load it on every lookup, and
// only moves write it.
type moveCount struct {
	n relUint32
	_ [cacheLineSize - 4]byte
}

// tupleKey sets *k to the key of *tup, hashed with the table's hasher: the
// hash with local port 0, plus the port. Every operation on a tuple comes
// here. N.B. it is written for Lookup, whose tuple arrives in memory (with
// the receiver and the generic dictionary, its eight words overflow the
// argument registers): it reads the addresses where they lie and hashes in
// line, where a copy of the tuple and the calls to convert and hash it
// cost 37 of a lookup's 418 instructions and 9 to 12% of its time at 1K
// entries. Keys are filled in place and passed by pointer: returning a
// 40-byte key just written field by field costs a copy that stalls on
// store-to-load forwarding.
func (t *Table[T]) tupleKey(k *key, tup *Tuple) {
	if addrReprKnown { // setWords, in line
		setWordsReprAt(&k.remote, &tup.Remote)
		setWordsReprAt(&k.local, &tup.Local)
	} else {
		setWordsAs16(&k.remote, tup.Remote.Addr())
		setWordsAs16(&k.local, tup.Local.Addr())
	}
	rport := tup.Remote.Port()
	var h uint32 // hashPort0, in line
	if t.hasher == XXH3Hasher {
		h = xxh3Port0(&t.secret, &k.local, &k.remote, rport)
	} else {
		h = inetEhashWords(&k.local, &k.remote, wordsAreIPv4(&k.local) && wordsAreIPv4(&k.remote), rport, t.secret.Ehash, t.secret.Ehash6Addr)
	}
	k.setPort(h, tup.Local.Port(), rport)
}

// setKey sets *k to the key of the flow (local:localPort, remote), hashed,
// as tupleKey does for the tuple. N.B. it converts the addresses it is
// given: building a tuple of them to pass to tupleKey made each call 8 ns
// slower, as the loads of the words just stored stall.
func (t *Table[T]) setKey(k *key, local netip.Addr, localPort uint16, remote netip.AddrPort) {
	if addrReprKnown { // setWords, in line
		setWordsRepr(&k.remote, remote.Addr())
		setWordsRepr(&k.local, local)
	} else {
		setWordsAs16(&k.remote, remote.Addr())
		setWordsAs16(&k.local, local)
	}
	k.setPort(hashPort0(t.hasher, &t.secret, &k.local, &k.remote, remote.Port()), localPort, remote.Port())
}

// setPort sets the local port of k, given the hash of k with local port 0.
func (k *key) setPort(hash0 uint32, localPort, remotePort uint16) {
	k.meta = uint64(hash0+uint32(localPort))<<32 | uint64(localPort)<<16 | uint64(remotePort)
}

// validate reports why tup cannot be a key, or nil.
func validate(tup Tuple) error {
	l, r := tup.Local.Addr().Unmap(), tup.Remote.Addr().Unmap()
	switch {
	case !l.IsValid() || !r.IsValid():
		return fmt.Errorf("%w %v: invalid address", ErrInvalidTuple, tup)
	case l.IsUnspecified() || r.IsUnspecified():
		return fmt.Errorf("%w %v: unspecified address", ErrInvalidTuple, tup)
	case l.Is4() != r.Is4():
		return fmt.Errorf("%w %v: local and remote address families differ", ErrInvalidTuple, tup)
	case tup.Local.Port() == 0 || tup.Remote.Port() == 0:
		return fmt.Errorf("%w %v: port 0", ErrInvalidTuple, tup)
	}
	return nil
}

// validateInsert reports why tup with value v cannot be inserted, or nil.
func validateInsert[T any](tup Tuple, v *T) error {
	if err := validate(tup); err != nil {
		return err
	}
	if v == nil {
		return fmt.Errorf("%w for %v", ErrNilValue, tup)
	}
	return nil
}

// Lookup returns the value stored for tup. It takes no lock and does not
// allocate. A tuple that Insert would reject is never found.
func (t *Table[T]) Lookup(tup Tuple) (*T, bool) {
	// No entry has port 0; checking it here also keeps a stray walk (into
	// a TCPTable listener chain, whose nodes leave the remote zero) from
	// ever matching.
	if tup.Remote.Port() == 0 || tup.Local.Port() == 0 {
		return nil, false
	}
	var k key
	t.tupleKey(&k, &tup)
	return t.lookup(&k, false)
}

// AppendLookups appends to dst the value stored for each tuple of tups, in
// order, nil for a tuple that is absent, and returns the extended slice. It
// allocates only if dst has too little room. Each lookup is a Lookup,
// without a lock, and the lookups run in order: under concurrent writes the
// answers are those of as many Lookups in a row, not a snapshot of the
// table.
//
// In a table beyond the caches it is faster than a loop of Lookup: it
// hashes up to 8 tuples and asks for the lines that each lookup will read
// before reading any, so that their memory misses overlap, as packet
// processors look up a burst of packets (DPDK's rte_hash_lookup_bulk). A
// loop of Lookup overlaps none: at 1M entries it runs as fast when each key
// depends on the last answer (BenchmarkLookupChained). In a table of 1M
// entries, batches of 8 made lookups about twice as fast, and 4 or 16 less
// than 8 (BenchmarkAppendLookups).
func (t *Table[T]) AppendLookups(dst []*T, tups []Tuple) []*T {
	dst = slices.Grow(dst, len(tups))
	var keys [lookupBatch]key
	var buckets [lookupBatch]uint32
	var valid [lookupBatch]bool
	a := t.arr.Load() // for the requests only: each lookup loads its own
	for len(tups) > 0 {
		batch := tups[:min(len(tups), lookupBatch)]
		tups = tups[len(batch):]
		for i := range batch {
			tup := &batch[i]
			// As Lookup: no entry has port 0.
			if valid[i] = tup.Remote.Port() != 0 && tup.Local.Port() != 0; valid[i] {
				t.tupleKey(&keys[i], tup)
				buckets[i] = a.b.bucket(uint32(keys[i].meta >> 32))
			}
		}
		// N.B. the requests for all lines come after all the hashing:
		// loads issued between hashes would wait behind them.
		t.requestLines(a, &buckets, &valid, len(batch))
		for i := range batch {
			var v *T
			if valid[i] {
				v, _ = t.lookup(&keys[i], true)
			}
			dst = append(dst, v)
		}
	}
	return dst
}

// lookupBatch is how many lookups AppendLookups overlaps.
const lookupBatch = 8

// requestLines asks for the lines that lookups in the first n buckets of bs
// (those marked valid) will read: each chain head, home slot and the other
// home slots of its group. With a prefetch instruction (prefetch_amd64.go)
// the requests do not wait; elsewhere they are loads, which overlap too but
// hold up what comes after them while they wait: in a 1M-entry table on
// amd64, with two goroutines, loads made AppendLookups 30% faster than a
// loop of Lookup, and PREFETCHT0 50% (4 interleaved rounds).
func (t *Table[T]) requestLines(a *tableArray[T], bs *[lookupBatch]uint32, valid *[lookupBatch]bool, n int) {
	if !canPrefetch {
		// N.B. atomic loads are not removed for want of a use.
		for i, b := range bs[:n] {
			if !valid[i] {
				continue
			}
			a.b.heads[b].load()
			a.homeAt(b).seq.Load()
			for _, x := range a.home.group[:a.home.groupOthers()] {
				a.homeAt(b ^ x).seq.Load()
			}
		}
		return
	}
	for i, b := range bs[:n] {
		if !valid[i] {
			continue
		}
		var h lineHints
		e := a.homeAt(b)
		addLineHint(&h, &a.b.heads[b])
		addLineHint(&h, &e.seq)
		addLineHint(&h, &e.val) // on the next line when the entry straddles two
		for _, x := range a.home.group[:a.home.groupOthers()] {
			addLineHint(&h, &a.homeAt(b^x).seq)
		}
		h.prefetchRead()
	}
}

// lookup is __inet_lookup_established over one chain, preceded by a look
// at the bucket's home slot, or its group's (home.go): trust a match only
// if the entry stayed live and unchanged across the read (see entry); walk
// the chain without locks, and trust a miss only if the walk ended on this
// chain's own nulls marker, since an entry recycled into another chain
// while we stood on it leads into that chain, if no move in the stripe
// overlapped the walk (see move), if the table's array is still the one
// walked, and if no Grow is moving entries out of the array before it (see
// Grow): then the lookup goes on in lookupGrowing, as it does when it
// finds the array replaced. asked is whether the caller has asked for the
// lines of k's bucket already (AppendLookups, requestLines), so that the
// lookup does not ask again.
func (t *Table[T]) lookup(k *key, asked bool) (*T, bool) {
	h := uint32(k.meta >> 32)
	a := t.arr.Load()
	b := a.b.bucket(h)
	head := &a.b.heads[b]
	nodes := t.nodes.view()
	// N.B. moves is loaded before the head, for correctness: a move that
	// counts itself after this load is seen by the check at a miss, and
	// one counted before it finished its writes before the walk began
	// (see move). A stripe's moves are the same in every array.
	moves := &t.moves[h&a.b.stripeMask].n
	m := moves.Load()
	var l link
	// A home slot that changed under us leaves the answer to the walk.
	if a.home.grouped() {
		// N.B. the head is loaded only once the group's slots have
		// missed: lookupGroup has asked for its line already.
		if v, ok := t.lookupGroup(a, k, b, asked); ok {
			return v, true
		}
		l = head.load()
	} else {
		// The head is loaded before the home slot is read so that the
		// two loads, which do not depend on each other, overlap their
		// misses.
		l = head.load()
		home := a.homeAt(b)
		if seq := home.seq.Load(); seq&1 == 1 && home.key.matches(k) {
			v := home.val.Load()
			if home.seq.Load() == seq {
				return v, true
			}
		}
	}
	for {
	walk:
		for !l.isNulls() {
			e := nodes.at(l.index())
			if seq := e.seq.Load(); seq&1 == 1 && e.key.matches(k) {
				v := e.val.Load()
				if e.seq.Load() != seq {
					break walk // changed under us: restart
				}
				return v, true
			}
			if t.visit != nil {
				t.visit(l.index())
			}
			l = e.next.load()
		}
		if l.isNulls() && l.nullsValue() == a.b.nullsBase+b {
			if t.visit != nil {
				t.visit(visitWalkEnd)
			}
			// A miss is trusted only if no move in the stripe
			// overlapped the walk (see move), the array is the
			// table's, and the stripe's entries are all in it.
			// N.B. old is loaded before the count: Grow counts a
			// move in each stripe once all its entries are in the
			// new array, and clears old once every stripe's are. So
			// if old is nil, either the walk began after the
			// stripe's count went up and saw all its entries, or the
			// count loaded now differs from m. (Loaded after the
			// walk, rather than before it, old sends to
			// lookupGrowing only the misses of lookups that overlap
			// a Grow's moves.)
			old := a.old.Load()
			now := moves.Load()
			if now == m && t.arr.Load() == a {
				if old == nil {
					return nil, false
				}
				return t.lookupGrowing(k)
			}
			m = now
		}
		t.restarts.Add(1) // the slow path's only write
		if t.arr.Load() != a {
			return t.lookupGrowing(k)
		}
		l = head.load()
	}
}

// lookupGrowing is lookup in a table whose array Grow replaced since the
// lookup began, or is moving entries into (see Grow): it walks the chain
// of k in the old array, while there is one, then in the new one, and
// restarts both until it can trust a miss. A miss in the old array is
// trusted, and the walk goes on in the new one, if it ended on the old
// chain's own marker: an entry leaves the old array only once it is live in
// the new one, so a walk that no longer meets it in the old array meets it
// in the new. A miss in the new array is trusted as lookup trusts one. It
// reads no home slot: every entry is in its chain.
func (t *Table[T]) lookupGrowing(k *key) (*T, bool) {
	h := uint32(k.meta >> 32)
	nodes := t.nodes.view()
	for {
		a := t.arr.Load()
		if t.visit != nil {
			t.visit(visitGrowing)
		}
		// N.B. moves is loaded before the walks, as in lookup.
		moves := &t.moves[h&a.b.stripeMask].n
		m := moves.Load()
		ok := true
		if old := a.old.Load(); old != nil {
			var v *T
			var found bool
			if v, found, ok = t.walk(old, &nodes, k, h); found {
				return v, true
			}
		}
		if ok {
			v, found, own := t.walk(a, &nodes, k, h)
			if found {
				return v, true
			}
			// N.B. the array check is needed even when a has no
			// old: a newer Grow may have emptied a's chain after
			// this lookup loaded a, and counted its move before m
			// was loaded, or not yet.
			if own && moves.Load() == m && t.arr.Load() == a {
				return nil, false
			}
		}
		t.restarts.Add(1)
	}
}

// walk walks the chain of hash h in array a for k and returns its value if
// it found k live and unchanged across the read, and whether the walk
// ended on the chain's own marker. N.B. lookup's walk is this one written
// in line, with its restarts in the loop: the fast path keeps its own.
func (t *Table[T]) walk(a *tableArray[T], nodes *slabView[entry[T]], k *key, h uint32) (v *T, found, own bool) {
	b := a.b.bucket(h)
	l := a.b.heads[b].load()
	for !l.isNulls() {
		e := nodes.at(l.index())
		if seq := e.seq.Load(); seq&1 == 1 && e.key.matches(k) {
			v := e.val.Load()
			if e.seq.Load() != seq {
				return nil, false, false // changed under us
			}
			return v, true, true
		}
		if t.visit != nil {
			t.visit(l.index())
		}
		l = e.next.load()
	}
	return nil, false, l.nullsValue() == a.b.nullsBase+b
}

// lookupGroup looks for k in the home slots of bucket b's group (home.go),
// its own first, as lookup does in its own home slot. N.B. unless asked
// says the caller has, it asks for the lines of the other three slots and
// of b's chain head at once, without waiting for them
// (requestGroupLines), so that their misses overlap with
// each other and with its own slot's; and it loads each slot's seq only
// when it comes to test the slot. A lookup waits for every line it has
// loaded, needed or not, before it is done: with the four seqs loaded up
// front and the head loaded by the caller before them, a key found in its
// own slot waited for the slowest of five misses, and lookups in a 1M
// table took 10% longer. The four are written out: as a loop over arrays,
// the loaded seqs went through the stack, and lookups in a 1M table took
// 40% longer.
func (t *Table[T]) lookupGroup(a *tableArray[T], k *key, b uint32, asked bool) (*T, bool) {
	g := &a.home.group
	e0, e1, e2, e3 := a.homeAt(b), a.homeAt(b^g[0]), a.homeAt(b^g[1]), a.homeAt(b^g[2])
	if !asked {
		requestGroupLines(&a.b.heads[b], &e1.seq, &e2.seq, &e3.seq)
	}
	if s0 := e0.seq.Load(); s0&1 == 1 && e0.key.matches(k) {
		v := e0.val.Load()
		if e0.seq.Load() == s0 {
			return v, true
		}
	}
	if s1 := e1.seq.Load(); s1&1 == 1 && e1.key.matches(k) {
		v := e1.val.Load()
		if e1.seq.Load() == s1 {
			return v, true
		}
	}
	if s2 := e2.seq.Load(); s2&1 == 1 && e2.key.matches(k) {
		v := e2.val.Load()
		if e2.seq.Load() == s2 {
			return v, true
		}
	}
	if s3 := e3.seq.Load(); s3&1 == 1 && e3.key.matches(k) {
		v := e3.val.Load()
		if e3.seq.Load() == s3 {
			return v, true
		}
	}
	return nil, false
}

// present reports whether k is in the table, without a lock: the
// lock-free pre-check of each Connect candidate, whose insert under the
// stripe lock decides every candidate it lets through. N.B. only a true
// answer must be exact, and is: a live entry held k unchanged across the
// read. A false one may be wrong when the walk met an entry recycled or
// moved under it, and the insert's own check corrects that, so present
// neither counts moves nor restarts, and saves lookup's loads for them.
func (t *Table[T]) present(k *key) bool {
	a := t.arr.Load()
	b := a.b.bucket(uint32(k.meta >> 32))
	l := a.b.heads[b].load()
	home := a.homeAt(b)
	if seq := home.seq.Load(); seq&1 == 1 && home.key.matches(k) && home.seq.Load() == seq {
		return true
	}
	return !l.isNulls() && t.presentInChain(k, l)
}

// presentInChain is present past the home slot: a walk of the chain from
// its first link l. N.B. it is a function of its own so that the checks
// where a Connect scan ends most candidates, the home slot and an empty
// chain, have a small frame.
func (t *Table[T]) presentInChain(k *key, l link) bool {
	nodes := t.nodes.view()
	for !l.isNulls() {
		e := nodes.at(l.index())
		if seq := e.seq.Load(); seq&1 == 1 && e.key.matches(k) && e.seq.Load() == seq {
			return true
		}
		if t.visit != nil {
			t.visit(l.index())
		}
		l = e.next.load()
	}
	return false
}

// findLocked returns the field that links the entry holding k in its chain
// (the head or the predecessor's next) and the entry's link, or a nulls
// link if k is absent. The caller holds the chain's stripe lock, so the
// chain and its entries are stable; a is the table's array, loaded under
// the lock (see lockStripe).
func (t *Table[T]) findLocked(a *tableArray[T], k *key) (*linkField, link) {
	prev := a.b.head(uint32(k.meta >> 32))
	l := prev.load()
	for !l.isNulls() {
		e := t.nodes.at(l.index())
		if e.key.matches(k) {
			return prev, l
		}
		prev = &e.next
		l = prev.load()
	}
	return prev, l
}

// Insert adds the flow tup with value v. It returns an error matching
// ErrExists if tup is already present, ErrInvalidTuple or ErrNilValue for
// bad input; on error the table is unchanged.
func (t *Table[T]) Insert(tup Tuple, v *T) error {
	if err := validateInsert(tup, v); err != nil {
		return err
	}
	var k key
	t.tupleKey(&k, &tup)
	switch _, res := t.insert(&k, v); res {
	case insertExists:
		return fmt.Errorf("%w: %v", ErrExists, tup)
	case insertFull:
		return ErrTableFull
	}
	return nil
}

// LookupOrInsert returns the value stored for tup and found = true if tup
// is present; otherwise it inserts v and returns v and found = false. Like
// sync.Map's LoadOrStore, it is one atomic step: of concurrent calls for an
// absent tuple, one inserts and the others find its value. A tuple that is
// present costs a lookup, without a lock. Bad input returns an error that
// matches ErrInvalidTuple or ErrNilValue, whether or not tup is present,
// and changes nothing; so does ErrTableFull.
func (t *Table[T]) LookupOrInsert(tup Tuple, v *T) (actual *T, found bool, err error) {
	if err := validateInsert(tup, v); err != nil {
		return nil, false, err
	}
	var k key
	t.tupleKey(&k, &tup)
	if old, ok := t.lookup(&k, false); ok {
		return old, true, nil
	}
	switch old, res := t.insert(&k, v); res {
	case insertExists: // inserted since the lookup
		return old, true, nil
	case insertFull:
		return nil, false, ErrTableFull
	}
	return v, false, nil
}

type insertResult uint8

const (
	inserted insertResult = iota
	insertExists
	insertFull
)

// insert adds k with value v under the stripe lock, unless k is present;
// then it returns the value k has (insertExists). An insert that leaves
// its stripe holding more entries than the array's growAt starts the
// table's growth (see growBehind).
func (t *Table[T]) insert(k *key, v *T) (*T, insertResult) {
	a, st, s, b := t.lockStripe(uint32(k.meta>>32), lockToInsert)
	if _, l := t.findLocked(a, k); !l.isNulls() {
		old := t.nodes.at(l.index()).val.Load()
		st.mu.Unlock()
		return old, insertExists
	}
	i, ok := t.place(a, st, s, b)
	if !ok {
		st.mu.Unlock()
		return nil, insertFull
	}
	t.fill(i, k, v, &a.b.heads[b])
	n := st.count.Load() + 1
	st.count.Store(n)
	st.mu.Unlock()
	// N.B. growing is loaded after the unlock, an atomic read-modify-write
	// that orders the count's store before the load on every target, as
	// growBehind stores growing before it reads the counts: of the two,
	// one sees the other, so a stripe left over its limit is grown.
	if n > a.growAt && !t.growing.Load() && t.growing.CompareAndSwap(false, true) {
		t.growers.Add(1)
		go func() {
			defer t.growers.Done()
			t.growBehind()
		}()
	}
	return nil, inserted
}

// growBehind grows the table (growTarget) until no stripe holds more
// entries than the array's growAt, on a goroutine of its own that an
// insert started (see insert), as rhashtable's inserts leave its growth to
// a deferred worker (rht_deferred_worker): the insert returns at once, and
// writers move the stripes they come to meanwhile, as in any Grow. If the
// node store cannot index a new array (ErrTableFull), growing stays set:
// the table grows no more by itself.
func (t *Table[T]) growBehind() {
	t.growMu.Lock()
	defer t.growMu.Unlock()
	for {
		for a := t.arr.Load(); a.overfull(); a = t.arr.Load() {
			if t.grow(t.growTarget(a)) != nil {
				return
			}
		}
		t.growing.Store(false)
		// N.B. an insert that found growing set before the store above
		// left its count where the check below sees it (see insert).
		if !t.arr.Load().overfull() || !t.growing.CompareAndSwap(false, true) {
			return
		}
	}
}

// growTarget returns the bucket count that a, overfull, grows to: the
// least power of two, from twice a's, at which no stripe holds more
// entries than its limit. N.B. inserts go on while a table grows, and one
// filled fast may be past the next size already: sized for its entries, it
// skips arrays whose moves would only be undone.
func (t *Table[T]) growTarget(a *tableArray[T]) int {
	var most uint64
	for i := range a.b.stripes {
		most = max(most, a.b.stripes[i].count.Load())
	}
	n := 2 * len(a.b.heads)
	for n < maxBuckets && t.growLimit(n, len(a.b.stripes)) < most {
		n *= 2
	}
	return n
}

// overfull reports whether a stripe holds more entries than a's growAt.
func (a *tableArray[T]) overfull() bool {
	for i := range a.b.stripes {
		if a.b.stripes[i].count.Load() > a.growAt {
			return true
		}
	}
	return false
}

// lockIntent says what a writer locking a stripe is about to do, and so
// which lines lockStripe asks for before it takes the lock (Table.touch).
type lockIntent uint8

const (
	lockOnly     lockIntent = iota // no request: CompareAndSwap, iteration, statistics, compaction
	lockToInsert                   // an insert (Table.insert)
	lockToDelete                   // a delete (Table.delete), which may refill a home slot (Table.free)
)

// lockStripe locks the stripe of hash h, after asking for the lines that
// an insert or a delete writes (touch) unless intent is lockOnly, and
// returns the array that holds the stripe's entries, the stripe and its
// index, and h's bucket in the array. If Grow has published a new array
// and the stripe's entries are still in the old one, it moves them first
// (see migrate).
//
// N.B. the array is loaded again under the lock, and the stripe of a hash
// is the same in every array. An array loaded under the lock is the
// table's, or was until a Grow published a newer one since; then the
// stripe's entries stay in it until the lock is released, when the next
// holder (or Grow) moves them.
func (t *Table[T]) lockStripe(h uint32, intent lockIntent) (a *tableArray[T], st *stripe, s, b uint32) {
	a = t.arr.Load()
	s = h & a.b.stripeMask
	st = &a.b.stripes[s]
	if intent != lockOnly {
		t.touch(a, a.b.bucket(h), intent)
	}
	st.mu.Lock()
	a = t.arr.Load()
	if st.flipped != a.flipped() {
		t.migrate(a, st, s)
	}
	return a, st, s, a.b.bucket(h)
}

// fill writes key k and value v into free node i and links it at field at
// of k's chain (its head, or a node's next field). The caller holds the
// chain's stripe lock.
func (t *Table[T]) fill(i uint32, k *key, v *T, at *linkField) {
	e := t.nodes.at(i)
	// N.B. the entry is free (seq even): readers that still stand on it
	// ignore its key, so it can be written field by field.
	e.key.store(k)
	e.val.Store(v)
	linkAt(at, nodeLink(i), &e.next)
	e.seq.Store(e.seq.Load() + 1) // live: N.B. after linking (see entry)
}

// touch asks for the lines that insert and delete write under the stripe
// lock of bucket b, before the caller takes the lock: the chain head and
// the home slot; and in tables with home groups, whose lines are beyond the
// caches (home.go), the stripe's word of the home bitmap and its move
// count, and the other home slots of b's group, where the walk under the
// lock finds most of the chain; for a delete, also the chain heads of the
// group's other buckets. N.B. the requests do not wait, so their
// misses overlap with each other and with the lock's, rather than come one
// after the other under it.
//
// With PREFETCHW (prefetch_amd64.go) a line comes in the state a store
// needs: a line another core wrote last comes over once, rather than once
// to read and again to write. With two goroutines on cores that do not
// share a cache, the head and home slot made churn of a 1K table 9.5%
// faster than plain loads (8 interleaved rounds); the bitmap, the move
// count and the group made churn of a 1M table 13% faster (6 rounds),
// and cost a Connect in a 32K-bucket table, whose lines are all cached,
// 4%, hence only with groups. Without PREFETCHW, touch loads the head and
// the home slot's seq only.
//
// A delete of an entry held in the home slot of another bucket of its
// group frees that slot, and free reads that bucket's head to learn
// whether an entry must refill it: a miss under the lock, for 11% of the
// keys churned in the benchmark's 1M table (28.5% of them sit in such a
// slot when it is filled once). Asking for the three heads with the rest
// made churn at 1M 4.7% faster with one goroutine (p = 0.04, 28
// interleaved rounds) and 5.0% with two (p = 0.02, 38). Inserts do not
// ask: the only other head they read is a stealer's, whose bucket is
// known only under the lock.
//
// N.B. the head and home slot go through touchForWrite, three pointers in
// registers, and only the group's lines through a list: with every line in
// one list, building it made churn of a 1K table 2.3% slower, and 5.6% with
// a table per goroutine (6 interleaved rounds).
func (t *Table[T]) touch(a *tableArray[T], b uint32, intent lockIntent) {
	e := a.homeAt(b)
	touchForWrite(&a.b.heads[b], &e.seq, &e.val.v)
	if canPrefetchW && a.home.grouped() {
		var h lineHints
		s := b & a.b.stripeMask
		w, _ := a.home.bit(&a.b.stripes[s], b)
		addLineHint(&h, w)
		addLineHint(&h, &t.moves[s])
		for _, x := range a.home.group {
			// Both halves, as touchForWrite's seq and val.
			g := a.homeAt(b ^ x)
			addLineHint(&h, &g.seq)
			addLineHint(&h, &g.val)
			if intent == lockToDelete {
				addLineHint(&h, &a.b.heads[b^x])
			}
		}
		h.prefetchW()
	}
}

// place returns a free node for a new entry of bucket b, of stripe s (st),
// whose lock the caller holds: b's home slot if it is free; else a free home
// slot of another bucket of b's home group; else one of those slots, b's
// own first, that holds an entry of a bucket outside the group (a
// stealer), which moves to a spare node (it is evicted); else a spare node.
//
// N.B. a stealer from b's own group stays: it is in a slot that lookups of
// its key read. A free slot of the group is taken before any stealer is
// evicted: lookups read it as they read b's own, and taking it costs no
// move.
func (t *Table[T]) place(a *tableArray[T], st *stripe, s, b uint32) (uint32, bool) {
	if a.home.take(st, b) {
		return a.home.slot(b), true
	}
	if i, ok := t.groupSlot(a, st, b); ok {
		return i, true
	}
	if i, ok, done := t.evict(a, st, s, b, b); done {
		return i, ok
	}
	for _, x := range a.home.group[:a.home.groupOthers()] {
		if i, ok, done := t.evict(a, st, s, b, b^x); done {
			return i, ok
		}
	}
	return t.spareNode(a, st, s)
}

// evict takes the home slot of bucket c, which holds a live entry, for a new
// entry of bucket b of c's home group, if the entry is of a bucket outside
// the group: it moves to a spare node. It reports whether it took the slot,
// and done if place should stop there: the slot is taken, or no spare node
// is left for the evicted entry.
//
// Any stealer moves, wherever it is in its chain: lookups that a move
// misleads restart on the move count (see move). Evicting only a stealer
// at the head of its chain, whose move could mislead no reader past other
// keys, left 4 points more of the entries of a churned table out of the
// home slots they could have (of their group, or without groups their
// own): a new entry of the stealer's bucket goes in front of it. The walk
// to the stealer is short: at one entry per bucket a chain holds one or
// two entries.
func (t *Table[T]) evict(a *tableArray[T], st *stripe, s, b, c uint32) (i uint32, ok, done bool) {
	home := a.home.slot(c)
	d := a.b.bucket(uint32(t.nodes.at(home).key.meta.Load() >> 32))
	if a.home.sameGroup(b, d) {
		return 0, false, false
	}
	prev := &a.b.heads[d]
	for prev.load() != nodeLink(home) {
		prev = &t.nodes.at(prev.load().index()).next
	}
	to, ok := t.spare(a, st, s, d)
	if !ok {
		return 0, false, true
	}
	t.move(a, prev, d, home, to)
	return home, true, true
}

// move moves the entry in node from, linked in bucket d's chain at field
// prev (the head or its predecessor's next), to free node to, and leaves
// from free and unlinked. The caller holds the chain's stripe lock.
//
// N.B. a move can hide keys from a walk that overlaps it: node to may be
// recycled from the chain a reader walks, and a reader standing on it has
// read its old key and goes on from the copy's place, right behind the
// original: past the moved key, and past any keys between node to's old
// place in the chain and the original's. So move first counts itself in
// the stripe's moves, and a lookup that ends in a miss restarts if the
// count changed since it began. The count goes up before any write of the
// move, and lookups load it before the head: incremented at the end, or
// loaded after the head, it would miss a move that recycles a node under a
// reader. A hit is never wrong (a reader trusts a match only across an
// unchanged seq), and a reader that comes to node to from another chain
// ends on d's marker and restarts. Lookups that skip the count (present)
// trust only their hits.
func (t *Table[T]) move(a *tableArray[T], prev *linkField, d, from, to uint32) {
	mc := &t.moves[d&a.b.stripeMask].n
	mc.Store(mc.Load() + 1)
	e := t.nodes.at(from)
	k := e.key.load()
	// N.B. the key is in two live entries for a moment, with one value:
	// a lookup may find either. The copy is linked right behind the
	// original and made live before the original is freed and unlinked,
	// so that a reader that would have reached the original reaches one
	// of them.
	t.fill(to, &k, e.val.Load(), &e.next)
	t.unlinkLocked(prev, nodeLink(from))
}

// spare returns a free node for an entry of bucket b that cannot have its
// home slot: the free home slot of another bucket of b's home group, else a
// spare node. The caller holds the lock of stripe s (st).
func (t *Table[T]) spare(a *tableArray[T], st *stripe, s, b uint32) (uint32, bool) {
	if i, ok := t.groupSlot(a, st, b); ok {
		return i, true
	}
	return t.spareNode(a, st, s)
}

// groupSlot takes a free home slot of another bucket of b's home group, if
// there is one; the caller holds the lock of b's stripe st.
func (t *Table[T]) groupSlot(a *tableArray[T], st *stripe, b uint32) (uint32, bool) {
	for _, x := range a.home.group[:a.home.groupOthers()] {
		if a.home.take(st, b^x) {
			return a.home.slot(b ^ x), true
		}
	}
	return 0, false
}

// spareNode returns a node for an entry that no home slot of its group can
// hold: the free home slot of a bucket of stripe s (st), stolen (see
// home.go); else a node freed under the stripe before; else a node from the
// store. The caller holds st's lock.
//
// N.B. free home slots come first so that the nodes a table holds beyond
// them do not grow under churn. Taken after the stripe's cached nodes, the
// slots stayed free wherever entries in nodes of their own were deleted and
// their nodes taken again, while stripes whose entries outnumber their
// buckets took more nodes from the store: after 16 rounds of churn of a
// table of 2^18 random flows, each round replacing every flow, it held 64.8
// bytes per entry and growing, against 61.8 and steady this way. The cost:
// churn of a 1K table 1.4% slower in a table per goroutine (a cold slot
// where a cached node was warm), at 1M unchanged (8 interleaved rounds).
func (t *Table[T]) spareNode(a *tableArray[T], st *stripe, s uint32) (uint32, bool) {
	if b, ok := a.home.steal(st, s); ok {
		return a.home.slot(b), true
	}
	if i, ok := st.cache.cached(); ok {
		return i, true
	}
	return t.nodes.get(&st.cache)
}

// unlinkLocked deletes the entry of link l, linked by prev, and returns its
// value; the caller frees its node. The caller holds the chain's stripe
// lock.
func (t *Table[T]) unlinkLocked(prev *linkField, l link) *T {
	e := t.nodes.at(l.index())
	e.seq.Store(e.seq.Load() + 1) // free: N.B. before unlinking, and before the value is cleared (see entry)
	unlink(prev, &e.next)
	v := e.val.Load()
	e.val.Store(nil)
	return v
}

// free returns node i, deleted under stripe st, for reuse. The caller holds
// st's lock. A home slot whose bucket still has entries is not freed but
// refilled at once with the entry at the head of that bucket's chain, and
// the node that entry leaves is freed in turn: so a home slot is free only
// while its bucket is empty.
func (t *Table[T]) free(a *tableArray[T], st *stripe, i uint32) {
	for {
		c, ok := a.home.isHome(i)
		if !ok {
			// A stripe that has free home slots takes them before
			// its cached nodes (spareNode): it keeps few, and the
			// depot passes the rest to stripes that need nodes.
			limit := t.nodes.cacheMax()
			if st.homeFree > 0 {
				limit = t.nodes.batchSize()
			}
			t.nodes.put(&st.cache, i, limit)
			return
		}
		head := a.b.heads[c].load()
		if head.isNulls() {
			a.home.release(st, c)
			if a.home.grouped() { // see steal
				st.homeLast = c + 1
			}
			return
		}
		j := head.index()
		t.move(a, &a.b.heads[c], c, j, i)
		i = j
	}
}

// Delete removes tup and returns its value.
func (t *Table[T]) Delete(tup Tuple) (*T, bool) {
	var k key
	t.tupleKey(&k, &tup)
	return t.delete(&k, nil)
}

// CompareAndDelete removes tup if its value is old (the same pointer), and
// reports whether it did, as sync.Map's CompareAndDelete: a flow reaper that read old can
// remove the flow without removing a newer one that took the same 4-tuple
// since. A nil old deletes nothing.
func (t *Table[T]) CompareAndDelete(tup Tuple, old *T) (deleted bool) {
	if old == nil {
		return false
	}
	var k key
	t.tupleKey(&k, &tup)
	_, deleted = t.delete(&k, old)
	return deleted
}

// CompareAndSwap sets the value of tup to new if it is old (the same
// pointer), and reports whether it did, as sync.Map's CompareAndSwap. The
// entry stays in its chain and only its value changes, so a lookup running
// meanwhile finds old or new, never neither: a connection can take over the
// 4-tuple of a TIME_WAIT socket with no moment at which its segments find
// no socket, as they would between a Delete and an Insert. (Linux's
// inet_ehash_insert makes this takeover, from the old socket osk to the
// new, under the bucket lock.) A nil old or new swaps nothing.
func (t *Table[T]) CompareAndSwap(tup Tuple, old, new *T) (swapped bool) {
	if old == nil || new == nil {
		return false
	}
	var k key
	t.tupleKey(&k, &tup)
	a, st, _, _ := t.lockStripe(uint32(k.meta>>32), lockOnly)
	defer st.mu.Unlock()
	_, l := t.findLocked(a, &k)
	if l.isNulls() {
		return false
	}
	e := t.nodes.at(l.index())
	if e.val.Load() != old {
		return false
	}
	// N.B. seq stays odd: a reader that loaded the value before this store
	// returns old, one after it new, and both were the entry's value while
	// it read.
	e.val.Store(new)
	return true
}

// delete removes k if its value is old, or whatever its value if old is
// nil, and returns the value removed.
func (t *Table[T]) delete(k *key, old *T) (*T, bool) {
	a, st, _, _ := t.lockStripe(uint32(k.meta>>32), lockToDelete)
	defer st.mu.Unlock()
	prev, l := t.findLocked(a, k)
	if l.isNulls() || (old != nil && t.nodes.at(l.index()).val.Load() != old) {
		return nil, false
	}
	v := t.unlinkLocked(prev, l)
	t.free(a, st, l.index())
	st.count.Store(st.count.Load() - 1)
	return v, true
}

// Len returns the number of entries. Under concurrent writes it is a
// moment's count of each stripe, not a snapshot of the whole table.
func (t *Table[T]) Len() int {
	var n int64
	ss := t.arr.Load().b.stripes
	for i := range ss {
		n += int64(ss[i].count.Load())
	}
	return int(n)
}

// All returns an iterator over the entries. Like sync.Map.Range it is
// weakly consistent: an entry present for the whole iteration is yielded
// exactly once, even if Grow runs meanwhile; one inserted or deleted
// meanwhile may or may not be. The loop body may call any method of the
// table.
//
// N.B. it copies one bucket's chain at a time under the bucket's stripe
// lock (after the stripe's entries have moved into the table's array, if a
// Grow is moving them: see lockStripe), and visits the buckets in the order of a counter whose bits are
// reversed (as Redis's SCAN): when Grow multiplies the bucket count by 2^j,
// the entries of bucket b go to the buckets that share b's low bits, which
// lie side by side in that order, where b lay. So the buckets of the new
// array left to visit hold exactly the entries of the old buckets left to
// visit.
func (t *Table[T]) All() iter.Seq2[Tuple, *T] {
	return func(yield func(Tuple, *T) bool) {
		type pair struct {
			tup Tuple
			v   *T
		}
		var chain []pair
		var c uint32 // the counter, bits reversed
		for {
			// Copy one chain under its lock, then yield outside it, so
			// that the body may write to the table.
			chain = chain[:0]
			a, st, _, b := t.lockStripe(c, lockOnly)
			for l := a.b.heads[b].load(); !l.isNulls(); {
				e := t.nodes.at(l.index())
				k := e.key.load()
				chain = append(chain, pair{
					tup: Tuple{
						Local:  netip.AddrPortFrom(wordsAddr(k.local), uint16(k.meta>>16)),
						Remote: netip.AddrPortFrom(wordsAddr(k.remote), uint16(k.meta)),
					},
					v: e.val.Load(),
				})
				l = e.next.load()
			}
			st.mu.Unlock()
			for _, p := range chain {
				if !yield(p.tup, p.v) {
					return
				}
			}
			c = bits.Reverse32(bits.Reverse32(c|^a.b.mask) + 1)
			if c == 0 {
				return
			}
		}
	}
}

// Stats describes a table's shape.
type Stats struct {
	Buckets     int // bucket count, a power of two
	LockStripes int // writer lock count, a power of two
	Entries     int // entries counted in the chains
	// LongestChain is the length of the longest chain.
	LongestChain int
	// ChainLengths[n] is the number of buckets whose chain holds n entries.
	ChainLengths []int
	// LookupRestarts counts lookups that started a chain walk again: they
	// met an entry deleted, recycled or moved under them, ended on the
	// nulls marker of another chain, or missed while an entry of their
	// stripe moved.
	LookupRestarts uint64
	// HomeEntries counts the entries found in their bucket's home slot,
	// which a lookup reaches without walking the chain.
	HomeEntries int
	// GroupEntries counts the entries found in the home slot of another
	// bucket of their home group, which a lookup also reaches without
	// walking the chain; zero in tables without home groups (home.go).
	GroupEntries int
	// Nodes counts the entry nodes the table holds, live or free: the
	// one reserved per bucket and those allocated beyond, less those
	// given back to the heap, by Grow (the old array's home slots) and
	// by Compact.
	Nodes int
}

// Stats walks every chain, one stripe lock at a time, and returns the
// table's shape. If Grow replaces the bucket array meanwhile, it walks the
// new one from the start.
func (t *Table[T]) Stats() Stats {
	for {
		if s, ok := t.stats(); ok {
			return s
		}
	}
}

// stats is Stats over the current array; false if Grow replaced it.
func (t *Table[T]) stats() (Stats, bool) {
	a := t.arr.Load()
	s := Stats{Buckets: len(a.b.heads), LockStripes: len(a.b.stripes)}
	for b := range a.b.heads {
		// N.B. lockStripe moves the stripe's entries into the table's
		// array if a Grow is moving them.
		la, st, _, _ := t.lockStripe(uint32(b), lockOnly)
		if la != a {
			st.mu.Unlock()
			return s, false
		}
		n := 0
		for l := a.b.heads[b].load(); !l.isNulls(); l = t.nodes.at(l.index()).next.load() {
			n++
			if hb, ok := a.home.isHome(l.index()); ok && hb == uint32(b) {
				s.HomeEntries++
			} else if ok && a.home.sameGroup(hb, uint32(b)) {
				s.GroupEntries++
			}
		}
		st.mu.Unlock()
		for len(s.ChainLengths) <= n {
			s.ChainLengths = append(s.ChainLengths, 0)
		}
		s.ChainLengths[n]++
		s.Entries += n
		s.LongestChain = max(s.LongestChain, n)
	}
	s.LookupRestarts = t.restarts.Load()
	s.Nodes, _ = t.nodes.stats()
	return s, true
}

// Grow sizes the table for about n entries, as WithCapacity sizes a new
// one: if n rounded up to a power of two (at most 2^29) is more buckets
// than the table has, it replaces the bucket array with one of that many,
// and otherwise does nothing. If the new array's home slots would not fit
// in the table's index space it returns ErrTableFull and changes nothing.
//
// A table grows itself past about two entries per bucket (see Table,
// Growth); Grow sizes it ahead of a known load instead, or grows a table
// made WithFixedBuckets.
//
// Every method may run while Grow runs, and finds every entry. Grow
// publishes the new array at once and then moves the entries into it one
// lock stripe at a time, under that stripe's lock, as rhashtable moves
// entries a bucket at a time. A writer (or All, or Stats) that comes to a
// stripe whose entries have not moved yet moves them itself first. So an
// Insert, Delete or swap waits at most for the move of one stripe's
// entries, 0.2 to 0.4 µs each: with the default stripes, about a thousand
// entries in a table of a million, as against the whole table. (Connect
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
// table keeps those. Made for 2^15 entries, filled, grown to 2^16 and
// filled again, a table holds 63.5 bytes per entry, as one made for 2^16
// does (TestTableMemoryPerEntry).
func (t *Table[T]) Grow(n int) error {
	t.growMu.Lock()
	defer t.growMu.Unlock()
	return t.grow(n)
}

// grow is Grow, with growMu held.
func (t *Table[T]) grow(n int) error {
	old := t.arr.Load()
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
	adviseHugePages(homes)
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
	a.b.initShared(nb, ss, old.b.nullsBase^arrayNullsFlip)
	a.home.init(nb, len(ss), base, t.groups.grouped(nb))
	a.growAt = t.growLimit(nb, len(ss))
	// N.B. old is set before the array is published, and cleared only
	// once every stripe's entries are in it: a lookup that finds old nil
	// in the table's array needs no other (see lookup).
	a.old.Store(old)
	t.arr.Store(a)
	for s := range ss {
		if t.growStep != nil {
			t.growStep(uint32(s))
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
				if t.relinked != nil {
					t.relinked(l.index())
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
