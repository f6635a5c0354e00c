package main

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/hash4/hash4/examples/internal/porttest"
)

// The demo's own function, short and small, succeeds and shows expiry.
func TestDemo(t *testing.T) {
	ports := porttest.Ports(32)
	cfg := testConfig(netip.AddrPort{}, ports) // the demo sets the upstream
	cfg.idle = 300 * time.Millisecond
	var out, progress bytes.Buffer
	res, err := runDemo(context.Background(), cfg, demoConfig{clients: 4, duration: 2 * time.Second, rate: 20}, &out, &progress)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("summary:\n%s", out.String())
	if !res.ok() {
		t.Errorf("demo failed: %+v", res)
	}
	if res.sent < 4*20 || res.wrong != 0 || res.lost != 0 {
		t.Errorf("sent %d, wrong %d, lost %d", res.sent, res.wrong, res.lost)
	}
	if res.gw.FlowsCreated != 8 || res.gw.FlowsExpired < 4 {
		t.Errorf("flows created %d, expired %d; want 8 and at least 4", res.gw.FlowsCreated, res.gw.FlowsExpired)
	}
	if res.rogueSent == 0 || res.gw.OversizeIn != res.rogueSent {
		t.Errorf("oversize dropped %d of %d sent", res.gw.OversizeIn, res.rogueSent)
	}
	if !strings.Contains(out.String(), "PASS") {
		t.Errorf("summary lacks PASS:\n%s", out.String())
	}
	if lines := strings.Count(progress.String(), "\n"); lines < 1 {
		t.Errorf("progress has %d lines, want one a second:\n%s", lines, progress.String())
	}
}

// The command runs the demo and exits 0.
func TestCommandDemo(t *testing.T) {
	ports := porttest.Ports(16)
	var stdout, stderr bytes.Buffer
	code := realMain(context.Background(), []string{"-demo", "-clients", "3", "-duration", "1s", "-rate", "20",
		"-ports", fmt.Sprintf("%d-%d", ports.Low, ports.High)}, &stdout, &stderr)
	if code != 0 {
		t.Errorf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	if !strings.Contains(stdout.String(), "PASS") {
		t.Errorf("no PASS in:\n%s", stdout.String())
	}
}

// The command runs the demo from IPv6 clients to an IPv6 upstream.
func TestCommandDemoIPv6(t *testing.T) {
	needIPv6Loopback(t)
	ports := porttest.Ports(8)
	var stdout, stderr bytes.Buffer
	code := realMain(context.Background(), []string{"-demo", "-clients", "2", "-duration", "1s", "-rate", "20",
		"-inside", "[::1]:0", "-outside", "::1", "-ports", fmt.Sprintf("%d-%d", ports.Low, ports.High)}, &stdout, &stderr)
	if code != 0 {
		t.Errorf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	for _, want := range []string{"PASS", "gateway [::1]:", "echo upstream [::1]:", "outside ::1 "} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("no %q in:\n%s", want, stdout.String())
		}
	}
}

// Bad flags: a clear message naming the flag, exit 2, no panic.
func TestBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{}, "-inside is required"},
		{[]string{"-inside", "127.0.0.1:5000"}, "-upstream is required"},
		{[]string{"-inside", "nonsense", "-upstream", "127.0.0.1:7"}, "-inside"},
		{[]string{"-inside", "0.0.0.0:5000", "-upstream", "127.0.0.1:7"}, "wildcard"},
		{[]string{"-inside", "127.0.0.1:5000", "-upstream", "127.0.0.1:0"}, "-upstream"},
		{[]string{"-inside", "127.0.0.1:5000", "-upstream", "[::1]:7"}, "different address families"},
		{[]string{"-inside", "127.0.0.1:5000", "-upstream", "127.0.0.1:7", "-outside", "0.0.0.0"}, "-outside"},
		// The IPv4 wildcard in IPv4-mapped form is a wildcard too.
		{[]string{"-inside", "[::ffff:0.0.0.0]:5000", "-upstream", "127.0.0.1:7"}, "wildcard"},
		{[]string{"-inside", "127.0.0.1:5000", "-upstream", "127.0.0.1:7", "-outside", "::ffff:0.0.0.0"}, "-outside"},
		{[]string{"-inside", "127.0.0.1:5000", "-upstream", "[::ffff:0.0.0.0]:7"}, "-upstream"},
		{[]string{"-demo", "-ports", "5-1"}, "-ports"},
		{[]string{"-demo", "-ports", "0-10"}, "-ports"},
		{[]string{"-demo", "-ports", "70000-70001"}, "-ports"},
		{[]string{"-demo", "-ports", "abc"}, "-ports"},
		{[]string{"-demo", "-idle", "0s"}, "-idle"},
		{[]string{"-demo", "-idle", "banana"}, "idle"},
		{[]string{"-demo", "-max-flows", "0"}, "-max-flows"},
		{[]string{"-demo", "-max-datagram", "70000"}, "-max-datagram"},
		{[]string{"-demo", "-max-datagram", "8"}, "-max-datagram"},
		{[]string{"-demo", "-clients", "0"}, "-clients"},
		{[]string{"-demo", "-clients", "600"}, "-clients 600 needs"},
		{[]string{"-demo", "-duration", "-1s"}, "-duration"},
		{[]string{"-demo", "-rate", "0"}, "-rate"},
		{[]string{"-demo", "-rate", "NaN"}, "-rate"},
		{[]string{"-demo", "-upstream", "127.0.0.1:7"}, "cannot be used with -demo"},
		{[]string{"-inside", "127.0.0.1:5000", "-upstream", "127.0.0.1:7", "-clients", "3"}, "only with -demo"},
		{[]string{"-demo", "extra"}, "unexpected argument"},
		{[]string{"-no-such-flag"}, "no-such-flag"},
	} {
		var stdout, stderr bytes.Buffer
		code := realMain(context.Background(), tc.args, &stdout, &stderr)
		// One line for the error, one pointing to -h: no usage dump.
		if code != 2 || !strings.Contains(stderr.String(), tc.want) || strings.Count(stderr.String(), "\n") != 2 {
			t.Errorf("%q: exit %d, stderr %q; want exit 2 and %q in two lines", tc.args, code, stderr.String(), tc.want)
		}
	}
	var stdout, stderr bytes.Buffer
	if code := realMain(context.Background(), []string{"-h"}, &stdout, &stderr); code != 0 || !strings.Contains(stderr.String(), "-max-flows") {
		t.Errorf("-h: exit %d, usage %q", code, stderr.String())
	}
}

// The command in gateway mode runs until its context ends, then prints its
// counts and exits 0.
func TestCommandGateway(t *testing.T) {
	up := startUpstream(t)
	ports := porttest.Ports(8)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := realMain(ctx, []string{"-inside", "127.0.0.1:0", "-upstream", up.addr().String(),
		"-ports", fmt.Sprintf("%d-%d", ports.Low, ports.High)}, &stdout, &stderr)
	if code != 0 || !strings.Contains(stdout.String(), "stopped") {
		t.Errorf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
}
