package hash4

// This file holds Compact: as the kernel's memory compaction empties a block
// to free it whole, entries move out of mostly free chunks of nodes, which
// then go back to the heap; free nodes lie among used ones otherwise.

// Compact gives back to the heap the free nodes the table keeps beyond
// what its entries are likely to need soon: call it after the flows have
// peaked and many have gone. It moves entries out of chunks of nodes at
// least half free and releases them, keeping free nodes for an eighth of
// the entries. Every method may run meanwhile; writers wait only for two
// brief passes over the processors' shards and for the move of one entry.
// The table never compacts by itself, as a filling table would allocate
// again.
func (t *Table[T]) Compact() {
	t.array() // a nil or zero Table panics here, named
	t.compact()
}

// compact is Compact; it returns the entries it moved and the chunks it
// released.
//
// N.B. growMu keeps growths out. While every shard is locked, no node moves
// between caches and the depot and no writer holds a node not yet linked,
// or freed and not yet cached (percpu.go's rule 2): so beginCompaction
// takes the victims' free nodes out of circulation at once, and
// endCompaction releases chunks no writer holds a node of. Between the two, put drops the victims' nodes, so a node
// seen free stays free. Lookups that stood on a moved entry see their
// line's seq change (bucket's rule 2); those that read a released chunk end
// on releasedNullsValue and restart.
func (t *Table[T]) compact() (moved, released int) {
	t.growMu.Lock()
	defer t.growMu.Unlock()
	caches := make([]*slabCache, len(t.shards))
	for i := range t.shards {
		caches[i] = &t.shards[i].cache
	}
	t.lockShards()
	v := t.nodes.beginCompaction(caches, max(int(t.count()/8), 2<<t.nodes.shift()))
	t.unlockShards()
	if v == nil {
		return 0, 0
	}
	for _, c := range v.chunks {
		first, end := v.nodes(c)
		for i := first; i < end; i++ {
			if !t.nodes.at(i).live() {
				continue
			}
			if free, did := t.moveOut(i); !free {
				v.stuck[c] = true
			} else if did {
				moved++
			}
		}
		if !v.stuck[c] {
			released++
		}
	}
	t.lockShards()
	t.nodes.endCompaction(v, func(n *node[T]) bool { return !n.live() }, markReleased[T])
	t.unlockShards()
	return moved, released
}

// lockShards and unlockShards lock and unlock every shard, in order.
func (t *Table[T]) lockShards() {
	for i := range t.shards {
		t.shards[i].take()
	}
}

func (t *Table[T]) unlockShards() {
	for i := range t.shards {
		t.shards[i].release()
	}
}

// markReleased makes n a node of the node store's released chunk: free,
// its next link ending on releasedNullsValue (see slab.releasing).
func markReleased[T any](n *node[T]) { n.next.initNulls(releasedNullsValue) }

// moveOut moves the entry in node i, found live, to another node under its
// bucket's lock, and reports whether i is free now and whether it moved the
// entry (else it was deleted meanwhile). N.B. the move changes the line's
// seq before it writes (bucket's rule 2): a reader on the taken node skips
// the keys between, so its miss must not be trusted.
func (t *Table[T]) moveOut(i uint32) (free, moved bool) {
	n := &t.nodes.at(i).entry
	k := n.key.load()
	_, b := t.lockBucket(k.hash())
	defer b.unlock()
	if !n.live() {
		return true, false
	}
	e, prev, at := t.findLocked(b, &k)
	if e == nil || at != i {
		return false, false
	}
	b.seq.Store(b.seq.Load() + seqGen)
	k = n.key.load() // a reservation's, as it is (see entry)
	j, m, sh := t.takeNode()
	if m == nil {
		return false, false
	}
	m.fill(&k, n.val.Load(), nodeLink(j), &n.next)
	sh.release()
	n.empty(prev)
	t.freeNode(i)
	return true, true
}
