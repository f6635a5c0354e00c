package nat

import "github.com/hash4/hash4"

// Batches: a gateway that reads packets in bursts (a TUN device's GSO
// read split into segments, a ring of frames) translates each burst with
// one call. The batch is parsed first, the keys of all its packets'
// flows looked up with one Table.AppendLookups per protocol table, which
// overlaps their cache misses, and only then is each packet translated,
// in order, by the path Outbound and Inbound take, given the flow the
// lookup found. A flow made or ended by an earlier packet of the batch is
// seen by the later ones: a flow the lookup missed, or found dead, is
// looked up again.

// Verdict is what OutboundBatch or InboundBatch did with one packet.
type Verdict struct {
	// Len is the length of the translated packet, pkts[i][:Len], which
	// the caller sends to To. It is 0 when the caller has nothing to
	// send: the packet was dropped (Drop says why), held (a fragment that
	// came before its datagram's first), or sent through emit in
	// fragments (larger than Config.MTU).
	Len int
	// To is the side the translated packet goes to: Outside, or Inside
	// for a hairpinned packet and one of the NAT's ICMP errors that
	// replaced it.
	To Side
	// Drop is why the packet was dropped, DropNone if it was not.
	Drop Drop
}

// Offload is what a packet's offload metadata says: Linux's virtio-net
// header, read with the packet from a TUN device of IFF_VNET_HDR, or a
// socket buffer's checksum state. The translated packet keeps it: the
// caller sends it with the same metadata.
type Offload struct {
	// PartialChecksum says that the packet's TCP or UDP checksum field
	// holds only the pseudo-header's sum (CHECKSUM_PARTIAL,
	// VIRTIO_NET_HDR_F_NEEDS_CSUM with the checksum at the transport
	// header's), which the receiver completes over the segment: the NAT
	// updates it for the addresses only. A packet of another protocol, or a
	// fragment, with a partial checksum is dropped (DropUnsupported): the
	// caller completes such checksums first.
	PartialChecksum bool
	// SegmentSize, if not 0, says that the packet is a GSO super-packet,
	// to be cut into segments of this much payload: Config.MTU applies to
	// its segments, and it is never fragmented.
	SegmentSize int
}

// Batch is the working memory of OutboundBatch and InboundBatch: the
// parsed packets, their keys, the flows found and the verdicts. Its zero
// value is ready to use; it grows to the largest batch it is given and
// keeps that memory, so that a gateway's steady state allocates nothing.
// A Batch is for one goroutine at a time.
type Batch struct {
	v    []Verdict
	pkts []packet
	// ref is, per packet, its key's index in tups[its protocol], -1 if it
	// has none (dropped by the parser, an ICMP error, a later fragment).
	ref   []int32
	tups  [numProtos][]hash4.Tuple
	flows [numProtos][]*flow
	// The keys of the tups' mappings, and the mappings found (lookups).
	mkeys []hash4.Tuple
	maps  []*mapping
	// During a call: the packet being translated, its index, the caller's
	// emit, and capture bound once as an Emit.
	cur  []byte
	i    int
	user Emit
	emit Emit
}

// OutboundBatch translates pkts, packets from the inside, in place, as
// Outbound translates each, and returns their verdicts, one per packet in
// order. off is nil, or holds each packet's offload metadata (off[i] for
// pkts[i]; missing entries are zero): each translated packet is pkts[i][:v[i].Len], for the caller to
// send to v[i].To. What the NAT sends besides the batch's own packets (its
// ICMP errors, fragments of a packet larger than Config.MTU, fragments it
// held for a datagram whose first came) goes to emit during the call,
// before the caller sends the batch. Packets of one flow keep their order
// in the verdicts. Drops are counted in Metrics. The verdicts are b's,
// valid until its next use.
func (n *NAT) OutboundBatch(b *Batch, pkts [][]byte, off []Offload, emit Emit) []Verdict {
	return n.batch(b, pkts, off, Inside, emit)
}

// InboundBatch translates pkts, packets from the outside, in place, as
// Inbound translates each, and returns their verdicts as OutboundBatch
// does.
func (n *NAT) InboundBatch(b *Batch, pkts [][]byte, off []Offload, emit Emit) []Verdict {
	return n.batch(b, pkts, off, Outside, emit)
}

