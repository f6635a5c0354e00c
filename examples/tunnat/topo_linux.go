package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// This file builds and removes the topology: network namespaces, TUN
// devices inside them (opened by this process), veth pairs and the
// kernel's NAT for -compare. Links, addresses and routes are set with ip
// (iproute2).

// farMTU is the MTU of the link between the server namespace and the far
// host.
const farMTU = 1280

// nsPrefix starts the name of every namespace this program makes; the
// process id and a sequence number follow, so that concurrent runs (and
// tests) do not meet, and leftovers of dead runs can be told apart.
const nsPrefix = "tunnat-"

// topoSeq numbers the topologies of one process.
var topoSeq atomic.Int64

// topology is a set of namespaces and, for the user-space NAT, the two TUN
// devices whose descriptors the process holds.
type topology struct {
	client, server, gw string      // namespace names; gw only for the kernel's NAT
	client2, far       string      // the second inside host, the host past the server (user-space NAT only)
	inside, outside    []*tunQueue // TUN queues (user-space NAT only)
	made               []string    // namespaces to remove
}

// ipCmd runs ip with args and returns its error with its output.
func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// nsExec runs a command in namespace ns and returns its error with its
// output.
func nsExec(ns string, args ...string) error {
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("in %s: %s: %v: %s", ns, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// removeLeftovers removes the namespaces of earlier runs whose process is
// gone. Those of live processes (another run, another test binary) stay.
func removeLeftovers() {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], nsPrefix) {
			continue
		}
		pidText, _, _ := strings.Cut(strings.TrimPrefix(f[0], nsPrefix), "-")
		pid, err := strconv.Atoi(pidText)
		if err != nil || pid == os.Getpid() {
			continue
		}
		if _, err := os.Stat("/proc/" + pidText); err == nil {
			continue // its run is alive
		}
		ipCmd("netns", "del", f[0])
	}
}

// addNS makes a namespace named for this run and role, with loopback up.
func (t *topology) addNS(tag, role string) (string, error) {
	name := fmt.Sprintf("%s%d-%s-%s", nsPrefix, os.Getpid(), tag, role)
	if err := ipCmd("netns", "add", name); err != nil {
		return "", err
	}
	t.made = append(t.made, name)
	return name, ipCmd("-n", name, "link", "set", "lo", "up")
}

// inNetns runs fn on a thread that has entered namespace ns, then moves
// the thread back. If it cannot move back, the thread stays locked to the
// goroutine, which makes the runtime end the thread with it rather than run
// other goroutines in the wrong namespace.
func inNetns(ns string, fn func() error) error {
	target, err := os.Open("/run/netns/" + ns)
	if err != nil {
		return err
	}
	defer target.Close()
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("setns %s: %w", ns, err)
	}
	ferr := fn()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		return errors.Join(ferr, fmt.Errorf("setns back from %s: %w", ns, err)) // thread left locked
	}
	runtime.UnlockOSThread()
	return ferr
}

// openTUN creates TUN device name in namespace ns with queues queues (see
// offload_linux.go) and returns them. The device lives as long as its
// queues' descriptors.
func openTUN(ns, name string, queues int) ([]*tunQueue, error) {
	var qs []*tunQueue
	err := inNetns(ns, func() error {
		for range queues {
			q, err := openQueue(name)
			if err != nil {
				return fmt.Errorf("%s in %s: %w", name, ns, err)
			}
			qs = append(qs, q)
		}
		return nil
	})
	if err != nil {
		for _, q := range qs {
			q.close()
		}
		return nil, err
	}
	return qs, nil
}

