package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"sync"
	"time"

	"github.com/hash4/hash4/nat"
)

// gateway runs a NAT between two multi-queue TUN devices: per queue, one
// goroutine reads batches from the inside device's queue and writes what
// the NAT emits to the outside device's queue of the same number
// (hairpinned packets and the NAT's own ICMP errors back to the inside
// queue), one does the same the other way; and one goroutine runs the
// NAT's expiry.
//
// A flow's packets stay in order: the kernel hands the packets of one flow
// to one queue of a device (the queue a packet of the flow was last
// written to, else one by the flow's hash: tun_automq_select_queue), and
// each queue is read by one goroutine, which translates and writes its
// packets in the order read. A flow's first packet is written to the
// other device on the queue it was read from, which is where the other
// device then sends its replies.
type gateway struct {
	nat     *nat.NAT
	c       counters
	inside  []*tunQueue // the client side, one per queue
	outside []*tunQueue // the server side
	stop    context.CancelFunc
	wg      sync.WaitGroup
}

// startGateway starts a NAT of cfg between the topology's TUN devices.
// stop ends it.
func startGateway(cfg natConfig, t *topology) (*gateway, error) {
	n, err := nat.New(natOf(cfg))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	g := &gateway{nat: n, inside: t.inside, outside: t.outside, stop: cancel}
	// The label marks the gateway's samples in a CPU profile, apart from
	// the clients and servers that -compare and the tests run in-process.
	pprof.Do(ctx, pprof.Labels("tunnat", "gateway"), func(ctx context.Context) {
		for q := range g.inside {
			g.wg.Add(2)
			go func() { defer g.wg.Done(); g.pump(ctx, nat.Inside, g.inside[q], g.outside[q]) }()
			go func() { defer g.wg.Done(); g.pump(ctx, nat.Outside, g.outside[q], g.inside[q]) }()
		}
		g.wg.Add(1)
		go func() { defer g.wg.Done(); n.Run(ctx) }()
	})
	return g, nil
}

// pump reads batches of packets from src, the queue of side from, hands
// each batch to the NAT, and writes the translated packets, each with the
// offload header it was read with (runs of UDP datagrams coalesced), to
// dst, the other side's queue, or back to src. It ends when ctx is done: a read deadline in the past then ends
// the read it waits in.
func (g *gateway) pump(ctx context.Context, from nat.Side, src, dst *tunQueue) {
	// A gateway before this one on the same device left its deadline in
	// the past.
	src.f.SetReadDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { src.f.SetReadDeadline(time.Now()) })
	defer stop()
	dev := [2]*tunQueue{nat.Inside: src, nat.Outside: dst}
	if from == nat.Outside {
		dev = [2]*tunQueue{nat.Inside: dst, nat.Outside: src}
	}
	translate := g.nat.OutboundBatch
	if from == nat.Outside {
		translate = g.nat.InboundBatch
	}
	rb, w := newReadBatch(), newWriter()
	count := g.count
	var b nat.Batch
	// What the NAT sends of its own (ICMP errors, fragments) goes at once,
	// without offload metadata.
	scratch := make([]byte, maxRead)
	emit := func(to nat.Side, pkt []byte) {
		g.count(to, len(pkt), dev[to].writePlain(scratch, pkt))
	}
	for {
		if err := src.read(rb); err != nil {
			if ctx.Err() != nil || errors.Is(err, os.ErrClosed) || errors.Is(err, os.ErrDeadlineExceeded) {
				return
			}
			g.c.readErrors.Add(1)
			continue // EINTR and the like; a dead device gives ErrClosed
		}
		g.c.reads.Add(int64(len(rb.pkts)))
		g.c.gsoReads.Add(int64(rb.gso))
		g.c.gsoSegments.Add(int64(rb.segs))
		g.c.readErrors.Add(int64(rb.bad))
		for i, v := range translate(&b, rb.pkts, rb.off, emit) {
			if v.Len > 0 {
				w.write(dev[v.To], v.To, rb, i, v.Len, count)
			}
		}
		w.flush(count)
	}
}

