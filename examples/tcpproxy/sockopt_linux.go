package main

import "syscall"

// reuseAddr sets SO_REUSEADDR on a socket before it binds (a
// net.Dialer.Control function). On Linux, a port bound this way may carry
// connected sockets toward several upstreams, as long as no socket listens
// on it, and the kernel refuses a 4-tuple only at connect(), if a socket
// already holds it.
func reuseAddr(network, address string, c syscall.RawConn) error {
	var err error
	if cerr := c.Control(func(fd uintptr) {
		err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
	}); cerr != nil {
		return cerr
	}
	return err
}
