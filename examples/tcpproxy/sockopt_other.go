//go:build !linux

package main

import (
	"errors"
	"net"
	"syscall"
)

// reuseAddr refuses to dial: the proxy relies on SO_REUSEADDR's meaning on
// Linux, a bound port that connected sockets toward other upstreams share,
// and has been tried only there.
func reuseAddr(network, address string, c syscall.RawConn) error {
	return errors.New("tcpproxy: sharing a bound source port between upstreams is built for Linux only")
}

// usedTimestamps reports false: where the proxy does not dial, no
// connection leaves a TIME_WAIT socket to take over.
func usedTimestamps(*net.TCPConn) bool { return false }
