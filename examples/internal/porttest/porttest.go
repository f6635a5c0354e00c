// Package porttest hands out source port ranges to the example commands'
// tests, which bind real sockets on loopback.
package porttest

import (
	"math/rand/v2"
	"os"
	"sync"

	"github.com/hash4/hash4"
)

// The blocks come from a region of 8000 ports outside the OS's ephemeral
// range (ip_local_port_range), where the OS picks the ports of the tests'
// other sockets: 21000-28999 unless that overlaps it, else the first such
// region above 10000 and below 65000. They start at a random place in it,
// so that concurrent runs of the tests rarely share ports, and wrap around.
var (
	mu     sync.Mutex
	region hash4.PortRange
	next   int
)

const regionSize = 8000

// Ports returns the next block of n consecutive ports, 1 <= n <= 1000.
func Ports(n int) hash4.PortRange {
	if n < 1 || n > 1000 {
		panic("porttest: a block is 1 to 1000 ports")
	}
	mu.Lock()
	defer mu.Unlock()
	if region.Size() == 0 {
		region = pickRegion(ephemeralRange())
		next = int(region.Low) + 100*rand.IntN(regionSize/100)
	}
	if next+n-1 > int(region.High) {
		next = int(region.Low)
	}
	r := hash4.PortRange{Low: uint16(next), High: uint16(next + n - 1)}
	next += n
	return r
}

// ephemeralRange returns the OS's ephemeral port range, or Linux's default
// where it cannot be read.
func ephemeralRange() hash4.PortRange {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return hash4.DefaultPortRange
	}
	r, err := hash4.ParsePortRange(string(b))
	if err != nil {
		return hash4.DefaultPortRange
	}
	return r
}

// pickRegion returns a region of regionSize ports clear of eph:
// 21000-28999 if it is, else the first clear one from 10000 up, else
// 21000-28999 all the same.
func pickRegion(eph hash4.PortRange) hash4.PortRange {
	clear := func(low int) bool { return low+regionSize-1 < int(eph.Low) || low > int(eph.High) }
	if clear(21000) {
		return hash4.PortRange{Low: 21000, High: 21000 + regionSize - 1}
	}
	for low := 10000; low+regionSize-1 < 65000; low += 1000 {
		if clear(low) {
			return hash4.PortRange{Low: uint16(low), High: uint16(low + regionSize - 1)}
		}
	}
	return hash4.PortRange{Low: 21000, High: 21000 + regionSize - 1}
}