// count counts a packet of n bytes written to side to, or its write's
// failure.
func (g *gateway) count(to nat.Side, n int, err error) {
	switch {
	case err != nil:
		g.c.writeErrors.Add(1)
	case to == nat.Outside:
		g.c.pktsOut.Add(1)
		g.c.bytesOut.Add(int64(n))
	default:
		g.c.pktsIn.Add(1)
		g.c.bytesIn.Add(int64(n))
	}
}

// stats returns the NAT's metrics and the gateway's counters.
func (g *gateway) stats() stats {
	return stats{Metrics: g.nat.Metrics(), PktsOut: g.c.pktsOut.Load(), PktsIn: g.c.pktsIn.Load(),
		BytesOut: g.c.bytesOut.Load(), BytesIn: g.c.bytesIn.Load(), WriteErrors: g.c.writeErrors.Load(),
		Reads: g.c.reads.Load(), GSOReads: g.c.gsoReads.Load(), GSOSegments: g.c.gsoSegments.Load(), ReadErrors: g.c.readErrors.Load()}
}

// close stops the gateway and waits for its goroutines. The devices stay
// open: the topology owns them.
func (g *gateway) close() {
	g.stop()
	g.wg.Wait()
}

// progress writes a progress line about n to w every second (in place four
// times a second on a terminal) until the returned function is called,
// which ends the line.
func progress(w io.Writer, g *gateway, label func() string) (stop func()) {
	tty := isTerminal(w)
	every := time.Second
	if tty {
		every = 250 * time.Millisecond
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	wg.Go(func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		last, lastT := g.stats(), start
		for {
			select {
			case <-done:
				if tty {
					fmt.Fprintln(w)
				}
				return
			case now := <-tick.C:
				s := g.stats()
				dt := now.Sub(lastT).Seconds()
				line := fmt.Sprintf("%5.1fs  flows %d (created %d, expired %d)  out %.0f pkt/s %.1f Mbit/s  in %.0f pkt/s %.1f Mbit/s  dropped %s",
					now.Sub(start).Seconds(), s.Flows, s.FlowsCreated, s.Expired[nat.ExpiredTimeout]+s.Expired[nat.ExpiredEarlyDrop],
					float64(s.PktsOut-last.PktsOut)/dt, float64(s.BytesOut-last.BytesOut)*8/dt/1e6,
					float64(s.PktsIn-last.PktsIn)/dt, float64(s.BytesIn-last.BytesIn)*8/dt/1e6, s.drops())
				if label != nil {
					line += "  " + label()
				}
				last, lastT = s, now
				if tty {
					fmt.Fprintf(w, "\r%s\x1b[K", line)
				} else {
					fmt.Fprintln(w, line)
				}
			}
		}
	})
	return sync.OnceFunc(func() { close(done); wg.Wait() })
}

// isTerminal reports whether w is a character device, such as a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// runGateway builds the topology and runs the NAT until ctx is done, then
// prints the counters and removes the topology.
func runGateway(ctx context.Context, o options, stdout, stderr io.Writer) (err error) {
	if err := checkEnv(); err != nil {
		return err
	}
	if err := setNice(o.nice); err != nil {
		return err
	}
	t, err := newTUNTopology(o.queues)
	defer func() { err = errors.Join(err, t.close()) }()
	if err != nil {
		return err
	}
	cfg := o.nat
	g, err := startGateway(cfg, t)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "tunnat: client namespace %s (%v, %v), server namespace %s (%v, %v); external %v, %v, ports %d-%d\n",
		t.client, clientAddr4, clientAddr6, t.server, serverAddr4, serverAddr6, extAddr4, extAddr6, cfg.ports.Low, cfg.ports.High)
	fmt.Fprintf(stdout, "try: ip netns exec %s python3 -m http.server --bind :: 8000 &\n     ip netns exec %s curl http://%v:8000/\nstop with Ctrl-C\n",
		t.server, t.client, serverAddr4)
	stopProgress := progress(stderr, g, nil)
	<-ctx.Done()
	stopProgress()
	g.close()
	fmt.Fprintf(stdout, "tunnat: stopped. %v\n", g.stats())
	return nil
}
