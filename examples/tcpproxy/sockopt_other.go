//go:build !unix

package main

import (
	"errors"
	"syscall"
)

// reuseAddr refuses to dial: the proxy needs SO_REUSEADDR's Unix meaning,
// a bound port that connected sockets toward other upstreams share.
func reuseAddr(network, address string, c syscall.RawConn) error {
	return errors.New("tcpproxy: binding a source port shared between upstreams needs a Unix system")
}
