package nat

import (
	"fmt"
	"strings"
	"sync/atomic"
)

// Drop says why the NAT did not translate a packet, or refused a flow;
// DropNone is no drop. Every drop is counted in Metrics.Drops.
type Drop uint8

// The drop reasons. The refusals of a new flow are DropNoPort, DropNoBlock,
// DropTableFull, DropHostLimit and DropFiltered.
const (
	DropNone            Drop = iota
	DropMalformed            // too short, bad version, bad lengths, no port
	DropChecksum             // bad IPv4 header checksum; bad ICMP checksum of an error
	DropOptions              // IPv4 source route options, IPv6 routing header with segments left
	DropBadTCP               // TCP data offset under 5 or past the segment
	DropUnsupported          // another protocol, ICMP type, extension header, family without external address
	DropNotOurs              // inbound to an address not in the pool
	DropNoFlow               // inbound of no flow and no mapping
	DropFiltered             // inbound refused by the filtering behaviour
	DropTCPState             // TCP segment other than SYN of no flow
	DropOutOfWindow          // RST, FIN or SYN outside the sequence window (a blind one)
	DropNoPort               // no external port free for a new mapping or flow
	DropNoBlock              // no port block for a new host
	DropTableFull            // MaxFlows reached and no unassured flow to evict
	DropHostLimit            // MaxFlowsPerHost reached for the inside host
	DropTTL                  // TTL or hop limit would reach 0 (time exceeded sent)
	DropTooBig               // larger than the MTU, and DF set or IPv6 (error sent)
	DropFragment             // fragment without a datagram: too many held, overlap, first fragment too short
	DropFragmentTimeout      // fragments held when their datagram's first never came
	DropICMPError            // ICMP error of no flow, or whose embedded packet is cut or malformed
	DropBusy                 // a new flow raced with another for its keys, too long
	DropAddress              // an address no router forwards (unspecified, loopback, multicast, link-local, broadcast), or from outside the NAT's own as source
	NumDrops
)

var dropNames = [NumDrops]string{
	"none", "malformed", "checksum", "options", "bad tcp", "unsupported", "not ours", "no flow",
	"filtered", "tcp state", "out of window", "no port", "no block", "table full", "host limit",
	"ttl", "too big", "fragment", "fragment timeout", "icmp error", "busy", "address",
}

// String names the reason.
func (d Drop) String() string {
	if d < NumDrops {
		return dropNames[d]
	}
	return fmt.Sprintf("Drop(%d)", uint8(d))
}

// Error makes a Drop an error: "nat: " and its name.
func (d Drop) Error() string { return "nat: " + d.String() }

// Expiry says why a flow ended.
type Expiry uint8

const (
	// ExpiredTimeout: idle past its timeout.
	ExpiredTimeout Expiry = iota
	// ExpiredEarlyDrop: evicted, unassured, for a new flow at MaxFlows.
	ExpiredEarlyDrop
	// ExpiredFlush: ended by Flush.
	ExpiredFlush
	// NumExpiries is the number of reasons.
	NumExpiries
)

var expiryNames = [NumExpiries]string{"timeout", "early drop", "flush"}

// String names the reason.
func (e Expiry) String() string {
	if e < NumExpiries {
		return expiryNames[e]
	}
	return fmt.Sprintf("Expiry(%d)", uint8(e))
}

// counters are the NAT's event counts. They change on creations, drops and
// expiries, not on a translated packet.
type counters struct {
	flowsCreated, mappingsCreated atomic.Uint64
	expired                       [NumExpiries]atomic.Uint64
	drops                         [NumDrops]atomic.Uint64
}

// Metrics are the NAT's counters and sizes, each read atomically but not
// together as one snapshot.
type Metrics struct {
	// Flows and Mappings are the flows and mappings now; an
	// address-and-port-dependent flow is its own mapping and counts as a
	// flow only.
	Flows, Mappings int
	// FlowsCreated and MappingsCreated count them since New.
	FlowsCreated, MappingsCreated uint64
	// Expired counts ended flows by reason.
	Expired [NumExpiries]uint64
	// Drops counts dropped packets and refused flows by reason.
	Drops [NumDrops]uint64
	// FragmentBytes is what counts now against Config.FragmentMemory:
	// the fragments held, and an entry's cost for each datagram known.
	FragmentBytes int
}

// Metrics returns the counters.
func (n *NAT) Metrics() Metrics {
	m := Metrics{
		Flows: int(n.flows.Load()), Mappings: int(n.mappings.Load()),
		FlowsCreated: n.ctr.flowsCreated.Load(), MappingsCreated: n.ctr.mappingsCreated.Load(),
		FragmentBytes: n.fragBytes(),
	}
	for i := range m.Expired {
		m.Expired[i] = n.ctr.expired[i].Load()
	}
	for i := range m.Drops {
		m.Drops[i] = n.ctr.drops[i].Load()
	}
	return m
}

// Dropped returns the sum of Drops.
func (m Metrics) Dropped() uint64 {
	var s uint64
	for _, d := range m.Drops {
		s += d
	}
	return s
}

// DropsString lists the drops that are not zero as "reason n, ...".
func (m Metrics) DropsString() string {
	var b strings.Builder
	for r, d := range m.Drops {
		if d != 0 {
			if b.Len() > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s %d", Drop(r).String(), d)
		}
	}
	return b.String()
}

// String gives the metrics on one line.
func (m Metrics) String() string {
	s := fmt.Sprintf("flows %d (created %d), mappings %d (created %d), expired %d by timeout, %d early, %d flushed; dropped %d",
		m.Flows, m.FlowsCreated, m.Mappings, m.MappingsCreated,
		m.Expired[ExpiredTimeout], m.Expired[ExpiredEarlyDrop], m.Expired[ExpiredFlush], m.Dropped())
	if d := m.DropsString(); d != "" {
		s += " (" + d + ")"
	}
	return s
}
