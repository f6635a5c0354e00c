// Package nat is a network address translator (NAT44 and NAT66, TCP, UDP
// and ICMP echo) as RFC 4787, 5382 and 5508 describe one, on hash4's
// tables, for a gateway that calls it once per packet in each direction.
//
// A NAT made by New holds mappings (an inside endpoint and its external
// endpoint) and flows (a mapping and a remote endpoint). Outbound takes a
// packet from the inside, Inbound one from the outside; each rewrites it in
// place (addresses, ports or echo identifier, every checksum, the TTL) and
// hands what is to be sent to an Emit function, saying which side it goes
// to, or returns why it dropped it:
//
//	n, err := nat.New(nat.Config{External: []netip.Addr{extIP}, Router: []netip.Addr{insideIP}})
//	go n.Run(ctx) // expiry
//	emit := func(to nat.Side, pkt []byte) { dev[to].Write(pkt) }
//	for { pkt := readInside(); n.Outbound(pkt, emit) } // and Inbound on the other side
//
// OutboundBatch and InboundBatch translate a burst of packets at once (a
// TUN device's reads, a ring of frames): the flows of the whole batch are
// looked up with one Table.AppendLookups per table, which overlaps their
// cache misses, and each packet gets a Verdict: send pkts[i][:Len] to a
// side, or why it was dropped. A packet may carry offload metadata
// (Offload): a partial checksum, which the NAT updates for the addresses
// only, and a GSO super-packet's segment size, to which the MTU applies, so
// that a gateway passes 64 KiB super-packets through whole.
//
// MapOutbound and MapInbound do the same for a NAT that sees endpoints
// rather than packets.
//
// # Behaviour
//
//   - Mapping, per protocol: endpoint-independent (the default, RFC 4787
//     REQ-1), address-dependent, or address-and-port-dependent, which shares
//     external ports between inside endpoints toward different remotes as
//     Linux's masquerade does. Filtering: endpoint-independent,
//     address-dependent (the default: see Behaviors) or
//     address-and-port-dependent. Options: port preservation, parity
//     preservation; a pool of external addresses, paired (the default) or
//     arbitrary; port blocks per inside host, dynamic or deterministic
//     (RFC 7422), so that NATs given disjoint blocks of one address range
//     never give out the same port.
//   - Hairpinning: a packet from inside to an external endpoint of the NAT
//     goes back inside, from the sender's external endpoint, unfiltered.
//     Under address-and-port-dependent mapping an external port may belong
//     to several inside endpoints, and such packets are dropped.
//   - TCP is tracked as conntrack tracks it: established only after the
//     three-way handshake; a RST, FIN or SYN outside the sequence window is
//     dropped (DropOutOfWindow) and changes nothing, the flow's clock
//     included. What an endpoint would take passes: a RST refusing the SYN;
//     a RST in the window but not at the expected sequence, forwarded with
//     the flow kept (RFC 5961's challenge ACK); the originator's SYN again,
//     or on a flow it lost (the flow starts anew once answered). Only a
//     SYN makes a TCP flow; flags no TCP sends together are refused.
//   - ICMP: echo identifiers are mapped as ports; errors (destination
//     unreachable, packet too big, time exceeded, parameter problem) are
//     translated with the packet they carry, embedded checksums included
//     (RFC 5508), and never refresh a flow. With Config.Router the NAT
//     answers a TTL that runs out, a packet over Config.MTU, and a flow it
//     refuses, with ICMP errors of its own (at most 1000 a second each way).
//   - Fragments are tracked, not reassembled: the first carries the ports,
//     the others follow its translation (hairpinned too); those that come
//     first are held for Config.FragmentTimeout, the fragments held and
//     the datagrams tracked within Config.FragmentMemory.
//   - Packets a router refuses are dropped: a bad IPv4 header checksum,
//     IPv4 source-route options, an IPv6 routing header with segments left,
//     a TCP data offset under 5 or past the segment; an unspecified,
//     loopback, multicast, link-local, limited-broadcast or (in IPv6)
//     IPv4-mapped address; from outside, one of the NAT's own addresses
//     as the source (DropAddress).
//     An echo identifier of 0 is refused (DropMalformed): a table's key
//     has no port 0.
//   - Limits: Config.MaxFlows, past which a new flow evicts an unanswered
//     one (early drop: of the oldest few, the one whose inside host has the
//     most flows) or is refused; Config.MaxFlowsPerHost. The tables grow by
//     themselves while lookups go on; Config.Capacity sizes them at start.
//   - Expiry: idle timeouts per protocol and TCP state (Timeouts), on a
//     timing wheel that Expire (or Run) advances: it looks only at the flows
//     due, at most Config.ExpireBudget per call. A flow that ends early
//     (early drop, Flush) leaves the wheel as it ends, so a flood's churn
//     holds no memory past MaxFlows' flows.
//   - Metrics counts flows and mappings made, flows ended by reason, and
//     drops and refusals by reason.
//
// # Contract
//
// Every method is safe for concurrent use. Both keys of a flow (inside and
// outside) and of a mapping become visible together, with one atomic
// store, and vanish together. A packet's lookup takes no lock and
// allocates nothing; a TCP segment takes its flow's lock for the tracker.
// No input makes the NAT panic; a packet it cannot translate is dropped and
// counted by reason. The NAT's clock is the time of the last Expire call:
// a packet refreshes its flow to it, and a flow ends between its timeout
// and two ticks past it, never before. Expire looks at every tick since
// its last call, or after a pause longer than the wheel's 4096 ticks at
// each slot once.
//
// # Cost
//
// A packet of a known flow costs a parse, one Table.Lookup (in a batch, its
// share of an AppendLookups; a batch's run of packets of one flow, such as
// a GSO read's segments, one lookup) and an incremental checksum update;
// under endpoint-independent mapping the lookup is of the flow's mapping,
// which holds the flow that made it and the next two, and a packet of the
// mapping's fourth and later flows (a socket that talks to several
// remotes) costs a second lookup. A new mapping costs its port (a
// compare-and-swap in a bitmap of its external address's ports, 8 KiB per
// address in use and protocol) and two inserts into hash4 tables (its
// inside and external keys); under endpoint-independent mapping that and
// one allocation make its first flow too, and its second and third flows
// cost an allocation each. Any other flow costs two inserts (its keys)
// and an allocation, or under address-and-port-dependent mapping a
// Table.Connect and one insert. The module's docs/performance.md has the
// measurements, memory included.
package nat
