package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// This file runs the real programs of the demo and the comparison inside
// the namespaces (servers in the background, clients to completion), and
// the small Go servers and clients that -compare runs in them.

// syncBuffer is a bytes.Buffer safe for a process's output and a reader.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// lockedWriter serializes the writes of the goroutines that share w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// server is a program running in a namespace until stopped.
type server struct {
	cmd  *exec.Cmd
	out  syncBuffer // stdout and stderr
	done chan struct{}
}

// startServer starts args in namespace ns.
func startServer(ns string, args ...string) (*server, error) {
	cmd := endpointArgs(ns, args...)
	s := &server{cmd: exec.Command(cmd[0], cmd[1:]...), done: make(chan struct{})}
	s.cmd.Stdout, s.cmd.Stderr = &s.out, &s.out
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: %w", args[0], err)
	}
	go func() { s.cmd.Wait(); close(s.done) }()
	return s, nil
}

// stop kills the server (ip netns exec runs it as its own process) and
// waits for it, at most a few seconds.
func (s *server) stop() {
	if s == nil {
		return
	}
	s.cmd.Process.Kill()
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
	}
}

// wait waits up to d for the server to exit by itself and reports whether
// it did.
func (s *server) wait(d time.Duration) bool {
	select {
	case <-s.done:
		return true
	case <-time.After(d):
		return false
	}
}

// waitListening polls ss in namespace ns until something listens on port
// (TCP, or UDP if udp), for at most 10 seconds: the servers are external
// processes, with nothing to wait on but their sockets.
func waitListening(ctx context.Context, ns string, udp bool, port int) error {
	flag := "-Hlnt"
	if udp {
		flag = "-Hlnu"
	}
	want := ":" + strconv.Itoa(port) + " "
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		out, err := exec.Command("ip", "netns", "exec", ns, "ss", flag).Output()
		if err == nil && strings.Contains(string(out), want) {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("nothing listens on port %d in %s", port, ns)
}

// runClient runs args in namespace ns with stdin, for at most timeout, and
// returns its standard output; the error carries its standard error.
func runClient(ctx context.Context, ns string, timeout time.Duration, stdin string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	argv := endpointArgs(ns, args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdin = strings.NewReader(stdin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return out, nil
}

// iperfResult is what tunnat reads of iperf3's JSON output, client's or
// server's.
type iperfResult struct {
	Start struct {
		AcceptedConnection struct {
			Host string `json:"host"`
		} `json:"accepted_connection"`
	} `json:"start"`
	End struct {
		SumReceived struct {
			BitsPerSecond float64 `json:"bits_per_second"`
		} `json:"sum_received"`
		Sum struct {
			Seconds     float64 `json:"seconds"`
			Packets     int64   `json:"packets"`
			LostPackets int64   `json:"lost_packets"`
			LostPercent float64 `json:"lost_percent"`
		} `json:"sum"`
	} `json:"end"`
	Error string `json:"error"`
}

// iperf runs one iperf3 test from the client namespace to a one-off
// server in the server namespace, args added to the client's, and returns
// the client's and the server's results.
func iperf(ctx context.Context, t *topology, d time.Duration, args ...string) (client, srv iperfResult, err error) {
	s, err := startServer(t.server, "iperf3", "-s", "-1", "-J", "-B", serverAddr4.String(), "-p", "5201")
	if err != nil {
		return client, srv, err
	}
	defer s.stop()
	if err := waitListening(ctx, t.server, false, 5201); err != nil {
		return client, srv, err
	}
	secs := strconv.Itoa(int(d.Round(time.Second) / time.Second))
	out, err := runClient(ctx, t.client, d+20*time.Second, "",
		append([]string{"iperf3", "-c", serverAddr4.String(), "-p", "5201", "-t", secs, "-J"}, args...)...)
	if jerr := json.Unmarshal(out, &client); jerr != nil && err == nil {
		err = fmt.Errorf("iperf3 client output: %v", jerr)
	}
	if err == nil && client.Error != "" {
		err = errors.New("iperf3: " + client.Error)
	}
	if err != nil {
		return client, srv, err
	}
	if !s.wait(5 * time.Second) {
		return client, srv, errors.New("iperf3 server did not finish")
	}
	if jerr := json.Unmarshal([]byte(s.out.String()), &srv); jerr != nil {
		return client, srv, fmt.Errorf("iperf3 server output: %v", jerr)
	}
	return client, srv, nil
}

// goListen starts, in namespace ns, a TCP server that writes one byte to
// each connection and closes it (so that the server, not the client,
// keeps the TIME_WAIT), and a UDP echo, both on addr. The socket belongs to
// the namespace it was made in, whichever thread uses it later.
func goListen(ns string, addr netip.AddrPort) (stop func(), err error) {
	var ln net.Listener
	var pc net.PacketConn
	err = inNetns(ns, func() error {
		var err error
		if ln, err = net.Listen("tcp", addr.String()); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp", addr.String())
		return err
	})
	if err != nil {
		if ln != nil {
			ln.Close()
		}
		return nil, err
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte{1})
			c.Close()
		}
	})
	wg.Go(func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:n], from)
		}
	})
	return func() { ln.Close(); pc.Close(); wg.Wait() }, nil
}

// connRate opens and closes TCP connections to addr from namespace ns,
// workers at a time, for d, and returns the connections completed per
// second (a connection counts once its byte has arrived).
func connRate(ns string, addr netip.AddrPort, workers int, d time.Duration) (float64, error) {
	var mu sync.Mutex
	var total int
	var firstErr error
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(d)
	for range workers {
		wg.Go(func() {
			n := 0
			err := inNetns(ns, func() error {
				buf := make([]byte, 1)
				for time.Now().Before(end) {
					c, err := net.DialTimeout("tcp", addr.String(), 2*time.Second)
					if err != nil {
						return err
					}
					c.SetReadDeadline(time.Now().Add(2 * time.Second))
					_, err = c.Read(buf)
					c.Close()
					if err != nil {
						return err
					}
					n++
				}
				return nil
			})
			mu.Lock()
			total += n
			if err != nil && firstErr == nil {
				firstErr = err
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	return float64(total) / time.Since(start).Seconds(), firstErr
}

// udpRTT sends n datagrams one at a time from namespace ns to the echo at
// addr and returns the round-trip times' median and 99th percentile.
func udpRTT(ns string, addr netip.AddrPort, n int) (p50, p99 time.Duration, err error) {
	rtts := make([]time.Duration, 0, n)
	err = inNetns(ns, func() error {
		c, err := net.Dial("udp", addr.String())
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 64)
		for i := range n {
			msg := []byte(fmt.Sprintf("rtt %d", i))
			t0 := time.Now()
			if _, err := c.Write(msg); err != nil {
				return err
			}
			c.SetReadDeadline(t0.Add(time.Second))
			m, err := c.Read(buf)
			if err != nil {
				return fmt.Errorf("round trip %d: %w", i, err)
			}
			if !bytes.Equal(buf[:m], msg) {
				return fmt.Errorf("round trip %d: echo %q", i, buf[:m])
			}
			rtts = append(rtts, time.Since(t0))
		}
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	slices.Sort(rtts)
	return rtts[len(rtts)/2], rtts[len(rtts)*99/100], nil
}
