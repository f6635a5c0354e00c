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
	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/tun"
)

// The gateway's buffers: each read gives up to batchSize packets (the
// segments of one GSO read), each buffer holds a whole packet after
// bufOffset bytes of headroom, where the tun package writes the
// virtio-net header of what it writes; and the buffers must hold 64 KiB
// so that Write can coalesce segments into them (GRO).
const (
	batchSize = conn.IdealBatchSize
	bufOffset = 16
	bufSize   = bufOffset + 65535
)

// gateway runs a NAT between two multi-queue TUN devices: per queue, one
// goroutine reads the inside device's queue and writes what the NAT emits
// to the outside device's queue of the same number (hairpinned packets
// and the NAT's own ICMP errors back to the inside queue), one does the
// same the other way; and one goroutine runs the NAT's expiry.
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
	inside  []tun.Device // the client side, one per queue
	outside []tun.Device // the server side
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

// pump reads batches of packets from src, the device of side from, hands
// each batch to the NAT, and writes the translated packets in one Write
// per device: to dst, the other side's device, or back to src. It ends
// when ctx is done: a read deadline in the past then ends the read it
// waits in.
func (g *gateway) pump(ctx context.Context, from nat.Side, src, dst tun.Device) {
	f := src.File()
	// A gateway before this one on the same device left its deadline in
	// the past.
	f.SetReadDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { f.SetReadDeadline(time.Now()) })
	defer stop()
	dev := [2]tun.Device{nat.Inside: src, nat.Outside: dst}
	if from == nat.Outside {
		dev = [2]tun.Device{nat.Inside: dst, nat.Outside: src}
	}
	bufs := make([][]byte, batchSize)
	for i := range bufs {
		bufs[i] = make([]byte, bufSize)
	}
	var (
		b       nat.Batch
		sizes   = make([]int, batchSize)
		pkts    = make([][]byte, 0, batchSize)
		out     [2][][]byte
		scratch = make([]byte, bufSize)
	)
	for i := range out {
		out[i] = make([][]byte, 0, batchSize)
	}
	translate := g.nat.OutboundBatch
	if from == nat.Outside {
		translate = g.nat.InboundBatch
	}
	// What the NAT sends of its own (ICMP errors, fragments) is written
	// at once, one packet per Write, after the headroom Write needs.
	emit := func(to nat.Side, pkt []byte) {
		n := copy(scratch[bufOffset:], pkt)
		g.write(to, dev[to], [][]byte{scratch[:bufOffset+n]})
	}
	for {
		n, err := src.Read(bufs, sizes, bufOffset)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, os.ErrClosed) || errors.Is(err, os.ErrDeadlineExceeded) {
				return
			}
			g.c.readErrors.Add(1)
			if n <= 0 {
				continue // EINTR, a GSO packet the tun package refused
			}
		}
		g.c.reads.Add(1)
		if n > 1 {
			g.c.gsoReads.Add(1)
			g.c.gsoSegments.Add(int64(n))
		}
		pkts = pkts[:0]
		for i := range n {
			pkts = append(pkts, bufs[i][bufOffset:bufOffset+sizes[i]])
		}
		out[0], out[1] = out[0][:0], out[1][:0]
		for i, v := range translate(&b, pkts, emit) {
			if v.Len > 0 {
				// Write may grow the buffer in place (GRO): its full
				// capacity is taken again at the next read.
				out[v.To] = append(out[v.To], bufs[i][:bufOffset+v.Len])
			}
		}
		for to := range out {
			if len(out[to]) > 0 {
				g.write(nat.Side(to), dev[to], out[to])
			}
		}
		for i := range n {
			bufs[i] = bufs[i][:bufSize]
		}
	}
}

// write writes pkts, each after bufOffset bytes of headroom, to dev, the
// device of side to, and counts them.
func (g *gateway) write(to nat.Side, dev tun.Device, pkts [][]byte) {
	var bytes int64
	for _, p := range pkts {
		bytes += int64(len(p) - bufOffset)
	}
	if _, err := dev.Write(pkts, bufOffset); err != nil {
		failed := 1
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			failed = len(j.Unwrap())
		}
		g.c.writeErrors.Add(int64(failed))
		return
	}
	if to == nat.Outside {
		g.c.pktsOut.Add(int64(len(pkts)))
		g.c.bytesOut.Add(bytes)
	} else {
		g.c.pktsIn.Add(int64(len(pkts)))
		g.c.bytesIn.Add(bytes)
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
