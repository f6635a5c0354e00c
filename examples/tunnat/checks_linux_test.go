package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hash4/hash4"
	"github.com/hash4/hash4/nat"
)

// The checks of the NAT's behaviour with real tools, as a user would run
// them, on one topology: RFC 5780 discovery (coturn's turnserver and
// turnutils_natdiscovery), Path MTU discovery (ping -M do, a TCP upload),
// traceroute (IPv4 and IPv6), a SYN flood (hping3) beside a download,
// blind RSTs and FINs (hping3), unsolicited packets under
// address-and-port-dependent filtering (hping3, tcpdump), a 3,000-byte
// UDP datagram both ways, and a TCP connection to a closed port refused.

// checkTools are the programs the checks run.
var checkTools = []string{"turnserver", "turnutils_natdiscovery", "hping3", "traceroute", "tcpdump", "ping", "python3", "curl", "ss"}

// checkNet is the topology the checks share, with the gateway of the
// moment.
type checkNet struct {
	t    *testing.T
	topo *topology
	g    *gateway
}

// run starts a gateway of cfg, after stopping the one before.
func (c *checkNet) run(cfg natConfig) *gateway {
	c.t.Helper()
	if c.g != nil {
		c.g.close()
	}
	if cfg.ports == (hash4.PortRange{}) {
		cfg.ports = hash4.PortRange{Low: 1024, High: 65535}
	}
	if cfg.maxFlows == 0 {
		cfg.maxFlows = 10000
	}
	g, err := startGateway(cfg, c.topo)
	if err != nil {
		c.t.Fatal(err)
	}
	c.g = g
	return g
}

// sh runs args in namespace ns for at most d and returns its output,
// standard error included.
func sh(ns string, d time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns}, args...)...).CombinedOutput()
	return string(out), err
}

