package nat

import (
	"net/netip"
	"testing"
	"time"

	"github.com/hash4/hash4"
)

// The cost of expiry at a million mappings: each op is one second of the
// NAT's clock, one Expire call, so ns/op is the CPU time expiry takes per
// second of wall time. "Idle": nothing is due (every flow's deadline is
// past the wheel's span, so each tick looks at an empty slot, and the
// flows come up once a span, 4096 s, to be filed again). "Expiring10k":
// flows made 10,000 a second, 100 s apart from their timeout, so that
// each second 10,000 expire (a mapping and its first flow: its two keys,
// the port) while as many are made (not timed). "Sweep" is what the full
// sweep of a reaper costs: DeleteFunc over the million inside keys (the
// mappings', which hold their flows), deleting nothing.

const benchFlows = 1 << 20

// fillNAT makes benchFlows endpoint-independent mappings, perSecond each
// second of the clock, from 16,384 hosts of 64 ports each, over 20
// external addresses in blocks of 64 ports (the allocator's own choice,
// BindEphemeral, scans a nearly full range port by port).
func fillNAT(b *testing.B, to Timeouts, perSecond int) (*NAT, *testClock) {
	var pool []netip.Addr
	for i := range 20 {
		pool = append(pool, netip.AddrFrom4([4]byte{192, 0, 2, byte(1 + i)}))
	}
	n, clk := newTest(b, Config{External: pool, Timeouts: to, MaxFlows: 2 * benchFlows,
		Ports: hash4.PortRange{Low: 1024, High: 65535}, Blocks: Blocks{Size: 64}})
	r := ap("198.51.100.1", 443)
	for i := range benchFlows {
		if i > 0 && i%perSecond == 0 {
			clk.advance(time.Second)
		}
		src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 14), byte(i >> 6)}), uint16(1024+i%64))
		if _, why := n.MapOutbound(UDP, src, r); why != DropNone {
			b.Fatalf("flow %d: %v", i, why)
		}
	}
	return n, clk
}

func BenchmarkExpire1M(b *testing.B) {
	b.Run("Idle", func(b *testing.B) {
		n, clk := fillNAT(b, Timeouts{UDPUnreplied: 5 * 24 * time.Hour}, benchFlows)
		b.ResetTimer()
		for range b.N {
			if clk.advance(time.Second) != 0 {
				b.Fatal("a flow expired")
			}
		}
		b.StopTimer()
		if f, _ := n.Len(); f != benchFlows {
			b.Fatalf("%d flows", f)
		}
	})
	b.Run("Expiring10k", func(b *testing.B) {
		const perSecond = 10000
		n, clk := fillNAT(b, Timeouts{UDPUnreplied: benchFlows / perSecond * time.Second}, perSecond)
		r := ap("198.51.100.2", 443)
		next := 0
		b.ResetTimer()
		for range b.N {
			b.StopTimer()
			for range perSecond {
				i := next
				next++
				src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 2, byte(i >> 14), byte(i >> 6)}), uint16(1024+i%64))
				if _, why := n.MapOutbound(UDP, src, r); why != DropNone {
					b.Fatalf("new flow: %v", why)
				}
			}
			b.StartTimer()
			if got := clk.advance(time.Second); got < perSecond*9/10 || got > perSecond*11/10 {
				b.Fatalf("%d expired in a second", got)
			}
		}
	})
	b.Run("Sweep", func(b *testing.B) {
		n, _ := fillNAT(b, Timeouts{UDPUnreplied: 5 * 24 * time.Hour}, benchFlows)
		b.ResetTimer()
		for range b.N {
			n.proto[UDP].maps.DeleteFunc(func(hash4.Tuple, *mapping) bool { return false })
		}
	})
}
