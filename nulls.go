package hash4

// This file holds the hlist_nulls primitives (include/linux/list_nulls.h,
// include/linux/rculist_nulls.h), over index links instead of pointers.
//
// Invariants, stated once and relied on by every chain in the package:
//
//  1. A chain never ends in "nil" but in a nulls marker that carries a value;
//     a table gives each chain its own value (its bucket index, plus a
//     per-table offset where chains of several kinds coexist, and a bit that
//     differs between a table's bucket arrays, see Table.Grow).
//  2. Readers walk chains without locks, with atomic loads only. Writers
//     change a chain only under the lock that covers it, with release
//     stores (release.go).
//  3. A node is published at the head, or behind a node: its next link is
//     set before the link that leads to it, so a reader that reaches the
//     node finds a well-formed rest of chain.
//  4. Unlinking a node leaves the node's own next link intact, so a reader
//     standing on it keeps walking. The node may be reused at once (entries
//     are recycled without waiting for readers, like SLAB_TYPESAFE_BY_RCU)
//     and linked into another chain; a reader standing on it then walks into
//     that chain and ends on its marker. A reader that ends on a marker
//     whose value is not the one of the chain it started in must restart.

// link is one hlist_nulls link: the index of a node, or a nulls marker. As
// in the kernel, where a marker is the odd pointer 1|(value<<1), bit 0 tells
// the two apart: a marker is value<<1|1, a node index i is i<<1. Index 0 is
// never a node, so the zero link is invalid rather than a valid reference.
type link uint32

// maxNullsValue is the largest value a marker can carry.
const maxNullsValue = 1<<31 - 1

// nullsLink returns the marker that ends the chain with value v.
func nullsLink(v uint32) link { return link(v<<1 | 1) }

// nodeLink returns the link to node i (i > 0).
func nodeLink(i uint32) link { return link(i << 1) }

// isNulls reports whether l is a marker (the kernel's is_a_nulls).
func (l link) isNulls() bool { return l&1 != 0 }

// nullsValue returns the value of marker l (the kernel's get_nulls_value).
func (l link) nullsValue() uint32 { return uint32(l >> 1) }

// index returns the node that l refers to; l must not be a marker.
func (l link) index() uint32 { return uint32(l >> 1) }

// linkField is a link read by lock-free readers: a chain head or a node's
// next field.
type linkField struct{ v relUint32 }

func (f *linkField) load() link   { return link(f.v.Load()) }
func (f *linkField) store(l link) { f.v.Store(uint32(l)) }

// initNulls makes head the head of an empty chain with marker value v
// (INIT_HLIST_NULLS_HEAD).
func (f *linkField) initNulls(v uint32) { f.store(nullsLink(v)) }

// linkAt links node, whose next field is nodeNext, at field at: at the head
// of the chain when at is its head (hlist_nulls_add_head_rcu), or behind a
// node when at is that node's next field (hlist_add_behind_rcu). The caller
// holds the chain's lock and has finished writing the node: N.B. nodeNext is
// set before at publishes the node, so readers never see a node without its
// rest of chain.
func linkAt(at *linkField, node link, nodeNext *linkField) {
	nodeNext.store(at.load())
	at.store(node)
}

// unlink removes the node whose next field is nodeNext from its chain, given
// the field that points at it, the head or the predecessor's next
// (hlist_nulls_del_rcu). The caller holds the chain's lock. N.B. nodeNext is
// left as it is: a reader standing on the node keeps walking.
func unlink(prevNext, nodeNext *linkField) {
	prevNext.store(nodeNext.load())
}