func TestRealTools(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the checks with real tools run in the full run (about 35s)")
	}
	needTopology(t, checkTools...)
	topo, err := newTUNTopology(defaultQueues())
	t.Cleanup(func() {
		if err := topo.close(); err != nil {
			t.Errorf("removing the topology: %v", err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	c := &checkNet{t: t, topo: topo}
	t.Cleanup(func() {
		if c.g != nil {
			c.g.close()
		}
	})
	t.Run("Discovery", c.discovery)
	t.Run("PMTUD", c.pmtud)
	t.Run("Traceroute", c.traceroute)
	t.Run("Flood", c.flood)
	t.Run("BlindResets", c.blindResets)
	t.Run("Unsolicited", c.unsolicited)
	t.Run("BigDatagram", c.bigDatagram)
	t.Run("Refused", c.refused)
}

// RFC 5780 discovery reports each configured mapping and filtering
// behaviour, and hairpinning. (The package's tests cover the other
// pairings; tunnat's flags pass any.)
func (c *checkNet) discovery(t *testing.T) {
	turn, err := startServer(c.topo.server, "turnserver", "-n", "--listening-ip", serverAddr4.String(), "--listening-ip", serverAlt4.String(),
		"--listening-port", "3478", "--alt-listening-port", "3479", "--no-auth", "--stun-only", "--no-cli",
		"--log-file", "stdout", "--simple-log", "--no-tls", "--no-dtls")
	if err != nil {
		t.Fatal(err)
	}
	defer turn.stop()
	if err := waitListening(context.Background(), c.topo.server, true, 3479); err != nil {
		t.Fatalf("%v\n%s", err, turn.out.String())
	}
	for _, k := range []struct {
		m, f      nat.Behavior
		mapping   string
		filtering string
	}{
		// Each behaviour once (each discovery costs the client's timeouts):
		{nat.EndpointIndependent, nat.EndpointIndependent, "Endpoint Independent Mapping", "Endpoint Independent Filtering"},
		{nat.AddressDependent, nat.AddressDependent, "Address Dependent Mapping", "Address Dependent Filtering"},
		{nat.AddressAndPortDependent, nat.AddressAndPortDependent, "Address and Port Dependent Mapping", "Address and Port Dependent Filtering"},
	} {
		c.run(natConfig{mapping: k.m, filtering: k.f, timeouts: testTimeouts})
		out, err := sh(c.topo.client, 30*time.Second, "turnutils_natdiscovery", "-m", "-f", "-H", serverAddr4.String())
		if err != nil {
			t.Errorf("%v mapping, %v filtering: %v\n%s", k.m, k.f, err, out)
			continue
		}
		got := regexp.MustCompile(`NAT with [^!]*!`).FindAllString(out, -1)
		hairpin := strings.Contains(out, "successful hairpinning")
		t.Logf("%v mapping, %v filtering: %q, hairpinning %v", k.m, k.f, got, hairpin)
		if len(got) != 2 || got[0] != "NAT with "+k.mapping+"!" || got[1] != "NAT with "+k.filtering+"!" {
			t.Errorf("%v mapping, %v filtering: discovery says %q", k.m, k.f, got)
		}
		// Address-and-port-dependent mapping shares an external port
		// between inside endpoints (toward different remotes), so a
		// packet to it names no one inside: it does not hairpin, as
		// Linux's masquerade does not without rules of its own.
		if want := k.m != nat.AddressAndPortDependent; hairpin != want {
			t.Errorf("%v mapping, %v filtering: hairpinning %v, want %v\n%s", k.m, k.f, hairpin, want, out)
		}
	}
}

// With a 1280-byte link on the server's side and a receiver whose MTU is
// 1500 (so its MSS does not shrink the segments), ping -M do learns the
// MTU from the router's error through the NAT, and a 2 MiB upload
// completes.
func (c *checkNet) pmtud(t *testing.T) {
	c.run(natConfig{timeouts: testTimeouts})
	// The far end takes 1500 bytes; its side of the link stays 1280 on
	// the router, which sends "fragmentation needed".
	if err := ipCmd("-n", c.topo.far, "link", "set", "f0", "mtu", "1500"); err != nil {
		t.Fatal(err)
	}
	defer ipCmd("-n", c.topo.far, "link", "set", "f0", "mtu", strconv.Itoa(farMTU))
	for _, far := range []netip.Addr{farAddr4, farAddr6} {
		out, _ := sh(c.topo.client, 10*time.Second, "ping", "-M", "do", "-s", "1400", "-c", "2", "-i", "0.3", "-W", "1", far.String())
		if !regexp.MustCompile(`mtu ?= ?1280`).MatchString(out) {
			t.Errorf("ping -M do -s 1400 %v learned no MTU:\n%s", far, out)
		}
		route, err := sh(c.topo.client, 5*time.Second, "ip", "route", "get", far.String())
		if err != nil || !strings.Contains(route, "mtu 1280") {
			t.Errorf("the route to %v has no MTU: %v\n%s", far, err, route)
		}
		if out, err := sh(c.topo.client, 10*time.Second, "ping", "-M", "do", "-s", "1200", "-c", "1", "-W", "2", far.String()); err != nil {
			t.Errorf("ping -M do -s 1200 %v: %v\n%s", far, err, out)
		}
	}
	// The upload: 2 MiB over a connection that starts with 1460-byte
	// segments.
	for _, far := range []netip.Addr{farAddr4, farAddr6} {
		addr := netip.AddrPortFrom(far, 9100)
		got := make(chan int64, 1)
		var ln net.Listener
		if err := inNetns(c.topo.far, func() error {
			var err error
			ln, err = net.Listen("tcp", addr.String())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		go func() {
			conn, err := ln.Accept()
			if err != nil {
				got <- -1
				return
			}
			n, _ := io.Copy(io.Discard, conn)
			conn.Close()
			got <- n
		}()
		data := make([]byte, 2<<20)
		var n int64
		err := inNetns(c.topo.client, func() error {
			conn, err := net.DialTimeout("tcp", addr.String(), 5*time.Second)
			if err != nil {
				return err
			}
			conn.SetDeadline(time.Now().Add(20 * time.Second))
			m, err := conn.Write(data)
			n = int64(m)
			conn.Close()
			return err
		})
		if err != nil {
			t.Errorf("upload to %v: %v after %d bytes", far, err, n)
		}
		select {
		case r := <-got:
			if r != int64(len(data)) {
				t.Errorf("upload to %v: %d bytes arrived, want %d", far, r, len(data))
			}
		case <-time.After(20 * time.Second):
			t.Errorf("upload to %v: the receiver got no end", far)
		}
		ln.Close()
	}
	t.Logf("NAT: %v", c.g.stats())
}

// traceroute shows the NAT, the router past it and the far host, IPv4 and
// IPv6: the routers' time-exceeded errors and the host's port unreachable
// cross the NAT, translated.
func (c *checkNet) traceroute(t *testing.T) {
	c.run(natConfig{timeouts: testTimeouts})
	for _, x := range []struct {
		args []string
		hops []netip.Addr
	}{
		{[]string{"traceroute", "-n", "-q", "1", "-w", "2", "-m", "5", farAddr4.String()}, []netip.Addr{gwInside4, serverAddr4, farAddr4}},
		{[]string{"traceroute", "-6", "-n", "-q", "1", "-w", "2", "-m", "5", farAddr6.String()}, []netip.Addr{gwInside6, serverAddr6, farAddr6}},
	} {
		out, err := sh(c.topo.client, 30*time.Second, x.args...)
		if err != nil {
			t.Errorf("%s: %v\n%s", strings.Join(x.args, " "), err, out)
			continue
		}
		t.Logf("%s:\n%s", strings.Join(x.args, " "), out)
		for i, want := range x.hops {
			if !regexp.MustCompile(`(?m)^\s*` + strconv.Itoa(i+1) + `\s+` + regexp.QuoteMeta(want.String()) + `\s`).MatchString(out) {
				t.Errorf("hop %d is not %v", i+1, want)
			}
		}
	}
}

// A SYN flood from the second inside host (10,000 a second) meets its cap
// of 190 flows; the first host's download completes meanwhile, its new
// connections get through (early drop evicts the flood's unanswered flows
// when the table's 192 are full), and the counters say what was dropped.
func (c *checkNet) flood(t *testing.T) {
	g := c.run(natConfig{timeouts: testTimeouts, maxFlows: 192, maxFlowsPerHost: 190})
	dir := t.TempDir()
	blob := make([]byte, 16<<20)
	rand.Read(blob)
	want := sha256.Sum256(blob)
	if err := os.WriteFile(filepath.Join(dir, "blob"), blob, 0o644); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "small"), []byte("small\n"), 0o644)
	httpd, err := startServer(c.topo.server, "python3", "-u", "-m", "http.server", "--bind", "::", "--directory", dir, "8001")
	if err != nil {
		t.Fatal(err)
	}
	defer httpd.stop()
	if err := waitListening(context.Background(), c.topo.server, false, 8001); err != nil {
		t.Fatal(err)
	}
	// The flood goes to an address the server namespace drops, so that
	// its SYNs stay unanswered, as a flood's do.
	if err := ipCmd("-n", c.topo.server, "route", "add", "blackhole", "10.48.9.0/24"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var body []byte
	var dlErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		body, dlErr = runClient(ctx, c.topo.client, 60*time.Second, "", "curl", "-sS", "--limit-rate", "4M",
			fmt.Sprintf("http://%v:8001/blob", serverAddr4))
	}()
	time.Sleep(500 * time.Millisecond)
	flood, err := startServer(c.topo.client2, "hping3", "-n", "-S", "-p", "80", "-i", "u100", "10.48.9.9")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	for i := range 5 {
		out, err := sh(c.topo.client, 10*time.Second, "curl", "-sS", "--max-time", "5", fmt.Sprintf("http://%v:8001/small", serverAddr4))
		if err != nil || out != "small\n" {
			t.Errorf("new connection %d during the flood: %v %q", i, err, out)
		}
	}
	time.Sleep(time.Second)
	flood.stop()
	wg.Wait()
	if dlErr != nil || sha256.Sum256(body) != want {
		t.Errorf("download during the flood: %v, %d bytes, sha256 matches %v", dlErr, len(body), sha256.Sum256(body) == want)
	}
	s := g.stats()
	t.Logf("NAT after the flood: %v\nhping3: %s", s, lastLine(flood.out.String()))
	if s.Drops[nat.DropHostLimit] < 1000 || s.Expired[nat.ExpiredEarlyDrop] < 1 {
		t.Errorf("host-limit drops %d, early drops %d: the flood did not fill the table", s.Drops[nat.DropHostLimit], s.Expired[nat.ExpiredEarlyDrop])
	}
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// 100 blind RSTs and 100 blind FINs (sequence number 12345) from the
// server's endpoint to the connection's external endpoint are dropped; the
// idle connection goes on.
func (c *checkNet) blindResets(t *testing.T) {
	g := c.run(natConfig{timeouts: testTimeouts})
	tcpPeers, _ := startEchoes(t, c.topo, 9000)
	conn, err := dialIn(c.topo, "tcp4", netip.AddrPortFrom(serverAddr4, 9000))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	echo := func(msg string) error {
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := conn.Write([]byte(msg)); err != nil {
			return err
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(conn, got); err != nil {
			return err
		}
		if string(got) != msg {
			return fmt.Errorf("echo %q", got)
		}
		return nil
	}
	if err := echo("before"); err != nil {
		t.Fatal(err)
	}
	peers := tcpPeers.list()
	if len(peers) != 1 {
		t.Fatalf("server peers %v", peers)
	}
	ext := peers[0]
	for _, flags := range [][]string{{"-R"}, {"-F", "-A"}} {
		args := append([]string{"hping3", "-q"}, flags...)
		args = append(args, "-s", "9000", "-k", "-p", strconv.Itoa(int(ext.Port())), "-M", "12345", "-c", "100", "-i", "u2000", ext.Addr().String())
		if out, err := sh(c.topo.server, 20*time.Second, args...); err != nil && !strings.Contains(out, "100 packets transmitted") {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	time.Sleep(200 * time.Millisecond)
	if err := echo("after the blind RSTs and FINs"); err != nil {
		t.Errorf("the connection after blind RSTs and FINs: %v", err)
	}
	if s := g.stats(); s.Drops[nat.DropOutOfWindow] != 200 {
		t.Errorf("out-of-window drops %d, want 200: %v", s.Drops[nat.DropOutOfWindow], s)
	}
}

// Under address-and-port-dependent filtering, no packet from outside but
// the contacted endpoint's reaches the inside host (tcpdump on its device
// sees none), whatever the source address or port.
func (c *checkNet) unsolicited(t *testing.T) {
	g := c.run(natConfig{timeouts: testTimeouts, filtering: nat.AddressAndPortDependent})
	_, udpPeers := startEchoes(t, c.topo, 9000)
	conn, err := dialIn(c.topo, "udp4", netip.AddrPortFrom(serverAddr4, 9000))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := udpExchange(conn, []byte("solicited"), 5, time.Second); err != nil {
		t.Fatal(err)
	}
	ext := udpPeers.list()[0]
	dump, err := startServer(c.topo.client, "tcpdump", "-i", "tun0", "-Q", "in", "-n", "-l", "-p",
		fmt.Sprintf("not (src host %v and src port 9000)", serverAddr4))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // tcpdump's start
	port := strconv.Itoa(int(ext.Port()))
	for _, args := range [][]string{
		{"hping3", "-q", "--udp", "-s", "9001", "-k", "-p", port, "-c", "50", "-i", "u1000", ext.Addr().String()},
		{"hping3", "-q", "--udp", "-a", serverAlt4.String(), "-s", "9000", "-k", "-p", port, "-c", "50", "-i", "u1000", ext.Addr().String()},
		{"hping3", "-q", "-S", "-s", "9000", "-k", "-p", port, "-c", "50", "-i", "u1000", ext.Addr().String()},
		{"hping3", "-q", "--udp", "-s", "9000", "-k", "-p", "++1024", "-c", "300", "-i", "u500", ext.Addr().String()},
		{"hping3", "-q", "--icmp", "-c", "20", "-i", "u1000", ext.Addr().String()},
	} {
		if out, err := sh(c.topo.server, 20*time.Second, args...); err != nil && !strings.Contains(out, "packets transmitted") {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	if err := udpExchange(conn, []byte("still solicited"), 5, time.Second); err != nil {
		t.Errorf("the solicited flow after: %v", err)
	}
	time.Sleep(500 * time.Millisecond)
	dump.stop()
	if lines := strings.TrimSpace(dump.out.String()); regexp.MustCompile(`(?m)^\d\d:\d\d`).MatchString(lines) {
		t.Errorf("unsolicited packets reached the inside host:\n%s", lines)
	}
	s := g.stats()
	t.Logf("NAT: %v", s)
	if s.Drops[nat.DropFiltered]+s.Drops[nat.DropNoFlow] < 470 {
		t.Errorf("filtered and no-flow drops %d, want the 470 sent", s.Drops[nat.DropFiltered]+s.Drops[nat.DropNoFlow])
	}
}

// A 3,000-byte UDP datagram, fragmented by the client, crosses the NAT and
// its echo comes back whole, IPv4 and IPv6.
func (c *checkNet) bigDatagram(t *testing.T) {
	g := c.run(natConfig{timeouts: testTimeouts})
	for _, srv := range []netip.AddrPort{netip.AddrPortFrom(serverAddr4, 9300), netip.AddrPortFrom(serverAddr6, 9300)} {
		var pc net.PacketConn
		if err := inNetns(c.topo.server, func() error {
			var err error
			pc, err = net.ListenPacket("udp", srv.String())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		go func() {
			buf := make([]byte, 65536)
			for {
				n, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				pc.WriteTo(buf[:n], from)
			}
		}()
		network := "udp4"
		if srv.Addr().Is6() {
			network = "udp6"
		}
		conn, err := dialIn(c.topo, network, srv)
		if err != nil {
			t.Fatal(err)
		}
		msg := bytes.Repeat([]byte("3,000 bytes "), 250)
		if err := udpExchange(conn, msg, 3, 2*time.Second); err != nil {
			t.Errorf("3,000 bytes to %v: %v", srv, err)
		}
		conn.Close()
		pc.Close()
	}
	if s := g.stats(); s.Drops[nat.DropFragment] != 0 || s.Drops[nat.DropFragmentTimeout] != 0 {
		t.Errorf("fragments dropped: %v", s)
	}
}

// A TCP connection to a port nobody listens on is refused at once, the
// server's RST answering the SYN let through, as without a NAT; IPv4 and
// IPv6.
func (c *checkNet) refused(t *testing.T) {
	g := c.run(natConfig{timeouts: testTimeouts})
	for _, srv := range []netip.AddrPort{netip.AddrPortFrom(serverAddr4, 9399), netip.AddrPortFrom(serverAddr6, 9399)} {
		start := time.Now()
		conn, err := dialIn(c.topo, "tcp", srv)
		if err == nil {
			conn.Close()
			t.Fatalf("%v: connected; nothing listens there", srv)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) || time.Since(start) > 2*time.Second {
			t.Errorf("%v: %v after %v, want connection refused at once", srv, err, time.Since(start).Round(time.Millisecond))
		}
	}
	if s := g.stats(); s.Drops[nat.DropOutOfWindow] != 0 {
		t.Errorf("out-of-window drops: %v", s)
	}
}
