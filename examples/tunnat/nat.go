package main

import (
	"fmt"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/hash4/hash4"
	"github.com/hash4/hash4/nat"
)

// This file joins the flags to the nat package: the NAT's configuration,
// and the counters the progress line and the summary print. The packet
// work, tables, expiry and limits are the package's.

// natConfig is what the flags say of the NAT; the topology adds the
// addresses.
type natConfig struct {
	pool               int // external IPv4 (and IPv6) addresses, from extAddr4 (extAddr6) up
	ports              hash4.PortRange
	mapping, filtering nat.Behavior
	pooling            nat.Pooling
	portPreservation   bool
	parityPreservation bool
	blocks             nat.Blocks
	maxFlows           int
	maxFlowsPerHost    int
	capacity           int
	timeouts           nat.Timeouts
	mtu                int
}

// natOf returns the package's configuration for c: the pool from the
// topology's external addresses, and the NAT's own inside addresses for
// the ICMP errors it sends.
func natOf(c natConfig) nat.Config {
	var pool []netip.Addr
	a4, a6 := extAddr4, extAddr6
	for range max(c.pool, 1) {
		pool = append(pool, a4, a6)
		a4, a6 = a4.Next(), a6.Next()
	}
	b := nat.Behaviors{Mapping: c.mapping, Filtering: c.filtering}
	return nat.Config{
		External: pool, Ports: c.ports, TCP: b, UDP: b, ICMP: b,
		PortPreservation: c.portPreservation, ParityPreservation: c.parityPreservation,
		Pooling: c.pooling, Blocks: c.blocks, MaxFlows: c.maxFlows, MaxFlowsPerHost: c.maxFlowsPerHost, Capacity: c.capacity,
		Timeouts: c.timeouts, Tick: tickFor(c.timeouts), MTU: c.mtu,
		Router: []netip.Addr{gwInside4, gwInside6},
	}
}

// tickFor returns the expiry tick: a quarter of the shortest timeout,
// between 10ms and 1s.
func tickFor(to nat.Timeouts) time.Duration {
	d := to
	m := time.Second
	for _, v := range []time.Duration{d.UDP, d.UDPUnreplied, d.ICMP, d.TCPSynSent, d.TCPSynRecv, d.TCPEstablished,
		d.TCPFinWait, d.TCPCloseWait, d.TCPLastAck, d.TCPTimeWait, d.TCPClose} {
		if v > 0 {
			m = min(m, v/4)
		}
	}
	return max(m, 10*time.Millisecond)
}

// counters are what the gateway counts itself: packets and bytes
// forwarded each way (hairpinned ones and the NAT's own ICMP errors with
// those going in; a GSO super-packet counts once, coalesced datagrams one
// each), writes that failed; packets read, the GSO super-packets among
// them and about how many segments they held, and reads that failed or
// gave a packet tunnat could not pass on.
type counters struct {
	pktsOut, pktsIn         atomic.Int64
	bytesOut, bytesIn       atomic.Int64
	writeErrors             atomic.Int64
	reads, gsoReads         atomic.Int64
	gsoSegments, readErrors atomic.Int64
}

// stats is a snapshot of the NAT's metrics and the gateway's counters.
type stats struct {
	nat.Metrics
	PktsOut, PktsIn, BytesOut, BytesIn int64
	WriteErrors                        int64
	Reads, GSOReads, GSOSegments       int64
	ReadErrors                         int64
}

// dropped returns the drops, the NAT's and the failed writes and reads.
func (s stats) dropped() uint64 { return s.Dropped() + uint64(s.WriteErrors+s.ReadErrors) }

// drops lists the drops by reason, "none" if there are none.
func (s stats) drops() string {
	d := s.DropsString()
	for _, e := range []struct {
		name string
		n    int64
	}{{"write error", s.WriteErrors}, {"read error", s.ReadErrors}} {
		if e.n != 0 {
			if d != "" {
				d += ", "
			}
			d += fmt.Sprintf("%s %d", e.name, e.n)
		}
	}
	if d == "" {
		return "none"
	}
	return d
}

// String gives the counters on one line.
func (s stats) String() string {
	return fmt.Sprintf("flows created %d, expired %d (early %d), active %d, mappings %d; packets out %d (%d bytes), in %d (%d bytes); read %d, of them GSO super-packets %d (about %d segments); dropped %d: %s",
		s.FlowsCreated, s.Expired[nat.ExpiredTimeout]+s.Expired[nat.ExpiredEarlyDrop], s.Expired[nat.ExpiredEarlyDrop],
		s.Flows, s.Mappings, s.PktsOut, s.BytesOut, s.PktsIn, s.BytesIn, s.Reads, s.GSOReads, s.GSOSegments, s.dropped(), s.drops())
}