// batch translates pkts from side from.
func (n *NAT) batch(b *Batch, pkts [][]byte, off []Offload, from Side, emit Emit) []Verdict {
	b.grow(len(pkts))
	v, ps, ref := b.v[:len(pkts)], b.pkts[:len(pkts)], b.ref[:len(pkts)]
	for pr := range b.tups {
		b.tups[pr] = b.tups[pr][:0]
	}
	for i, pkt := range pkts {
		p := &ps[i]
		v[i], ref[i] = Verdict{}, -1
		why := parse(pkt, p)
		if i < len(off) && why == DropNone {
			p.partial, p.segSize = off[i].PartialChecksum, max(off[i].SegmentSize, 0)
			if p.partial && (p.proto != ipTCP && p.proto != ipUDP || p.frag) {
				why = DropUnsupported
			}
		}
		if why != DropNone {
			v[i].Drop = why
			continue
		}
		if p.frag && !p.first || p.icmpErr {
			continue // no flow of its own to look up
		}
		var k hash4.Tuple
		pr, _ := flowKey(p, from, &k)
		t := b.tups[pr]
		// The segments of a GSO read are of one flow: one lookup for a
		// run of them.
		if m := len(t); m > 0 && t[m-1] == k {
			ref[i] = int32(m - 1)
			continue
		}
		ref[i] = int32(len(t))
		b.tups[pr] = append(t, k)
	}
	for pr := range b.tups {
		if len(b.tups[pr]) > 0 {
			b.flows[pr] = b.lookups(&n.proto[pr], b.flows[pr][:0], b.tups[pr], from)
		}
	}
	if b.emit == nil {
		b.emit = b.capture
	}
	b.user = emit
	for i, pkt := range pkts {
		why := v[i].Drop
		if why == DropNone {
			var known *flow
			if r := ref[i]; r >= 0 {
				known = b.flows[protoOf(ps[i].proto)][r]
			}
			b.cur, b.i = pkt, i
			why = n.translate(pkt, &ps[i], from, b.emit, known)
			v[i].Drop = why
		}
		if why != DropNone {
			v[i].Len = 0
			n.ctr.drops[why].Add(1)
		}
	}
	b.cur, b.user = nil, nil
	return v
}

// lookups appends to dst the live flow of each key of ks from side from,
// nil if none, as lookupOut and lookupIn find them: where mappings hold
// their first flow, the mappings are looked up in one batch, and the
// flows that are not their mappings' first one by one.
func (b *Batch) lookups(ps *protoState, dst []*flow, ks []hash4.Tuple, from Side) []*flow {
	mt, ft := ps.maps, ps.fwd
	if from == Outside {
		mt, ft = ps.extm, ps.rev
	}
	if !ps.keyless() {
		// N.B. flowOf takes a flow found not live as a miss.
		return ft.AppendLookups(dst, ks)
	}
	b.mkeys = b.mkeys[:0]
	for i := range ks {
		b.mkeys = append(b.mkeys, soloKey(ks[i].Local)) // as lookup
	}
	b.maps = mt.AppendLookups(b.maps[:0], b.mkeys)
	for i, m := range b.maps {
		f := m.firstTo(ks[i].Remote)
		if f == nil {
			f = ps.notFirst(m, &ks[i], from)
		}
		dst = append(dst, f)
	}
	return dst
}

// capture is the Emit a batch's packets are translated with: the packet
// translated in place (it starts where the batch's buffer does) becomes
// its verdict; anything else the NAT sends goes to the caller's emit.
func (b *Batch) capture(to Side, pkt []byte) {
	if len(pkt) > 0 && len(b.cur) > 0 && &pkt[0] == &b.cur[0] {
		b.v[b.i].Len, b.v[b.i].To = len(pkt), to
		return
	}
	b.user(to, pkt)
}

// grow makes room for n packets.
func (b *Batch) grow(n int) {
	if len(b.v) >= n {
		return
	}
	b.v = make([]Verdict, n)
	b.pkts = make([]packet, n)
	b.ref = make([]int32, n)
}
