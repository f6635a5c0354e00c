package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"
)

// Ports of the demo's servers in the server namespace.
const (
	httpPort = 8000
	echoPort = 7777
)

// demoFileSize is the size of the file the demo's clients fetch.
const demoFileSize = 2 << 20

// check is one verdict of the demo.
type check struct {
	name   string
	ok     bool
	detail string
}

// demoResult is what the demo saw.
type demoResult struct {
	checks      []check
	interrupted bool
	nat         stats
}

// ok reports whether every check passed.
func (r demoResult) ok() bool {
	if r.interrupted || len(r.checks) == 0 {
		return false
	}
	for _, c := range r.checks {
		if !c.ok {
			return false
		}
	}
	return true
}

// demoTools are the programs the demo runs.
var demoTools = []string{"python3", "curl", "socat", "iperf3", "ping", "ss"}

// runDemo builds the topology and a NAT, runs real servers in the server
// namespace and real clients in the client namespace through it, and
// checks that every client succeeded and that the servers saw every
// connection come from the NAT's external address. The summary goes to
// out, the progress line to progress.
func runDemo(ctx context.Context, o options, out, progressW io.Writer) (res demoResult, err error) {
	if err := checkEnv(demoTools...); err != nil {
		return res, err
	}
	if err := setNice(o.nice); err != nil {
		return res, err
	}
	t, err := newTUNTopology(o.queues)
	defer func() { err = errors.Join(err, t.close()) }()
	if err != nil {
		return res, err
	}
	cfg := o.nat
	g, err := startGateway(cfg, t)
	if err != nil {
		return res, err
	}
	defer g.close()
	fmt.Fprintf(out, "tunnat demo: client %s (%v, %v) -> tunnat (external %v, %v, ports %d-%d) -> server %s (%v, %v)\n",
		t.client, clientAddr4, clientAddr6, extAddr4, extAddr6, cfg.ports.Low, cfg.ports.High, t.server, serverAddr4, serverAddr6)

	var stepMu sync.Mutex
	step := "servers"
	setStep := func(s string) { stepMu.Lock(); step = s; stepMu.Unlock() }
	stopProgress := progress(progressW, g, func() string { stepMu.Lock(); defer stepMu.Unlock(); return step })
	defer stopProgress()

	add := func(name string, err error, detail string) {
		c := check{name: name, ok: err == nil, detail: detail}
		if err != nil {
			c.detail = err.Error()
		}
		res.checks = append(res.checks, c)
	}

	// The servers: a file over HTTP, a UDP echo.
	dir, err := os.MkdirTemp("", "tunnat-demo")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	blob := make([]byte, demoFileSize)
	rand.Read(blob)
	if err := os.WriteFile(filepath.Join(dir, "blob"), blob, 0o644); err != nil {
		return res, err
	}
	want := sha256.Sum256(blob)
	httpd, err := startServer(t.server, "python3", "-u", "-m", "http.server", "--bind", "::", "--directory", dir, fmt.Sprint(httpPort))
	if err != nil {
		return res, err
	}
	defer httpd.stop()
	echo, err := startServer(t.server, "socat", "-d", "-d", fmt.Sprintf("UDP4-RECVFROM:%d,fork", echoPort), "PIPE")
	if err != nil {
		return res, err
	}
	defer echo.stop()
	if err := waitListening(ctx, t.server, false, httpPort); err != nil {
		return res, err
	}
	if err := waitListening(ctx, t.server, true, echoPort); err != nil {
		return res, err
	}

	// HTTP: two fetches over IPv4, one over IPv6, each checked.
	setStep("curl")
	urls := []string{
		fmt.Sprintf("http://%v:%d/blob", serverAddr4, httpPort),
		fmt.Sprintf("http://%v:%d/blob", serverAddr4, httpPort),
		fmt.Sprintf("http://[%v]:%d/blob", serverAddr6, httpPort),
	}
	for _, url := range urls {
		body, err := runClient(ctx, t.client, 20*time.Second, "", "curl", "-sS", "-g", "--max-time", "15", url)
		detail := ""
		if err == nil {
			if sha256.Sum256(body) != want {
				err = fmt.Errorf("%d bytes, checksum differs", len(body))
			} else {
				detail = fmt.Sprintf("%d bytes, sha256 matches", len(body))
			}
		}
		add("curl "+url, err, detail)
	}

	// UDP: three exchanges, three flows, at once.
	setStep("socat")
	const udpExchanges = 3
	var wg sync.WaitGroup
	udpErrs := make([]error, udpExchanges)
	for i := range udpExchanges {
		wg.Go(func() {
			msg := fmt.Sprintf("tunnat udp probe %d\n", i)
			got, err := runClient(ctx, t.client, 10*time.Second, msg, "socat", "-t", "1", "-T", "5", "-", fmt.Sprintf("UDP4:%v:%d", serverAddr4, echoPort))
			if err == nil && string(got) != msg {
				err = fmt.Errorf("echo %q, want %q", got, msg)
			}
			udpErrs[i] = err
		})
	}
	wg.Wait()
	for i, err := range udpErrs {
		add(fmt.Sprintf("socat UDP exchange %d", i), err, "echo matches")
	}

	// ICMP echo, both families.
	setStep("ping")
	for _, a := range []netip.Addr{serverAddr4, serverAddr6} {
		_, err := runClient(ctx, t.client, 10*time.Second, "", "ping", "-c", "3", "-i", "0.2", "-W", "2", "-q", a.String())
		add("ping "+a.String(), err, "3 of 3 answered")
	}

	// iperf3, TCP then UDP.
	setStep("iperf3 TCP")
	c, s, err := iperf(ctx, t, o.duration)
	detail := ""
	if err == nil {
		detail = fmt.Sprintf("%.0f Mbit/s; server saw %s", c.End.SumReceived.BitsPerSecond/1e6, s.Start.AcceptedConnection.Host)
		err = fromExternal(s.Start.AcceptedConnection.Host, "iperf3 server")
	}
	add("iperf3 TCP", err, detail)
	setStep("iperf3 UDP")
	c, s, err = iperf(ctx, t, o.duration, "-u", "-b", "100M")
	if err == nil {
		detail = fmt.Sprintf("%d datagrams, %.2f%% lost; server saw %s", c.End.Sum.Packets, c.End.Sum.LostPercent, s.Start.AcceptedConnection.Host)
		err = fromExternal(s.Start.AcceptedConnection.Host, "iperf3 server")
		if err == nil && c.End.Sum.Packets-c.End.Sum.LostPackets <= 0 {
			err = errors.New("no datagram arrived")
		}
	}
	add("iperf3 UDP", err, detail)

	// What the servers saw: python logs each request's client address,
	// socat each new peer.
	setStep("logs")
	httpd.stop()
	echo.stop()
	add("http.server saw the external address", checkPeers(httpd.out.String(), httpLog, len(urls)), fmt.Sprintf("%d requests, all from %v or %v", len(urls), extAddr4, extAddr6))
	add("socat saw the external address", checkPeers(echo.out.String(), socatLog, udpExchanges), fmt.Sprintf("%d peers, all from %v", udpExchanges, extAddr4))

	stopProgress()
	g.close()
	res.nat = g.stats()
	res.interrupted = ctx.Err() != nil
	for _, c := range res.checks {
		verdict := "ok  "
		if !c.ok {
			verdict = "FAIL"
		}
		fmt.Fprintf(out, "  %s %-45s %s\n", verdict, c.name, c.detail)
	}
	fmt.Fprintf(out, "tunnat: %v\n", res.nat)
	switch {
	case res.interrupted:
		fmt.Fprintln(out, "INTERRUPTED")
	case res.ok():
		fmt.Fprintln(out, "PASS")
	default:
		fmt.Fprintln(out, "FAIL")
	}
	return res, nil
}

