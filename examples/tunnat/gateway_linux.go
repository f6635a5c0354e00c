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

// maxPacket is the largest packet a TUN device hands over (its MTU is
// 1500; the buffer takes any IP packet).
const maxPacket = 65535

// gateway runs a NAT between two TUN devices: one goroutine per direction,
// each reading one device and writing what the NAT emits to the other (or,
// for hairpinned packets and the NAT's own ICMP errors, back to the same
// side), and one running the NAT's expiry.
type gateway struct {
	nat     *nat.NAT
	c       counters
	inside  *os.File // the client side
	outside *os.File // the server side
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
		g.wg.Add(3)
		go func() { defer g.wg.Done(); g.pump(ctx, g.inside, n.Outbound) }()
		go func() { defer g.wg.Done(); g.pump(ctx, g.outside, n.Inbound) }()
		go func() { defer g.wg.Done(); n.Run(ctx) }()
	})
	return g, nil
}

// emit writes a packet the NAT sends to the device of its side.
func (g *gateway) emit(to nat.Side, pkt []byte) {
	dev := g.outside
	if to == nat.Inside {
		dev = g.inside
	}
	if _, err := dev.Write(pkt); err != nil {
		g.c.writeErrors.Add(1)
		return
	}
	if to == nat.Outside {
		g.c.pktsOut.Add(1)
		g.c.bytesOut.Add(int64(len(pkt)))
	} else {
		g.c.pktsIn.Add(1)
		g.c.bytesIn.Add(int64(len(pkt)))
	}
}

// pump reads packets from src and hands them to translate, until ctx is
// done: a read deadline in the past then ends the read it waits in.
func (g *gateway) pump(ctx context.Context, src *os.File, translate func([]byte, nat.Emit) nat.Drop) {
	// A gateway before this one on the same device left its deadline in
	// the past.
	src.SetReadDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { src.SetReadDeadline(time.Now()) })
	defer stop()
	buf := make([]byte, maxPacket)
	emit := g.emit // one func value for every packet: no allocation each
	for {
		n, err := src.Read(buf)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, os.ErrClosed) || errors.Is(err, os.ErrDeadlineExceeded) {
				return
			}
			continue // EINTR and the like; a dead device gives ErrClosed
		}
		translate(buf[:n], emit)
	}
}

// stats returns the NAT's metrics and the gateway's counters.
func (g *gateway) stats() stats {
	return stats{Metrics: g.nat.Metrics(), PktsOut: g.c.pktsOut.Load(), PktsIn: g.c.pktsIn.Load(),
		BytesOut: g.c.bytesOut.Load(), BytesIn: g.c.bytesIn.Load(), WriteErrors: g.c.writeErrors.Load()}
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
	t, err := newTUNTopology()
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
