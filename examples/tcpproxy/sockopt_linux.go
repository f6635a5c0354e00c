package main

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

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

// tcpiOptTimestamps is TCP_INFO's TCPI_OPT_TIMESTAMPS, missing from x/sys/unix.
const tcpiOptTimestamps = 1

// usedTimestamps reports whether the connection c negotiated TCP
// timestamps: only then does the kernel
// let a new connection take over the TIME_WAIT socket it leaves behind.
func usedTimestamps(c *net.TCPConn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return false
	}
	used := false
	rc.Control(func(fd uintptr) {
		info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		used = err == nil && info.Options&tcpiOptTimestamps != 0
	})
	return used
}