// newTUNTopology makes the user-space NAT's topology: a client namespace
// whose default routes lead into one TUN device, a server namespace whose
// TUN device has the NAT's external addresses on its link. The caller must
// close it, also after an error.
func newTUNTopology(queues int) (*topology, error) {
	removeLeftovers()
	t := &topology{}
	tag := strconv.FormatInt(topoSeq.Add(1), 10)
	var err error
	if t.client, err = t.addNS(tag, "client"); err != nil {
		return t, err
	}
	if t.server, err = t.addNS(tag, "server"); err != nil {
		return t, err
	}
	if t.client2, err = t.addNS(tag, "client2"); err != nil {
		return t, err
	}
	if t.far, err = t.addNS(tag, "far"); err != nil {
		return t, err
	}
	if t.inside, err = openTUN(t.client, "tun0", queues); err != nil {
		return t, err
	}
	if t.outside, err = openTUN(t.server, "tun0", queues); err != nil {
		return t, err
	}
	// No link-local address and no multicast on the devices: nothing but
	// the test traffic (no router solicitations, no MLD reports, which the
	// namespaces send as routers) reaches the NAT.
	steps := [][]string{
		{"-n", t.client, "link", "set", "tun0", "addrgenmode", "none", "multicast", "off"},
		{"-n", t.client, "addr", "add", clientAddr4.String() + "/24", "dev", "tun0"},
		{"-n", t.client, "addr", "add", clientAddr6.String() + "/64", "dev", "tun0", "nodad"},
		{"-n", t.client, "link", "set", "tun0", "up"},
		{"-n", t.client, "route", "add", "default", "dev", "tun0"},
		{"-n", t.client, "-6", "route", "add", "default", "dev", "tun0"},
		{"-n", t.server, "link", "set", "tun0", "addrgenmode", "none", "multicast", "off"},
		{"-n", t.server, "addr", "add", serverAddr4.String() + "/24", "dev", "tun0"},
		{"-n", t.server, "addr", "add", serverAddr6.String() + "/64", "dev", "tun0", "nodad"},
		{"-n", t.server, "addr", "add", serverAlt4.String() + "/32", "dev", "tun0"},
		{"-n", t.server, "link", "set", "tun0", "up"},
		// The second inside host, behind the client namespace.
		{"link", "add", "c1", "netns", t.client, "type", "veth", "peer", "name", "h0", "netns", t.client2},
		{"-n", t.client, "addr", "add", "10.48.2.1/24", "dev", "c1"},
		{"-n", t.client, "addr", "add", "fd48:2::1/64", "dev", "c1", "nodad"},
		{"-n", t.client, "link", "set", "c1", "up"},
		{"-n", t.client2, "addr", "add", client2Addr4.String() + "/24", "dev", "h0"},
		{"-n", t.client2, "addr", "add", client2Addr6.String() + "/64", "dev", "h0", "nodad"},
		{"-n", t.client2, "link", "set", "h0", "up"},
		{"-n", t.client2, "route", "add", "default", "via", "10.48.2.1"},
		{"-n", t.client2, "-6", "route", "add", "default", "via", "fd48:2::1"},
		// The far host, past the server namespace, over a smaller MTU.
		{"link", "add", "s1", "netns", t.server, "mtu", strconv.Itoa(farMTU), "type", "veth", "peer", "name", "f0", "netns", t.far, "mtu", strconv.Itoa(farMTU)},
		{"-n", t.server, "addr", "add", "10.48.3.1/24", "dev", "s1"},
		{"-n", t.server, "addr", "add", "fd48:3::1/64", "dev", "s1", "nodad"},
		{"-n", t.server, "link", "set", "s1", "up"},
		{"-n", t.far, "addr", "add", farAddr4.String() + "/24", "dev", "f0"},
		{"-n", t.far, "addr", "add", farAddr6.String() + "/64", "dev", "f0", "nodad"},
		{"-n", t.far, "link", "set", "f0", "up"},
		{"-n", t.far, "route", "add", "default", "via", "10.48.3.1"},
		{"-n", t.far, "-6", "route", "add", "default", "via", "fd48:3::1"},
	}
	for _, s := range steps {
		if err := ipCmd(s...); err != nil {
			return t, err
		}
	}
	for _, ns := range []string{t.client, t.server} {
		if err := nsExec(ns, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"); err != nil {
			return t, err
		}
	}
	return t, nil
}

// newKernelTopology makes the kernel NAT's topology for -compare: client,
// gateway and server namespaces joined by veth pairs, the gateway
// forwarding with an nftables masquerade rule on its server side, so that
// the server sees the same external address.
func newKernelTopology() (*topology, error) {
	removeLeftovers()
	t := &topology{}
	tag := strconv.FormatInt(topoSeq.Add(1), 10)
	var err error
	for _, p := range []struct {
		name *string
		role string
	}{{&t.client, "client"}, {&t.gw, "gw"}, {&t.server, "server"}} {
		if *p.name, err = t.addNS(tag, p.role); err != nil {
			return t, err
		}
	}
	steps := [][]string{
		{"link", "add", "c0", "netns", t.client, "type", "veth", "peer", "name", "g0", "netns", t.gw},
		{"link", "add", "g1", "netns", t.gw, "type", "veth", "peer", "name", "s0", "netns", t.server},
		{"-n", t.client, "addr", "add", clientAddr4.String() + "/24", "dev", "c0"},
		{"-n", t.client, "link", "set", "c0", "up"},
		{"-n", t.client, "route", "add", "default", "via", gwInside4.String()},
		{"-n", t.gw, "addr", "add", gwInside4.String() + "/24", "dev", "g0"},
		{"-n", t.gw, "addr", "add", extAddr4.String() + "/24", "dev", "g1"},
		{"-n", t.gw, "link", "set", "g0", "up"},
		{"-n", t.gw, "link", "set", "g1", "up"},
		{"-n", t.server, "addr", "add", serverAddr4.String() + "/24", "dev", "s0"},
		{"-n", t.server, "link", "set", "s0", "up"},
	}
	for _, s := range steps {
		if err := ipCmd(s...); err != nil {
			return t, err
		}
	}
	if err := nsExec(t.gw, "sysctl", "-qw", "net.ipv4.ip_forward=1"); err != nil {
		return t, err
	}
	rules := `table ip tunnat {
	chain post {
		type nat hook postrouting priority srcnat; policy accept;
		oifname "g1" masquerade
	}
}
`
	cmd := exec.Command("ip", "netns", "exec", t.gw, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		return t, fmt.Errorf("nft in %s: %v: %s", t.gw, err, bytes.TrimSpace(out))
	}
	return t, nil
}

// close removes what the topology made: the TUN devices (closing their
// descriptors removes them) and the namespaces, with the veth pairs and the
// nftables rules inside them. It returns the first error.
func (t *topology) close() error {
	var errs []error
	for _, q := range append(t.inside, t.outside...) {
		errs = append(errs, q.close())
	}
	t.inside, t.outside = nil, nil
	for _, ns := range t.made {
		errs = append(errs, ipCmd("netns", "del", ns))
	}
	t.made = nil
	return errors.Join(errs...)
}

// checkEnv returns why the topology cannot be built here, or nil.
func checkEnv(tools ...string) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root (network namespaces, TUN devices)")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		return fmt.Errorf("no TUN device: %v", err)
	}
	for _, tool := range append([]string{"ip", "sysctl"}, tools...) {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not found (Debian packages: iproute2 procps curl socat iperf3 nftables iputils-ping python3 coturn hping3 traceroute tcpdump)", tool)
		}
	}
	return nil
}
