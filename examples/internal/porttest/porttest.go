// Package porttest hands out source port ranges to the example commands'
// tests, which bind real sockets on loopback.
package porttest

import (
	"math/rand/v2"
	"sync/atomic"

	"github.com/hash4/hash4"
)

// Ranges are consecutive blocks from a random start in 21000-28999, clear
// of the OS's ephemeral range, so that concurrent runs of the tests rarely
// share ports.
var (
	base = 21000 + 100*rand.IntN(70)
	next atomic.Int32
)

// Ports returns the next block of n ports. It panics once the blocks run
// past 29999, which tests that ask for a few hundred ports in all never
// reach.
func Ports(n int) hash4.PortRange {
	start := base + int(next.Add(int32(n))) - n
	if n < 1 || start+n > 29999 {
		panic("porttest: port blocks exhausted")
	}
	return hash4.PortRange{Low: uint16(start), High: uint16(start + n - 1)}
}