// The servers' log lines that name a client: http.server's access log
// (the address first; IPv4 clients appear IPv4-mapped on its :: socket),
// socat's "receiving packet from AF=2 addr:port".
var (
	httpLog  = regexp.MustCompile(`(?m)^(\S+) - - \[[^]]*\] "GET /blob`)
	socatLog = regexp.MustCompile(`receiving packet from AF=\d+ \[?([0-9a-fA-F.:]+?)\]?:\d+\s`)
)

// checkPeers returns nil if the log holds want client addresses, all the
// NAT's external ones.
func checkPeers(log string, re *regexp.Regexp, want int) error {
	ms := re.FindAllStringSubmatch(log, -1)
	if len(ms) != want {
		return fmt.Errorf("%d clients in the log, want %d:\n%s", len(ms), want, strings.TrimSpace(log))
	}
	for _, m := range ms {
		if err := fromExternal(m[1], "log"); err != nil {
			return err
		}
	}
	return nil
}

// fromExternal returns nil if host is one of the NAT's external addresses.
func fromExternal(host, who string) error {
	a, err := netip.ParseAddr(host)
	if err != nil {
		return fmt.Errorf("%s: client address %q does not parse", who, host)
	}
	if a = a.Unmap(); a != extAddr4 && a != extAddr6 {
		return fmt.Errorf("%s: client %v, not the NAT's external address", who, a)
	}
	return nil
}
