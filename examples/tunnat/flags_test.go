package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hash4/hash4/nat"
)

// Bad flags exit 2 with a message naming the flag; -h exits 0.
func TestFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-ports", "0-10"}, 2, "-ports"},
		{[]string{"-ports", "20-10"}, 2, "-ports"},
		{[]string{"-max-flows", "0"}, 2, "-max-flows"},
		{[]string{"-udp-idle", "0s"}, 2, "-udp-idle"},
		{[]string{"-tcp-close", "-1s"}, 2, "-tcp-close"},
		{[]string{"-demo", "-compare"}, 2, "choose one"},
		{[]string{"-duration", "2s"}, 2, "-duration"},
		{[]string{"-demo", "-duration", "500ms"}, 2, "-duration"},
		{[]string{"extra"}, 2, "unexpected argument"},
		{[]string{"-mapping", "cone"}, 2, "-mapping"},
		{[]string{"-mapping", "apdm", "-filtering", "eif"}, 2, "address-and-port-dependent"},
		{[]string{"-pool", "9"}, 2, "-pool"},
		{[]string{"-block-size", "64", "-blocks", "x"}, 2, "-blocks"},
		{[]string{"-mtu", "100"}, 2, "MTU"},
		{[]string{"-queues", "0"}, 2, "-queues"},
		{[]string{"-nice", "20"}, 2, "-nice 20: want 0 to 19"},
		{[]string{"-nice", "-1"}, 2, "-nice -1"},
		{[]string{"-capacity", "-1"}, 2, "-capacity -1"},
		{[]string{"-max-flows", "100", "-capacity", "101"}, 2, "-capacity 101: want 0 to -max-flows (100)"},
		{[]string{"-rounds", "3"}, 2, "-rounds works only with -compare"},
		{[]string{"-compare", "-rounds", "0"}, 2, "-rounds 0: want 1 to 20"},
		{[]string{"-compare", "-rounds", "21"}, 2, "-rounds 21"},
		{[]string{"-h"}, 0, "usage"},
	} {
		var stdout, stderr bytes.Buffer
		if code := realMain(context.Background(), c.args, &stdout, &stderr); code != c.code || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%q: exit %d, want %d; stderr:\n%s", c.args, code, c.code, stderr.String())
		}
	}
}

// The defaults, and the demo's and comparison's run lengths.
func TestFlagDefaults(t *testing.T) {
	o, err := parseFlags(nil, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if o.nat.ports.Low != 1024 || o.nat.ports.High != 65535 || o.nat.timeouts.TCPEstablished != nat.DefaultTimeouts.TCPEstablished || o.duration != 0 || o.rounds != 1 {
		t.Errorf("defaults: %+v", o)
	}
	if o, _ := parseFlags([]string{"-demo"}, &bytes.Buffer{}); o.duration != defaultDemoDuration {
		t.Errorf("-demo duration %v", o.duration)
	}
	if o, _ := parseFlags([]string{"-compare", "-duration", "5s", "-udp-idle", "1s"}, &bytes.Buffer{}); o.duration != 5*time.Second || o.nat.timeouts.UDP != time.Second {
		t.Errorf("-compare -duration 5s -udp-idle 1s: %+v", o)
	}
}
